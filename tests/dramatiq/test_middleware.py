"""The middleware's translation of actors into jobs, in process (no worker, no server)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from anarchon_core import ConfigurationError, Run
from anarchon_core.handoff import HandOff
from anarchon_core.stores.memory import MemoryStore
from anarchon_dramatiq import Anarchon, ScheduleError, every
from anarchon_dramatiq.broker_store import broker_store_url
from tests.servers import free_port


def make_broker(**options: Any) -> tuple[StubBroker, Anarchon]:
    broker = StubBroker()
    middleware = Anarchon(store="memory://", **options)
    broker.add_middleware(middleware)
    return broker, middleware


def noop() -> None:
    """An actor body."""


def test_the_option_without_the_middleware_fails_at_declaration() -> None:
    with pytest.raises(ValueError, match=r"actor options are undefined: schedule.*middleware"):
        dramatiq.actor(noop, broker=StubBroker(), schedule="* * * * *")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schedule": "61 * * * *"}, "actor 'noop'"),
        ({"schedule": 10}, "expected a cron string"),
        ({"schedule": every(10), "schedule_timezone": "UTC"}, "timezone= applies to cron"),
        ({"schedule": "* * * * *", "schedule_timezone": "Mars/Olympus"}, "actor 'noop'"),
        ({"schedule": every(10), "schedule_jitter": 10}, "jitter"),
        ({"schedule": every(10), "schedule_lease": 400}, "pickup=300"),
        ({"schedule_lease": 4}, "without schedule="),
    ],
)
def test_an_invalid_schedule_fails_at_declaration_naming_the_actor(
    options: dict[str, Any], message: str
) -> None:
    broker, middleware = make_broker()
    with pytest.raises(ScheduleError, match=message) as info:
        dramatiq.actor(noop, broker=broker, **options)
    assert isinstance(info.value, ConfigurationError)
    assert "actor 'noop'" in str(info.value)
    assert middleware.periodic == {}


def test_periodic_actors_become_jobs_that_send_their_message() -> None:
    broker, middleware = make_broker(lease=4)
    dramatiq.actor(noop, broker=broker, queue_name="q", schedule=every(10), schedule_lease=5)
    dramatiq.actor(noop, actor_name="nightly", broker=broker, schedule="0 3 * * *")
    dramatiq.actor(noop, actor_name="plain", broker=broker)
    engine = middleware.build_engine(broker, "test:1")
    try:
        assert set(engine.jobs) == {"noop", "nightly"}
        assert engine.jobs["noop"].options.lease == 5
        assert engine.jobs["nightly"].options.lease == 4
        assert isinstance(engine.store, MemoryStore)
        claim = engine.store.claim("noop", 10_000, "test:1", 5)
        assert claim.holder is not None
        token = claim.holder.token
        run = Run(
            job="noop",
            slot=None,  # type: ignore[arg-type]
            slot_id="noop@10000",
            attempt=1,
            token=token,
            instance="test:1",
        )
        middleware.send(broker, engine, "noop", run)
        (message,) = broker.queues["q"].queue
    finally:
        engine.stop(timeout=0)
    encoded = dramatiq.Message.decode(message)
    info = encoded.options["anarchon"]
    assert info["slot_id"] == "noop@10000"
    assert info["attempt"] == 1
    assert info["token"] == token
    assert info["tracked"] is True
    assert info["pickup"] == 300


def test_the_store_defaults_to_the_broker() -> None:
    assert broker_store_url(RedisBroker(url="redis://u:p%40ss@cache:6380/10")) == (
        "redis://u:p%40ss@cache:6380/10"
    )
    assert broker_store_url(RedisBroker(host="cache")) == "redis://cache:6379/0"
    rabbit = SimpleNamespace(
        parameters=[
            SimpleNamespace(
                host="mq",
                port=5672,
                virtual_host="/",
                credentials=SimpleNamespace(username="guest", password="pw"),
                ssl_options=None,
            )
        ]
    )
    assert broker_store_url(rabbit) == "amqp://guest:pw@mq:5672/%2F"  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="store="):
        broker_store_url(StubBroker())


def test_invalid_middleware_options_fail_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="namespace"):
        Anarchon(namespace="a b")
    with pytest.raises(ConfigurationError, match="pickup"):
        Anarchon(pickup="soon")


def tracked_message(store_url: str, namespace: str, token: int) -> dramatiq.Message[Any]:
    info = {
        "namespace": namespace,
        "job": "sync",
        "slot_id": "sync@1700000000000",
        "attempt": 1,
        "token": token,
        "lease": 5,
        "pickup": 60,
        "tracked": True,
    }
    return dramatiq.Message(
        queue_name="default", actor_name="sync", args=(), kwargs={}, options={"anarchon": info}
    )


def test_the_hand_off_ticket_reads_and_writes_the_option_as_sent() -> None:
    """The same dict, key for key, as every version sends: old and new workers read it."""
    info = {
        "namespace": "t",
        "job": "sync",
        "slot_id": "sync@1700000000000",
        "attempt": 2,
        "token": 7,
        "tracked": True,
        "lease": 5.0,
        "pickup": 60.0,
        "sent_by": "host:1:dq",
    }
    assert list(HandOff.from_message(info).to_message().items()) == list(info.items())


@pytest.fixture
def sqlite_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'tracking.db'}"


def test_a_stale_attempt_is_skipped_and_a_current_one_is_tracked(sqlite_url: str) -> None:
    from dramatiq.middleware import SkipMessage

    from anarchon_core import RunState, open_store

    store = open_store(sqlite_url, namespace="t")
    first = store.claim("sync", 1_700_000_000_000, "beat", 60).holder
    assert first is not None
    assert store.release("sync", first.token)
    second = store.takeover("sync", 1_700_000_000_000, "beat2", 60, first.token).holder
    assert second is not None
    broker = StubBroker()
    middleware = Anarchon(store=sqlite_url, namespace="t")
    broker.add_middleware(middleware)
    with pytest.raises(SkipMessage):
        middleware.before_process_message(broker, tracked_message(sqlite_url, "t", first.token))
    current = tracked_message(sqlite_url, "t", second.token)
    middleware.before_process_message(broker, current)
    state = store.state("sync")
    assert state is not None and state.lease_remaining <= 5  # the executor's lease now
    middleware.after_process_message(broker, current)
    middleware.after_ack(broker, current)
    state = store.state("sync")
    assert state is not None and state.state is RunState.DONE


def test_a_message_retried_by_dramatiq_keeps_its_slot(sqlite_url: str) -> None:
    from dramatiq.middleware import Retries

    from anarchon_core import RunState, open_store

    store = open_store(sqlite_url, namespace="t")
    holder = store.claim("sync", 1_700_000_000_000, "beat", 60).holder
    assert holder is not None
    broker = StubBroker()
    assert any(isinstance(m, Retries) for m in broker.middleware)
    middleware = Anarchon(store=sqlite_url, namespace="t")
    broker.add_middleware(middleware)
    message = tracked_message(sqlite_url, "t", holder.token)
    middleware.before_process_message(broker, message)
    middleware.after_process_message(broker, message, exception=RuntimeError("boom"))
    middleware.after_ack(broker, message)  # Retries re-enqueued it: the slot is kept
    state = store.state("sync")
    # Dispatched again for the retried message, with the pickup lease.
    assert state is not None and state.state is RunState.DISPATCHED
    assert 55 < state.lease_remaining <= 60
    assert store.renew("sync", holder.token, 5)  # and the retried message may take it


def test_the_middleware_is_hosting_and_tracking_each_a_middleware_of_its_own() -> None:
    from anarchon_dramatiq.hosting import SchedulerHost
    from anarchon_dramatiq.tracking import ExecutionTracking

    _, middleware = make_broker()
    assert isinstance(middleware, SchedulerHost) and isinstance(middleware, ExecutionTracking)
    hosting = {"before_declare_actor", "after_worker_boot", "before_worker_shutdown"}
    tracking = {
        "before_process_message",
        "after_process_message",
        "after_ack",
        "after_nack",
        "after_worker_shutdown",
    }
    assert hosting <= set(vars(SchedulerHost)) and not hosting & set(vars(ExecutionTracking))
    assert tracking <= set(vars(ExecutionTracking)) and not tracking & set(vars(SchedulerHost))


def test_a_worker_shutting_down_closes_the_stores_it_tracked_with(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anarchon_core import handoff, open_store
    from anarchon_dramatiq.tracking import ExecutionTracking

    store = open_store(sqlite_url, namespace="t")
    holder = store.claim("sync", 1_700_000_000_000, "beat", 60).holder
    assert holder is not None
    executions = handoff.Executions()
    monkeypatch.setattr(handoff, "EXECUTIONS", executions)
    closed: list[object] = []
    real_open = handoff.open_store

    def opening(url: str, *, namespace: str) -> Any:
        opened = real_open(url, namespace=namespace)
        real_close = opened.close
        monkeypatch.setattr(opened, "close", lambda: (closed.append(opened), real_close()))
        return opened

    monkeypatch.setattr(handoff, "open_store", opening)
    broker = StubBroker()
    tracking = ExecutionTracking(store=sqlite_url)
    broker.add_middleware(tracking)
    message = tracked_message(sqlite_url, "t", holder.token)
    tracking.before_process_message(broker, message)
    tracking.after_process_message(broker, message)
    tracking.after_ack(broker, message)
    assert closed == []
    tracking.after_worker_shutdown(broker, None)  # type: ignore[arg-type]
    assert len(closed) == 1
    assert executions.running() == []


def test_a_store_that_cannot_be_reached_is_waited_out_and_said_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0?socket_connect_timeout=1"
    broker = StubBroker()
    middleware = Anarchon(store=url)
    broker.add_middleware(middleware)
    dramatiq.actor(noop, broker=broker, schedule=every(10))
    caplog.set_level("INFO", logger="anarchon_core.probes")
    said = f"anarchon: the store redis://:***@127.0.0.1:{port}/0?socket_connect_timeout=1 has"
    middleware.after_worker_boot(broker, None)  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 20
        while said not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
        errors = [r for r in caplog.records if r.name == "anarchon_core.probes"]
        assert errors and errors[0].levelname == "ERROR", caplog.text
        assert "since this scheduler started" in errors[0].getMessage()
        assert "hunter2" not in caplog.text
    finally:
        middleware.before_worker_shutdown(broker, None)  # type: ignore[arg-type]
