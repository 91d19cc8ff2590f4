"""Dramatiq's ``schedule_start``, ``schedule_end`` and ``schedule_expires`` actor options,
in process: what a declaration accepts, the jobs and messages it makes, and what a
Dramatiq worker with the default middleware does with a slot's message."""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage

from anarchon_core import Run, RunState
from anarchon_core.control import Control, Definition
from anarchon_core.slots import BACKFILL, Slot
from anarchon_core.store import LeaseStore
from anarchon_dramatiq import Anarchon, ScheduleError, every
from anarchon_dramatiq.hosting import age_limit, expiring_pickup

UTC = timezone.utc


def make_broker(broker: StubBroker | None = None, **options: Any) -> tuple[StubBroker, Anarchon]:
    broker = broker or StubBroker()
    middleware = Anarchon(**{"store": "memory://", "scheduler": False, **options})
    broker.add_middleware(middleware)
    return broker, middleware


def noop() -> None:
    """An actor body."""


# -- schedule_start and schedule_end --------------------------------------------------


def test_start_and_end_bound_the_actors_slots_both_included() -> None:
    broker, middleware = make_broker()
    dramatiq.actor(
        noop,
        broker=broker,
        schedule=every(3600),
        schedule_start="2027-01-01T00:00:00+01:00",
        schedule_end=datetime(2027, 1, 1, 3, tzinfo=UTC),
    )
    engine = middleware.build_engine(broker, "test:1")
    try:
        slots = engine.next_slots("noop", 10, after=datetime(2026, 12, 1, tzinfo=UTC))
    finally:
        engine.stop(timeout=0)
    assert slots == [datetime(2026, 12, 31, 23, tzinfo=UTC)] + [
        datetime(2027, 1, 1, h, tzinfo=UTC) for h in range(4)
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schedule_start": datetime(2027, 1, 1)}, r"schedule_start=2027-01-01T00:00:00: give its"),
        ({"schedule_end": "next tuesday"}, r"schedule_end='next tuesday': not an ISO 8601"),
        ({"schedule_start": 1798761600}, r"schedule_start=1798761600: expected a datetime"),
        (
            {
                "schedule_start": "2027-02-01T00:00:00+00:00",
                "schedule_end": "2027-01-01T00:00:00+00:00",
            },
            r"schedule_end=2027-01-01T00:00:00\+00:00 is before schedule_start=2027-02-01",
        ),
        (
            {
                "schedule_start": "2027-01-01T00:10:00+00:00",
                "schedule_end": "2027-01-01T00:20:00+00:00",
            },
            r"schedule_start, schedule_end: every 3600s has no slot from start=2027-01-01T00:10",
        ),
        ({"schedule_expires": "soon"}, r"schedule_expires='soon': expected a duration"),
        ({"schedule_expires": 0}, r"schedule_expires=0s: must be at least 0.001s"),
        ({"schedule_expires": -5}, r"schedule_expires=-5: a duration must be finite"),
    ],
)
def test_a_bad_bound_or_expiry_fails_at_declaration_naming_actor_and_option(
    options: dict[str, Any], message: str
) -> None:
    broker, middleware = make_broker()
    with pytest.raises(ScheduleError, match=message) as info:
        dramatiq.actor(noop, broker=broker, schedule=every(3600), **options)
    assert str(info.value).startswith("actor 'noop': ")
    assert middleware.periodic == {}


def test_a_bound_without_schedule_fails_at_declaration() -> None:
    broker, middleware = make_broker()
    with pytest.raises(ScheduleError, match="actor 'noop': schedule_end given without schedule="):
        dramatiq.actor(noop, broker=broker, schedule_end="2027-01-01T00:00:00+00:00")
    assert middleware.periodic == {}


def test_an_expiry_on_a_broker_that_drops_no_expired_message_fails_at_declaration() -> None:
    broker, middleware = make_broker(StubBroker(middleware=[]))
    with pytest.raises(
        ScheduleError, match=r"actor .noop.: schedule_expires=30 needs Dramatiq.s AgeLimit"
    ):
        dramatiq.actor(noop, broker=broker, schedule=every(60), schedule_expires=30)
    assert middleware.periodic == {}


