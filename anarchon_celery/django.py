"""``beat_scheduler = "anarchon_celery:DatabaseScheduler"``: django-celery-beat's rows, every beat.

For projects whose schedules live in django-celery-beat's tables (edited in
the Django admin): the rows stay where they are and keep their meaning; beat
runs in every pod, and each slot of each enabled ``PeriodicTask`` is sent by
one beat (see :mod:`anarchon_celery.rows` for how a row is read).

- **Changes**: every ``anarchon_django_poll`` seconds (default 2) each beat
  reads django-celery-beat's change marker (``PeriodicTasks``, one row by its
  primary key, written by the admin and by every ``PeriodicTask.save()``);
  only when it moved (or every 5 minutes, for changes made without moving it)
  are the enabled rows read again (one query), and the added, changed,
  disabled and deleted rows applied to the engine.
- **Bookkeeping**: ``last_run_at`` and ``total_run_count`` are written by the
  beat that sends the slot, just before the send (as django-celery-beat
  counts an entry before applying it), once per slot whatever order the
  beats' writes arrive in (a takeover of the same slot does not count it
  again; ``last_run_at`` never moves back). A one-off row (``one_off``, and every clocked row) is
  disabled by the beat that sends it, in the same conditional update that
  makes it the only one: ``UPDATE ... WHERE enabled``.
- **Clocked rows** run once at ``clocked_time``; if every beat was down then,
  the first beat up sends it within the catch-up window (``anarchon_catch_up``,
  else an hour).
- ``beat_schedule`` entries are scheduled from the configuration, as
  :class:`~anarchon_celery.Scheduler` does, and are not written to the
  tables; a row of the same name replaces the entry, and a disabled row of
  that name switches it off (django-celery-beat keeps each entry as a row).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from celery.beat import ScheduleEntry

from anarchon_core import ConfigurationError, DispatchFailed, Run
from anarchon_core import Scheduler as Engine
from anarchon_core.durations import parse_duration
from anarchon_core.jobs import MAX_DEFAULT_CATCH_UP

from .entries import ScheduledEntry
from .rows import Refused, Row, RowSchedule, anchor_of, expiry, read_row, skipped
from .scheduler import Scheduler, embedded

log = logging.getLogger(__name__)

#: How often each beat reads the change marker, by default (seconds).
DEFAULT_POLL = 2.0

#: The rows are read again at least this often (seconds), whatever the marker says:
#: ``QuerySet.update()`` and ``bulk_create()`` change rows without moving it.
FULL_READ = 300.0

#: The columns read for each enabled row: the row's, and its schedule row's.
COLUMNS = {
    "id": "id",
    "name": "name",
    "task": "task",
    "enabled": "enabled",
    "one_off": "one_off",
    "args": "args",
    "kwargs": "kwargs",
    "queue": "queue",
    "exchange": "exchange",
    "routing_key": "routing_key",
    "priority": "priority",
    "headers": "headers",
    "expires": "expires",
    "expire_seconds": "expire_seconds",
    "start_time": "start_time",
    "last_run_at": "last_run_at",
    "total_run_count": "total_run_count",
    "interval__every": None,
    "interval__period": None,
    "crontab__minute": None,
    "crontab__hour": None,
    "crontab__day_of_month": None,
    "crontab__month_of_year": None,
    "crontab__day_of_week": None,
    "crontab__timezone": None,
    "solar__event": None,
    "solar__latitude": None,
    "solar__longitude": None,
    "clocked__clocked_time": None,
}


class RowEntry(ScheduleEntry):  # type: ignore[misc]
    """A ``PeriodicTask`` row as beat's entry: anarchon's reading of it rides along."""

    def __init__(
        self, *args: Any, row_schedule: RowSchedule | Refused | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.row_schedule = row_schedule


def _setup_django() -> None:
    """Make sure Django is set up (Celery's Django fix-up usually did it already)."""
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def _forget_inherited_connections() -> None:
    """Drop the database connections a forked process inherited, without a word to the server.

    ``celery worker -B`` forks beat from the worker: a connection the worker
    had opened would be one socket shared by two processes. Closing it
    properly would end the worker's session too, so only this process's
    descriptor is closed, and Django connects afresh on the next query (as
    Celery's own Django fix-up does for the worker's pool processes).
    """
    import os

    from django.db import connections

    for connection in connections.all(initialized_only=True):
        raw = getattr(connection, "connection", None)
        if raw is None:
            continue
        with contextlib.suppress(AttributeError, OSError, TypeError, ValueError):
            os.close(raw.fileno())
        connection.connection = None


class Tables:
    """django-celery-beat's tables, as this beat reads and writes them."""

    def __init__(self, forked: bool = False) -> None:
        _setup_django()
        if forked:
            _forget_inherited_connections()
        from django.conf import settings
        from django_celery_beat.models import PeriodicTask, PeriodicTasks

        self.task_model = PeriodicTask
        self.marker_model = PeriodicTasks
        self.use_tz = bool(getattr(settings, "USE_TZ", True))

    def reset(self) -> None:
        """Drop this thread's database connections: the next read opens a new one.

        Beat keeps its connection between polls (it is a daemon, not a
        request); after an error, the next poll starts afresh.
        """
        from django.db import connections

        connections.close_all()

    def marker(self) -> Any:
        """The change marker: one row read by its primary key (None if never written)."""
        return (
            self.marker_model.objects.filter(ident=1).values_list("last_update", flat=True).first()
        )

    def enabled_rows(self, names: list[str]) -> tuple[list[Row], set[str]]:
        """Every enabled row with its schedule row's columns, and which of ``names``
        have a disabled row, in one query."""
        from django.db.models import Q

        rows, off = [], set()
        query = self.task_model.objects.filter(Q(enabled=True) | Q(name__in=names))
        for values in query.values(*COLUMNS):
            if not values["enabled"]:
                off.add(values["name"])
                continue
            fields = {key: values[key] for key, column in COLUMNS.items() if column is not None}
            for key in ("expires", "start_time", "last_run_at"):
                fields[key] = self._aware(fields[key])
            if values["interval__every"] is not None:
                fields["interval"] = (values["interval__every"], values["interval__period"])
            if values["crontab__minute"] is not None:
                fields["crontab"] = (
                    values["crontab__minute"],
                    values["crontab__hour"],
                    values["crontab__day_of_month"],
                    values["crontab__month_of_year"],
                    values["crontab__day_of_week"],
                    str(values["crontab__timezone"] or "UTC"),
                )
            if values["solar__event"] is not None:
                fields["solar"] = (
                    values["solar__event"],
                    values["solar__latitude"],
                    values["solar__longitude"],
                )
            fields["clocked"] = self._aware(values["clocked__clocked_time"])
            rows.append(Row(**fields))
        return rows, off

    def _aware(self, value: datetime | None) -> datetime | None:
        if value is None or value.tzinfo is not None:
            return value
        from django.utils import timezone as django_timezone

        aware: datetime = django_timezone.make_aware(value)  # USE_TZ=False: in TIME_ZONE
        return aware

    def _stored(self, value: datetime) -> datetime:
        if self.use_tz:
            return value
        from django.utils import timezone as django_timezone

        naive: datetime = django_timezone.make_naive(value)
        return naive

    def take_one_off(self, row_id: int, slot: datetime) -> bool:
        """Disable a one-off row for ``slot``: True if ``slot`` is the one it runs.

        The conditional update makes one slot the row's only one, whichever
        beat sends it; a takeover of that same slot finds it recorded.
        """
        from django.db import transaction
        from django.db.models import F

        stored = self._stored(slot)
        with transaction.atomic():
            taken = self.task_model.objects.filter(pk=row_id, enabled=True).update(
                enabled=False,
                last_run_at=stored,
                total_run_count=F("total_run_count") + 1,
            )
            if not taken:
                last = (
                    self.task_model.objects.filter(pk=row_id)
                    .values_list("last_run_at", flat=True)
                    .first()
                )
                return last is not None and self._aware(last) == slot
        self.marker_model.update_changed()  # the other beats drop the row at their next poll
        return True

    def count(self, row_id: int, slot: datetime, attempt: int) -> None:
        """``last_run_at`` and ``total_run_count`` for ``slot``, once whatever the order.

        Counted before the slot is sent, so that a beat killed at its send has
        counted it. The first attempt is the only one that can have counted
        ``slot`` before: it counts unless the row's ``last_run_at`` is
        ``slot``, even after a later slot was counted first (beats' writes can
        arrive out of order). A takeover counts only a slot newer than
        ``last_run_at``: ``last_run_at`` at or past ``slot`` means the first
        attempt counted it. ``last_run_at`` never moves back.
        """
        from django.db.models import Case, DateTimeField, F, Q, Value, When

        stored = self._stored(slot)
        newer = Q(last_run_at__isnull=True) | Q(last_run_at__lt=stored)
        counted = newer if attempt > 1 else newer | Q(last_run_at__gt=stored)
        self.task_model.objects.filter(pk=row_id).filter(counted).update(
            last_run_at=Case(
                When(newer, then=Value(stored, output_field=DateTimeField())),
                default=F("last_run_at"),
            ),
            total_run_count=F("total_run_count") + 1,
        )


def _database_errors() -> tuple[type[BaseException], ...]:
    from django.db import DatabaseError, InterfaceError

    return (DatabaseError, InterfaceError)


class DatabaseScheduler(Scheduler):
    """django-celery-beat's ``PeriodicTask`` rows, each slot sent by one beat of many."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._tables: Tables | None = None
        self._rows: dict[str, RowEntry] = {}
        self._marker: Any = None
        self._polled = float("-inf")
        #: When the rows were last read (monotonic).
        self._read_at = float("-inf")
        #: When the rows must be read again whatever the marker says (a start or an expiry).
        self._due_again: float | None = None
        self._poll = DEFAULT_POLL
        #: Reading the tables failed at the last poll (said once per outage).
        self._failing = False
        #: Rows reported as not run (clocked rows missed by every beat), by row and time.
        self._reported: set[tuple[int, datetime | None]] = set()
        #: Names of beat_schedule entries a row replaces or switches off, reported once.
        self._shadowed: set[str] = set()
        #: Names of configured entries whose row is disabled: not sent.
        self._off: set[str] = set()
        super().__init__(*args, **kwargs)

    def _setup(self) -> None:
        poll = self.app.conf.get("anarchon_django_poll", DEFAULT_POLL)
        self._poll = parse_duration("anarchon_django_poll", poll)
        if self._poll <= 0:
            raise ConfigurationError(f"anarchon_django_poll={poll!r}: must be positive")
        self._tables = Tables(forked=embedded())
        self._rows, self._marker, self._polled, self._due_again = {}, None, float("-inf"), None
        self._read_rows(time.monotonic(), strict=True)
        super()._setup()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """As beat's tick; beat wakes up again by the next poll of the change marker."""
        delay = super().tick(*args, **kwargs)
        if self.engine is None:
            return delay
        return max(0.0, min(delay, self._polled + self._poll - time.monotonic()))

    @property
    def info(self) -> str:
        return super().info + "\n    . schedule -> django-celery-beat's PeriodicTask rows"

    # -- reading the rows -------------------------------------------------

    def _apply_schedule(self, strict: bool = False) -> None:
        with self._lock:
            if self._entries is None:
                return
            now = time.monotonic()
            if not strict and now - self._polled >= self._poll:
                self._poll_rows(now)
            entries: dict[str, Any] = dict(self.schedule)
            for name in self._off & set(entries):
                del entries[name]
                if name not in self._shadowed:
                    self._shadowed.add(name)
                    log.info(
                        "anarchon: the entry %s is not sent: its PeriodicTask row is disabled",
                        name,
                    )
            for name in self._rows:
                if name in entries and name not in self._shadowed:
                    self._shadowed.add(name)
                    log.info(
                        "anarchon: PeriodicTask %r replaces the beat_schedule entry of that name",
                        name,
                    )
            entries.update(self._rows)
            self._entries.apply(entries, strict=strict)

    def _poll_rows(self, now: float) -> None:
        """Read the rows again if the marker moved (or a row's start or expiry came)."""
        self._polled = now
        tables = self._tables
        if tables is None:
            return
        try:
            marker = tables.marker()
            if (
                marker != self._marker
                or (self._due_again is not None and now >= self._due_again)
                or now - self._read_at >= FULL_READ
            ):
                self._read_rows(now)
        except _database_errors() as exc:
            tables.reset()
            if not self._failing:
                self._failing = True
                log.warning(
                    "anarchon: reading django-celery-beat's tables failed (%s: %s); the rows"
                    " read before stay scheduled, and beat tries again every %gs",
                    type(exc).__name__,
                    exc,
                    self._poll,
                )
            return
        if self._failing:
            self._failing = False
            log.info("anarchon: django-celery-beat's tables can be read again")

    def _read_rows(self, now: float, strict: bool = False) -> None:
        tables = self._tables
        assert tables is not None
        try:
            marker = tables.marker()
            # An entry of the configuration is off while a row of its name is disabled,
            # as django-celery-beat (which keeps each entry as a row) has it.
            configured = set(self.schedule) | set(self.app.conf.beat_schedule or {})
            rows, off = tables.enabled_rows(sorted(configured | {"celery.backend_cleanup"}))
        except _database_errors() as exc:
            if strict:
                tables.reset()
                raise ConfigurationError(
                    "cannot read django-celery-beat's tables"
                    f" ({type(exc).__name__}: {exc}); are its migrations applied?"
                ) from None
            raise
        self._marker, self._read_at, self._off = marker, now, off
        self._rows, self._due_again = self._entries_of(rows, now)

    def _entries_of(self, rows: list[Row], now: float) -> tuple[dict[str, RowEntry], float | None]:
        """Beat's entries of the rows to schedule now, and when to read them again at the latest."""
        wall = datetime.now(timezone.utc)
        lead = timedelta(seconds=self._poll + 1.0)
        window = timedelta(seconds=self._catch_up())
        entries: dict[str, RowEntry] = {}
        again: list[datetime] = []
        for row in rows:
            try:
                schedule = read_row(row)
            except ConfigurationError as exc:
                # An entry anarchon cannot run: EntryJobs logs it, once, and runs the others.
                entries[row.name] = self._refused_entry(row, exc)
                continue
            if schedule.expires is not None:
                if schedule.expires <= wall:
                    continue
                again.append(schedule.expires)
            if schedule.clocked is not None and schedule.clocked <= wall:
                if wall - schedule.clocked > window:
                    self._report_missed(row, schedule, window)
                    continue
                schedule = _caught_up(schedule)
            elif schedule.start is not None and schedule.start - wall > lead:
                again.append(schedule.start - lead)
                continue
            if schedule.clocked is not None:
                # Read again after its time: still enabled then, it was not sent (this
                # beat may have scheduled it too late for its slot), and is caught up.
                again.append(max(schedule.clocked, wall) + lead)
            entries[row.name] = self._row_entry(schedule)
        due_again = None
        if again:
            due_again = now + max(0.0, (min(again) - wall).total_seconds())
        return entries, due_again

    def _catch_up(self) -> float:
        settings = self.settings
        if settings is not None and settings.defaults.catch_up is not None:
            return settings.defaults.catch_up
        if settings is None:
            configured = self.app.conf.get("anarchon_catch_up")
            if configured is not None:
                return parse_duration("anarchon_catch_up", configured)
        return MAX_DEFAULT_CATCH_UP

    def _report_missed(self, row: Row, schedule: RowSchedule, window: timedelta) -> None:
        key = (row.id, schedule.clocked)
        if key in self._reported:
            return
        self._reported.add(key)
        log.warning(
            "anarchon: PeriodicTask %r (clocked at %s) was due while no beat ran, more than"
            " the catch-up window (%gs) ago: not sent; it stays enabled until changed",
            row.name,
            schedule.clocked.isoformat() if schedule.clocked else "?",
            window.total_seconds(),
        )

    def _row_entry(self, schedule: RowSchedule) -> RowEntry:
        spec = schedule.entry
        every = spec.every if spec.every is not None else 60.0
        return RowEntry(
            name=spec.name,
            task=spec.task,
            schedule=timedelta(seconds=every),
            args=spec.args,
            kwargs=dict(spec.kwargs),
            options=dict(spec.options),
            app=self.app,
            row_schedule=schedule,
        )

    def _refused_entry(self, row: Row, exc: ConfigurationError) -> RowEntry:
        """An entry that EntryJobs refuses with ``exc``'s reason (a row it cannot run)."""
        return RowEntry(
            name=row.name,
            task=row.task,
            schedule=timedelta(seconds=60),
            app=self.app,
            row_schedule=Refused(row.id, str(exc)),
        )

    # -- sending a slot -----------------------------------------------------

    def send(self, job: ScheduledEntry, run: Run, engine: Engine) -> None:
        """Send a row's slot unless the row says not to, its bookkeeping written first, once."""
        row = getattr(job.entry, "row_schedule", None)
        tables = self._tables
        if not isinstance(row, RowSchedule) or tables is None:
            super().send(job, run, engine)
            return
        why = skipped(row, run.slot)
        if why is not None:
            log.info(
                "anarchon: PeriodicTask %r: slot %s not sent: %s", job.entry.name, run.slot, why
            )
            return
        if row.one_off:
            try:
                mine = tables.take_one_off(row.row_id, run.slot)
            except _database_errors() as exc:
                tables.reset()
                raise DispatchFailed(
                    f"could not record the one-off run in the table: {exc}"
                ) from exc
            if not mine:
                log.info(
                    "anarchon: one-off PeriodicTask %r already ran; slot %s not sent",
                    job.entry.name,
                    run.slot,
                )
                return
        else:
            self._count(tables, row, job.entry.name, run)
        super().send(job, run, engine)

    def _count(self, tables: Tables, row: RowSchedule, name: str, run: Run) -> None:
        """The row's bookkeeping for ``run``'s slot, written before its send.

        A table that cannot be written does not hold the send up: the slot is
        sent, and the row's count misses it (logged).
        """
        try:
            tables.count(row.row_id, run.slot, run.attempt)
        except _database_errors() as exc:
            tables.reset()
            log.warning(
                "anarchon: PeriodicTask %r: slot %s is sent, but its last_run_at and"
                " total_run_count could not be written (%s)",
                name,
                run.slot,
                exc,
            )

    def _expiry(self, job: ScheduledEntry, run: Run) -> Any:
        """A row's task expires as the row says (:func:`~anarchon_celery.rows.expiry`)."""
        row = getattr(job.entry, "row_schedule", None)
        if isinstance(row, RowSchedule):
            return expiry(row, run.slot)
        return super()._expiry(job, run)


def _caught_up(schedule: RowSchedule) -> RowSchedule:
    """A clocked row whose time passed while no beat ran: a slot every second until sent."""
    from dataclasses import replace

    clocked = schedule.clocked
    assert clocked is not None
    return replace(schedule, entry=replace(schedule.entry, every=1.0, anchor=anchor_of(clocked)))


def rows_of(schedule: Mapping[str, Any]) -> dict[str, RowSchedule]:
    """The rows among beat's entries (for status and tests)."""
    return {
        name: entry.row_schedule
        for name, entry in schedule.items()
        if isinstance(getattr(entry, "row_schedule", None), RowSchedule)
    }
