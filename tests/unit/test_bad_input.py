"""Bad input is refused at declaration or open, with a message naming it; no secret leaks.

One test per case a new user hit: a job name no store can keep, URLs that
opened and failed at the first call, durations that meant busy polling, a
password in a conninfo error, and ``anarchon status`` exiting 0 on a store it
could not reach. The same cases on real servers are in
tests/stores/test_bad_input_servers.py; random inputs in
tests/stores/test_input_properties.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from anarchon_core import (
    ConfigurationError,
    Event,
    Run,
    RunState,
    Scheduler,
    open_store,
    redact,
)
from anarchon_core.cli import EXIT_CONFIG, EXIT_EMPTY, EXIT_OK, EXIT_UNREACHABLE, main
from anarchon_core.store import Change, Claim, ClaimRequest, JobState, refused_if_any
from anarchon_core.stores.memory import MemoryStore
from anarchon_core.urls import secrets_in
from tests.servers import free_port

# -- 1. job names -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nightly\x00", r"character 7 \('\\x00'\) is not printable"),
        ("sync\udc80", r"character 4 \('\\udc80'\) is not printable"),
        ("two\nlines", "is not printable"),
        ("tab\there", "is not printable"),
        ("zero\u200bwidth", "is not printable"),
        ("x" * 201, "201 characters, at most 200"),
        ("   ", "empty or only spaces"),
        ("", "empty or only spaces"),
    ],
)
def test_a_job_name_no_store_can_keep_is_refused_at_declaration(name: str, message: str) -> None:
    cron = Scheduler("memory://")
    with pytest.raises(ConfigurationError, match=message):
        cron.add_job(lambda: None, name=name, every=10)
    with pytest.raises(ConfigurationError, match=message):
        cron.job(every=10, name=name)(lambda: None)
    assert cron.jobs == {}  # nothing half-registered


def test_a_celery_entry_name_follows_the_same_rule() -> None:
    from anarchon_celery.schedules import read_entry

    with pytest.raises(ConfigurationError, match="is not printable"):
        read_entry("nightly\x00", {"task": "t", "schedule": 10}, "UTC")


@pytest.mark.parametrize("name", ["nightly", "billing:sync-v2", "rapport été", "üñí 👍", "a" * 200])
def test_printable_names_are_kept(name: str) -> None:
    assert Scheduler("memory://").add_job(lambda: None, name=name, every=10).name == name


class RefusesOneJob(MemoryStore):
    """A store whose server answers any call naming ``bad`` with an error (not an outage)."""

    def __init__(self, bad: str) -> None:
        super().__init__()
        self.bad = bad

    def _refuse(self, jobs: Iterable[str]) -> None:
        if self.bad in jobs:
            raise ValueError("the server cannot store this job's name")

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        self._refuse([r.job for r in requests])
        return super().claim_many(requests, owner)

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(jobs)
        self._refuse(names)
        return super().states(names)


def test_one_job_the_store_refuses_does_not_stop_the_others() -> None:
    store = RefusesOneJob(bad="poisoned")
    events: list[Event] = []
    ran: list[str] = []
    both = threading.Event()
    cron = Scheduler(store, instance="a", listener=events.append)
    for name in ("healthy", "poisoned", "other"):
        cron.add_job(
            lambda run, name=name: (ran.append(name), len(set(ran)) == 2 and both.set()),
            name=name,
            every=1,
            jitter=0,
        )
    cron.start()
    try:
        assert both.wait(5), f"ran: {ran}"
    finally:
        cron.stop()
    assert set(ran) == {"healthy", "other"}
    refused = [e for e in events if e.kind == "store_refused"]
    assert refused and {e.job for e in refused} == {"poisoned"}
    assert len(refused) == 1  # once, not at every step
    assert "cannot store this job's name" in refused[0].detail
    assert not [e for e in events if e.kind == "store_unavailable"]


class RefusesOneEnd(MemoryStore):
    """Takes every claim; refuses, always and alone, the end of one job's runs."""

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        answers = [
            ValueError("the server cannot record this job's end")
            if change.job == "poisoned" and change.state is not RunState.RUNNING
            else super(RefusesOneEnd, self).change_many([change])[0]
            for change in changes
        ]
        return refused_if_any(answers)