# -- schedule_expires: the message options ---------------------------------------------


def test_the_age_limit_counts_from_the_slots_time() -> None:
    slot = 1_800_000_000_000
    assert age_limit(slot, slot + 2_000, 5) == 3_000  # sent 2 s late: 3 s left
    assert age_limit(slot, slot, 0.25) == 250
    assert age_limit(slot, slot - 1_000, 5) == 6_000  # a run-now slot, sent ahead of it
    assert age_limit(slot, slot + 4_999, 5) == 1
    # Past its expiry when sent: how long ago, which AgeLimit drops at once
    # (at the very moment, -1: Dramatiq reads 0 as no limit).
    assert age_limit(slot, slot + 60_000, 5) == -55_000
    assert age_limit(slot, slot + 5_000, 5) == -1
    # An age limit the message has anyway holds when it comes first.
    assert age_limit(slot, slot + 2_000, 5, current=1_000) == 1_000
    assert age_limit(slot, slot + 2_000, 5, current=10_000) == 3_000
    assert age_limit(slot, slot + 6_000, 5, current=1_000) == -1_000


def test_the_slot_waits_for_pickup_until_its_message_expired() -> None:
    slot = 1_800_000_000_000
    assert expiring_pickup(300, slot, slot + 2_000, 5) == 4.0  # 3 s left, plus a second
    assert expiring_pickup(300, slot, slot + 9_000, 5) == 1.0
    assert expiring_pickup(300, slot, slot + 2_000, 3600) == 300


def _engine_run(engine: Any, job: str, slot: datetime, *, key: str | None = None) -> Run:
    """The run of ``slot``, claimed in the engine's store, whose hand-off writes there."""
    store = engine.store
    assert isinstance(store, LeaseStore)
    record = key or job
    claim = store.claim(record, Slot(job, slot).ms, engine.instance, 10)
    assert claim.holder is not None
    token = claim.holder.token
    return Run.of(
        Slot(job, slot),
        attempt=1,
        token=token,
        instance=engine.instance,
        dispatch=lambda lease: store.dispatch(record, token, lease),
        key=key,
    )


