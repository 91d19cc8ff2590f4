"""Slot grids: when a job is due, as pure functions of time.

Nothing here reads the clock or keeps state, so every instance, asked at any
moment, computes the same slots (aware UTC datetimes). :class:`Every` is
``anchor + k * interval``. :class:`Cron` evaluates a cron expression in an IANA
time zone with the daylight saving rule of classic (Vixie) cron:

* A *fixed-time* job (its hour field does not cover all 24 hours, e.g.
  ``30 2 * * *`` or ``0 */2 * * *``) fires once per matching wall-clock time. A
  wall time skipped by a spring-forward fires at the gap's end (02:30 in New York
  on 2024-03-10 fires at 03:00 EDT); one repeated by a fall-back fires on its
  first occurrence only.
* An *hourly* job (hour field ``*``) fires at every real instant whose local
  reading matches. A reading inside a gap never happens, so nothing fires there;
  a reading in a repeated hour happens in two different real hours and fires in
  both. So every real hour gets its firing exactly once: ``30 * * * *`` fires 23
  times on a spring-forward day (the real hour 03:00-04:00 EDT gets 03:30) and
  25 times on a fall-back day (01:30 EDT and 01:30 EST), always 1 h apart in UTC.
  (Lord Howe's 30-minute shift gives 30- or 90-minute steps: what its clocks read.)

croniter's own DST handling differs (it fires ``30 1 * * *`` twice on a fall-back
day), so croniter only walks the naive local calendar, where every wall time
exists once, and this module maps wall times to instants from the zone's offset
changes. Internally instants and wall times are integer microseconds.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cache, lru_cache
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from anarchon_core.errors import ConfigurationError

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_US, _MS = timedelta(microseconds=1), timedelta(milliseconds=1)
#: The longest interval of an ``every=`` schedule: slots stay within the calendar.
MAX_INTERVAL = timedelta(days=366)
_SECOND = 1_000_000
_DAY = 86_400 * _SECOND
_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week", "second")
_RANGES = ("0-59", "0-23", "1-31", "1-12", "0-7", "0-59")
_ALIASES = {  # croniter's, resolved here so that fields can be checked one by one
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_SPLIT = re.compile(r"\S+", re.ASCII)  # croniter's own split: Unicode spaces are no separator
# croniter's R draws a random value per parse and H needs a hash id: instances would disagree.
_RANDOM_OR_HASHED = re.compile(r"^[hr](?:\(|/|$)", re.IGNORECASE)
_FIXED_OFFSET_ZONES = frozenset({"UTC", "UCT", "GMT", "GMT0", "Greenwich", "Universal", "Zulu"})


@runtime_checkable
class Schedule(Protocol):
    """The slot grid of a job, as the engine sees it. Every method is pure."""

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after the aware datetime ``t``."""

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last slot at or before ``t``, or None if there is none."""

    def describe(self) -> str:
        """A short human-readable form, e.g. ``every 10s``."""

    @property
    def min_interval(self) -> timedelta:
        """A lower bound on the gap between two consecutive slots (caps jitter)."""


#: Equal schedules, each kept once (see :func:`shared`); emptied past this many.
_SHARED_KEPT = 4096
_shared: dict[object, Schedule] = {}


def shared(schedule: Schedule) -> Schedule:
    """The one instance of the schedules equal to ``schedule`` (itself, the first time):
    jobs on the same grid hold the same schedule, so that the slot maths done for one
    serves them all (see :meth:`~anarchon_core.roles.JobRuntime.following`). A schedule
    that cannot be hashed is its own."""
    try:
        found = _shared.get(schedule)
    except TypeError:
        return schedule
    if found is not None:
        return found
    if len(_shared) >= _SHARED_KEPT:
        _shared.clear()
    _shared[schedule] = schedule
    return schedule


def to_ms(slot: datetime) -> int:
    """The Unix time of an aware datetime in whole milliseconds (floored)."""
    return _to_us(slot) // 1000


def from_ms(ms: int) -> datetime:
    """The aware UTC datetime of a Unix time in milliseconds."""
    return EPOCH + timedelta(milliseconds=ms)


def slot_id(job: str, slot: datetime) -> str:
    """The stable id of one slot of a job: ``"{job}@{unix_ms}"``."""
    return f"{job}@{to_ms(slot)}"


@dataclass(frozen=True)
class Every:
    """Slots at ``anchor + k * interval`` for every integer ``k``; time zones play no part.

    The grid is fixed in UTC, the same on every machine whenever a process started.
    The interval is at least 1 s; interval and anchor are whole milliseconds, so
    slot ids are exact.
    """

    interval: timedelta
    anchor: datetime = EPOCH

    def __post_init__(self) -> None:
        if not isinstance(self.interval, timedelta):
            raise ConfigurationError(f"every={self.interval!r}: expected a timedelta")
        label = f"every={_format(self.interval)}"
        if self.interval <= timedelta(0):
            raise ConfigurationError(f"{label}: the interval must be positive")
        if self.interval < timedelta(seconds=1):
            raise ConfigurationError(f"{label}: intervals under 1 second are not supported")
        if self.interval % _MS:
            raise ConfigurationError(f"{label}: the interval must be whole milliseconds")
        if not isinstance(self.anchor, datetime) or self.anchor.utcoffset() is None:
            raise ConfigurationError(f"{label}: anchor= must be a timezone-aware datetime")
        if self.interval > MAX_INTERVAL:
            raise ConfigurationError(f"{label}: intervals over 366 days are not supported")
        try:
            if (self.anchor - EPOCH) % _MS:
                raise ConfigurationError(f"{label}: anchor= must be on a whole millisecond")
            anchor = self.anchor.astimezone(timezone.utc)
        except OverflowError:
            raise ConfigurationError(
                f"{label}: anchor={self.anchor!r} is too close to the calendar's ends"
            ) from None
        object.__setattr__(self, "anchor", anchor)

    def _floor(self, x: int) -> int:
        origin, step = (self.anchor - EPOCH) // _US, self.interval // _US
        return origin + (x - origin) // step * step

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t``."""
        return _from_us(self._floor(_to_us(t)) + self.interval // _US)

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last slot at or before ``t`` (None only near ``datetime.min``)."""
        try:
            return _from_us(self._floor(_to_us(t)))
        except OverflowError:
            return None

    def describe(self) -> str:
        """``every 10s``, plus ``from <anchor>`` unless anchored at the epoch."""
        text = f"every {_format(self.interval)}"
        return text if self.anchor == EPOCH else f"{text} from {self.anchor.isoformat()}"

    @property
    def min_interval(self) -> timedelta:
        """The interval itself."""
        return self.interval


@dataclass(frozen=True)
class Cron:
    """A cron expression in an IANA time zone, with classic cron's DST rule (see module).

    Five fields (minute hour day-of-month month day-of-week), or six with the seconds
    field *last*, croniter's default: ``* * * * * */15`` is every 15 seconds. Quartz
    and APScheduler put seconds first; following croniter keeps an expression
    meaning here what it means in croniter. ``@hourly``, ``@daily`` and croniter's
    other aliases are accepted; its random ``R`` and hashed ``H`` values are not.
    """

    expression: str
    timezone: str = "UTC"
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _parser: croniter = field(init=False, repr=False, compare=False)
    _hourly: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise ConfigurationError(f"cron={self.expression!r}: expected a string")
        label = f"cron {self.expression!r}"
        fields = _SPLIT.findall(_ALIASES.get(self.expression.strip().lower(), self.expression))
        if len(fields) not in (5, 6):
            raise ConfigurationError(
                f"{label}: expected 5 fields (minute hour day-of-month month day-of-week)"
                f" or 6 with seconds last, got {len(fields)}"
            )
        for index in range(len(fields)):
            _check_field(label, fields, index)
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError, TypeError) as exc:
            raise ConfigurationError(f"unknown time zone {self.timezone!r}") from exc
        try:
            parser = croniter(" ".join(fields), _NAIVE_EPOCH)
        except ValueError as exc:
            raise ConfigurationError(f"{label}: {exc}") from exc
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(self, "_parser", parser)
        object.__setattr__(self, "_hourly", parser.expanded[1] == ["*"])
        try:
            self._wall_at_or_after(0)
        except CroniterBadDateError as exc:  # "0 0 30 2 *" parses, but never fires
            raise ConfigurationError(f"{label}: matches no date") from exc

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t``."""
        return _from_us(self._first_at_or_after(_to_us(t) + 1))  # slots are whole seconds

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last slot at or before ``t``, or None if croniter finds none."""
        try:
            return _from_us(self._last_at_or_before(_to_us(t)))
        except (CroniterBadDateError, OverflowError):
            return None

    def names_wall(self, wall: datetime) -> bool:
        """Whether the naive wall time ``wall`` matches the expression."""
        return bool(croniter.match(" ".join(map(str, self._parser.expressions)), wall))

    def describe(self) -> str:
        """``cron '0 8 * * *' Europe/Athens``."""
        return f"cron {self.expression!r} {self.timezone}"

    @property
    def min_interval(self) -> timedelta:
        """A sound lower bound on the gap between consecutive slots.

        On the naive calendar: the smallest step of the finest field with more than
        one value (second, minute, hour), else a day. A spring-forward brings
        fixed-time slots closer by up to the zone's largest offset change; hourly
        slots keep their gaps unless the zone shifts by a fraction of an hour. Never
        below the expression's granularity (1 minute, or 1 s with a seconds field).
        """
        expanded = self._parser.expanded
        granularity = 1 if len(expanded) == 6 else 60
        levels = [(expanded[5], 60, 1)] if len(expanded) == 6 else []
        gap = 86_400
        for values, period, unit in [*levels, (expanded[0], 60, 60), (expanded[1], 24, 3600)]:
            points = list(range(period)) if values == ["*"] else sorted(map(int, values))
            if len(points) > 1:
                gap = min(b - a for a, b in pairwise([*points, points[0] + period])) * unit
                break
        shifts = _shifts(self.timezone)
        if self._hourly and any(shift % 3600 for shift in shifts):
            gap = granularity
        elif not self._hourly and shifts:
            gap = max(gap - max(shifts), granularity)
        return timedelta(seconds=gap)

    def _first_at_or_after(self, x: int) -> int:
        change = _last_change(self.timezone, x, x - 1)
        if change is not None and self._gap_fires(change):
            return x  # x is the very end of a gap
        while True:
            offset = _offset(self._zone, x)
            wall = self._wall_at_or_after(x + offset)
            change = _next_change(self.timezone, x, wall - offset)
            if change is None:  # the offset holds from x to the candidate
                repeat = None if self._hourly else self._repeat(x, wall)
                if repeat is None:
                    return wall - offset
                x = repeat[0] + repeat[1] - repeat[2]  # first occurrence passed: skip the rerun
            elif self._gap_fires(change):
                return change[0]
            else:
                x = change[0]

    def _last_at_or_before(self, x: int) -> int:
        while True:
            offset = _offset(self._zone, x)
            wall = self._wall_at_or_before(x + offset)
            change = _last_change(self.timezone, x, wall - offset)
            if change is None:
                repeat = None if self._hourly else self._repeat(wall - offset, wall)
                if repeat is None:
                    return wall - offset
                x = repeat[0] - 1  # a rerun: the first occurrence lies before the change
            elif self._gap_fires(change):
                return change[0]
            else:
                x = change[0] - 1

    def _gap_fires(self, change: tuple[int, int, int]) -> bool:
        """Whether a spring-forward skips a wall time of this fixed-time job.

        If so, the job fires once at the gap's end, the instant of the change.
        """
        at, before, after = change
        return (
            not self._hourly and before < after and self._wall_at_or_after(at + before) < at + after
        )

    def _repeat(self, x: int, wall: int) -> tuple[int, int, int] | None:
        """The fall-back that makes ``wall``, read at instant ``x``, a second occurrence."""
        change = _last_change(self.timezone, x, x - _DAY)
        if change is not None and change[1] > change[2] and wall < change[0] + change[1]:
            return change
        return None

    def _wall_at_or_after(self, wall: int) -> int:
        # get_next is strictly after, at whole seconds (or minutes): start 1 s before
        # the wall time rounded up. A copy, because croniter keeps its position.
        start = -(-wall // _SECOND) * _SECOND - _SECOND
        found = copy.copy(self._parser).get_next(datetime, _NAIVE_EPOCH + start * _US)
        return (found - _NAIVE_EPOCH) // _US

    def _wall_at_or_before(self, wall: int) -> int:
        # get_prev subtracts 1 us, then truncates: half a second in lands on the wall.
        start = wall // _SECOND * _SECOND + _SECOND // 2
        found = copy.copy(self._parser).get_prev(datetime, _NAIVE_EPOCH + start * _US)
        return (found - _NAIVE_EPOCH) // _US


def make_schedule(
    *,
    every: float | int | timedelta | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    anchor: datetime | None = None,
    start: datetime | str | None = None,
    end: datetime | str | None = None,
) -> Schedule:
    """The schedule of a job: exactly one of ``every=`` (seconds or a timedelta) and ``cron=``.

    ``timezone=`` (default UTC) applies to cron only, ``anchor=`` to every only.
    ``start=`` and ``end=`` (aware datetimes or ISO 8601 strings with an offset)
    bound the slots, both included (:class:`Bounded`).
    """
    return bounded(_grid(every, cron, timezone, anchor), start, end)


def _grid(
    every: float | int | timedelta | None,
    cron: str | None,
    timezone: str | None,
    anchor: datetime | None,
) -> Schedule:
    if (every is None) == (cron is None):
        which = "both" if every is not None else "neither"
        raise ConfigurationError(f"pass exactly one of every= and cron= (got {which})")
    if cron is not None:
        if anchor is not None:
            raise ConfigurationError("anchor= applies to every= schedules only")
        return Cron(cron, "UTC" if timezone is None else timezone)
    if timezone is not None:
        raise ConfigurationError("timezone= applies to cron= schedules only")
    if isinstance(every, bool) or not isinstance(every, (int, float, timedelta)):
        raise ConfigurationError(f"every={every!r}: expected seconds or a timedelta")
    try:
        interval = every if isinstance(every, timedelta) else timedelta(seconds=every)
    except (OverflowError, ValueError) as exc:  # inf, nan, or beyond timedelta
        raise ConfigurationError(f"every={every!r}: not a usable interval") from exc
    return Every(interval, EPOCH if anchor is None else anchor)


def _check_field(label: str, fields: list[str], index: int) -> None:
    """Validate one field alone, so that the error names the field that is wrong."""
    token, name = fields[index], _FIELDS[index]
    if any(_RANDOM_OR_HASHED.match(part) for part in token.split(",")):
        raise ConfigurationError(
            f"{label}: {name} field {token!r}: random (R) and hashed (H) values are not"
            " supported, since every instance must compute the same slots"
        )
    probe = ["*"] * len(fields)
    probe[index] = token
    try:
        croniter.expand(" ".join(probe))
    except ValueError as exc:
        reason = str(exc)
        if "out of range" in reason or "out of bands" in reason:
            why = f"is out of range {_RANGES[index]}"
        else:
            why = "has an invalid step" if "step" in reason else "is not valid"
        raise ConfigurationError(f"{label}: {name} field {token!r} {why}") from exc


def _to_us(t: datetime) -> int:
    try:
        # A naive datetime, or anything else, cannot be subtracted from an aware one.
        return (t - EPOCH) // _US
    except TypeError:
        raise ConfigurationError(f"expected a timezone-aware datetime, got {t!r}") from None


def _from_us(x: int) -> datetime:
    return EPOCH + x * _US


def _offset(zone: ZoneInfo, x: int) -> int:
    offset = _from_us(x).astimezone(zone).utcoffset()
    return 0 if offset is None else offset // _US  # never None for a ZoneInfo


def _new_year(year: int) -> int:
    return _to_us(datetime(year, 1, 1, tzinfo=timezone.utc))


def _is_fixed_offset(key: str) -> bool:
    return key in _FIXED_OFFSET_ZONES or key.startswith("Etc/")


@cache  # one entry per zone in use
def _shifts(key: str) -> frozenset[int]:
    """The sizes in seconds of zone ``key``'s offset changes, 1970-2100.

    Sampled in January and July, which tell standard from summer time in both
    hemispheres; only :attr:`Cron.min_interval` relies on it.
    """
    zone = ZoneInfo(key)
    samples = [
        _offset(zone, _to_us(datetime(year, month, 15, tzinfo=timezone.utc)))
        for year in range(1970, 2100)
        for month in (1, 7)
    ]
    return frozenset(abs(b - a) // _SECOND for a, b in pairwise(samples) if a != b)


@lru_cache(maxsize=4096)
def _changes(key: str, year: int) -> tuple[tuple[int, int, int], ...]:
    """The offset changes of zone ``key`` in (Jan 1 ``year``, Jan 1 ``year + 1``] UTC.

    Each is ``(instant, offset before, offset after)``. zoneinfo does not expose its
    transitions, so the year is probed daily and each change bisected to the second
    (tzdata changes offsets on whole seconds, and never twice in a day).
    """
    zone = ZoneInfo(key)
    low, end = _new_year(year), _new_year(year + 1)
    before, changes = _offset(zone, low), []
    while low < end:
        high = min(low + _DAY, end)
        after = _offset(zone, high)
        if after != before:
            while high - low > _SECOND:
                middle = low + (high - low) // 2 // _SECOND * _SECOND
                low, high = (middle, high) if _offset(zone, middle) == before else (low, middle)
            after = _offset(zone, high)
            changes.append((high, before, after))
        low, before = high, after
    return tuple(changes)


def _next_change(key: str, x: int, limit: int) -> tuple[int, int, int] | None:
    """The first offset change at an instant in ``(x, limit]``."""
    year = _from_us(x).year
    while not _is_fixed_offset(key) and _new_year(year) < limit:
        for change in _changes(key, year):
            if change[0] > x:
                return change if change[0] <= limit else None
        year += 1
    return None


def _last_change(key: str, x: int, limit: int) -> tuple[int, int, int] | None:
    """The last offset change at an instant in ``(limit, x]``."""
    year = _from_us(x).year
    while not _is_fixed_offset(key) and _new_year(year + 1) > limit:
        for change in reversed(_changes(key, year)):
            if change[0] <= x:
                return change if change[0] > limit else None
        year -= 1
    return None


def _format(interval: timedelta) -> str:
    """``10s``, ``1.5s``, ``-2s``: an interval in seconds, as ``every=`` takes it."""
    return f"{interval / timedelta(seconds=1):.3f}".rstrip("0").rstrip(".") + "s"


#: The "slot" of a job whose schedule has ended (:class:`Bounded` past its ``end``):
#: a time no clock reaches, so nothing is ever claimed for it.
NEVER = datetime(9999, 12, 31, tzinfo=timezone.utc)


def moment(name: str, value: datetime | str) -> datetime:
    """An aware UTC datetime from an aware datetime or an ISO 8601 string with its offset."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ConfigurationError(
                f"{name}={value!r}: not an ISO 8601 date and time (2026-01-31T08:00:00+00:00)"
            ) from None
    if not isinstance(value, datetime):
        raise ConfigurationError(f"{name}={value!r}: expected a datetime or an ISO 8601 string")
    if value.utcoffset() is None:
        raise ConfigurationError(
            f"{name}={value.isoformat()}: give its time zone (an aware datetime, or an"
            " offset such as +00:00): instances in other zones would read it differently"
        )
    try:
        if (value - EPOCH) % _MS:
            raise ConfigurationError(f"{name}={value.isoformat()}: must be on a whole millisecond")
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ConfigurationError(f"{name}={value!r}: too close to the calendar's ends") from None


