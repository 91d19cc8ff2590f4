"""Celery's ``beat_schedule`` entries, read as anarchon jobs.

A stock entry (``task``, ``schedule``, ``args``, ``kwargs``, ``options``)
becomes one job of the same name. Intervals (a number of seconds, a
``timedelta``, ``celery.schedules.schedule``) become fixed grids anchored at
the Unix epoch, the same on every instance; stock beat instead counts them
from when its process started. ``crontab`` entries become cron expressions
in the app's time zone.

A schedule whose due times depend on anything but the clock cannot be put on
a grid that every instance computes alike: ``solar``, a subclass of
``schedule`` or ``crontab`` that overrides how its due times are computed
(``is_due``, ``remaining_estimate``...), a ``crontab`` with its own
``nowfun``, and any other ``BaseSchedule``. Read for beat (``owned=True``),
such an entry decides its own due times, one beat at a time
(:mod:`anarchon_celery.owned`; :attr:`Entry.decides` names its kind); read for
anything else (an import into stored schedules), it is refused
(:class:`OwnSchedule`), as is any other type.

Per-entry overrides of the ``anarchon_*`` settings go in the entry's
``options`` (``anarchon_lease``, ``anarchon_jitter``, ``anarchon_catch_up``),
with the job's rules (``anarchon_overlap``, ``anarchon_limit``,
``anarchon_pause_on_failure``) and the bounds of its slots (``anarchon_start``,
``anarchon_end``: aware datetimes or ISO 8601 strings with an offset, both
included); all are removed
before the task is sent. The ``expires`` option, when a number of seconds or a
``timedelta``, counts from each slot's time (:func:`expires_at`), not from the
send: a slot sent late expires as it would have on time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload

from celery.beat import ScheduleEntry
from celery.schedules import BaseSchedule, crontab, schedstate, schedule, solar

from anarchon_core import ConfigurationError, Rules
from anarchon_core.names import check_name
from anarchon_core.schedules import moment

#: Entry options read by anarchon (``anarchon_<name>``) and not passed on to ``apply_async``.
OVERRIDES = (
    "lease", "jitter", "catch_up", "start", "end", "overlap", "limit", "pause_on_failure",
)  # fmt: skip
#: The overrides that bound the job's slots (``Scheduler.add_job(start=, end=)``), not job options.
BOUNDS = ("start", "end")
#: The overrides that are the job's rules (``overlap``, ``limit``, ``pause_on_failure``).
RULES = ("overlap", "limit", "pause_on_failure")
#: The longest ``expires`` in seconds after the slot (beyond it, a datetime is clearer).
MAX_EXPIRES = 100 * 365 * 86400.0

#: Methods whose override changes when a schedule is due: such a subclass is refused.
_DUE_METHODS = {
    schedule: ("is_due", "remaining_estimate"),
    crontab: ("is_due", "remaining_estimate", "remaining_delta", "now", "to_local"),
}


class OwnSchedule(ConfigurationError):
    """A schedule that decides its own due times (``kind``): refused where slots must be
    computed from the clock alone; beat runs it on one beat at a time."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


_USE_INSTEAD = (
    "use a number of seconds, a timedelta, schedule(...) or crontab(...) (and let the task"
    " skip the runs it does not want)"
)
#: A crontab field's full range: a field covering it is written ``*``.
_CRON_RANGES = (
    ("minute", range(60)),
    ("hour", range(24)),
    ("day_of_month", range(1, 32)),
    ("month_of_year", range(1, 13)),
    ("day_of_week", range(7)),
)


@dataclass(frozen=True)
class Entry:
    """One ``beat_schedule`` entry, validated."""

    name: str
    task: str
    every: float | None
    cron: str | None
    timezone: str | None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    #: The ``anarchon_*`` options, without their prefix: the job's options as given,
    #: ``start`` and ``end`` as aware UTC datetimes.
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Unix seconds of an ``every`` grid's anchor (None: the Unix epoch).
    anchor: float | None = None
    #: A one-off's time (:class:`once`, django-celery-beat's ``clocked``): its one slot,
    #: aware UTC; ``every``, ``cron`` and ``timezone`` are then None.
    at: datetime | None = None
    #: The kind of a schedule that decides its own due times (``"solar"``, a class name):
    #: its due times are decided by one beat at a time (:mod:`anarchon_celery.owned`);
    #: ``every``, ``cron`` and ``timezone`` are then None.
    decides: str | None = None

    @property
    def job_options(self) -> dict[str, Any]:
        """The overrides of the job's options (``lease``, ``jitter``, ``catch_up``)."""
        return {k: v for k, v in self.overrides.items() if k not in BOUNDS and k not in RULES}

    @property
    def rules(self) -> dict[str, Any]:
        """The job's rules set (``overlap``, ``limit``, ``pause_on_failure``)."""
        return {k: v for k, v in self.overrides.items() if k in RULES}

    @property
    def bounds(self) -> dict[str, datetime]:
        """``start`` and ``end``, those set."""
        return {k: v for k, v in self.overrides.items() if k in BOUNDS}


