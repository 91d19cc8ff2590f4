"""Beat's schedule as the engine's jobs: each entry added, changed, removed, or refused once.

Beat's ``schedule`` dict may change at any time (``add()``,
``update_from_dict()``, or code that edits it directly). :class:`EntryJobs`
compares it with what the engine schedules and brings the engine in line: an
entry whose fields changed becomes a new job; an invalid entry is logged once
and left unscheduled until it changes again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry

from anarchon_core import ConfigurationError, Job, Run
from anarchon_core import Scheduler as Engine
from anarchon_core.handoff import check_pickup
from anarchon_core.once import once_schedule
from anarchon_core.schedules import make_schedule

from .owned import UNDECIDED, Owners, check_store, probe
from .schedules import Entry, read_schedule_entry
from .settings import BeatSettings, timezone_of

log = logging.getLogger(__name__)


def entry_fields(entry: ScheduleEntry) -> tuple[Any, ...]:
    """What makes an entry's job: compared to notice an entry changed in place."""
    args, kwargs, options = entry.args or (), entry.kwargs or {}, entry.options or {}
    return (
        entry.task,
        tuple(args) if isinstance(args, (list, tuple)) else args,
        dict(kwargs) if isinstance(kwargs, Mapping) else kwargs,
        dict(options) if isinstance(options, Mapping) else options,
        entry.schedule,
        getattr(entry, "row_schedule", None),
    )


@dataclass
class ScheduledEntry:
    """An entry of ``schedule`` as scheduled: the entry, its fields then, anarchon's reading."""

    entry: ScheduleEntry
    seen: tuple[Any, ...]
    spec: Entry


def check_entry(
    entry: ScheduleEntry, where: str, app: Celery, settings: BeatSettings | None
) -> Entry:
    """anarchon's reading of ``entry``, or a ConfigurationError naming it.

    Without ``settings`` (beat not set up yet), only the entry's own fields
    are checked: the settings are checked with it at setup.
    """
    row = getattr(entry, "row_schedule", None)
    spec = (
        row.spec()
        if row is not None
        else read_schedule_entry(entry, timezone_of(app), where, owned=True)
    )
    if spec.decides is not None:  # its due times come from its own is_due: it must answer
        probe(where, spec.decides, entry.schedule)
    if settings is None:
        return spec
    try:
        options = settings.defaults.merged(**spec.job_options)
        schedule = (
            once_schedule(spec.at)
            if spec.at is not None
            else make_schedule(**UNDECIDED)
            if spec.decides is not None
            else make_schedule(
                every=spec.every,
                cron=spec.cron,
                timezone=spec.timezone,
                anchor=None
                if spec.anchor is None
                else datetime.fromtimestamp(spec.anchor, timezone.utc),
                **spec.bounds,
            )
        )
        Job.check(spec.name, schedule, options)
        check_pickup(settings.pickup, options.lease, name="anarchon_pickup")
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    return spec


def where_of(name: str, entry: Any) -> str:
    """How messages name an entry: its row of a database schedule, or its beat_schedule key."""
    if getattr(entry, "row_schedule", None) is not None:
        return f"PeriodicTask {name!r}"
    return f"beat_schedule[{name!r}]"


#: Makes the handler of an entry's job: it sends the entry's task for each run.
Dispatcher = Callable[[ScheduledEntry, Engine], Callable[[Run], None]]