def test_a_run_whose_end_the_store_keeps_refusing_does_not_stop_the_others() -> None:
    # The end of "poisoned" is sent alone at the start of a step (the batch of
    # ends holds nothing else): it fails the step once, as a store failure;
    # after that it fails alone, and the other job's slots go on every second.
    events: list[Event] = []
    ran: list[str] = []
    enough = threading.Event()
    cron = Scheduler(RefusesOneEnd(), instance="a", listener=events.append)

    def healthy(run: Run) -> None:
        ran.append(run.slot_id)
        if len(ran) >= 4:
            enough.set()

    cron.add_job(healthy, name="healthy", every=1, jitter=0)
    cron.add_job(lambda: None, name="poisoned", every=1, jitter=0)
    cron.start()
    try:
        assert enough.wait(7), "\n".join(str(e) for e in events)
    finally:
        cron.stop()
    assert len(set(ran)) == len(ran)
    refused = [e for e in events if e.kind == "store_refused"]
    assert {e.job for e in refused} == {"poisoned"}
    assert "cannot record this job's end" in refused[0].detail


def test_an_error_on_every_job_alike_is_a_store_failure() -> None:
    class RefusesAll(MemoryStore):
        def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
            raise ValueError("READONLY You can't write against a read only replica")

    events: list[Event] = []
    cron = Scheduler(RefusesAll(), instance="a", listener=events.append)
    for name in ("one", "two"):
        cron.add_job(lambda: None, name=name, every=1)
    cron.run_pending()
    assert [e.kind for e in events] == ["store_unavailable"]
    assert "READONLY" in events[0].detail


