"""Celery's ``beat_schedule`` entries, read as anarchon jobs.

A stock entry (``task``, ``schedule``, ``args``, ``kwargs``, ``options``)
becomes one job of the same name. Intervals (a number of seconds, a
``timedelta``, ``celery.schedules.schedule``) become fixed grids anchored at
the Unix epoch, the same on every instance; stock beat instead counts them
from when its process started. ``crontab`` entries become cron expressions
in the app's time zone. ``solar`` schedules are refused.

Per-entry overrides of the ``anarchon_*`` settings go in the entry's
``options`` (``anarchon_lease``, ``anarchon_jitter``, ``anarchon_catch_up``)
and are removed before the task is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery.schedules import crontab, schedule, solar

from anarchon_core import ConfigurationError

#: Entry options read by anarchon and not passed on to ``apply_async``.
OVERRIDES = ("lease", "jitter", "catch_up")


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
    overrides: dict[str, Any] = field(default_factory=dict)


def read_entry(name: str, raw: Mapping[str, Any], app_timezone: str) -> Entry:
    """An :class:`Entry` from a ``beat_schedule`` item, or a ConfigurationError naming it."""
    where = f"beat_schedule[{name!r}]"
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{where}: expected a dict, got {type(raw).__name__}")
    task = raw.get("task")
    if not isinstance(task, str) or not task:
        raise ConfigurationError(f"{where}: 'task' must name a task")
    every, cron, timezone = _schedule(where, raw.get("schedule"), app_timezone)
    args = raw.get("args") or ()
    kwargs = raw.get("kwargs") or {}
    if not isinstance(args, (list, tuple)):
        raise ConfigurationError(f"{where}: 'args' must be a list or tuple")
    if not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"{where}: 'kwargs' must be a dict")
    options = dict(raw.get("options") or {})
    overrides = {k: options.pop(f"anarchon_{k}") for k in OVERRIDES if f"anarchon_{k}" in options}
    unknown = sorted(k for k in options if k.startswith("anarchon_"))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(unknown)};"
            f" known: {', '.join('anarchon_' + k for k in OVERRIDES)}"
        )
    return Entry(name, task, every, cron, timezone, tuple(args), dict(kwargs), options, overrides)


def _field(value: Any) -> str:
    """A crontab field as cron text: Celery also takes ints, lists and sets."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(str(v) for v in sorted(value, key=str))
    return str(value).replace(" ", "")


def _schedule(
    where: str, value: Any, app_timezone: str
) -> tuple[float | None, str | None, str | None]:
    if isinstance(value, bool) or value is None:
        raise ConfigurationError(f"{where}: 'schedule' is missing")
    if isinstance(value, (int, float)):
        return float(value), None, None
    if isinstance(value, timedelta):
        return value.total_seconds(), None, None
    if isinstance(value, solar):
        raise ConfigurationError(f"{where}: solar schedules are not supported by anarchon")
    if isinstance(value, crontab):
        fields = [
            _field(f)
            for f in (
                value._orig_minute,
                value._orig_hour,
                value._orig_day_of_month,
                value._orig_month_of_year,
                value._orig_day_of_week,
            )
        ]
        if fields[2] != "*" and fields[4] != "*":
            # Celery requires both to match; classic cron, which anarchon follows, either.
            raise ConfigurationError(
                f"{where}: crontab with both day_of_month and day_of_week restricted is not"
                " supported (Celery needs both to match, cron either): split it in two entries"
            )
        return None, " ".join(fields), app_timezone
    if isinstance(value, schedule):
        return value.run_every.total_seconds(), None, None
    raise ConfigurationError(f"{where}: unsupported schedule {value!r}")
