"""A beat entry's start, end and expiry (``anarchon_start``, ``anarchon_end``, ``expires``).

The entries are read as beat reads them, and sent through beat's own send
path to an in-memory broker; the messages are read as published
(``before_task_publish``). Slots come from a fake clock where the lateness of
a send matters, from real time on a SQLite store otherwise.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish

from anarchon_celery import Scheduler
from anarchon_celery.entries import EntryJobs
from anarchon_celery.schedules import expires_at, read_entry
from anarchon_celery.settings import read_settings
from anarchon_core import ConfigurationError, Control, FakeClock
from anarchon_core import Scheduler as Engine
from anarchon_core.control import Definition
from anarchon_core.slots import BACKFILL
from anarchon_core.stores.memory import MemoryStore
from tests.waiting import wait_until

UTC = timezone.utc
#: 2030-01-01T00:00:00Z: a whole hour, in the future (no expiry of these tests has passed).
HOUR = 1_893_456_000.0
T0 = datetime.fromtimestamp(HOUR, UTC)


def make_app(tmp_path: Path, schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
    app = Celery("billing", broker="memory://")
    app.conf.update(
        beat_schedule=schedule or {},
        anarchon_store=f"sqlite:///{tmp_path / 'anarchon.db'}",
        anarchon_tracking=False,
        **conf,
    )
    return app


@pytest.fixture
def published() -> Iterator[dict[str, dict[str, Any]]]:
    """The headers of every task message published meanwhile, by task id."""
    seen: dict[str, dict[str, Any]] = {}

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers is not None:
            seen[headers["id"]] = dict(headers)

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


@pytest.fixture
def beats() -> Iterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for beat in reversed(made):
        beat.close()


def entry(**options: Any) -> dict[str, Any]:
    return {"task": "billing.report", "schedule": 60, "options": options}


# -- start and end ------------------------------------------------------------------


def test_start_and_end_are_read_from_the_options_and_not_sent() -> None:
    start = "2030-01-01T09:00:00+02:00"
    end = datetime(2030, 2, 1, tzinfo=UTC)
    read = read_entry(
        "report", entry(queue="q", anarchon_start=start, anarchon_end=end, anarchon_lease=30), "UTC"
    )
    assert read.options == {"queue": "q"}
    assert read.bounds == {"start": datetime(2030, 1, 1, 7, tzinfo=UTC), "end": end}
    assert read.job_options == {"lease": 30}


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"anarchon_start": datetime(2030, 1, 1)}, "anarchon_start=2030-01-01T00:00:00: give its"),
        ({"anarchon_end": "next week"}, "anarchon_end='next week': not an ISO 8601"),
        ({"anarchon_start": 1_893_456_000}, "anarchon_start=1893456000: expected a datetime"),
        (
            {"anarchon_start": "2030-02-01T00:00:00Z", "anarchon_end": "2030-01-01T00:00:00Z"},
            "anarchon_end=2030-01-01T00:00:00+00:00 is before"
            " anarchon_start=2030-02-01T00:00:00+00:00",
        ),
        ({"anarchon_ends": "2030-01-01T00:00:00Z"}, "unknown option(s) anarchon_ends"),
    ],
)
def test_bad_bounds_are_refused_naming_the_entry_and_the_field(
    options: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        read_entry("report", entry(**options), "UTC")
    assert str(info.value).startswith("beat_schedule['report']: ")
    assert said in str(info.value)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"anarchon_end": datetime(2030, 1, 1, 8)}, "anarchon_end=2030-01-01T08:00:00: give its"),
        # Valid each, but no slot of the hourly grid between them.
        (
            {"anarchon_start": "2030-01-01T08:15:00Z", "anarchon_end": "2030-01-01T08:45:00Z"},
            "has no slot from start=2030-01-01T08:15:00+00:00 to end=2030-01-01T08:45:00+00:00",
        ),
    ],
)
def test_beat_does_not_start_with_bad_bounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, options: dict[str, Any], said: str
) -> None:
    raw = {"task": "billing.report", "schedule": 3600, "options": options}
    app = make_app(tmp_path, {"report": raw, "fine": entry()})
    with pytest.raises(SystemExit):
        Scheduler(app)
    assert "anarchon: beat cannot start: beat_schedule['report']: " in caplog.text
    assert said in caplog.text


def test_start_and_end_bound_the_entrys_slots(tmp_path: Path, beats: list[Scheduler]) -> None:
    start, end = T0 + timedelta(minutes=2), T0 + timedelta(minutes=4)
    app = make_app(
        tmp_path,
        {
            "bounded": entry(anarchon_start=start.isoformat(), anarchon_end=end),
            "ended": entry(anarchon_end="2020-01-01T00:00:00+00:00"),
        },
    )
    beats.append(beat := Scheduler(app))
    assert beat.engine is not None
    assert beat.engine.next_slots("bounded", 10, after=T0) == [
        start,
        start + timedelta(minutes=1),
        end,
    ]
    assert beat.engine.next_slots("ended", 3) == []


def test_start_and_end_follow_entries_changed_at_run_time(
    tmp_path: Path, beats: list[Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    start, end = T0 + timedelta(minutes=2), T0 + timedelta(minutes=5)
    app = make_app(tmp_path, {"fine": entry()})
    beats.append(beat := Scheduler(app))
    engine = beat.engine
    assert engine is not None

    beat.add(name="added", **entry(anarchon_start=start))
    assert engine.next_slots("added", 1, after=T0) == [start]

    # Edited in place in beat's schedule: noticed at the next tick.
    beat.schedule["added"].options["anarchon_end"] = end.isoformat()
    beat.tick()
    assert engine.next_slots("added", 10, after=T0) == [
        start + timedelta(minutes=m) for m in (0, 1, 2, 3)
    ]

    caplog.set_level(logging.ERROR, logger="anarchon_celery.entries")
    beat.schedule["added"].options["anarchon_end"] = "soon"
    beat.tick()
    assert "added" not in engine.jobs
    assert "beat_schedule['added']: anarchon_end='soon': not an ISO 8601" in caplog.text

    with pytest.raises(ConfigurationError, match=r"entry 'other': anarchon_start=.*give its"):
        beat.update_from_dict({"other": entry(anarchon_start=datetime(2030, 1, 1))})
    assert "other" not in beat.schedule and "other" not in engine.jobs


# -- expires ------------------------------------------------------------------------


def test_expires_is_read_as_seconds_after_the_slot() -> None:
    at = datetime(2031, 1, 1, tzinfo=UTC)
    assert expires_at(30, T0) == expires_at(30.0, T0) == T0 + timedelta(seconds=30)
    assert expires_at(timedelta(minutes=2), T0) == T0 + timedelta(minutes=2)
    assert expires_at(at, T0) is at
    assert expires_at("2031-01-01T00:00:00+00:00", T0) == "2031-01-01T00:00:00+00:00"
    assert expires_at(None, T0) is None


@pytest.mark.parametrize(
    ("expires", "said"),
    [
        (0, "expires=0: seconds after the slot's time must be positive"),
        (-5, "expires=-5: seconds after the slot's time must be positive"),
        (float("nan"), "expires=nan: seconds after the slot's time must be positive"),
        (timedelta(0), "must be positive"),
        ("30s", "expires='30s': a string must be an ISO 8601 date and time"),
        (True, "expires=True: expected a number of seconds after the slot's time"),
        ([30], "expires=[30]: expected a number of seconds after the slot's time"),
    ],
)
def test_bad_expires_is_refused_naming_the_entry(expires: Any, said: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        read_entry("report", entry(expires=expires), "UTC")
    assert str(info.value).startswith("beat_schedule['report']: ")
    assert said in str(info.value)


def test_the_sent_expires_is_the_slot_plus_the_option_however_late_the_send(
    tmp_path: Path, published: dict[str, dict[str, Any]]
) -> None:
    at = datetime(2031, 6, 1, 12, tzinfo=UTC)
    app = make_app(tmp_path)
    beat = Scheduler(app, lazy=True)  # beat's send path; its engine is this test's
    clock = FakeClock(HOUR)
    engine = Engine(MemoryStore(namespace="billing", clock=clock), clock=clock, inline=True)
    try:
        jobs = EntryJobs(engine, app, read_settings(app), beat._dispatcher)
        schedule = {
            "seconds": entry(expires=30),
            "timedelta": entry(expires=timedelta(seconds=45)),
            "datetime": entry(expires=at),
            "none": entry(queue="q"),
        }
        jobs.apply({name: beat._new_entry(name, raw) for name, raw in schedule.items()})

        def sent(slot: datetime) -> dict[str, Any]:
            """The expiry of each entry's message for ``slot``, by entry."""
            ms = int(slot.timestamp() * 1000)
            return {
                h["anarchon"]["job"]: h.get("expires")
                for h in published.values()
                if h["anarchon"]["slot_id"].endswith(f"@{ms}")
            }

        def run_until(deadline: datetime) -> None:
            """The engine's steps, the clock moved to when each says, up to ``deadline``."""
            while clock.time() < deadline.timestamp():
                delay = engine.run_pending()
                clock.advance(max(0.001, min(delay, deadline.timestamp() - clock.time())))
            engine.run_pending()

        first, second = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
        run_until(first + timedelta(seconds=5))  # the first slot, on time
        assert set(sent(first)) == set(schedule)
        clock.advance((second - first).total_seconds() + 50 - 5)
        run_until(second + timedelta(seconds=55))  # the second slot, 50 s late
        for slot in (first, second):
            got = sent(slot)
            assert set(got) == set(schedule), got
            assert datetime.fromisoformat(got["seconds"]) == slot + timedelta(seconds=30)
            assert datetime.fromisoformat(got["timedelta"]) == slot + timedelta(seconds=45)
            assert datetime.fromisoformat(got["datetime"]) == at
            assert got["none"] is None
        # The second slots were sent late: as catch-ups, 50 s after their time.
        assert engine.stats.get("catch_up") == len(schedule)
    finally:
        engine.stop(timeout=0)
        beat.close()


