"""django-celery-beat's ``PeriodicTask`` rows, read as anarchon schedules.

A row is read from its columns alone (:class:`Row`, plain values: no Django
import here), so that the beat scheduler (:mod:`anarchon_celery.django`) and
``anarchon import`` read rows the same way:

- an ``interval`` row (every N days, hours, minutes, seconds) is a grid of
  that interval, anchored at the row's ``start_time`` when it has one (its
  first slot is then ``start_time``, as django-celery-beat runs it), else at
  the Unix epoch, the same on every beat;
- a ``crontab`` row is the cron expression of its five fields in the row's own
  ``timezone`` (anarchon's DST rule: see docs/celery.md);
- a ``clocked`` row is one slot at ``clocked_time`` (django-celery-beat makes
  clocked rows one-off);
- a ``solar`` row is refused, naming it: its times depend on each beat's
  reading of the sun's position between two polls, and anarchon needs the
  same slots on every beat from the clock alone.

The row's ``queue``, ``exchange``, ``routing_key``, ``priority`` and
``headers`` become the send's options, as django-celery-beat sends them (with
the ``periodic_task_name`` header); ``expires`` and ``expire_seconds`` are
applied per slot by the scheduler (``expire_seconds`` counts from the slot's
time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from celery.schedules import crontab

from anarchon_core import ConfigurationError
from anarchon_core.schedules import MAX_INTERVAL

from .schedules import Entry, cron_of, expires_at

#: The periods of an ``IntervalSchedule``, in seconds.
PERIODS = {
    "days": 86400.0,
    "hours": 3600.0,
    "minutes": 60.0,
    "seconds": 1.0,
    "microseconds": 1e-6,
}

#: The interval of a clocked row's grid: the longest there is, so that its one
#: slot (at ``clocked_time``) is the only one it reaches (the row is disabled
#: once sent, and is not scheduled before its time comes near).
CLOCKED_EVERY = MAX_INTERVAL.total_seconds()


@dataclass(frozen=True)
class Row:
    """The columns of one ``PeriodicTask`` row and of its schedule row, as plain values.

    ``interval`` is ``(every, period)``; ``crontab`` is ``(minute, hour,
    day_of_month, month_of_year, day_of_week, timezone)``; ``solar`` is
    ``(event, latitude, longitude)``; ``clocked`` is the ``clocked_time``.
    Datetimes are aware (Django's ``USE_TZ``) or naive in UTC.
    """

    id: int
    name: str
    task: str
    enabled: bool = True
    one_off: bool = False
    args: str | None = "[]"
    kwargs: str | None = "{}"
    queue: str | None = None
    exchange: str | None = None
    routing_key: str | None = None
    priority: int | None = None
    headers: str | None = "{}"
    expires: datetime | None = None
    expire_seconds: int | None = None
    start_time: datetime | None = None
    interval: tuple[int, str] | None = None
    crontab: tuple[str, str, str, str, str, str] | None = None
    solar: tuple[str, float, float] | None = None
    clocked: datetime | None = None
    last_run_at: datetime | None = None
    total_run_count: int = 0


@dataclass(frozen=True)
class RowSchedule:
    """What anarchon runs for a row: the entry, and the rules applied to each slot."""

    row_id: int
    entry: Entry
    #: Runs once, then the row is disabled (by the beat that sent it).
    one_off: bool = False
    #: No slot before this time (``start_time``, or a clocked row's time).
    start: datetime | None = None
    #: No slot at or after this time (``expires``).
    expires: datetime | None = None
    #: A sent task expires this long after its slot (``expire_seconds``).
    expire_seconds: float | None = None
    #: The time of a clocked row's one slot.
    clocked: datetime | None = None

    def spec(self) -> Entry:
        """The entry anarchon schedules for the row."""
        return self.entry


@dataclass(frozen=True)
class Refused:
    """A row anarchon cannot run, and why (its message names the row)."""

    row_id: int
    reason: str

    def spec(self) -> Entry:
        raise ConfigurationError(self.reason)


def anchor_of(when: datetime) -> float:
    """``when`` as a grid's anchor: Unix seconds, rounded up to the millisecond.

    Slots are whole milliseconds; rounding down would put the first slot
    before ``start_time`` (then skipped), rounding up keeps it at its time.
    """
    return math.ceil(round(when.timestamp() * 1000, 3)) / 1000


def aware(value: datetime | None) -> datetime | None:
    """``value`` with its time zone; a naive datetime is UTC (Django's ``USE_TZ=False``)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def _json(where: str, column: str, text: str | None, kind: type, default: Any) -> Any:
    if text is None or text == "":
        return default
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {column} is not JSON ({exc})") from None
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ConfigurationError(f"{where}: {column} must be a JSON {kind.__name__}")
    return value


def read_row(row: Row) -> RowSchedule:
    """How anarchon schedules ``row``, or a ConfigurationError naming the row and the reason."""
    where = f"PeriodicTask {row.name!r}"
    kinds = [k for k in ("interval", "crontab", "solar", "clocked") if getattr(row, k) is not None]
    if len(kinds) != 1:
        said = " and ".join(kinds) if kinds else "none"
        raise ConfigurationError(
            f"{where}: needs exactly one of interval, crontab, solar and clocked (has {said})"
        )
    args = _json(where, "args", row.args, list, [])
    kwargs = _json(where, "kwargs", row.kwargs, dict, {})
    headers = _json(where, "headers", row.headers, dict, {})
    headers["periodic_task_name"] = row.name
    options: dict[str, Any] = {
        key: value
        for key, value in (
            ("queue", row.queue),
            ("exchange", row.exchange),
            ("routing_key", row.routing_key),
            ("priority", row.priority),
        )
        if value not in (None, "")
    }
    options["headers"] = headers
    start = aware(row.start_time)
    every: float | None = None
    cron: str | None = None
    zone: str | None = None
    anchor: float | None = None
    clocked = aware(row.clocked)
    if row.interval is not None:
        count, period = row.interval
        if period not in PERIODS:
            raise ConfigurationError(
                f"{where}: interval period {period!r} is not one of {', '.join(PERIODS)}"
            )
        every = count * PERIODS[period]
        if every <= 0:
            raise ConfigurationError(f"{where}: interval every={count} {period} is not positive")
        if start is not None:
            anchor = anchor_of(start)
    elif row.crontab is not None:
        minute, hour, day_of_month, month_of_year, day_of_week, zone = row.crontab
        try:
            value = crontab(
                minute=minute,
                hour=hour,
                day_of_month=day_of_month,
                month_of_year=month_of_year,
                day_of_week=day_of_week,
            )
        except Exception as exc:  # Celery's parser says which field, in its own words
            raise ConfigurationError(f"{where}: crontab: {exc}") from None
        cron = cron_of(where, value)
        zone = str(zone or "UTC")
    elif row.solar is not None:
        event = row.solar[0]
        raise ConfigurationError(
            f"{where}: solar schedule ({event}) is not supported: every beat must compute the"
            " same slots from the clock alone; use a crontab row at a fixed time instead"
        )
    else:
        assert clocked is not None
        every, anchor = CLOCKED_EVERY, anchor_of(clocked)
        start = clocked if start is None or clocked > start else start
    expires = aware(row.expires)
    entry = Entry(
        name=row.name,
        task=row.task,
        every=every,
        cron=cron,
        timezone=zone,
        args=tuple(args),
        kwargs=kwargs,
        options=options,
        anchor=anchor,
    )
    return RowSchedule(
        row_id=row.id,
        entry=entry,
        one_off=bool(row.one_off or clocked is not None),
        start=start,
        expires=expires,
        expire_seconds=None if row.expire_seconds is None else float(row.expire_seconds),
        clocked=clocked,
    )


def expiry(schedule: RowSchedule, slot: datetime) -> datetime | None:
    """The ``expires`` option of the task sent for ``slot``, if the row sets one."""
    if schedule.expire_seconds is not None:
        return expires_at(schedule.expire_seconds, slot)
    return schedule.expires


def skipped(schedule: RowSchedule, slot: datetime) -> str | None:
    """Why ``slot`` is not sent for this row (before its start, after it expired), or None."""
    if schedule.start is not None and slot < schedule.start:
        return f"before its start_time {schedule.start.isoformat()}"
    if schedule.expires is not None and slot >= schedule.expires:
        return f"after it expired at {schedule.expires.isoformat()}"
    return None


def row_from_mapping(values: Mapping[str, Any]) -> Row:
    """A :class:`Row` from a mapping of its column names (extra keys ignored)."""
    known = Row.__dataclass_fields__
    return Row(**{k: v for k, v in values.items() if k in known})