@dataclass(frozen=True)
class Bounded:
    """The slots of ``grid`` from ``start`` to ``end`` (both included, either may be None).

    Past its end the next slot is :data:`NEVER`: the job has ended. Its grid is
    unchanged by the bounds: an ``every=`` grid stays on its anchor, so every
    instance agrees on the slots whatever the start.
    """

    grid: Schedule
    start: datetime | None = None
    end: datetime | None = None

    def __post_init__(self) -> None:
        if self.start is None and self.end is None:
            raise ConfigurationError("a bounded schedule needs start= or end=")
        if self.start is not None and self.end is not None and self.end < self.start:
            raise ConfigurationError(
                f"end={self.end.isoformat()} is before start={self.start.isoformat()}"
            )
        first = self._first_at_or_after(self.start) if self.start is not None else None
        if self.end is not None and first is not None and first > self.end:
            raise ConfigurationError(
                f"{self.grid.describe()} has no slot from start={self.start.isoformat()}"  # type: ignore[union-attr]
                f" to end={self.end.isoformat()}"
            )

    def _first_at_or_after(self, t: datetime) -> datetime:
        latest = self.grid.latest_at_or_before(t)
        return latest if latest is not None and latest == t else self.grid.next_after(t)

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t`` within the bounds; :data:`NEVER` past the end."""
        if self.end is not None and t >= self.end:
            return NEVER
        if self.start is not None and t < self.start:
            found = self._first_at_or_after(self.start)
        else:
            found = self.grid.next_after(t)
        return NEVER if self.end is not None and found > self.end else found

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last slot at or before ``t`` within the bounds, or None."""
        if self.end is not None and t > self.end:
            t = self.end
        latest = self.grid.latest_at_or_before(t)
        if latest is None or (self.start is not None and latest < self.start):
            return None
        return latest

    def describe(self) -> str:
        """``every 1m from 2027-01-01T00:00:00+00:00 until 2027-02-01T00:00:00+00:00``."""
        text = self.grid.describe()
        if self.start is not None:
            text += f", starting {self.start.isoformat()}"
        if self.end is not None:
            text += f", ending {self.end.isoformat()}"
        return text

    @property
    def min_interval(self) -> timedelta:
        """The grid's."""
        return self.grid.min_interval

    def ended(self, t: datetime) -> bool:
        """Whether no slot of this schedule comes after ``t``."""
        return self.next_after(t) == NEVER