class EntryJobs:
    """The jobs of one engine, kept in line with beat's ``schedule``."""

    def __init__(
        self, engine: Engine, app: Celery, settings: BeatSettings, dispatcher: Dispatcher
    ) -> None:
        self.engine = engine
        self.app = app
        self.settings = settings
        self.jobs: dict[str, ScheduledEntry] = {}
        self._refused: dict[str, tuple[Any, ...]] = {}
        #: The row entries applied (scheduled or refused), by name: see _remember_row.
        self._rows: dict[str, Any] = {}
        self._dispatcher = dispatcher
        #: The entries whose due times their schedule decides: their owner leases.
        self.owners = Owners(engine, app)

    def apply(self, schedule: Mapping[str, Any], strict: bool = False) -> None:
        """Make the engine's jobs those of ``schedule``: add, replace and remove.

        ``strict``: raise on an invalid entry of the configuration; otherwise,
        and always for a row of a database schedule, it is logged (once) and
        left unscheduled.
        """
        current = dict(schedule)
        for name in [n for n in self.jobs if n not in current]:
            self._remove(name)
            log.info("anarchon: entry %s removed", name)
        self._rows = {
            name: entry for name, entry in self._rows.items() if current.get(name) is entry
        }
        rows = self._rows
        for name, entry in current.items():
            if rows.get(name) is entry:
                continue  # the very row entry applied before: rows never change in place
            job = self.jobs.get(name)
            if isinstance(entry, ScheduleEntry):
                seen = entry_fields(entry)
                if job is not None and seen == job.seen:
                    job.entry = entry  # an equal entry (beat's reserve() replaces them)
                    self._remember_row(name, entry)
                    continue
                if self._refused.get(name) == seen:
                    self._remember_row(name, entry)
                    continue
            else:
                seen = (entry,)
            try:
                new = self._schedule(name, entry, seen, job)
            except ConfigurationError as exc:
                if strict and getattr(entry, "row_schedule", None) is None:
                    raise
                self._refused[name] = seen
                self._remember_row(name, entry)
                if name in self.jobs:
                    self._remove(name)
                log.error("anarchon: %s; the entry is not scheduled", exc)
                continue
            self._remember_row(name, entry)
            if new is None:
                continue
            self._refused.pop(name, None)
            self.jobs[name] = new
            if not strict:
                log.info("anarchon: entry %s %s", name, "changed" if job else "added")

    def _remember_row(self, name: str, entry: Any) -> None:
        """A row's entry, once applied, is skipped while the same object comes again.

        A database schedule hands over thousands of rows at every step; each
        row's entry is a new object only when the row was read again.
        """
        if getattr(entry, "row_schedule", None) is not None:
            self._rows[name] = entry
        else:
            self._rows.pop(name, None)

    def _schedule(
        self, name: str, entry: Any, seen: tuple[Any, ...], job: ScheduledEntry | None
    ) -> ScheduledEntry | None:
        """The new job of ``entry`` (replacing ``job``), or None if ``job`` still fits it."""
        where = where_of(name, entry)
        if not isinstance(entry, ScheduleEntry):
            got = type(entry).__name__
            raise ConfigurationError(f"{where}: expected a ScheduleEntry, not {got}")
        spec = check_entry(entry, where, self.app, self.settings)
        if job is not None and spec == job.spec:
            job.entry, job.seen = entry, seen
            return None
        if job is not None:
            self._remove(name)
        new = ScheduledEntry(entry, seen, spec)
        if spec.decides is not None:
            check_store(self.engine.store, where, spec.decides)
        try:
            if spec.decides is not None:  # its due times decided by one beat at a time
                self._own(name, new)
                return new
            if spec.at is not None:  # a one-off: kept in the store until its time
                self.engine.once(
                    name, spec.at, self._dispatcher(new, self.engine), **spec.job_options
                )
                return new
            self.engine.add_job(
                self._dispatcher(new, self.engine),
                name=name,
                every=spec.every,
                cron=spec.cron,
                timezone=spec.timezone,
                anchor=None
                if spec.anchor is None
                else datetime.fromtimestamp(spec.anchor, timezone.utc),
                **spec.overrides,
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        return new

    def _own(self, name: str, new: ScheduledEntry) -> None:
        """Declare ``new``'s job, whose due times its owner decides (:mod:`.owned`)."""
        spec, engine = new.spec, self.engine
        kind = spec.decides or "?"
        engine.add_job(
            self._dispatcher(new, engine), name=name, **UNDECIDED, **spec.job_options, **spec.rules
        )
        lease = self.settings.defaults.merged(**spec.job_options).lease
        self.owners.add(name, new, lease)
        log.info(
            "anarchon: entry %s: its schedule (%s) decides its own due times: sent by one beat"
            " at a time under a lease (takeover after %gs), not on a shared grid",
            name,
            kind,
            lease,
        )

    def _remove(self, name: str) -> None:
        # A one-off row (django-celery-beat) is disabled by the beat that sends its
        # slot, just before the send: the other beats see it go while that slot may
        # still be claimed or running. They keep watching it, so that if that beat
        # dies before its send, one of them takes the slot over and sends it.
        row = getattr(self.jobs[name].entry, "row_schedule", None)
        self.engine.remove_job(name, keep_watching=bool(getattr(row, "one_off", False)))
        self.owners.remove(name)
        del self.jobs[name]
