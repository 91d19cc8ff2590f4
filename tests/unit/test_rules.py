"""Schedule rules: start and end, and the preview of the next slots.

Bounds are pure functions of the schedule (every instance computes the same),
so they are checked on the schedule itself, then on a fleet of simulated
instances (memory store, fake clock): no slot before the start, none after
the end, the last one still caught up after an outage.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from anarchon_core import ConfigurationError, Scheduler, make_schedule, preview, slot_id
from anarchon_core.clock import FakeClock
from anarchon_core.schedules import NEVER, Bounded, from_spec, spec
from anarchon_core.stores.memory import MemoryStore
from tests.sim import START, Cluster

UTC = timezone.utc


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(START + seconds, UTC)


def slots_of(schedule: object, after: datetime, limit: int = 100) -> list[datetime]:
    out, t = [], after
    for _ in range(limit):
        t = schedule.next_after(t)  # type: ignore[attr-defined]
        if t == NEVER:
            break
        out.append(t)
    return out


def test_start_and_end_bound_the_slots_both_included_on_the_unchanged_grid() -> None:
    schedule = make_schedule(every=60, start=at(30), end=at(300))
    # The grid stays on its anchor (the epoch): the start does not shift it.
    assert slots_of(schedule, at(-1000)) == [at(60), at(120), at(180), at(240), at(300)]
    assert schedule.latest_at_or_before(at(10_000)) == at(300)
    assert schedule.latest_at_or_before(at(59)) is None
    assert schedule.latest_at_or_before(at(200)) == at(180)
    # A start on a slot includes it.
    assert slots_of(make_schedule(every=60, start=at(60), end=at(120)), at(0)) == [at(60), at(120)]


def test_an_open_ended_start_and_an_end_without_start() -> None:
    assert slots_of(make_schedule(every=60, start=at(100)), at(0), 3) == [at(120), at(180), at(240)]
    assert slots_of(make_schedule(every=60, end=at(130)), at(0)) == [at(60), at(120)]


def test_iso_strings_with_an_offset_are_accepted_and_read_alike() -> None:
    text = make_schedule(
        cron="0 9 * * *", timezone="Europe/Athens", start="2027-03-01T00:00:00+02:00"
    )
    typed = make_schedule(
        cron="0 9 * * *",
        timezone="Europe/Athens",
        start=datetime(2027, 2, 28, 22, tzinfo=UTC),
    )
    assert text == typed
    assert text.next_after(datetime(2026, 1, 1, tzinfo=UTC)) == datetime(2027, 3, 1, 7, tzinfo=UTC)


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ({"start": at(600), "end": at(0)}, "is before start="),
        ({"start": at(61), "end": at(119)}, "has no slot from start="),
        ({"start": "2027-01-01T08:00:00"}, "start=2027-01-01T08:00:00: give its time zone"),
        ({"end": datetime(2027, 1, 1)}, "end=2027-01-01T00:00:00: give its time zone"),
        ({"end": "next tuesday"}, "end='next tuesday': not an ISO 8601 date and time"),
        ({"start": 1700000000}, "start=1700000000: expected a datetime or an ISO 8601 string"),
    ],
)
def test_bad_bounds_are_refused_naming_the_field(bounds: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        make_schedule(every=60, **bounds)  # type: ignore[arg-type]


def test_a_bad_bound_registers_nothing() -> None:
    scheduler = Scheduler(MemoryStore(namespace="t"), clock=FakeClock(START))
    with pytest.raises(ConfigurationError, match="is before start="):
        scheduler.add_job(lambda: None, name="job", every=60, start=at(100), end=at(0))
    assert scheduler.jobs == {}


def test_the_written_form_builds_the_same_schedule() -> None:
    for schedule in [
        make_schedule(every=90, anchor=at(7), start=at(100), end=at(5000)),
        make_schedule(cron="*/5 * * * *", timezone="America/New_York", end="2027-06-01T00:00:00Z"),
        make_schedule(every=timedelta(hours=1)),
    ]:
        assert from_spec(spec(schedule)) == schedule


def test_a_fleet_runs_exactly_the_slots_between_start_and_end_then_the_job_has_ended() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(
            name,
            lambda s: s.add_job(
                cluster.handler(0.2), name="job", every=1, start=at(10), end=at(20)
            ),
        )
    cluster.run(40.5)
    slots = cluster.slots("job")
    assert set(slots) == {slot_id("job", at(k)) for k in range(10, 21)}
    assert all(len(spans) == 1 for spans in slots.values())
    # Past its end no instance shows a next slot.
    for instance in cluster.live.values():
        assert instance.upcoming()["job"][0] is None


@pytest.mark.parametrize(("back_at", "caught_up"), [(150, True), (200, False)])
def test_the_last_slot_before_the_end_is_caught_up_within_one_interval_of_the_grid(
    back_at: float, caught_up: bool
) -> None:
    # The only instance runs the slot at 60, then is down across the last one (120).
    # Back 30 s late: inside the default window (one interval of the grid). Back 80 s
    # late: outside it (past the end there is no next slot, yet the window stays one
    # interval, not an hour).
    cluster = Cluster()

    def setup(s: Scheduler) -> None:
        s.add_job(cluster.handler(0.1), name="job", every=60, end=at(120))

    cluster.add("a", setup)
    cluster.run(61)
    cluster.kill("a")
    cluster.run(back_at - 61)
    cluster.add("b", setup)
    cluster.run(5)
    expected = {slot_id("job", at(60))} | ({slot_id("job", at(120))} if caught_up else set())
    assert set(cluster.slots("job")) == expected


def test_preview_gives_local_times_and_marks_dst_gaps_and_folds() -> None:
    spring = preview(
        make_schedule(cron="30 2 * * *", timezone="America/New_York"),
        3,
        datetime(2024, 3, 9, tzinfo=UTC),
    )
    assert [(u.local.strftime("%m-%d %H:%M %Z"), bool(u.note)) for u in spring] == [
        ("03-09 02:30 EST", False),
        ("03-10 03:00 EDT", True),  # 02:30 does not exist that day: the gap's end
        ("03-11 02:30 EDT", False),
    ]
    assert spring[1].note.startswith("DST gap")
    fall = preview(
        make_schedule(cron="30 * * * *", timezone="America/New_York"),
        3,
        datetime(2024, 11, 3, 5, tzinfo=UTC),
    )
    assert [u.local.strftime("%H:%M %Z") for u in fall] == ["01:30 EDT", "01:30 EST", "02:30 EST"]
    assert [u.note.split(";")[-1].strip() for u in fall[:2]] == [
        "this is the first",
        "this is the second",
    ]
    assert fall[2].note == ""


def test_next_slots_stop_at_the_end_and_follow_the_schedulers_clock() -> None:
    clock = FakeClock(START)
    scheduler = Scheduler(MemoryStore(namespace="t"), clock=clock)
    scheduler.add_job(lambda: None, name="job", every=60, start=at(100), end=at(300))
    assert scheduler.next_slots("job", 10) == [at(120), at(180), at(240), at(300)]
    clock.advance(200)
    assert scheduler.next_slots("job", 1) == [at(240)]
    assert scheduler.next_slots("job", 2, after=at(300)) == []
    with pytest.raises(ConfigurationError, match="n=0"):
        scheduler.next_slots("job", 0)
    with pytest.raises(KeyError):
        scheduler.next_slots("nope")


def test_a_bounded_schedule_describes_its_bounds() -> None:
    schedule = make_schedule(every=60, start=at(60), end=at(120))
    assert isinstance(schedule, Bounded)
    assert "starting" in schedule.describe() and "ending" in schedule.describe()
