"""Slot grids: every= and cron= schedules, the DST rule, errors and slot ids."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from anarchon_core.errors import ConfigurationError
from anarchon_core.schedules import (
    EPOCH,
    Cron,
    Every,
    Schedule,
    from_ms,
    make_schedule,
    slot_id,
    to_ms,
)

UTC = timezone.utc
MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)
HOUR = timedelta(hours=1)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def take(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    """The first ``count`` slots after ``start``, found by walking next_after."""
    found, t = [], start
    for _ in range(count):
        t = schedule.next_after(t)
        found.append(t)
    return found


def between(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """Every slot in ``(start, end]``."""
    found, t = [], schedule.next_after(start)
    while t <= end:
        found.append(t)
        t = schedule.next_after(t)
    return found


# Offset changes of 2024, as UTC instants: (zone, instant, spring-forward?).
TRANSITIONS = [
    ("America/New_York", utc(2024, 3, 10, 7), True),
    ("America/New_York", utc(2024, 11, 3, 6), False),
    ("Europe/Athens", utc(2024, 3, 31, 1), True),
    ("Europe/Athens", utc(2024, 10, 27, 1), False),
    ("Australia/Sydney", utc(2024, 10, 5, 16), True),
    ("Australia/Sydney", utc(2024, 4, 6, 16), False),
    ("Australia/Lord_Howe", utc(2024, 10, 5, 15, 30), True),  # 30-minute shift
    ("Australia/Lord_Howe", utc(2024, 4, 6, 15), False),
    ("Antarctica/Troll", utc(2024, 3, 31, 1), True),  # 2-hour shift
    ("Antarctica/Troll", utc(2024, 10, 27, 1), False),
]


@pytest.mark.parametrize(("zone", "instant", "spring"), TRANSITIONS)
def test_the_transition_table_is_right(zone: str, instant: datetime, spring: bool) -> None:
    before = (instant - timedelta(seconds=1)).astimezone(ZoneInfo(zone)).utcoffset()
    after = instant.astimezone(ZoneInfo(zone)).utcoffset()
    assert before is not None
    assert after is not None
    assert (after > before) is spring


# --- every= ---------------------------------------------------------------


@pytest.mark.parametrize(
    "t", [utc(2024, 5, 1, 12, 0, 3, 250_000), utc(1999, 12, 31, 23, 59, 59), utc(2024, 1, 1)]
)
def test_every_grid_is_anchored_at_the_epoch(t: datetime) -> None:
    schedule = make_schedule(every=10)
    following = schedule.next_after(t)
    assert to_ms(following) % 10_000 == 0
    assert t < following <= t + timedelta(seconds=10)
    assert schedule.latest_at_or_before(t) == following - timedelta(seconds=10)
    assert following.tzinfo is UTC


def test_every_slot_is_its_own_latest_and_not_its_own_next() -> None:
    schedule = make_schedule(every=10)
    slot = utc(2024, 1, 1, 0, 0, 10)
    assert schedule.latest_at_or_before(slot) == slot
    assert schedule.next_after(slot) == slot + timedelta(seconds=10)
    assert schedule.next_after(slot - MS) == slot


def test_every_with_a_custom_anchor() -> None:
    anchor = utc(2024, 1, 1, 0, 0, 3)
    schedule = make_schedule(every=60, anchor=anchor)
    assert take(schedule, utc(2024, 6, 1, 12), 2) == [
        utc(2024, 6, 1, 12, 0, 3),
        utc(2024, 6, 1, 12, 1, 3),
    ]
    assert schedule.latest_at_or_before(utc(2023, 1, 1)) == utc(2022, 12, 31, 23, 59, 3)  # k < 0
    # The same instant written in another zone is the same grid, stored in UTC.
    athens = Every(timedelta(seconds=60), anchor.astimezone(ZoneInfo("Europe/Athens")))
    assert athens == schedule
    assert athens.anchor.tzinfo is UTC
    assert schedule.describe() == "every 60s from 2024-01-01T00:00:03+00:00"


def test_every_accepts_a_timedelta_and_fractional_seconds() -> None:
    schedule = make_schedule(every=timedelta(minutes=90))
    assert take(schedule, utc(2024, 1, 1), 2) == [utc(2024, 1, 1, 1, 30), utc(2024, 1, 1, 3)]
    assert schedule.min_interval == timedelta(minutes=90)
    assert schedule.describe() == "every 5400s"
    half = make_schedule(every=1.5)
    assert half.next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 0, 0, 1, 500_000)
    assert half.describe() == "every 1.5s"
    assert make_schedule(every=10).describe() == "every 10s"


def test_every_ignores_time_zones_across_dst() -> None:
    schedule = make_schedule(every=3600)
    slots = between(schedule, utc(2024, 3, 10), utc(2024, 3, 11))
    assert len(slots) == 24
    assert all(b - a == HOUR for a, b in pairwise(slots))


@pytest.mark.parametrize(
    ("every", "message"),
    [
        (0.5, "every=0.5s: intervals under 1 second are not supported"),
        (timedelta(milliseconds=999), "under 1 second"),
        (0, "every=0s: the interval must be positive"),
        (-5, "every=-5s: the interval must be positive"),
        (1.0001, "whole milliseconds"),
        (True, "expected seconds or a timedelta"),
        ("10", "expected seconds or a timedelta"),
        (float("inf"), "not a usable interval"),
        (float("nan"), "not a usable interval"),
    ],
)
def test_every_refuses_bad_intervals(every: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace(".", r"\.")):
        make_schedule(every=every)  # type: ignore[arg-type]


def test_every_refuses_a_naive_anchor() -> None:
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        make_schedule(every=10, anchor=datetime(2024, 1, 1))


# --- cron= ------------------------------------------------------------------


def test_cron_in_utc() -> None:
    schedule = make_schedule(cron="0 8 * * *")
    assert schedule.next_after(utc(2024, 1, 1, 8)) == utc(2024, 1, 2, 8)
    assert schedule.next_after(utc(2024, 1, 1, 7, 59, 59, 999_000)) == utc(2024, 1, 1, 8)
    assert schedule.latest_at_or_before(utc(2024, 1, 1, 8)) == utc(2024, 1, 1, 8)
    assert schedule.latest_at_or_before(utc(2024, 1, 1, 7, 59)) == utc(2023, 12, 31, 8)
    assert schedule.min_interval == timedelta(days=1)
    assert schedule.describe() == "cron '0 8 * * *' UTC"


def test_cron_in_a_zone_uses_its_wall_clock() -> None:
    schedule = make_schedule(cron="0 8 * * *", timezone="Europe/Athens")
    assert schedule.next_after(utc(2024, 1, 15)) == utc(2024, 1, 15, 6)  # EET, +2
    assert schedule.next_after(utc(2024, 7, 15)) == utc(2024, 7, 15, 5)  # EEST, +3
    assert schedule.describe() == "cron '0 8 * * *' Europe/Athens"
    # A spring-forward day is 23 hours long: the bound must allow for it.
    assert schedule.min_interval == timedelta(hours=23)


def test_six_fields_put_the_seconds_last() -> None:
    every_15s = make_schedule(cron="* * * * * */15")
    assert take(every_15s, utc(2024, 1, 1, 0, 0, 7), 4) == [
        utc(2024, 1, 1, 0, 0, 15),
        utc(2024, 1, 1, 0, 0, 30),
        utc(2024, 1, 1, 0, 0, 45),
        utc(2024, 1, 1, 0, 1, 0),
    ]
    assert every_15s.min_interval == timedelta(seconds=15)
    at = make_schedule(cron="30 8 * * * 15")  # 08:30:15, not 15:08 on the 30th
    assert at.next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 8, 30, 15)
    assert at.latest_at_or_before(utc(2024, 1, 1, 8, 30, 15)) == utc(2024, 1, 1, 8, 30, 15)


@pytest.mark.parametrize(
    ("alias", "first"), [("@hourly", utc(2024, 1, 1, 1)), ("@daily", utc(2024, 1, 2))]
)
def test_cron_aliases(alias: str, first: datetime) -> None:
    assert make_schedule(cron=alias).next_after(utc(2024, 1, 1)) == first


# --- DST ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "expression", "day", "expected"),
    [
        # Spring-forward: the wall time does not exist, it fires at the gap's end.
        ("America/New_York", "30 2 * * *", (2024, 3, 10), utc(2024, 3, 10, 7)),
        ("Europe/Athens", "30 3 * * *", (2024, 3, 31), utc(2024, 3, 31, 1)),
        ("Australia/Sydney", "30 2 * * *", (2024, 10, 6), utc(2024, 10, 5, 16)),
        # Fall-back: the wall time happens twice, it fires on the first occurrence.
        ("America/New_York", "30 1 * * *", (2024, 11, 3), utc(2024, 11, 3, 5, 30)),
        ("Europe/Athens", "30 3 * * *", (2024, 10, 27), utc(2024, 10, 27, 0, 30)),
        ("Australia/Sydney", "30 2 * * *", (2024, 4, 7), utc(2024, 4, 6, 15, 30)),
    ],
)
def test_a_fixed_time_job_fires_once_on_a_transition_day(
    zone: str, expression: str, day: tuple[int, int, int], expected: datetime
) -> None:
    schedule = make_schedule(cron=expression, timezone=zone)
    tz = ZoneInfo(zone)
    start = datetime(*day).replace(tzinfo=tz) - timedelta(days=1)
    slots = between(schedule, start, start + timedelta(days=3))
    assert [s for s in slots if s.astimezone(tz).date() == expected.astimezone(tz).date()] == [
        expected
    ]
    # The days around it fire at the plain wall-clock time, once each.
    minute, hour = map(int, expression.split()[:2])
    others = [s.astimezone(tz) for s in slots if s != expected]
    assert [(s.hour, s.minute) for s in others] == [(hour, minute)] * 2
    assert schedule.latest_at_or_before(expected) == expected
    assert schedule.latest_at_or_before(expected - US) == slots[0]
    assert schedule.next_after(expected - US) == expected


@pytest.mark.parametrize("expression", ["0 * * * *", "30 * * * *"])
@pytest.mark.parametrize(  # Lord Howe shifts by 30 minutes: its steps are 30 or 90 minutes
    ("zone", "instant"), [(z, i) for z, i, _ in TRANSITIONS if z != "Australia/Lord_Howe"]
)
def test_an_hourly_job_fires_once_per_real_hour(
    zone: str, instant: datetime, expression: str
) -> None:
    schedule = make_schedule(cron=expression, timezone=zone)
    slots = between(schedule, instant - 12 * HOUR - MS, instant + 12 * HOUR - MS)
    assert len(slots) == 24
    assert all(b - a == HOUR for a, b in pairwise(slots))
    assert schedule.min_interval == HOUR


@pytest.mark.parametrize(
    ("day", "count", "twice", "never"),
    [((2024, 3, 10), 23, [], ["02:30"]), ((2024, 11, 3), 25, ["01:30"], [])],
)
def test_half_past_every_hour_on_new_york_transition_days(
    day: tuple[int, int, int], count: int, twice: list[str], never: list[str]
) -> None:
    tz = ZoneInfo("America/New_York")
    start = datetime(*day).replace(tzinfo=tz)  # local midnight; + 1 day is the next local midnight
    slots = between(make_schedule(cron="30 * * * *", timezone=tz.key), start, start + 24 * HOUR)
    readings = [s.astimezone(tz).strftime("%H:%M") for s in slots]
    assert len(slots) == count
    assert all(b - a == HOUR for a, b in pairwise(slots))
    assert [r for r in readings if readings.count(r) == 2] == twice * 2
    assert [r for r in never if r in readings] == []


def reference(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """The DST rule, spelled out minute by minute with nothing but zoneinfo.

    For expressions that restrict only the minute and hour fields.
    """
    tz = ZoneInfo(zone)
    minutes, hours = croniter.expand(expression)[0][:2]

    def matches(t: datetime) -> bool:
        return (minutes == ["*"] or t.minute in minutes) and (hours == ["*"] or t.hour in hours)

    found: set[datetime] = set()
    if hours == ["*"]:  # every real minute whose reading matches
        t = start.replace(second=0, microsecond=0)
        while t <= end:
            found.update([t] if matches(t.astimezone(tz)) else [])
            t += timedelta(minutes=1)
    else:  # every matching wall-clock minute, resolved to one instant
        wall = start.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0) - 3 * HOUR
        while wall <= end.astimezone(tz).replace(tzinfo=None) + 3 * HOUR:
            if matches(wall):
                first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
                if first.astimezone(tz).replace(tzinfo=None) != wall:  # in a gap
                    first -= 3 * HOUR
                    while first.astimezone(tz).replace(tzinfo=None) <= wall:
                        first += timedelta(minutes=1)
                found.add(first)
            wall += timedelta(minutes=1)
    return sorted(t for t in found if start < t <= end)


@pytest.mark.parametrize(
    "expression",
    ["30 2 * * *", "0 * * * *", "30 * * * *", "*/20 * * * *", "15,45 1-4 * * *", "0 */2 * * *"],
)
@pytest.mark.parametrize(("zone", "instant", "spring"), TRANSITIONS)
def test_slots_around_transitions_follow_the_rule(
    zone: str, instant: datetime, spring: bool, expression: str
) -> None:
    start, end = instant - 20 * HOUR, instant + 20 * HOUR
    expected = reference(expression, zone, start, end)
    schedule = make_schedule(cron=expression, timezone=zone)
    assert between(schedule, start, end) == expected
    for previous, slot in pairwise(expected):
        assert schedule.latest_at_or_before(slot) == slot
        assert schedule.latest_at_or_before(slot - MS) == previous
        assert slot - previous >= schedule.min_interval


# --- properties -----------------------------------------------------------

EXPRESSIONS = [
    "*/15 * * * *",
    "0 * * * *",
    "30 * * * *",
    "0 8 * * *",
    "30 2 * * *",
    "30 1 * * *",
    "15,45 1-3 * * *",
    "0 */2 * * *",
    "0 0 * * 1",
    "0 9 1 * *",
    "*/10 * * * * 5",
    "@daily",
]
ZONES = [zone for zone, _, _ in TRANSITIONS[::2]] + ["UTC", "Asia/Kolkata"]

every_schedules = st.builds(
    Every,
    st.integers(1_000, 86_400_000).map(lambda ms: timedelta(milliseconds=ms)),
    st.integers(-(10**12), 10**12).map(from_ms),
)
cron_schedules = st.builds(Cron, st.sampled_from(EXPRESSIONS), st.sampled_from(ZONES))
schedules = st.one_of(every_schedules, cron_schedules)
# Half of the instants fall within two days of a transition, where the rule bites.
near_transitions = st.builds(
    lambda base, ms: base + ms * MS,
    st.sampled_from([instant for _, instant, _ in TRANSITIONS]),
    st.integers(-2 * 86_400_000, 2 * 86_400_000),
)
anywhere = st.integers(to_ms(utc(1990, 1, 1)), to_ms(utc(2060, 1, 1))).map(from_ms)
instants = st.one_of(near_transitions, anywhere)


def fresh(schedule: Schedule) -> Schedule:
    """A new instance of the same schedule, as another process would build it."""
    if isinstance(schedule, Cron):
        return make_schedule(cron=schedule.expression, timezone=schedule.timezone)
    assert isinstance(schedule, Every)
    return make_schedule(every=schedule.interval, anchor=schedule.anchor)


@settings(max_examples=60, deadline=None)
@given(schedules, instants, st.data())
def test_instances_asked_at_different_moments_agree(
    schedule: Schedule, t1: datetime, data: st.DataObject
) -> None:
    first = take(schedule, t1, 30)
    assert all(a < b for a, b in zip([t1, *first], first))  # strictly increasing
    t2 = t1 + data.draw(st.integers(0, (first[20] - t1) // US)) * US
    assert take(fresh(schedule), t2, 9) == [s for s in first if s > t2][:9]


@settings(max_examples=60, deadline=None)
@given(schedules, instants)
def test_next_and_latest_are_consistent(schedule: Schedule, t: datetime) -> None:
    following = schedule.next_after(t)
    latest = schedule.latest_at_or_before(t)
    assert latest is not None
    assert latest <= t < following
    assert schedule.next_after(latest) == following
    assert schedule.latest_at_or_before(following - MS) == latest
    assert schedule.latest_at_or_before(following) == following
    assert schedule.next_after(following - US) == following
    assert following.tzinfo is UTC
    assert following.microsecond % 1000 == 0
    assert following - latest >= schedule.min_interval
    if isinstance(schedule, Every):
        assert (following - schedule.anchor) % schedule.interval == timedelta(0)
    else:
        assert following.microsecond == 0


# --- errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 25 * * *", "cron '0 25 * * *': hour field '25' is out of range 0-23"),
        ("61 * * * *", "minute field '61' is out of range 0-59"),
        ("* * 32 * *", "day-of-month field '32' is out of range 1-31"),
        ("* * 0 * *", "day-of-month field '0' is out of range 1-31"),
        ("* * * 13 *", "month field '13' is out of range 1-12"),
        ("* * * * 8", "day-of-week field '8' is out of range 0-7"),
        ("* * * * * 60", "second field '60' is out of range 0-59"),
        ("1-70 * * * *", "minute field '1-70' is out of range 0-59"),
        ("*/0 * * * *", "minute field '*/0' has an invalid step"),
        ("* x * * *", "hour field 'x' is not valid"),
        ("* * * foo *", "month field 'foo' is not valid"),
        ("R * * * *", "minute field 'R': random (R) and hashed (H)"),
        ("0 H * * *", "hour field 'H': random"),
        (
            "* * * *",
            "day-of-week) or 6 with seconds last, got 4",
        ),
        ("0 0 1 1 * 0 2030", "got 7"),
        ("@reboot", "got 1"),
        ("0 0 30 2 *", "cron '0 0 30 2 *': matches no date"),
    ],
)
def test_an_invalid_cron_names_the_field(expression: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make_schedule(cron=expression)
    assert message in str(info.value)


def test_an_unknown_time_zone_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"^unknown time zone 'Mars/Base'$"):
        make_schedule(cron="0 8 * * *", timezone="Mars/Base")
    with pytest.raises(ConfigurationError, match=r"unknown time zone '\.\./etc'"):
        Cron("0 8 * * *", "../etc")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"exactly one of every= and cron= \(got neither\)"),
        ({"every": 10, "cron": "* * * * *"}, r"exactly one of every= and cron= \(got both\)"),
        ({"every": 10, "timezone": "UTC"}, "timezone= applies to cron= schedules only"),
        ({"cron": "* * * * *", "anchor": EPOCH}, "anchor= applies to every= schedules only"),
    ],
)
def test_make_schedule_refuses_bad_combinations(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make_schedule(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("schedule", [Every(timedelta(seconds=10)), Cron("0 8 * * *")])
def test_naive_datetimes_are_refused(schedule: Schedule) -> None:
    naive = datetime(2024, 1, 1)
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.next_after(naive)
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        schedule.latest_at_or_before(naive)
    with pytest.raises(ConfigurationError):
        to_ms(naive)


# --- slot ids ---------------------------------------------------------------


def test_slot_id() -> None:
    assert slot_id("backup", utc(2024, 1, 1)) == "backup@1704067200000"
    athens = datetime(2024, 1, 1, 2, tzinfo=ZoneInfo("Europe/Athens"))
    assert slot_id("backup", athens) == "backup@1704067200000"
    assert to_ms(EPOCH - MS) == -1


@given(st.integers(-(10**13), 10**13))
def test_ms_round_trip(ms: int) -> None:
    slot = from_ms(ms)
    assert slot.tzinfo is UTC
    assert to_ms(slot) == ms
    assert from_ms(to_ms(slot + timedelta(microseconds=999))) == slot
