"""Periodic actors' declarations: the ``schedule`` actor options, read and checked.

An actor is periodic when it is declared with ``schedule=`` (a cron string,
or :func:`every`), optionally ``schedule_timezone`` and per-actor overrides
of the middleware's defaults (``schedule_lease``, ``schedule_jitter``,
``schedule_catch_up``). A declaration is checked as the engine will check
the actor's job, so that a bad one fails at import, naming the actor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dramatiq.middleware import MiddlewareError

from anarchon_core import ConfigurationError, Job, JobOptions
from anarchon_core.handoff import check_pickup
from anarchon_core.schedules import make_schedule

#: Actor option -> job option.
OVERRIDES = {
    "schedule_lease": "lease",
    "schedule_jitter": "jitter",
    "schedule_catch_up": "catch_up",
}
#: The actor options that declare a periodic actor.
OPTIONS = frozenset({"schedule", "schedule_timezone", *OVERRIDES})


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


def read_declaration(
    name: str, options: Mapping[str, Any], defaults: JobOptions, pickup: float
) -> Periodic:
    """The periodic actor ``name`` declared with ``options`` (its ``schedule*`` options).

    ``defaults`` and ``pickup`` are the middleware's. Raises
    :class:`ScheduleError` naming the actor.
    """
    try:
        return _read(name, options, defaults, pickup)
    except ConfigurationError as exc:
        raise ScheduleError(f"actor {name!r}: {exc}") from None


def _read(name: str, options: Mapping[str, Any], defaults: JobOptions, pickup: float) -> Periodic:
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
    job_options = defaults.merged(**overrides)
    Job.check(name, schedule, job_options)
    check_pickup(pickup, job_options.lease)
    return Periodic(name, spec.every, spec.anchor, spec.cron, spec.timezone, overrides)
