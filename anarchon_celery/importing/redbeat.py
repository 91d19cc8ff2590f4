"""celery-redbeat's entries in Redis, as entries to import.

redbeat keeps each entry in a hash ``<prefix><name>`` whose ``definition``
field is JSON: ``name``, ``task``, ``args``, ``kwargs``, ``options``,
``enabled``, and ``schedule``, a Celery schedule encoded as an object with a
``__type__`` (``interval``: ``every`` seconds and ``relative``; ``crontab``:
its five fields; ``rrule``: a dateutil recurrence rule). The entries are the
members of the sorted set ``<prefix>:schedule``. The names in
``<prefix>:statics`` are the app's ``beat_schedule`` entries, which redbeat
copies into Redis at each start: they stay in code, and are not imported.

Each schedule is decoded into Celery's own schedule object and read by
:func:`~anarchon_celery.schedules.read_entry`, as beat reads a
``beat_schedule`` entry (crontab entries in the app's time zone, which the
command is told). Disabled entries are skipped, and so are those that cannot
be carried, with the reason: an ``rrule`` schedule, a relative interval,
arguments or options holding values redbeat encodes that are not JSON (a
datetime; except in ``anarchon_start`` and ``anarchon_end``, the bounds of
the entry's slots, which become the stored schedule's ``start`` and ``end``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import redis
from celery.schedules import crontab, schedule

from anarchon_core.control import Definition
from anarchon_core.errors import ConfigurationError, StoreUnavailable
from anarchon_core.urls import redact, scrub, secrets_in

from ..schedules import read_entry
from .plan import Found, Source, carried, definition_of

#: redbeat's default ``redbeat_key_prefix``.
PREFIX = "redbeat:"
#: The entry options that bound its slots (a datetime here is read, not refused).
BOUND_OPTIONS = ("anarchon_start", "anarchon_end")


@dataclass(frozen=True)
class Encoded:
    """A value redbeat encoded as ``{"__type__": kind, ...fields}``."""

    kind: str
    fields: dict[str, Any]


def read_redbeat(url: str, prefix: str = PREFIX, timezone: str = "UTC") -> Source:
    """The entries redbeat keeps under ``prefix`` in the Redis at ``url``.

    StoreUnavailable if that Redis cannot be reached (or refuses the
    connection); ConfigurationError for a bad URL, or keys that are not
    redbeat's.
    """
    try:
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
    except ValueError as exc:
        raise ConfigurationError(f"--redbeat {redact(url)}: {_scrubbed(exc, url)}") from None
    try:
        # The sorted set holds every entry's key, scored by its due time.
        keys = [
            _text(key) for key in cast("list[bytes]", client.zrange(prefix + ":schedule", 0, -1))
        ]
        statics = {_text(name) for name in client.smembers(prefix + ":statics")}
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "definition")
            texts = pipe.execute()
    except redis.ResponseError as exc:
        raise ConfigurationError(
            f"redbeat's Redis {redact(url)} (prefix {prefix!r}) answered: {_scrubbed(exc, url)}"
        ) from None
    except redis.RedisError as exc:
        raise StoreUnavailable(f"redbeat's Redis {redact(url)}: {_scrubbed(exc, url)}") from None
    finally:
        client.close()
    found = []
    for key, text in zip(keys, texts, strict=True):
        name = key[len(prefix) :]
        if text is None:  # deleted since the sorted set was read, or never saved whole
            found.append(Found(name, skipped="cannot be carried: its hash has no definition"))
        else:
            found.append(_found(name, _text(text), timezone, statics))
    what = f"redbeat at {redact(url)} (prefix {prefix!r})"
    return Source(what, tuple(sorted(found, key=lambda f: f.name)))


def _found(name: str, text: str, zone: str, statics: set[str]) -> Found:
    """The entry whose redbeat definition is ``text``."""
    try:
        data = json.loads(text, object_hook=_tagged)
    except ValueError as exc:
        return Found(name, skipped=f"cannot be carried: its definition is not JSON ({exc})")
    if not isinstance(data, dict):
        return Found(name, skipped="cannot be carried: its definition is not a JSON object")
    name = str(data.get("name") or name)
    if name in statics:
        return Found(name, skipped="an entry of the app's beat_schedule (redbeat's statics):"
                     " it stays in code")  # fmt: skip
    if data.get("enabled", True) is False:
        return Found(name, skipped="disabled")
    return carried(name, _definition, name, data, zone)


def _definition(name: str, data: dict[str, Any], zone: str) -> Definition:
    where = f"redbeat entry {name!r}"
    options = data.get("options")
    if isinstance(options, dict):  # a datetime saved as a bound: redbeat encoded it
        data = dict(data, options={k: _bound(where, k, v) for k, v in options.items()})
    for field in ("args", "kwargs", "options"):
        kinds = _encoded_kinds(data.get(field))
        if kinds:
            raise ConfigurationError(
                f"{where}: its {field} hold a {', '.join(sorted(kinds))} value, which is not JSON"
            )
    raw = {
        "task": data.get("task"),
        "schedule": _schedule(where, data.get("schedule")),
        "args": data.get("args"),
        "kwargs": data.get("kwargs"),
        "options": data.get("options"),
    }
    return definition_of(read_entry(name, raw, zone, where=where))


def _schedule(where: str, value: Any) -> Any:
    """Celery's schedule object for redbeat's encoding of it (read_entry judges it)."""
    if not isinstance(value, Encoded):
        return value
    fields = value.fields
    try:
        if value.kind == "interval":
            every = timedelta(seconds=float(fields["every"]))
            return schedule(run_every=every, relative=bool(fields.get("relative")))
        if value.kind == "crontab":
            return crontab(**fields)
    except (KeyError, TypeError, ValueError) as exc:
        said = f"{where}: its {value.kind} schedule is unreadable: {exc}"
        raise ConfigurationError(said) from None
    if value.kind == "rrule":
        raise ConfigurationError(
            f"{where}: an rrule schedule (a dateutil recurrence rule) is not a grid or a cron"
            " expression, so anarchon cannot compute its slots; use an interval or a crontab"
        )
    raise ConfigurationError(f"{where}: a schedule of type {value.kind!r} is not supported")


def _bound(where: str, option: str, value: Any) -> Any:
    """An ``anarchon_start`` or ``anarchon_end`` option's datetime, which redbeat encodes as
    ``{"__type__": "datetime", "year": ..., "timezone": <zone name or offset seconds>}``."""
    if option not in BOUND_OPTIONS or not isinstance(value, Encoded) or value.kind != "datetime":
        return value
    fields = dict(value.fields)
    zone = fields.pop("timezone", "UTC")
    try:
        if isinstance(zone, (int, float)):
            tz: tzinfo = dt_timezone(timedelta(seconds=zone))
        else:
            tz = ZoneInfo(str(zone))
        return datetime(tzinfo=tz, **fields)
    except (TypeError, ValueError, KeyError, ZoneInfoNotFoundError) as exc:
        raise ConfigurationError(
            f"{where}: its {option} is not a readable datetime: {exc}"
        ) from None


def _tagged(data: dict[str, Any]) -> Any:
    if "__type__" not in data:
        return data
    fields = dict(data)
    return Encoded(str(fields.pop("__type__")), fields)


def _encoded_kinds(value: Any) -> set[str]:
    """The kinds of the redbeat-encoded values in ``value``, at any depth."""
    if isinstance(value, Encoded):
        return {value.kind}
    if isinstance(value, dict):
        return set().union(*map(_encoded_kinds, value.values()))
    if isinstance(value, list):
        return set().union(*map(_encoded_kinds, value))
    return set()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _scrubbed(exc: Exception, url: str) -> str:
    said = str(exc) or type(exc).__name__
    for secret in secrets_in(url):
        said = scrub(said, secret)
    return said
