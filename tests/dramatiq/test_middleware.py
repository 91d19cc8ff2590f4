"""The middleware's translation of actors into jobs, in process (no worker, no server)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from anarchon_core import ConfigurationError, Run
from anarchon_core.stores.memory import MemoryStore
from anarchon_dramatiq import Anarchon, ScheduleError, every
from anarchon_dramatiq.middleware import broker_store_url


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