def read_entry(
    name: str, raw: Mapping[str, Any], app_timezone: str, where: str = "", *, owned: bool = False
) -> Entry:
    """An :class:`Entry` from a ``beat_schedule`` item, or a ConfigurationError naming it.

    ``owned``: a schedule that decides its own due times is read as such
    (:attr:`Entry.decides`), for beat; otherwise it is refused (:class:`OwnSchedule`).
    """
    where = where or f"beat_schedule[{name!r}]"
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{where}: expected a dict, got {type(raw).__name__}")
    return _read(
        where,
        name,
        raw.get("task"),
        raw.get("schedule"),
        raw.get("args"),
        raw.get("kwargs"),
        raw.get("options"),
        app_timezone,
        owned,
    )


def read_schedule_entry(
    entry: ScheduleEntry, app_timezone: str, where: str = "", *, owned: bool = False
) -> Entry:
    """An :class:`Entry` from beat's own ``ScheduleEntry`` (``scheduler.schedule``'s values);
    ``owned`` as for :func:`read_entry`."""
    return _read(
        where or f"beat_schedule[{entry.name!r}]",
        entry.name,
        entry.task,
        entry.schedule,
        entry.args,
        entry.kwargs,
        entry.options,
        app_timezone,
        owned,
    )


def _read(
    where: str,
    name: Any,
    task: Any,
    value: Any,
    args: Any,
    kwargs: Any,
    options: Any,
    app_timezone: str,
    owned: bool = False,
) -> Entry:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{where}: the entry needs a name")
    try:
        check_name(name)  # the entry's name is its job's name in the store
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    if not isinstance(task, str) or not task:
        raise ConfigurationError(f"{where}: 'task' must name a task")
    at = once_at(where, value)
    decides = None
    try:
        every, cron, timezone = (None, None, None) if at else _schedule(where, value, app_timezone)
    except OwnSchedule as exc:
        if not owned:
            raise
        every, cron, timezone, decides = None, None, None, exc.kind
    args = args or ()
    kwargs = kwargs or {}
    if not isinstance(args, (list, tuple)):
        raise ConfigurationError(f"{where}: 'args' must be a list or tuple")
    if not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"{where}: 'kwargs' must be a dict")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigurationError(f"{where}: 'options' must be a dict")
    options = dict(options or {})
    overrides = {k: options.pop(f"anarchon_{k}") for k in OVERRIDES if f"anarchon_{k}" in options}
    unknown = sorted(k for k in options if k.startswith("anarchon_"))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(unknown)};"
            f" known: {', '.join('anarchon_' + k for k in OVERRIDES)}"
        )
    _bounds(where, overrides)
    try:
        Rules.build(**{k: v for k, v in overrides.items() if k in RULES})
    except ConfigurationError as exc:  # named as the entry option that set it
        raise ConfigurationError(f"{where}: anarchon_{exc}") from None
    if at is not None and set(overrides) & {*BOUNDS, *RULES}:
        said = ", ".join(f"anarchon_{k}" for k in sorted(set(overrides) & {*BOUNDS, *RULES}))
        raise ConfigurationError(f"{where}: a one-off runs once, at its time: {said} do not apply")
    if decides is not None and set(overrides) & {"overlap", "limit"}:
        said = ", ".join(f"anarchon_{k}" for k in sorted(set(overrides) & {"overlap", "limit"}))
        raise ConfigurationError(
            f"{where}: its schedule ({decides}) decides its own due times, one at a time (the"
            f" next once the last one's run has ended): {said} do not apply"
        )
    check_expires(where, options.get("expires"))
    return Entry(
        name,
        task,
        every,
        cron,
        timezone,
        tuple(args),
        dict(kwargs),
        options,
        overrides,
        at=at,
        decides=decides,
    )