# -- 2. URLs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1/0?foo=bar", r"unknown option 'foo' \(accepted: socket_timeout, "),
        ("valkey://127.0.0.1/0?db=3", r"unknown option 'db' \(accepted: "),
        ("rediss://127.0.0.1/0?ssl_nope=1", r"unknown option 'ssl_nope' \(accepted: .*ssl_ca"),
        ("redis://127.0.0.1/0?health_check_interval=often", "health_check_interval"),
        ("nats://127.0.0.1:4222?retries=3", r"'retries' \(accepted: timeout, connect_timeout"),
        ("nats://127.0.0.1:4222?replicas=seven", "replicas='seven'"),
        ("amqp://guest:pw@127.0.0.1//?heartbeat=10", r"'heartbeat' \(accepted: expires, timeout"),
        ("sqlite:///jobs.db?timeout=3", r"'timeout' \(accepted: busy_timeout\)"),
        ("http://127.0.0.1:8080?auth_token=x", r"'auth_token' \(accepted: authToken, timeout"),
        ("memory://?size=3", r"unknown option 'size' \(accepted: none\)"),
        ("postgresql://127.0.0.1/test?foo=bar", r'invalid URI query parameter: "foo"'),
        # Linux refuses a TCP keepalive time of 0: libpq would fail at every connect.
        ("postgresql://127.0.0.1/test?keepalives_idle=0", r"keepalives_idle='0'.*from 1 to"),
        # Percent-escapes that decode to no UTF-8, in the user, password or database.
        ("postgresql://%fA@127.0.0.1/test", r"percent-escape.*not UTF-8"),
        ("postgresql://u:s3cr%ffet@127.0.0.1/test", r"percent-escape.*not UTF-8"),
        ("postgresql://127.0.0.1/te%e9st", r"percent-escape.*not UTF-8"),
        ("postgresql://127.0.0.1/test?keepalives_count=0", r"keepalives_count='0'.*from 1 to"),
        ("redis://[::1", "Invalid IPv6 URL"),
        ("redis://:pw@127.0.0.1:99999/0", "Port out of range"),
        ("nats://127.0.0.1:port", "Port could not be cast"),
        ("redis://127.0.0.1/0 ", "whitespace or control characters"),
        ("redis://127.0.0.1/\x000", "whitespace or control characters"),
        ("redis://:pw#x@127.0.0.1/0", "percent-encode '@', '/', '\\?' and '#'"),
        ("nats://pw/x@127.0.0.1:4222", "percent-encode"),
        ("redis://127.0.0.1/0#db", "no '#' fragment"),
    ],
)
def test_a_url_is_checked_when_the_store_is_opened(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        open_store(url)
    assert "pw" not in str(info.value).replace("pwd", "")


def test_a_sqlite_path_may_hold_an_at_sign(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/jobs@2026.db")
    try:
        assert store.claim("sync", 1_000, "a", 10).won
    finally:
        store.close()


def test_a_malformed_url_is_named_redacted() -> None:
    with pytest.raises(ConfigurationError) as info:
        open_store("redis://admin:s3cr3t@[::1/0")
    assert str(info.value) == "store URL 'redis://admin:***@[::1/0': Invalid IPv6 URL"


# -- 3. durations ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease": 1e-9}, r"lease=1e-09s: must be between 1s and 86400s"),
        ({"lease": "2d"}, r"lease=172800s: must be between 1s and 86400s"),
        ({"watch": 1e-9}, r"watch=1e-09s: must be between 0.05s and 3600s"),
        ({"watch": 0}, r"watch=0s: must be between"),
        ({"lease": 3, "renew": 0.001}, r"renew=0.001s: must be at least 0.1s"),
    ],
)
def test_durations_that_mean_busy_polling_are_refused(
    options: dict[str, Any], message: str
) -> None:
    cron = Scheduler("memory://")
    with pytest.raises(ConfigurationError, match=message):
        cron.add_job(lambda: None, name="job", every=10, **options)
    assert cron.jobs == {}


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1/0?socket_timeout=0.001",
        "redis://127.0.0.1/0?socket_connect_timeout=1h",
        "postgresql://127.0.0.1/test?timeout=10ms",
        "nats://127.0.0.1:4222?timeout=0",
        "nats://127.0.0.1:4222?connect_timeout=0.1",
        "amqp://127.0.0.1//?timeout=0.2",
        "sqlite:///x.db?busy_timeout=0",
        "http://127.0.0.1:1?timeout=0.01",
    ],
)
def test_store_timeouts_are_bounded(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"must be between 0.5s and 300s"):
        open_store(url)


# -- 5. secrets -----------------------------------------------------------------


def test_a_password_in_a_conninfo_string_is_never_in_the_error() -> None:
    from anarchon_core.stores.postgres import PostgresStore

    with pytest.raises(ConfigurationError) as info:
        PostgresStore(conninfo="host=127.0.0.1 password=s3cr3t bogus")
    message = str(info.value)
    assert "s3cr3t" not in message
    assert "'host=127.0.0.1 password=*** bogus'" in message
    assert 'missing "=" after "bogus"' in message  # what libpq said