def _seconds_ago(seconds: float) -> datetime:
    """A slot time ``seconds`` ago (a whole second)."""
    return datetime.fromtimestamp(time.time() // 1 - seconds, UTC)


def test_a_slots_message_expires_its_expiry_after_the_slots_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker, middleware = make_broker()
    dramatiq.actor(noop, actor_name="fresh", broker=broker, queue_name="q", schedule=every(60),
                   schedule_expires="5s")  # fmt: skip
    dramatiq.actor(noop, actor_name="capped", broker=broker, queue_name="q", schedule=every(60),
                   schedule_expires=timedelta(seconds=5), max_age=1_000)  # fmt: skip
    dramatiq.actor(noop, actor_name="late", broker=broker, queue_name="q", schedule=every(60),
                   schedule_expires=5)  # fmt: skip
    engine = middleware.build_engine(broker, "test:1")
    on_time, two_late = _seconds_ago(2), _seconds_ago(10)
    try:
        for job, slot in (("fresh", on_time), ("capped", on_time), ("late", two_late)):
            engine.job_named(job).handler(_engine_run(engine, job, slot))
        records = {job: engine.store.state(job) for job in ("fresh", "capped", "late")}
    finally:
        engine.stop(timeout=0)
    messages = {m.actor_name: m for m in map(dramatiq.Message.decode, broker.queues["q"].queue)}

    fresh = messages["fresh"]
    slot_ms = Slot("fresh", on_time).ms
    assert fresh.options["max_age"] == slot_ms + 5_000 - fresh.message_timestamp
    assert 1_000 < fresh.options["max_age"] <= 3_000
    assert fresh.options["anarchon"]["slot_id"] == f"fresh@{slot_ms}"
    assert messages["capped"].options["max_age"] == 1_000
    late = messages["late"]
    assert late.options["max_age"] == Slot("late", two_late).ms + 5_000 - late.message_timestamp
    assert -7_000 < late.options["max_age"] <= -5_000

    # The slot waits for a worker until its message expired, plus a second.
    assert records["fresh"] is not None and records["fresh"].state is RunState.DISPATCHED
    assert 2 < records["fresh"].lease_remaining <= 4
    assert records["late"] is not None and records["late"].state is RunState.DISPATCHED
    assert 0 < records["late"].lease_remaining <= 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1, said
    found = re.fullmatch(
        rf"anarchon: late@{Slot('late', two_late).ms} attempt 1 sent (\d+\.\d{{3}})s past"
        r" its expiry \(schedule_expires=5s\): the workers drop its message",
        said[0],
    )
    assert found is not None, said
    assert 5 <= float(found.group(1)) < 10


def test_a_backfills_slots_are_sent_without_the_expiry() -> None:
    broker, middleware = make_broker()
    dramatiq.actor(noop, broker=broker, queue_name="q", schedule=every(60), schedule_expires=5)
    engine = middleware.build_engine(broker, "test:1")
    try:
        run = _engine_run(engine, "noop", _seconds_ago(3600), key="noop" + BACKFILL)
        engine.job_named("noop").handler(run)
    finally:
        engine.stop(timeout=0)
    (message,) = map(dramatiq.Message.decode, broker.queues["q"].queue)
    assert "max_age" not in message.options
    assert message.options["anarchon"]["pickup"] == 300


def test_a_stored_schedule_carries_its_expiry_in_its_options(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker, middleware = make_broker()
    dramatiq.actor(noop, broker=broker, queue_name="q")
    engine = middleware.build_engine(broker, "test:1")
    try:
        control = Control(engine.store, namespace=engine.namespace)
        options = {"schedule_expires": "5s", "priority": 3}
        control.add(Definition("stored", "noop", every=3600, options=options))
        control.add(Definition("broken", "noop", every=3600, options={"schedule_expires": "x"}))
        engine.run_pending()
        slot = _seconds_ago(1)
        engine.job_named("stored").handler(_engine_run(engine, "stored", slot))
        with pytest.raises(KeyError):
            engine.job_named("broken")
    finally:
        engine.stop(timeout=0)
    (message,) = map(dramatiq.Message.decode, broker.queues["q"].queue)
    assert message.options["max_age"] == Slot("stored", slot).ms + 5_000 - message.message_timestamp
    assert message.options["priority"] == 3
    assert "schedule_expires" not in message.options
    assert any(
        "broken" in r.getMessage() and "schedule_expires='x'" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


# -- schedule_expires: a Dramatiq worker with the default middleware ------------------


def test_the_worker_drops_a_slot_sent_past_its_expiry_and_runs_one_sent_in_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = StubBroker()  # Dramatiq's default middleware, AgeLimit among them
    broker.add_middleware(CurrentMessage())
    broker, middleware = make_broker(broker, store=f"sqlite:///{tmp_path}/jobs.db")
    ran: list[str] = []

    def work() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        ran.append(message.options["anarchon"]["slot_id"])

    for name in ("on_time", "late"):
        dramatiq.actor(work, actor_name=name, broker=broker, queue_name="q",
                       schedule=every(60), schedule_expires=5)  # fmt: skip
    engine = middleware.build_engine(broker, "test:1")
    on_time, late = _seconds_ago(1), _seconds_ago(10)
    worker = Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        engine.job_named("late").handler(_engine_run(engine, "late", late))
        engine.job_named("on_time").handler(_engine_run(engine, "on_time", on_time))
        broker.join("q", timeout=10_000, fail_fast=False)
        worker.join()
        records = {job: engine.store.state(job) for job in ("on_time", "late")}
    finally:
        worker.stop()
        engine.stop(timeout=0)
    assert ran == [Slot("on_time", on_time).id]
    assert records["on_time"] is not None and records["on_time"].state is RunState.DONE
    # Never picked up: left for its short pickup lease to end (then it is missed).
    assert records["late"] is not None and records["late"].state is RunState.DISPATCHED
    assert [m.actor_name for m in broker.dead_letters] == ["late"]
    assert any("exceeded its age limit" in r.getMessage() for r in caplog.records)
