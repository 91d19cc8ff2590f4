"""One-off actors (``schedule_at=``): in process, a stub broker, two schedulers on one SQLite
store, real time.

The actor's message is sent once, by one of the schedulers, at its time; schedulers
started again afterwards (the same declaration) do not send it again.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from anarchon_core import ConfigurationError, Control, Scheduler
from anarchon_dramatiq import Anarchon, ScheduleError, every
from tests.waiting import wait_until


def noop() -> None:
    """An actor body."""


def _sent(broker: StubBroker, queue: str) -> list[str]:
    """The slot ids of the messages enqueued on ``queue`` (left there: no worker runs)."""
    found = []
    for raw in list(broker.queues[queue].queue):
        options = json.loads(raw)["options"]
        found.append(options["anarchon"]["slot_id"])
    return found


def _run(engines: list[Scheduler], until: Any, timeout: float, what: str) -> None:
    for engine in engines:
        engine.start()
    try:
        wait_until(until, timeout, what)
    finally:
        for engine in engines:
            engine.stop()


def test_a_schedule_at_actor_is_sent_once_by_one_of_two_schedulers_and_not_again(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/anarchon.db"
    broker = StubBroker()
    middleware = Anarchon(store=url)
    broker.add_middleware(middleware)
    at = datetime.fromtimestamp(int(time.time()) + 2, timezone.utc)
    dramatiq.actor(noop, actor_name="report", broker=broker, queue_name="q", schedule_at=at)
    slot = f"report@{int(at.timestamp() * 1000)}"

    engines = [middleware.build_engine(broker, f"test:{i}") for i in (1, 2)]
    assert engines[0].jobs["report"].schedule.next_after(at - timedelta(seconds=1)) == at
    control = Control(engines[0].store)

    def done() -> bool:
        return time.time() > at.timestamp() + 1.5 and not control.pending_once()

    _run(engines, done, 10, "the one-off sent and its entry settled")
    assert _sent(broker, "q") == [slot]

    again = [middleware.build_engine(broker, f"test:{i}") for i in (3, 4)]
    started = time.time()
    _run(again, lambda: time.time() > started + 2.5, 5, "the schedulers to run a while")
    assert _sent(broker, "q") == [slot]
    assert control.pending_once() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schedule_at": "2030-01-01T00:00:00"}, "time zone"),
        ({"schedule_at": "soon"}, "ISO 8601"),
        ({"schedule_at": "2030-01-01T00:00:00Z", "schedule": every(10)}, "schedule do not apply"),
        ({"schedule_at": "2030-01-01T00:00:00Z", "schedule_end": "2031-01-01T00:00:00Z"}, "end"),
        ({"schedule_at": "2030-01-01T00:00:00Z", "schedule_lease": 400}, "pickup=300"),
    ],
)
def test_a_bad_schedule_at_fails_at_declaration_naming_the_actor(
    options: dict[str, Any], message: str
) -> None:
    broker = StubBroker()
    middleware = Anarchon(store="memory://")
    broker.add_middleware(middleware)
    with pytest.raises(ScheduleError, match=message) as info:
        dramatiq.actor(noop, broker=broker, **options)
    assert isinstance(info.value, ConfigurationError)
    assert "actor 'noop'" in str(info.value)
    assert middleware.periodic == {}