def _bounds(where: str, overrides: dict[str, Any]) -> None:
    """``start`` and ``end`` of ``overrides`` read in place as aware UTC datetimes."""
    for bound in BOUNDS:
        if bound in overrides:
            try:
                overrides[bound] = moment(f"anarchon_{bound}", overrides[bound])
            except ConfigurationError as exc:
                raise ConfigurationError(f"{where}: {exc}") from None
    start, end = overrides.get("start"), overrides.get("end")
    if start is not None and end is not None and end < start:
        raise ConfigurationError(
            f"{where}: anarchon_end={end.isoformat()} is before anarchon_start={start.isoformat()}"
        )


def check_expires(where: str, expires: Any) -> None:
    """Refuse an ``expires`` option that :func:`expires_at` cannot read, naming ``where``."""
    if expires is None or isinstance(expires, datetime):
        return
    if isinstance(expires, str):
        try:
            datetime.fromisoformat(expires.strip())
        except ValueError:
            raise ConfigurationError(
                f"{where}: expires={expires!r}: a string must be an ISO 8601 date and time;"
                " for a number of seconds after the slot's time, give a number"
            ) from None
        return
    if isinstance(expires, timedelta):
        seconds = expires.total_seconds()
    elif isinstance(expires, (int, float)) and not isinstance(expires, bool):
        seconds = float(expires)
    else:
        raise ConfigurationError(
            f"{where}: expires={expires!r}: expected a number of seconds after the slot's"
            " time, a timedelta or a datetime"
        )
    if not 0 < seconds < MAX_EXPIRES:
        raise ConfigurationError(
            f"{where}: expires={expires!r}: seconds after the slot's time must be positive"
            " (and under 100 years)"
        )


@overload
def expires_at(expires: float | timedelta | datetime, slot: datetime) -> datetime: ...
@overload
def expires_at(expires: Any, slot: datetime) -> Any: ...
def expires_at(expires: Any, slot: datetime) -> Any:
    """The ``expires`` of the task sent for ``slot``: absolute, whenever it is sent.

    A number of seconds or a ``timedelta`` counts from the slot's time (stock
    Celery counts it from the send, which a late send would push back); a
    datetime, or an ISO 8601 string, is kept as it is; None stays None.
    """
    if isinstance(expires, timedelta):
        return slot + expires
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        return slot + timedelta(seconds=expires)
    return expires


def _field(value: Any) -> str:
    """A crontab field as cron text: Celery also takes ints, lists and sets."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(str(v) for v in sorted(value, key=str))
    return str(value).replace(" ", "")


def _refuse_overrides(where: str, value: BaseSchedule, base: type) -> None:
    """Refuse ``value`` if its class changes, from ``base``'s, when it is due."""
    overridden = [m for m in _DUE_METHODS[base] if getattr(type(value), m) is not getattr(base, m)]
    if overridden:
        raise OwnSchedule(
            f"{where}: {type(value).__name__} overrides {', '.join(overridden)}, so anarchon"
            f" cannot compute its slots the same on every beat: {_USE_INSTEAD}",
            type(value).__name__,
        )


def cron_of(where: str, value: crontab) -> str:
    """``value`` as a cron expression, or a ConfigurationError naming ``where``."""
    fields = []
    for attr, full in _CRON_RANGES:
        expanded = getattr(value, attr)
        if set(expanded) == set(full):
            fields.append("*")  # cron's day-of-month/day-of-week rule needs '*' for "any"
        elif type(value) is crontab:
            fields.append(_field(getattr(value, f"_orig_{attr}")))
        else:  # a subclass may have set its fields itself: read what it holds
            fields.append(",".join(str(v) for v in sorted(expanded)))
    if fields[2] != "*" and fields[4] != "*":
        # Celery requires both to match; classic cron, which anarchon follows, either.
        # Two entries, one per field, would run on either day too: the advice
        # keeps Celery's meaning (both must match) by checking the other field
        # in the task.
        raise ConfigurationError(
            f"{where}: crontab with both day_of_month and day_of_week restricted is not"
            " supported: Celery runs it on the days that match both, classic cron (which"
            " anarchon follows) on the days that match either. Keep one of the two (e.g."
            " day_of_week='mon', or a daily crontab) and let the task return unless the"
            " date matches the other (e.g. day of month 1-7); two entries would run on"
            " the days of either"
        )
    minute, hour, day_of_month, month, day_of_week = fields
    return " ".join((minute, hour, day_of_month, month, day_of_week))


