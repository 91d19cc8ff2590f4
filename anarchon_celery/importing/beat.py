"""A ``beat_schedule`` mapping, or a Celery app's, as entries to import.

``module:attribute`` names a dict of ``beat_schedule`` items, or a Celery
app whose ``conf.beat_schedule`` is read (its crontab entries in the app's
time zone). Each item is read by :func:`~anarchon_celery.schedules.read_entry`,
as anarchon's beat reads it; an item it refuses (a solar schedule, a
relative interval...) is skipped with its reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from celery import Celery

from anarchon_core.control import Definition
from anarchon_core.errors import ConfigurationError

from ..schedules import read_entry
from ..settings import timezone_of
from .plan import Source, carried, definition_of


def load(target: str) -> Any:
    """The object ``module:attribute`` names (the attribute may be dotted)."""
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigurationError(
            f"--beat-schedule {target!r}: expected module:attribute, e.g. proj.celery:app"
        )
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--beat-schedule {target!r}: cannot import it: {exc}") from None
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise ConfigurationError(
                f"--beat-schedule {target!r}: {module_name} has no attribute {attribute!r}"
            )
        value = getattr(value, part)
    return value


def read_beat_schedule(target: str, timezone: str | None = None) -> Source:
    """The entries of the ``beat_schedule`` that ``target`` names.

    Crontab entries are read in ``timezone``, else in the app's time zone
    (``app.conf.timezone``, UTC if unset), else in UTC for a plain dict.
    """
    value = load(target)
    if isinstance(value, Celery):
        schedule = value.conf.beat_schedule or {}
        zone = timezone or timezone_of(value)
        what = f"the beat_schedule of the Celery app {target}"
    elif isinstance(value, Mapping):
        schedule, zone = value, timezone or "UTC"
        what = f"the beat_schedule {target}"
    else:
        raise ConfigurationError(
            f"--beat-schedule {target!r}: a {type(value).__name__}, not a dict of"
            " beat_schedule entries or a Celery app"
        )
    found = [carried(str(name), _definition, name, raw, zone) for name, raw in schedule.items()]
    return Source(what, tuple(found))


def _definition(name: Any, raw: Any, zone: str) -> Definition:
    return definition_of(read_entry(name, raw, zone))