def test_a_stored_entrys_expires_counts_from_its_slot(
    tmp_path: Path,
    beats: list[Scheduler],
    published: dict[str, dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(tmp_path)
    beats.append(beat := Scheduler(app))
    control = Control(app.conf.anarchon_store, namespace="billing")
    try:
        control.add(
            Definition(name="stored", handler="billing.report", every=1, options={"expires": 30})
        )
        control.add(
            Definition(name="bad", handler="billing.report", every=1, options={"expires": "soon"})
        )
    finally:
        control.close()

    def stored() -> list[dict[str, Any]]:
        beat.tick()
        return [h for h in published.values() if h["anarchon"]["job"] == "stored"]

    (headers, *_) = wait_until(stored, 5, "a slot of the stored entry sent")
    slot_ms = int(headers["anarchon"]["slot_id"].rsplit("@", 1)[1])
    slot = datetime.fromtimestamp(slot_ms / 1000, UTC)
    assert datetime.fromisoformat(headers["expires"]) == slot + timedelta(seconds=30)
    said = "not run here: ConfigurationError: job 'bad': expires='soon': a string must be an ISO"
    assert re.search(rf"stored schedule bad v\d+ {said}", caplog.text), caplog.text
    assert not [h for h in published.values() if h["anarchon"]["job"] == "bad"]


def test_a_backfill_runs_past_slots_without_their_expiry(
    tmp_path: Path, beats: list[Scheduler], published: dict[str, dict[str, Any]]
) -> None:
    app = make_app(
        tmp_path, {"report": {"task": "billing.report", "schedule": 1, "options": {"expires": 30}}}
    )
    beats.append(beat := Scheduler(app))

    def sent(backfill: bool) -> list[dict[str, Any]]:
        beat.tick()
        return [
            h for h in published.values() if h["anarchon"]["job"].endswith(BACKFILL) is backfill
        ]

    (on_time, *_) = wait_until(lambda: sent(False), 5, "a slot sent on schedule")
    slot = datetime.fromtimestamp(int(on_time["anarchon"]["slot_id"].rsplit("@", 1)[1]) / 1000, UTC)
    assert datetime.fromisoformat(on_time["expires"]) == slot + timedelta(seconds=30)

    control = Control(app.conf.anarchon_store, namespace="billing")
    try:  # slots of an hour ago: long expired, yet a backfill runs them
        control.backfill(
            "report", slot - timedelta(hours=1), slot - timedelta(hours=1) + timedelta(seconds=2)
        )
    finally:
        control.close()
    wait_until(lambda: len(sent(True)) == 2, 10, "the 2 backfilled slots", seen=lambda: sent(True))
    assert [h.get("expires") for h in sent(True)] == [None, None]