def _timezone(where: str, value: crontab, app_timezone: str) -> str:
    """The app's time zone, or the IANA zone a crontab subclass sets as its ``tz``."""
    if getattr(type(value), "tz", None) is getattr(crontab, "tz", None):
        return app_timezone
    zone = getattr(value.tz, "key", None) or getattr(value.tz, "zone", None)
    if not isinstance(zone, str) or not zone:
        raise ConfigurationError(
            f"{where}: {type(value).__name__}.tz is {value.tz!r}, not an IANA time zone"
            " (zoneinfo.ZoneInfo): use one, or app.conf.timezone"
        )
    return zone


def _schedule(
    where: str, value: Any, app_timezone: str
) -> tuple[float | None, str | None, str | None]:
    if isinstance(value, bool) or value is None:
        raise ConfigurationError(f"{where}: 'schedule' is missing")
    if isinstance(value, (int, float)):
        return float(value), None, None
    if isinstance(value, timedelta):
        return value.total_seconds(), None, None
    kind = type(value).__name__
    if isinstance(value, solar):
        raise OwnSchedule(
            f"{where}: solar schedules are not supported by anarchon (every beat must compute"
            " the same slots from the clock alone): use crontab(...) at a fixed time instead",
            kind,
        )
    if isinstance(value, crontab):
        _refuse_overrides(where, value, crontab)
        if value.nowfun is not None:
            raise OwnSchedule(
                f"{where}: crontab(nowfun=...) is not supported: slots are computed from the"
                " clock in app.conf.timezone; set the time zone there, or write the times in it",
                f"{kind} with nowfun",
            )
        return None, cron_of(where, value), _timezone(where, value, app_timezone)
    if isinstance(value, schedule):
        _refuse_overrides(where, value, schedule)
        if value.relative:
            # Celery rounds each due time down to the interval's resolution from
            # when that one beat last ran the entry: no two beats would agree.
            raise ConfigurationError(
                f"{where}: schedule(..., relative=True) is not supported: its due times are"
                " rounded from when each beat last ran the entry. anarchon's slots are"
                " already on round times, a grid anchored at the Unix epoch"
                " (timedelta(minutes=15) fires at :00, :15, :30, :45): remove"
                " relative=True, or use crontab(...) for times in app.conf.timezone"
            )
        return value.run_every.total_seconds(), None, None
    message = (
        f"{where}: unsupported schedule {value!r} ({kind}): anarchon computes every slot from"
        f" the clock alone, the same on every beat: {_USE_INSTEAD}"
    )
    if isinstance(value, BaseSchedule):
        raise OwnSchedule(message, kind)
    raise ConfigurationError(message)


# -- one-off entries ------------------------------------------------------------------


class once(BaseSchedule):  # type: ignore[misc]
    """A ``beat_schedule`` entry's schedule that sends its task once, at ``at``.

    ``at`` is an aware datetime or an ISO 8601 string with its offset. anarchon's
    beat keeps the one-off in the store until its time: one beat sends it, once,
    even if every beat restarts (late, within the entry's catch-up window, if
    they were all down at its time). django-celery-beat's ``clocked`` reads alike.
    """

    def __init__(self, at: datetime | str, nowfun: Any = None, app: Any = None) -> None:
        self.at = moment("at", at)
        super().__init__(nowfun=nowfun, app=app)

    def remaining_estimate(self, last_run_at: datetime | None) -> timedelta:
        now: datetime = self.now()
        return self.at - now

    def is_due(self, last_run_at: datetime | None) -> tuple[bool, float]:
        """Stock beat's reading: due once its time came (and was not run since)."""
        left = self.remaining_estimate(last_run_at).total_seconds()
        due = left <= 0 and (last_run_at is None or last_run_at < self.at)
        state: tuple[bool, float] = schedstate(due, 86400.0 if left <= 0 else left)
        return state

    def __repr__(self) -> str:
        return f"<once: {self.at.isoformat()}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, once) and other.at == self.at

    def __hash__(self) -> int:
        return hash(self.at)

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.at, self.nowfun)


def once_at(where: str, value: Any) -> datetime | None:
    """A one-off schedule's time (:class:`once`, django-celery-beat's ``clocked``), aware
    UTC; None for any other schedule."""
    if isinstance(value, once):
        return value.at
    kind = type(value)
    if kind.__name__ == "clocked" and kind.__module__.startswith("django_celery_beat"):
        try:
            return moment("clocked_time", value.clocked_time)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    return None