@pytest.mark.parametrize(
    ("dsn", "shown", "secrets"),
    [
        ("postgresql://u:s3cr3t@h:5432/db", "postgresql://u:***@h:5432/db", ["s3cr3t"]),
        ("host=h password=s3cr3t dbname=x", "host=h password=*** dbname=x", ["s3cr3t"]),
        ("host=h password = 's3 cr3t' x=1", "host=h password = *** x=1", ["s3 cr3t"]),
        ("redis://:s3cr3t@[::1", "redis://:***@[::1", ["s3cr3t"]),
        ("redis://u:p,q@h/0", "redis://u:***@h/0", ["p,q"]),
        ("nats://tok3n@h1:4222,u:s3cr3t@h2", "nats://***@h1:4222,u:***@h2", ["tok3n", "s3cr3t"]),
        ("https://h?authToken=tok3n&timeout=3", "https://h?authToken=***&timeout=3", ["tok3n"]),
        ("amqp://guest:s%40cret@mq//", "amqp://guest:***@mq//", ["s%40cret"]),
        ("redis://h:6379/0", "redis://h:6379/0", []),
    ],
)
def test_every_dsn_form_is_redacted(dsn: str, shown: str, secrets: list[str]) -> None:
    assert redact(dsn) == shown
    assert secrets_in(dsn) == secrets


# -- 6. status exit codes --------------------------------------------------------


def test_status_exit_codes_tell_the_cases_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    assert main(["status", "--store", db]) == EXIT_EMPTY
    store = open_store(db)
    store.claim("sync", 1_700_000_000_000, "host:1", 30)
    store.close()
    assert main(["status", "--store", db]) == EXIT_OK
    assert main(["status", "--store", db, "--namespace", "other"]) == EXIT_EMPTY
    assert main(["status", "--store", "redis://127.0.0.1/0?foo=1"]) == EXIT_CONFIG
    capsys.readouterr()
    closed = f"redis://:s3cr3t@127.0.0.1:{free_port()}/0?socket_connect_timeout=1"
    assert main(["status", "--store", closed]) == EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert "cannot reach the store redis://:***@127.0.0.1:" in err
    assert "s3cr3t" not in err


# -- 7. metrics ports ------------------------------------------------------------

BAD_METRICS_PORTS = ["9100", 70000, True, -1, 9100.0]


@pytest.mark.parametrize("port", BAD_METRICS_PORTS)
def test_celery_refuses_a_metrics_port_that_is_no_tcp_port(port: object) -> None:
    from celery import Celery

    from anarchon_celery.settings import read_settings

    app = Celery("metrics", broker="memory://")
    app.conf.anarchon_metrics_port = port
    with pytest.raises(ConfigurationError, match=r"^anarchon_metrics_port=.*expected a TCP port"):
        read_settings(app)


def test_celery_reads_its_metrics_port_and_host() -> None:
    from celery import Celery

    from anarchon_celery.settings import read_settings

    app = Celery("metrics", broker="memory://")
    assert read_settings(app).metrics_port is None  # none served by default
    app.conf.anarchon_metrics_port = 9100
    app.conf.anarchon_metrics_host = "127.0.0.1"
    settings = read_settings(app)
    assert (settings.metrics_port, settings.metrics_host) == (9100, "127.0.0.1")
    app.conf.anarchon_metrics_host = ""
    with pytest.raises(ConfigurationError, match="anarchon_metrics_host=''"):
        read_settings(app)


@pytest.mark.parametrize("port", BAD_METRICS_PORTS)
def test_dramatiq_refuses_a_metrics_port_that_is_no_tcp_port(port: object) -> None:
    from anarchon_dramatiq import Anarchon

    with pytest.raises(ConfigurationError, match=r"^metrics_port=.*expected a TCP port"):
        Anarchon(store="memory://", metrics_port=port)  # type: ignore[arg-type]


def test_dramatiq_keeps_a_good_metrics_port() -> None:
    from anarchon_dramatiq import Anarchon

    middleware = Anarchon(store="memory://", metrics_port=9100, metrics_host="127.0.0.1")
    assert (middleware.metrics_port, middleware.metrics_host) == (9100, "127.0.0.1")
    assert Anarchon(store="memory://").metrics_port is None


def test_dramatiq_refuses_an_empty_metrics_host() -> None:
    from anarchon_dramatiq import Anarchon

    with pytest.raises(ConfigurationError, match="metrics_host=''"):
        Anarchon(store="memory://", metrics_port=9100, metrics_host="")
