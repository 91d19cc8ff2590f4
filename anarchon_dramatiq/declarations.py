"""Periodic actors' declarations: the ``schedule`` actor options, read and checked.

An actor is periodic when it is declared with ``schedule=`` (a cron string,
or :func:`every`), optionally ``schedule_timezone``, per-actor overrides
of the middleware's defaults (``schedule_lease``, ``schedule_jitter``,
``schedule_catch_up``), the bounds of its slots (``schedule_start``,
``schedule_end``), its rules (``schedule_overlap``, ``schedule_limit``,
``schedule_pause_on_failure``) and how long a slot's message stays worth processing,
counted from the slot's time (``schedule_expires``). An actor declared with
``schedule_at=`` (a time) instead runs once, at that time (a one-off). A
declaration is checked as the engine will check the actor's job, so that a
bad one fails at import, naming the actor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dramatiq.middleware import MiddlewareError

from anarchon_core import ConfigurationError, Job, JobOptions, Rules
from anarchon_core.durations import parse_duration, within
from anarchon_core.handoff import check_pickup
from anarchon_core.once import once_schedule
from anarchon_core.schedules import make_schedule, moment

#: Actor option -> job option.
OVERRIDES = {
    "schedule_lease": "lease",
    "schedule_jitter": "jitter",
    "schedule_catch_up": "catch_up",
}
#: Actor option -> bound of the schedule (slots from start to end, both included).
BOUNDS = {"schedule_start": "start", "schedule_end": "end"}
#: The actor option (and stored schedule's message option) of a slot's expiry:
#: its message is dropped once this long past the slot's time.
EXPIRES = "schedule_expires"
#: Actor option -> rule of the job (see anarchon_core.Rules).
RULES = {
    "schedule_overlap": "overlap",
    "schedule_limit": "limit",
    "schedule_pause_on_failure": "pause_on_failure",
}
#: The actor option of a one-off: the actor's message is sent once, at that time.
AT = "schedule_at"
#: The actor options that declare a periodic actor.
OPTIONS = frozenset({"schedule", "schedule_timezone", *OVERRIDES, *BOUNDS, EXPIRES, *RULES, AT})
#: The shortest expiry: Dramatiq counts a message's age in whole milliseconds.
MIN_EXPIRES = 0.001


class ScheduleError(ConfigurationError, MiddlewareError):
    """A periodic actor's declaration is invalid (raised at import, naming the actor).

    Also a Dramatiq ``MiddlewareError``: Dramatiq lets only those out of its hooks.
    """


@dataclass(frozen=True)
class Interval:
    """A fixed-interval schedule: every ``seconds``, on a grid anchored at ``anchor``.

    The default anchor is the Unix epoch, the same on every instance.
    """

    seconds: float | timedelta
    anchor: datetime | None = None


def every(seconds: float | timedelta, *, anchor: datetime | None = None) -> Interval:
    """``schedule=every(10)``: every ten seconds (see :class:`Interval`)."""
    return Interval(seconds, anchor)


@dataclass(frozen=True)
class Periodic:
    """One periodic actor, checked: what the engine needs to schedule it."""

    actor_name: str
    every: float | timedelta | None
    anchor: datetime | None
    cron: str | None
    timezone: str | None
    overrides: dict[str, Any] = field(default_factory=dict)
    #: No slot before ``start``, none after ``end`` (aware UTC datetimes).
    start: datetime | None = None
    end: datetime | None = None
    #: Seconds after its slot's time when a slot's message is dropped unprocessed.
    expires: float | None = None
    #: The job's rules (``overlap``, ``limit``, ``pause_on_failure``), as given.
    rules: dict[str, Any] = field(default_factory=dict)
    #: A one-off's time (``schedule_at``), aware UTC: its one slot (``every`` and
    #: ``cron`` are then None).
    at: datetime | None = None


def read_expires(value: Any, age_limited: bool) -> float:
    """Seconds of ``schedule_expires`` (a number, a timedelta, ``"30s"``).

    ``age_limited``: whether the broker has Dramatiq's ``AgeLimit`` middleware,
    the one that drops expired messages (it is in Dramatiq's default stack).
    """
    seconds = within(
        EXPIRES,
        parse_duration(EXPIRES, value),
        MIN_EXPIRES,
        why="a message's age is counted in whole milliseconds",
    )
    if not age_limited:
        raise ConfigurationError(
            f"{EXPIRES}={value!r} needs Dramatiq's AgeLimit middleware on the broker"
            " (in its default middleware): it is what drops an expired message"
        )
    return seconds


def read_declaration(
    name: str,
    options: Mapping[str, Any],
    defaults: JobOptions,
    pickup: float,
    *,
    age_limited: bool = True,
) -> Periodic:
    """The periodic actor ``name`` declared with ``options`` (its ``schedule*`` options).

    ``defaults`` and ``pickup`` are the middleware's; ``age_limited``: whether
    the broker drops expired messages (see :func:`read_expires`). Raises
    :class:`ScheduleError` naming the actor.
    """
    try:
        return _read(name, options, defaults, pickup, age_limited)
    except ConfigurationError as exc:
        raise ScheduleError(f"actor {name!r}: {exc}") from None


def _bounds(options: Mapping[str, Any]) -> tuple[datetime | None, datetime | None]:
    """``schedule_start`` and ``schedule_end`` as aware UTC datetimes (None if not given)."""
    start, end = (
        None if options.get(option) is None else moment(option, options[option])
        for option in BOUNDS
    )
    if start is not None and end is not None and end < start:
        raise ConfigurationError(
            f"schedule_end={end.isoformat()} is before schedule_start={start.isoformat()}"
        )
    return start, end


def _read(
    name: str,
    options: Mapping[str, Any],
    defaults: JobOptions,
    pickup: float,
    age_limited: bool,
) -> Periodic:
    if options.get(AT) is not None:
        return _read_once(name, options, defaults, pickup, age_limited)
    value = options.get("schedule")
    if value is None:
        raise ConfigurationError(f"{', '.join(sorted(options))} given without schedule=")
    timezone = options.get("schedule_timezone")
    if isinstance(value, Interval):
        spec = Periodic(name, value.seconds, value.anchor, None, timezone)
    elif isinstance(value, str):
        spec = Periodic(name, None, None, value, timezone)
    else:
        raise ConfigurationError(
            f"schedule={value!r}: expected a cron string ('*/5 * * * *') or every(seconds)"
        )
    overrides = {OVERRIDES[k]: v for k, v in options.items() if k in OVERRIDES}
    schedule = make_schedule(
        every=spec.every, cron=spec.cron, timezone=spec.timezone, anchor=spec.anchor
    )
    start, end = _bounds(options)
    if start is not None or end is not None:
        try:
            schedule = make_schedule(
                every=spec.every,
                cron=spec.cron,
                timezone=spec.timezone,
                anchor=spec.anchor,
                start=start,
                end=end,
            )
        except ConfigurationError as exc:  # no slot between them
            raise ConfigurationError(f"schedule_start, schedule_end: {exc}") from None
    rules = {RULES[k]: v for k, v in options.items() if k in RULES and v is not None}
    try:
        Rules.build(**rules)
    except ConfigurationError as exc:  # named as the actor option that set it
        raise ConfigurationError(f"schedule_{exc}") from None
    job_options = defaults.merged(**overrides)
    Job.check(name, schedule, job_options)
    check_pickup(pickup, job_options.lease)
    expires = None if options.get(EXPIRES) is None else read_expires(options[EXPIRES], age_limited)
    return Periodic(
        name,
        spec.every,
        spec.anchor,
        spec.cron,
        spec.timezone,
        overrides,
        start=start,
        end=end,
        expires=expires,
        rules=rules,
    )


# -- one-off actors -------------------------------------------------------------------


def _read_once(
    name: str,
    options: Mapping[str, Any],
    defaults: JobOptions,
    pickup: float,
    age_limited: bool,
) -> Periodic:
    """A one-off actor (``schedule_at=``): its message sent once, at that time, by one
    scheduler (kept in the store until then, and caught up within ``schedule_catch_up``
    if every scheduler was down at its time)."""
    given = {k for k, v in options.items() if v is not None}
    other = sorted(given - {AT, EXPIRES, *OVERRIDES})
    if other:
        raise ConfigurationError(
            f"{AT} runs the actor once, at its time: {', '.join(other)} do not apply"
        )
    at = moment(AT, options[AT])
    overrides = {OVERRIDES[k]: v for k, v in options.items() if k in OVERRIDES}
    job_options = defaults.merged(**overrides)
    Job.check(name, once_schedule(at), job_options)
    check_pickup(pickup, job_options.lease)
    expires = None if options.get(EXPIRES) is None else read_expires(options[EXPIRES], age_limited)
    return Periodic(name, None, None, None, None, overrides, expires=expires, at=at)
