"""django-celery-beat's ``PeriodicTask`` rows, as entries to import.

Read either with plain SQL from a database URL (PostgreSQL through psycopg,
MySQL or MariaDB through PyMySQL: the tables ``django_celery_beat_periodictask``
and its ``_intervalschedule``, ``_crontabschedule``, ``_solarschedule`` and
``_clockedschedule``), or through Django's ORM with the project's settings
module. Either way each row becomes a :class:`~anarchon_celery.rows.Row` and
is read by :func:`~anarchon_celery.rows.read_row`, as anarchon's beat reads
it.

A row's ``start_time`` becomes the stored schedule's ``start`` (no slot
before it; an interval's grid stays anchored at it, as anarchon's beat runs
the row), its ``expires`` the ``end`` (the last millisecond before it: a
slot at ``expires`` itself does not run) and the ``expires`` send option,
and its ``expire_seconds`` the ``expires`` send option in seconds, counted
from the slot's time. A stored schedule has no one-off run yet, so
``one_off`` and clocked rows are skipped, naming it, and so is a row whose
``expires`` has passed (nothing of it runs any more). Disabled rows are
skipped as ``disabled``; solar rows with :func:`read_row`'s reason.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

from anarchon_core.control import Definition
from anarchon_core.errors import ConfigurationError, MissingDependency, StoreUnavailable
from anarchon_core.urls import redact, scrub, secrets_in

from ..rows import Row, RowSchedule, read_row, row_from_mapping
from .plan import Found, Source, carried, definition_of

_MS = timedelta(milliseconds=1)
#: Every row with its schedule's columns, under the names :func:`row_of` reads.
QUERY = """
SELECT t.id, t.name, t.task, t.enabled, t.one_off, t.args, t.kwargs, t.queue, t.exchange,
       t.routing_key, t.priority, t.headers, t.expires, t.expire_seconds, t.start_time,
       t.last_run_at, t.total_run_count,
       i.every AS interval_every, i.period AS interval_period,
       c.minute AS cron_minute, c.hour AS cron_hour, c.day_of_month AS cron_day_of_month,
       c.month_of_year AS cron_month_of_year, c.day_of_week AS cron_day_of_week,
       c.timezone AS cron_timezone,
       s.event AS solar_event, s.latitude AS solar_latitude, s.longitude AS solar_longitude,
       k.clocked_time
FROM django_celery_beat_periodictask t
LEFT JOIN django_celery_beat_intervalschedule i ON i.id = t.interval_id
LEFT JOIN django_celery_beat_crontabschedule c ON c.id = t.crontab_id
LEFT JOIN django_celery_beat_solarschedule s ON s.id = t.solar_id
LEFT JOIN django_celery_beat_clockedschedule k ON k.id = t.clocked_id
ORDER BY t.name
"""
#: A ``PeriodicTask``'s own columns, as :data:`QUERY` names them.
COLUMNS = (
    "id", "name", "task", "enabled", "one_off", "args", "kwargs", "queue", "exchange",
    "routing_key", "priority", "headers", "expires", "expire_seconds", "start_time",
    "last_run_at", "total_run_count",
)  # fmt: skip
_NO_TABLES = "are django-celery-beat's tables there, migrated to its current version?"


def row_of(values: Mapping[str, Any]) -> Row:
    """The :class:`Row` of one result of :data:`QUERY` (or the same names from the ORM)."""
    interval = crontab = solar = None
    if values["interval_every"] is not None:
        interval = (int(values["interval_every"]), str(values["interval_period"]))
    if values["cron_minute"] is not None:
        fields = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        zone = str(values["cron_timezone"] or "UTC")
        crontab = (*(str(values[f"cron_{name}"]) for name in fields), zone)
    if values["solar_event"] is not None:
        solar = (
            str(values["solar_event"]),
            float(values["solar_latitude"]),
            float(values["solar_longitude"]),
        )
    return row_from_mapping(
        {
            **values,
            "enabled": bool(values["enabled"]),
            "one_off": bool(values["one_off"]),
            "interval": interval,
            "crontab": crontab,
            "solar": solar,
            "clocked": values["clocked_time"],
        }
    )


def found_of(row: Row, now: datetime) -> Found:
    """What importing ``row`` at ``now`` finds: its stored schedule, or why it has none."""
    if not row.enabled:
        return Found(row.name, skipped="disabled")
    try:
        schedule = read_row(row)
    except ConfigurationError as exc:
        return Found(row.name, skipped=f"cannot be carried: {exc}")
    if schedule.expires is not None and schedule.expires <= now:
        return Found(
            row.name,
            skipped=f"expired: its expires {schedule.expires.isoformat()} has passed,"
            " so no slot of it runs any more",
        )
    why = _not_carried(schedule)
    if why is not None:
        return Found(row.name, skipped=f"cannot be carried: {why}")
    return carried(row.name, _definition, schedule)


def _not_carried(schedule: RowSchedule) -> str | None:
    """What of the row a stored schedule cannot hold yet, or None."""
    if schedule.clocked is not None:
        return (
            f"a clocked row (one run at {schedule.clocked.isoformat()}): stored schedules"
            " have no one-off runs yet (`anarchon trigger` runs a job once)"
        )
    if schedule.one_off:
        return "one_off: stored schedules have no one-off runs yet"
    return None


def _definition(schedule: RowSchedule) -> Definition:
    """The stored schedule of a row: its entry, bounded by ``start_time`` and ``expires``,
    each task sent with the row's expiry (as anarchon's beat sends it)."""
    entry, expires = schedule.entry, schedule.expires
    options = dict(entry.options)
    if schedule.expire_seconds is not None:  # counted from the slot's time
        seconds = schedule.expire_seconds
        options["expires"] = int(seconds) if seconds.is_integer() else seconds
    elif expires is not None:
        options["expires"] = expires.isoformat()
    start = None if schedule.start is None else _ceil_ms(schedule.start)
    end = None if expires is None else _ceil_ms(expires) - _MS
    return definition_of(replace(entry, options=options), start, end)


def _ceil_ms(when: datetime) -> datetime:
    """``when`` rounded up to a whole millisecond, as slots are."""
    extra = when.microsecond % 1000
    return when + timedelta(microseconds=1000 - extra) if extra else when


def read_tables(url: str, now: datetime) -> Source:
    """The rows of django-celery-beat's tables in the database at ``url``.

    ``postgresql://`` (any libpq URL: ``?options=-csearch_path%3Dapp`` for a
    schema) or ``mysql://`` / ``mariadb://`` (user, password, host, port,
    database). StoreUnavailable if the database cannot be reached or
    refuses the connection; ConfigurationError for another URL, or
    without the tables.
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("postgresql", "postgres"):
        results = _postgres(url)
    elif scheme in ("mysql", "mariadb"):
        results = _mysql(url)
    else:
        raise ConfigurationError(
            f"--django-db {redact(url)}: expected a postgresql:// or mysql:// URL"
        )
    found = tuple(found_of(row_of(values), now) for values in results)
    return Source(f"django-celery-beat's tables at {redact(url)}", found)


