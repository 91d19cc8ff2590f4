"""Slot grids: when a job is due, as pure functions of time.

A schedule turns any instant into the neighbouring slots (timezone-aware UTC
datetimes). Nothing here reads the clock or keeps state, so every instance asked
at any moment computes the same grid.

:class:`Every` is ``anchor + k * interval``; time zones play no part. :class:`Cron`
evaluates a cron expression in an IANA time zone with the daylight saving rule of
classic (Vixie) cron:

* A *fixed-time* job (its hour field does not cover all 24 hours, e.g.
  ``30 2 * * *`` or ``0 */2 * * *``) fires once per matching wall-clock time. A
  wall time skipped by a spring-forward gap fires at the gap's end (02:30 in New
  York on 2024-03-10 fires at 03:00 EDT); a wall time repeated by a fall-back
  fires on its first occurrence only.
* An *hourly* job (hour field ``*``) fires at every real instant whose local
  reading matches. A reading inside a gap never happens, so it does not fire; a
  reading in a repeated hour happens twice, in two different real hours, so it
  fires twice. With whole-hour shifts this is "every real hour gets its firing
  exactly once": ``30 * * * *`` fires 23 times on a spring-forward day (the real
  hour 03:00-04:00 EDT gets 03:30) and 25 times on a fall-back day (01:30 EDT and
  01:30 EST), always 1 h apart in UTC. Lord Howe's 30-minute shift gives 30- or
  90-minute gaps instead, which is what its clocks read.

croniter's own DST handling differs (it fires ``30 1 * * *`` twice on a fall-back
day), so croniter only walks the naive local calendar, where every wall time
exists once, and this module maps wall times to instants from the zone's offset
changes itself.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cache, lru_cache
from typing import Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from anarchon_core.errors import ConfigurationError

_UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=_UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_US = timedelta(microseconds=1)
_MS = timedelta(milliseconds=1)
_SECOND = 1_000_000  # internal instants and wall times are integer microseconds
_DAY = 86_400 * _SECOND

_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week", "second")
_FIELD_RANGES = ("0-59", "0-23", "1-31", "1-12", "0-7", "0-59")
_ALIASES = {
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_FIELD_SPLIT = re.compile(r"\S+", re.ASCII)  # croniter's own split: no Unicode spaces
# croniter's R picks a random value per parse and H needs a hash id: either way two
# instances could compute different grids.
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


def to_ms(slot: datetime) -> int:
    """The integer Unix timestamp of an aware datetime in milliseconds (floored)."""
    return _to_us(slot) // 1000


def from_ms(ms: int) -> datetime:
    """The aware UTC datetime of a Unix timestamp in milliseconds."""
    return EPOCH + timedelta(milliseconds=ms)


def slot_id(job: str, slot: datetime) -> str:
    """The stable id of one slot of a job: ``"{job}@{unix_ms}"``."""
    return f"{job}@{to_ms(slot)}"


@dataclass(frozen=True)
class Every:
    """Slots at ``anchor + k * interval`` for every integer ``k``.

    The grid is fixed in UTC, identical on every machine and independent of when a
    process started. The interval is at least 1 second; interval and anchor are
    whole milliseconds, so slot ids are exact.
    """

    interval: timedelta
    anchor: datetime = EPOCH

    def __post_init__(self) -> None:
        if not isinstance(self.interval, timedelta):
            raise ConfigurationError(f"every={self.interval!r}: expected a timedelta")
        label = f"every={_format_interval(self.interval)}"
        if self.interval <= timedelta(0):
            raise ConfigurationError(f"{label}: the interval must be positive")
        if self.interval < timedelta(seconds=1):
            raise ConfigurationError(f"{label}: intervals under 1 second are not supported")
        if self.interval % _MS:
            raise ConfigurationError(f"{label}: the interval must be whole milliseconds")
        if not isinstance(self.anchor, datetime) or self.anchor.utcoffset() is None:
            raise ConfigurationError(f"{label}: anchor= must be an aware datetime")
        if (self.anchor - EPOCH) % _MS:
            raise ConfigurationError(f"{label}: anchor= must be on a whole millisecond")
        object.__setattr__(self, "anchor", self.anchor.astimezone(_UTC))

    def _floor(self, x: int) -> int:
        origin, step = (self.anchor - EPOCH) // _US, self.interval // _US
        return origin + (x - origin) // step * step

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t``."""
        return _from_us(self._floor(_to_us(t)) + self.interval // _US)

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last slot at or before ``t`` (None only below ``datetime.min``)."""
        try:
            return _from_us(self._floor(_to_us(t)))
        except OverflowError:
            return None

    def describe(self) -> str:
        """``every 10s``, with ``from <anchor>`` when the anchor is not the epoch."""
        text = f"every {_format_interval(self.interval)}"
        return text if self.anchor == EPOCH else f"{text} from {self.anchor.isoformat()}"

    @property
    def min_interval(self) -> timedelta:
        """The interval itself."""
        return self.interval


@dataclass(frozen=True)
class Cron:
    """A cron expression evaluated in an IANA time zone, with classic cron DST rules.

    Five fields (minute hour day-of-month month day-of-week) or six with the
    seconds field *last*, croniter's default (``* * * * * */15`` is every 15
    seconds). Quartz and APScheduler put seconds first; following croniter keeps
    an expression meaning the same here as in croniter itself. Aliases such as
    ``@hourly`` and ``@daily`` are accepted; croniter's random ``R`` and hashed
    ``H`` values are refused because instances would disagree on the grid.
    See the module docstring for the daylight saving time rule.
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
        text = _ALIASES.get(self.expression.strip().lower(), self.expression)
        fields = _FIELD_SPLIT.findall(text)
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
        except CroniterBadDateError as exc:  # e.g. "0 0 30 2 *" parses but never fires
            raise ConfigurationError(f"{label}: matches no date") from exc

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t``."""
        # Cron slots are whole seconds, so "after t" is "at or after t + 1 us".
        return _from_us(self._first_at_or_after(_to_us(t) + 1))

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last slot at or before ``t``, or None if croniter finds none."""
        try:
            found = self._last_at_or_before(_to_us(t))
        except (CroniterBadDateError, OverflowError):
            return None
        return _from_us(found)

    def describe(self) -> str:
        """``cron '0 8 * * *' Europe/Athens``."""
        return f"cron {self.expression!r} {self.timezone}"

    @property
    def min_interval(self) -> timedelta:
        """A sound lower bound on the gap between consecutive slots.

        On the naive calendar: the smallest step of the finest field with more than
        one value (seconds, minutes, hours), else a day. A spring-forward brings
        fixed-time slots closer by up to the zone's largest offset change; hourly
        jobs keep their gaps unless the zone shifts by a fraction of an hour. The
        bound never drops below the expression's granularity (1 minute, or 1 s).
        """
        expanded = self._parser.expanded
        granularity = 1 if len(expanded) == 6 else 60
        levels = [(expanded[5], 60, 1)] if len(expanded) == 6 else []
        gap = 86_400
        for values, period, unit in [*levels, (expanded[0], 60, 60), (expanded[1], 24, 3600)]:
            points = list(range(period)) if values == ["*"] else sorted(map(int, values))
            if len(points) > 1:
                wrapped = [*points[1:], points[0] + period]
                gap = min(b - a for a, b in zip(points, wrapped, strict=True)) * unit
                break
        shifts = _shifts(self.timezone)
        if self._hourly and any(shift % 3600 for shift in shifts):
            gap = granularity
        elif not self._hourly and shifts:
            gap = max(gap - max(shifts), granularity)
        return timedelta(seconds=gap)

    def _first_at_or_after(self, x: int) -> int:
        while True:
            offset = _offset(self._zone, x)
            wall = self._wall_at_or_after(x + offset)
            found = wall - offset
            change = _next_change(self.timezone, x, found)
            if change is None:
                repeat = None if self._hourly else self._repeated(x, wall)
                if repeat is None:
                    return found
                at, before, after = repeat
                x = at + before - after  # its first occurrence has passed: skip the rerun
                continue
            at, before, after = change
            gap = not self._hourly and after > before
            if gap and self._wall_at_or_after(at + before) < at + after:
                return at  # a wall time inside the gap fires at the gap's end
            x = at

    def _last_at_or_before(self, x: int) -> int:
        while True:
            offset = _offset(self._zone, x)
            wall = self._wall_at_or_before(x + offset)
            found = wall - offset
            change = _last_change(self.timezone, x, found)
            if change is None:
                repeat = None if self._hourly else self._repeated(found, wall)
                if repeat is None:
                    return found
                x = repeat[0] - 1  # a rerun wall time: its slot lies before the change
                continue
            at, before, after = change
            gap = not self._hourly and after > before
            if gap and self._wall_at_or_before(at + after - 1) >= at + before:
                return at
            x = at - 1

    def _repeated(self, x: int, wall: int) -> tuple[int, int, int] | None:
        """The fall-back that makes ``wall`` (read at instant ``x``) a repeat, if any."""
        change = _last_change(self.timezone, x, x - _DAY)
        if change is not None and change[1] > change[2] and wall < change[0] + change[1]:
            return change
        return None

    def _wall_at_or_after(self, wall: int) -> int:
        # croniter's get_next is strictly after, at whole-second (or minute)
        # granularity: start one second before the wall time rounded up.
        start = -(-wall // _SECOND) * _SECOND - _SECOND
        found = copy.copy(self._parser).get_next(datetime, _naive(start))
        return (found - _NAIVE_EPOCH) // _US

    def _wall_at_or_before(self, wall: int) -> int:
        # get_prev subtracts 1 us and truncates: half a second in lands on the wall.
        start = wall // _SECOND * _SECOND + _SECOND // 2
        found = copy.copy(self._parser).get_prev(datetime, _naive(start))
        return (found - _NAIVE_EPOCH) // _US


def make_schedule(
    *,
    every: float | int | timedelta | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    anchor: datetime | None = None,
) -> Schedule:
    """Build a schedule from a job's keyword arguments.

    Exactly one of ``every=`` (seconds as a number, or a timedelta) and ``cron=``.
    ``timezone=`` applies to cron only, ``anchor=`` to every only.
    """
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
    """Validate one field alone, so the error can say which field is wrong."""
    token, name = fields[index], _FIELD_NAMES[index]
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
            why = f"is out of range {_FIELD_RANGES[index]}"
        else:
            why = "has an invalid step" if "step" in reason else "is not valid"
        raise ConfigurationError(f"{label}: {name} field {token!r} {why}") from exc


def _is_fixed_offset(key: str) -> bool:
    return key in _FIXED_OFFSET_ZONES or key.startswith("Etc/")


def _to_us(t: datetime) -> int:
    if not isinstance(t, datetime) or t.utcoffset() is None:
        raise ConfigurationError(f"expected a timezone-aware datetime, got {t!r}")
    return (t - EPOCH) // _US


def _from_us(x: int) -> datetime:
    return EPOCH + timedelta(microseconds=x)


def _naive(wall: int) -> datetime:
    return _NAIVE_EPOCH + timedelta(microseconds=wall)


def _offset(zone: ZoneInfo, x: int) -> int:
    """The UTC offset of ``zone`` at instant ``x``, in microseconds."""
    offset = _from_us(x).astimezone(zone).utcoffset()
    return 0 if offset is None else offset // _US  # never None for a ZoneInfo


@cache  # a few hundred zones at most
def _shifts(key: str) -> frozenset[int]:
    """The sizes in seconds of the offset changes of zone ``key``, 1970-2100.

    Sampled in January and July, which tell standard time from summer time in
    both hemispheres; only :attr:`Cron.min_interval` relies on it.
    """
    zone = ZoneInfo(key)
    samples = [
        datetime(year, month, 15, tzinfo=_UTC).astimezone(zone).utcoffset()
        for year in range(1970, 2100)
        for month in (1, 7)
    ]
    return frozenset(
        abs(b - a) // timedelta(seconds=1)  # type: ignore[operator]
        for a, b in itertools.pairwise(samples)
        if a != b
    )


@lru_cache(maxsize=2048)
def _changes_in_year(key: str, year: int) -> tuple[tuple[int, int, int], ...]:
    """The offset changes of zone ``key`` in (Jan 1 ``year``, Jan 1 ``year + 1``] UTC.

    Each is ``(instant, offset before, offset after)`` in microseconds. zoneinfo
    does not expose its transitions, so the year is probed daily and each change
    bisected to the second; tzdata never changes a zone's offset twice in a day.
    """
    zone = ZoneInfo(key)
    low = _to_us(datetime(year, 1, 1, tzinfo=_UTC))
    end = _to_us(datetime(year + 1, 1, 1, tzinfo=_UTC))
    before, changes = _offset(zone, low), []
    while low < end:
        high = min(low + _DAY, end)
        after = _offset(zone, high)
        if after != before:
            while high - low > _SECOND:
                middle = low + (high - low) // 2 // _SECOND * _SECOND
                if _offset(zone, middle) == before:
                    low = middle
                else:
                    high = middle
            after = _offset(zone, high)
            changes.append((high, before, after))
        low, before = high, after
    return tuple(changes)


def _next_change(key: str, x: int, limit: int) -> tuple[int, int, int] | None:
    """The first offset change at an instant in ``(x, limit]``."""
    if _is_fixed_offset(key):
        return None
    year = _from_us(x).year
    while _to_us(datetime(year, 1, 1, tzinfo=_UTC)) < limit:
        for change in _changes_in_year(key, year):
            if change[0] > limit:
                return None
            if change[0] > x:
                return change
        year += 1
    return None


def _last_change(key: str, x: int, limit: int) -> tuple[int, int, int] | None:
    """The last offset change at an instant in ``(limit, x]``."""
    if _is_fixed_offset(key):
        return None
    year = _from_us(x).year
    while _to_us(datetime(year + 1, 1, 1, tzinfo=_UTC)) > limit:
        for change in reversed(_changes_in_year(key, year)):
            if change[0] <= limit:
                return None
            if change[0] <= x:
                return change
        year -= 1
    return None


def _format_interval(interval: timedelta) -> str:
    micros = abs(interval // _US)
    parts = []
    for unit, size in (("d", 86_400 * _SECOND), ("h", 3600 * _SECOND), ("m", 60 * _SECOND)):
        count, micros = divmod(micros, size)
        if count:
            parts.append(f"{count}{unit}")
    if micros or not parts:
        parts.append(f"{micros / _SECOND:.6f}".rstrip("0").rstrip(".") + "s")
    return ("-" if interval < timedelta(0) else "") + "".join(parts)