def bounded(
    schedule: Schedule, start: datetime | str | None = None, end: datetime | str | None = None
) -> Schedule:
    """``schedule`` limited to ``start``..``end`` (each an aware datetime or an ISO string)."""
    if start is None and end is None:
        return schedule
    return Bounded(
        schedule,
        None if start is None else moment("start", start),
        None if end is None else moment("end", end),
    )


def grid_of(schedule: Schedule) -> Schedule:
    """The unbounded grid of ``schedule``."""
    return schedule.grid if isinstance(schedule, Bounded) else schedule


def ended(schedule: Schedule, t: datetime) -> bool:
    """Whether ``schedule`` has no slot after ``t`` (a :class:`Bounded` one past its end)."""
    return isinstance(schedule, Bounded) and schedule.ended(t)


def spec(schedule: Schedule) -> dict[str, object]:
    """``schedule`` as JSON values (``every`` seconds, ``anchor`` Unix seconds, ``cron``,
    ``timezone``, ``start`` and ``end`` ISO strings): :func:`from_spec` builds it again."""
    out: dict[str, object] = {}
    grid = grid_of(schedule)
    if isinstance(grid, Every):
        out["every"] = grid.interval.total_seconds()
        if grid.anchor != EPOCH:
            out["anchor"] = to_ms(grid.anchor) / 1000
    elif isinstance(grid, Cron):
        out["cron"], out["timezone"] = grid.expression, grid.timezone
    else:
        raise ConfigurationError(f"{grid.describe()}: not a schedule that can be written down")
    if isinstance(schedule, Bounded):
        if schedule.start is not None:
            out["start"] = schedule.start.isoformat()
        if schedule.end is not None:
            out["end"] = schedule.end.isoformat()
    return out