def _postgres(url: str) -> list[dict[str, Any]]:
    try:
        import psycopg
        from psycopg.rows import dict_row
    except ImportError:
        raise MissingDependency(
            "--django-db postgresql://: pip install anarchon[postgres]"
        ) from None
    try:
        conn = psycopg.connect(url, connect_timeout=5, autocommit=True, row_factory=dict_row)
    except psycopg.Error as exc:
        raise StoreUnavailable(_said(url, exc)) from None
    try:
        with conn.cursor() as cur:
            cur.execute(QUERY)
            return list(cur.fetchall())
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(_said(url, exc)) from None
    except psycopg.Error as exc:
        raise ConfigurationError(f"{_said(url, exc)}: {_NO_TABLES}") from None
    finally:
        conn.close()


def _mysql(url: str) -> list[dict[str, Any]]:
    try:
        import pymysql
        import pymysql.cursors
    except ImportError:
        raise MissingDependency("--django-db mysql://: needs anarchon[mysql]") from None
    parts = urlsplit(url)
    try:
        port = parts.port or 3306
    except ValueError as exc:
        raise ConfigurationError(f"--django-db {redact(url)}: {exc}") from None
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigurationError(f"--django-db {redact(url)}: name the database, e.g. /app")
    try:
        conn = pymysql.connect(
            host=parts.hostname or "localhost",
            port=port,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=database,
            connect_timeout=5,
            read_timeout=30,
            charset="utf8mb4",
            cursorclass=pymysql.cursors.DictCursor,
        )
    except pymysql.Error as exc:
        raise StoreUnavailable(_said(url, exc)) from None
    try:
        with conn.cursor() as cur:
            cur.execute(QUERY)
            return list(cur.fetchall())
    except pymysql.OperationalError as exc:
        raise StoreUnavailable(_said(url, exc)) from None
    except pymysql.Error as exc:
        raise ConfigurationError(f"{_said(url, exc)}: {_NO_TABLES}") from None
    finally:
        conn.close()


def read_models(settings: str, now: datetime) -> Source:
    """The rows of django-celery-beat's models, through Django with ``settings``
    (a settings module, as ``DJANGO_SETTINGS_MODULE`` names one)."""
    try:
        import django
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        raise MissingDependency("--django-settings: Django is not installed") from None
    os.environ["DJANGO_SETTINGS_MODULE"] = settings
    try:
        django.setup()
        from django.db import DatabaseError, OperationalError
        from django_celery_beat.models import PeriodicTask
    except (ImportError, ImproperlyConfigured) as exc:
        raise ConfigurationError(f"--django-settings {settings}: {exc}") from None
    try:
        tasks = list(
            PeriodicTask.objects.select_related("interval", "crontab", "solar", "clocked").order_by(
                "name"
            )
        )
    except OperationalError as exc:
        raise StoreUnavailable(f"the database of {settings}: {exc}") from None
    except DatabaseError as exc:
        raise ConfigurationError(f"the database of {settings}: {exc}: {_NO_TABLES}") from None
    found = tuple(found_of(row_of(_values(task)), now) for task in tasks)
    return Source(f"django-celery-beat's models (settings {settings})", found)


def _values(task: Any) -> dict[str, Any]:
    """A ``PeriodicTask``'s columns, under :data:`QUERY`'s names."""
    values = {name: getattr(task, name) for name in COLUMNS}
    interval, cron, solar, clocked = task.interval, task.crontab, task.solar, task.clocked
    values["interval_every"] = interval.every if interval else None
    values["interval_period"] = interval.period if interval else None
    for name in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week", "timezone"):
        values[f"cron_{name}"] = getattr(cron, name) if cron else None
    for name in ("event", "latitude", "longitude"):
        values[f"solar_{name}"] = getattr(solar, name) if solar else None
    values["clocked_time"] = clocked.clocked_time if clocked else None
    return values


def _said(url: str, exc: Exception) -> str:
    said = str(exc).strip() or type(exc).__name__
    for secret in secrets_in(url):
        said = scrub(said, secret)
    return f"django-celery-beat's database {redact(url)}: {said}"
