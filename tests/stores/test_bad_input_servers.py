"""Bad input on real servers: a poisoned job, PostgreSQL's own reasons, status exit codes."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from anarchon_core import ConfigurationError, Event, Scheduler, StoreUnavailable, open_store
from anarchon_core.cli import EXIT_EMPTY, EXIT_UNREACHABLE, main
from tests.cleanup import drop_namespace


@pytest.fixture
def namespace(postgres_url: str) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    drop_namespace(postgres_url, name)


def test_a_job_postgresql_refuses_does_not_stop_the_others(
    postgres_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Declaration refuses NUL now; let one through to show that a job the store
    # cannot take (psycopg.DataError on every batch it is in) no longer stops
    # the other jobs of the scheduler, whose claims and reads are batched with it.
    monkeypatch.setattr("anarchon_core.jobs.check_name", lambda name: name)
    events: list[Event] = []
    ran = threading.Event()
    cron = Scheduler(postgres_url, namespace=namespace, instance="a", listener=events.append)
    cron.add_job(lambda: ran.set(), name="healthy", every=1, jitter=0)
    cron.add_job(lambda: None, name="nightly\x00", every=1, jitter=0)
    cron.start()
    try:
        assert ran.wait(6), [str(e) for e in events]
    finally:
        cron.stop()
    refused = [e for e in events if e.kind == "store_refused"]
    assert [e.job for e in refused] == ["nightly\x00"]
    assert "DataError" in refused[0].detail


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("/no_such_db?timeout=1", 'database "no_such_db" does not exist'),
        ("/test?timeout=1&sslmode=require", "server does not support SSL, but SSL was required"),
    ],
)
def test_a_postgresql_connection_error_says_what_the_server_said(
    postgres_url: str, query: str, said: str
) -> None:
    base = postgres_url.rsplit("/", 1)[0].replace("postgres@", "postgres:s3cr3t@")
    store = open_store(base + query)
    try:
        with pytest.raises(StoreUnavailable) as info:
            store.jobs()
    finally:
        store.close()
    message = str(info.value)
    assert said in message
    assert "couldn't get a connection" not in message
    assert "s3cr3t" not in message


def test_status_exits_non_zero_when_the_store_refuses_or_is_empty(
    amqp_url: str, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = amqp_url.replace("guest:guest@", "guest:WRONG-pw@")
    assert main(["status", "--store", wrong]) == EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert "ACCESS_REFUSED" in err and "WRONG-pw" not in err
    # Reached, with the right password: RabbitMQ records no jobs.
    assert main(["status", "--store", amqp_url]) == EXIT_EMPTY
    assert "records no jobs" in capsys.readouterr().out
    namespace = f"t{uuid.uuid4().hex[:10]}"
    try:
        assert main(["status", "--store", nats_url, "--namespace", namespace]) == EXIT_EMPTY
        assert f"no jobs recorded in namespace '{namespace}'" in capsys.readouterr().out
    finally:
        drop_namespace(nats_url, namespace)


def test_a_libpq_value_libpq_would_refuse_is_refused_when_opened(postgres_url: str) -> None:
    # Before: accepted, then every call waited out the pool for "invalid sslmode value".
    base = postgres_url.rsplit("/", 1)[0].replace("postgres@", "postgres:s3cr3t@")
    with pytest.raises(ConfigurationError, match="sslmode='bogus': expected one of") as info:
        open_store(base + "/test?sslmode=bogus")
    assert "s3cr3t" not in str(info.value)