def from_spec(values: Mapping[str, Any]) -> Schedule:
    """The schedule :func:`spec` wrote; ConfigurationError naming what is wrong."""
    anchor = values.get("anchor")
    try:
        when = None if anchor is None else from_ms(round(float(anchor) * 1000))
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"anchor={anchor!r}: expected Unix seconds") from None
    return make_schedule(
        every=values.get("every"),
        cron=values.get("cron"),
        timezone=values.get("timezone"),
        anchor=when,
        start=values.get("start"),
        end=values.get("end"),
    )


@dataclass(frozen=True)
class Upcoming:
    """One slot to come (:func:`preview`): its instant, its wall time in the job's zone,
    and a note when a daylight saving change moved or repeated that wall time."""

    slot: datetime
    local: datetime
    #: ``""``, or why this wall time is unusual: ``"DST gap: ..."`` or ``"DST fold: ..."``.
    note: str = ""


def zone_of(schedule: Schedule) -> str:
    """The IANA time zone a schedule's wall times are read in (UTC for ``every=``)."""
    grid = grid_of(schedule)
    return grid.timezone if isinstance(grid, Cron) else "UTC"


def preview(schedule: Schedule, n: int, after: datetime) -> list[Upcoming]:
    """The next ``n`` slots of ``schedule`` after ``after`` (fewer past its end), each
    with its wall time in the schedule's zone and the DST gaps and folds marked."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigurationError(f"n={n!r}: expected a whole number of slots, at least 1")
    grid, zone = grid_of(schedule), ZoneInfo(zone_of(schedule))
    out: list[Upcoming] = []
    t = after
    while len(out) < n:
        t = schedule.next_after(t)
        if t == NEVER:
            break
        local = t.astimezone(zone)
        note = ""
        if isinstance(grid, Cron) and not grid.names_wall(local.replace(tzinfo=None)):
            note = (
                f"DST gap: the wall time it names does not exist in {zone.key};"
                " it fires at the gap's end"
            )
        elif local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset():
            which = "second" if local.fold else "first"
            note = f"DST fold: {local:%H:%M:%S} happens twice in {zone.key}; this is the {which}"
        out.append(Upcoming(t, local, note))
    return out
