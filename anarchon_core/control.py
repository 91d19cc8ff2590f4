"""Runtime control of a namespace through its store, with or without a scheduler running.

:class:`Control` is what admin scripts, the ``anarchon`` command and the
Celery and Dramatiq commands use; :class:`~anarchon_core.Scheduler` offers the
same verbs on its own store. Every decision lives in the shared store, so
every instance sees it at its next claim: a pause is read inside the claim's
own atomic step (see :meth:`anarchon_core.store.Store.claim`).
"""

from __future__ import annotations

import getpass
import json
import socket
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from . import pauses
from .declarations import Declared, DeclaredJobs, Reader
from .errors import ConfigurationError, Conflict
from .errors import JobPaused as JobPaused  # defined with every error; importable here as before
from .errors import UnknownJob as UnknownJob
from .jobs import JobOptions, Rules
from .names import check_name
from .once import entry_value
from .schedules import Schedule, Upcoming, make_schedule, moment, preview
from .slots import BACKFILL, LANE, Slot, lane_records, record_job
from .store import (
    ControlStore,
    InstanceRecord,
    JobState,
    JobStats,
    OnceEntry,
    OnceStore,
    Paused,
    RegistryStore,
    RunRecord,
    Store,
    onces,
)

T = TypeVar("T")

#: Prefixes of the control entries: run-now requests, the marks of slots run on
#: request, and the schedules defined in the store.
RUN_NOW, MANUAL, DEFINED, FILL, CATCH_UP = "run/", "manual/", "def/", "fill/", "catchup/"
#: Seconds ahead of the request that a run-now slot is due: every instance (each
#: reads the requests once a second) knows of it before its time, so none claims
#: a scheduled slot after it first.
RUN_NOW_LEAD = 2.0
#: The options a stored schedule may set, as in ``Scheduler.add_job``.
OPTIONS = ("lease", "renew", "jitter", "catch_up", "watch")
#: The rules a stored schedule may set (see :class:`~anarchon_core.Rules`).
RULES = ("overlap", "limit", "pause_on_failure")


@dataclass(frozen=True)
class Definition:
    """A job whose schedule lives in the store, read by every instance at run time.

    ``handler`` names code, never holds it: a handler registered with
    :meth:`Scheduler.handler <anarchon_core.Scheduler.handler>` (core), a Celery
    task's name, a Dramatiq actor's name. ``args``, ``kwargs`` and ``options``
    are JSON values passed to it (Celery: ``apply_async`` options; Dramatiq:
    message options). ``job_options`` holds ``lease``, ``renew``, ``jitter``,
    ``catch_up``, ``watch`` in seconds. ``start`` and ``end`` (aware
    datetimes or ISO 8601 strings with an offset, kept as ISO strings in
    UTC) bound its slots, both included, as ``Scheduler.add_job``'s.
    ``version`` is the store's (0 before it was written).
    """

    name: str
    handler: str
    every: float | None = None
    cron: str | None = None
    timezone: str | None = None
    #: Unix seconds of the every= grid's anchor (default: the Unix epoch).
    anchor: float | None = None
    #: No slot before it (ISO 8601 with its offset; an aware datetime is accepted).
    start: datetime | str | None = None
    #: No slot after it (ISO 8601 with its offset; an aware datetime is accepted).
    end: datetime | str | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    job_options: Mapping[str, float] = field(default_factory=dict)
    #: Its rules: ``overlap``, ``limit``, ``pause_on_failure`` (see :class:`~anarchon_core.Rules`).
    rules: Mapping[str, Any] = field(default_factory=dict)
    version: int = 0

    def __post_init__(self) -> None:
        check_name(self.name)
        check_name(self.handler, "handler name")
        for bound in ("start", "end"):  # kept as written down: ISO 8601, in UTC
            value = getattr(self, bound)
            if value is not None:
                try:
                    object.__setattr__(self, bound, moment(bound, value).isoformat())
                except ConfigurationError as exc:
                    raise ConfigurationError(f"job {self.name!r}: {exc}") from None
        self.schedule()  # every error now, naming it, before anything is written
        unknown = set(self.job_options) - set(OPTIONS)
        if unknown:
            raise ConfigurationError(f"job {self.name!r}: unknown options {sorted(unknown)}")
        JobOptions.build(**self.job_options)
        unknown = set(self.rules) - set(RULES)
        if unknown:
            raise ConfigurationError(f"job {self.name!r}: unknown rules {sorted(unknown)}")
        try:
            Rules.build(**self.rules)
        except ConfigurationError as exc:
            raise ConfigurationError(f"job {self.name!r}: {exc}") from None
        try:
            json.dumps(
                [list(self.args), dict(self.kwargs), dict(self.options), dict(self.rules)],
                allow_nan=False,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"job {self.name!r}: args, kwargs and options must be JSON values: {exc}"
            ) from None

    def schedule(self) -> Schedule:
        anchor = None
        if self.anchor is not None:
            anchor = datetime.fromtimestamp(self.anchor, timezone.utc)
        try:
            return make_schedule(
                every=self.every,
                cron=self.cron,
                timezone=self.timezone,
                anchor=anchor,
                start=self.start,
                end=self.end,
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"job {self.name!r}: {exc}") from None

    def to_json(self) -> str:
        data = asdict(self)
        del data["name"], data["version"]
        data["args"] = list(self.args)
        for bound in ("start", "end"):  # unset: left out, as instances that predate them wrote
            if data[bound] is None:
                del data[bound]
        if not data["rules"]:
            del data["rules"]  # likewise
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, name: str, text: str, version: int) -> Definition:
        """The definition stored as ``text``; ConfigurationError if it does not hold one."""
        try:
            data = json.loads(text)
            data["args"] = tuple(data.get("args", ()))
            return cls(name=name, version=version, **data)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"stored schedule of {name!r} is unreadable: {exc}") from None

    def describe(self) -> str:
        """``every 60s, starting 2027-01-01T00:00:00+00:00 -> report``."""
        when = f"every {self.every:g}s" if self.every is not None else f"cron {self.cron!r}"
        if self.timezone:
            when += f" ({self.timezone})"
        if self.start is not None:
            when += f", starting {self.start}"
        if self.end is not None:
            when += f", ending {self.end}"
        for rule, value in sorted(self.rules.items()):
            when += f", {rule.replace('_', ' ')}" if value is True else f", {rule} {value}"
        return f"{when} -> {self.handler}"


@dataclass(frozen=True)
class JobStatus:
    """One job of a namespace as the store knows it."""

    job: str
    #: Its record (the last slot's run), or ``None`` if no slot of it started yet.
    state: JobState | None
    #: Paused by name (the namespace's own pause is :attr:`Paused.namespace`).
    paused: bool
    #: Its schedule, when it is stored (``None``: declared in code).
    defined: Definition | None = None
    #: Its counts (runs, takeovers, last success and failure), once it ran.
    stats: JobStats | None = None
    #: How the live instances declare it (``None``: none says it does).
    declared: Declared | None = None

    def schedule(self) -> Schedule | None:
        """The schedule it runs on, as far as the namespace tells: as the live instances
        declare it (code wins over a stored schedule), else as stored; ``None`` if
        neither tells (or it is of a kind that cannot be written down)."""
        if self.declared is not None:
            return self.declared.schedule
        return self.defined.schedule() if self.defined is not None else None

    @property
    def limit(self) -> int | None:
        """Its run limit, as the live instances declare it, else as stored; None if none."""
        form = self.declared.spec if self.declared is not None else None
        if form is not None:
            value = form.get("limit")
        elif self.defined is not None:
            value = self.defined.rules.get("limit")
        else:
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def limit_note(self) -> str:
        """``limit reached (5 of 5)`` or ``3 of 5 slots``; empty without a limit."""
        limit = self.limit
        if limit is None:
            return ""
        claims = self.stats.claims if self.stats is not None else 0
        if claims >= limit:
            return f"limit reached ({claims} of {limit})"
        return f"{claims} of {limit} slots"


class Control:
    """Pause, resume and inspect the jobs of ``store``'s namespace.

    ``store`` is a :class:`~anarchon_core.store.Store` or a URL (opened, and
    closed by :meth:`close`, here). RabbitMQ, which keeps no leases, refuses
    every change with :class:`~anarchon_core.ConfigurationError`.
    """

    def __init__(self, store: Store | str, *, namespace: str = "default") -> None:
        if isinstance(store, str):
            from .urls import open_store

            self.store = open_store(store, namespace=namespace)
            self._owns_store = True
        else:
            self.store = store
            self._owns_store = False
        self._reader = Reader()

    def known(self, job: str) -> bool:
        """Whether ``job`` has a record (or its backfill has), a pause mark or a stored
        schedule, or a live instance declares it."""
        lanes = lane_records(job)
        if self.store.states([job, job + BACKFILL, *lanes]) or job in self.store.paused().jobs:
            return True  # a record of its own, of its backfill or of a lane
        if DEFINED + job in self.store.controls(DEFINED + job):
            return True
        return job in self.declarations().jobs

    def declarations(self, instances: Sequence[InstanceRecord] | None = None) -> DeclaredJobs:
        """The jobs the live instances declare, with their schedules (see
        :mod:`anarchon_core.declarations`); ``instances``: the registry, if read already.

        Empty on a store without a registry or control entries (RabbitMQ).
        """
        store = self.store
        if not (isinstance(store, RegistryStore) and isinstance(store, ControlStore)):
            return DeclaredJobs()
        return self._reader.read(store, store.instances() if instances is None else instances)

    def schedule_of(self, job: str) -> tuple[Schedule, str]:
        """The schedule ``job`` runs on, and where it was read from.

        As the live instances declare it (most of them, while they disagree),
        else as stored. :class:`UnknownJob` if neither tells: a name nothing
        knows, or a job recorded whose instances are all gone (or say nothing
        of their jobs), or declared with a schedule that cannot be written down.
        """
        check_name(job)
        declared = self.declarations().jobs.get(job)
        namespace = self.store.namespace
        if declared is not None:
            if declared.schedule is None:
                raise UnknownJob(
                    f"job {job!r} is declared by {declared.instances} live instance(s) with a"
                    " schedule that cannot be written down (a kind of its own, or one this"
                    " version cannot read): its slots cannot be worked out here"
                )
            said = f"declared by {declared.instances} live instance(s)"
            if len(declared.forms) > 1:
                said += f"; {len(declared.forms)} schedules declared: the instances disagree"
            return declared.schedule, said
        if isinstance(self.store, ControlStore):
            found = self.store.controls(DEFINED + job).get(DEFINED + job)
            if found is not None:
                stored = Definition.from_json(job, found[1], found[0])
                return stored.schedule(), f"stored (v{stored.version})"
        if not isinstance(self.store, RegistryStore):
            raise ConfigurationError(
                f"{type(self.store).__name__} keeps no registry of instances nor stored"
                " schedules: the schedule of a job cannot be read from it"
            )
        if self.known(job):
            raise UnknownJob(
                f"job {job!r} is known in namespace {namespace!r} (recorded, or paused by"
                " name), but no live instance says it declares it and no schedule of it is"
                " stored: its schedule is unknown here (are its instances running, and of"
                " this version?)"
            )
        raise UnknownJob(
            f"no job named {job!r} is declared by a live instance, stored or recorded in"
            f" namespace {namespace!r}"
        )

    def next_slots(
        self, job: str, n: int = 10, after: datetime | None = None
    ) -> tuple[list[Upcoming], Schedule, str]:
        """The next ``n`` slots of ``job`` after ``after`` (default: now), each with its
        wall time in the job's time zone and the DST gaps and folds marked; its schedule,
        and where it was read from (see :meth:`schedule_of`). Fewer past its end."""
        schedule, source = self.schedule_of(job)
        when = datetime.now(timezone.utc) if after is None else after
        return preview(schedule, n, when), schedule, source

    def pause(self, job: str | None = None, *, unrecorded: bool = False) -> bool:
        """Pause ``job`` (``None``: the whole namespace); ``False`` if it was paused already.

        A job with no trace in the store (a typo, or a job whose first slot
        has not come yet) raises :class:`UnknownJob` unless ``unrecorded``.
        """
        if job is not None and not unrecorded:
            self._check_known(job)
        return self.store.pause(job)

    def resume(self, job: str | None = None, *, catch_up: bool = False) -> bool:
        """Resume ``job`` (``None``: the namespace); ``False`` if it was not paused.

        Slots that passed while paused are not run: the next slot is the next
        one due. With ``catch_up``, the most recent slot missed while paused
        runs too, once, with its own slot id, if it is still within the job's
        catch-up window (the window a late instance would claim it in); an
        older one never does (no burst). For the namespace, that applies to
        every job :meth:`jobs` lists. The resume then waits
        :data:`RUN_NOW_LEAD` seconds, for every instance to read the request.
        """
        if catch_up and self.store.paused().covers(job or ""):
            # Asked while still paused, and read by every instance before the
            # resume: none claims a scheduled slot after the missed one first.
            asked = time.time()
            jobs = [job] if job is not None else [j.job for j in self.jobs()]
            for name in jobs:
                key = f"{CATCH_UP}{name}/{uuid.uuid4().hex[:12]}"
                self.store.set_control(key, json.dumps({"asked": asked}), 0)
            time.sleep(RUN_NOW_LEAD)
        resumed = self.store.resume(job)
        if job is not None:
            pauses.clear(self.store, job)  # why it was paused (pause_on_failure) goes with it
        return resumed

    def paused(self) -> Paused:
        return self.store.paused()

    def jobs(self) -> list[JobStatus]:
        """Every job with a record, a pause mark or a stored schedule, or declared by a
        live instance, sorted by name."""
        return self.listing()[0]

    def listing(
        self,
        limit: int | None = None,
        paused: Paused | None = None,
        declared: DeclaredJobs | None = None,
        records: Records | None = None,
    ) -> tuple[list[JobStatus], int]:
        """The first ``limit`` jobs of :meth:`jobs` (only theirs are read), and how many
        jobs there are in all. ``paused``, ``declared``, ``records``: what :meth:`paused`,
        :meth:`declarations` and :meth:`Records.of` said, if read already."""
        paused = self.store.paused() if paused is None else paused
        declared = self.declarations() if declared is None else declared
        defined = self.definitions()
        records = Records.of(self.store) if records is None else records
        recorded = set(records.jobs)
        every = sorted(recorded | set(paused.jobs) | set(defined) | set(declared.jobs))
        names = every[:limit]
        states = records.states(self.store, names)
        stats = records.stats(self.store, names)
        shown = [
            JobStatus(
                name,
                states.get(name),
                name in paused.jobs,
                defined.get(name),
                stats.get(name),
                declared.jobs.get(name),
            )
            for name in names
        ]
        return shown, len(every)

    def definitions(self) -> dict[str, Definition]:
        """The schedules defined in the store, by job name."""
        found = {}
        for key, (version, text) in self.store.controls(DEFINED).items():
            name = key[len(DEFINED) :]
            found[name] = Definition.from_json(name, text, version)
        return dict(sorted(found.items()))

    def add(self, definition: Definition) -> Definition:
        """Store a new job's schedule; every instance picks it up within a second.

        :class:`~anarchon_core.errors.Conflict` if a schedule of that name is
        stored already. Returns the definition with its version.
        """
        key = DEFINED + definition.name
        try:
            version = self.store.set_control(key, definition.to_json(), 0)
        except Conflict as exc:
            said = f"a schedule named {definition.name!r} is stored already (v{exc.found})"
            raise Conflict(key, 0, exc.found, said) from None
        return _with_version(definition, version)

    def change(
        self, name: str, expected: int | None = None, **changes: Any
    ) -> tuple[Definition, Definition]:
        """Change fields of a stored schedule by compare-and-set; (before, after).

        ``expected`` is the version the change is based on (as read by the
        editor); by default the version read here. Either way, a schedule
        changed meanwhile raises :class:`~anarchon_core.errors.Conflict` and
        nothing is written. Setting ``every`` clears ``cron`` and the other
        way round. :class:`UnknownJob` if no schedule of that name is stored.
        """
        current = self._definition(name)
        if expected is not None and expected != current.version:
            raise _changed(name, expected, current.version)
        data = {k: v for k, v in asdict(current).items() if k != "version"}
        if changes.get("every") is not None:
            data.update(cron=None, timezone=None)
        if changes.get("cron") is not None:
            data.update(every=None, anchor=None)
        unknown = set(changes) - set(data) - {"version"}
        if unknown:
            raise ConfigurationError(f"job {name!r}: no field {sorted(unknown)} to change")
        for merged in ("job_options", "rules"):  # one changed leaves the others as they are
            if changes.get(merged) is not None:
                changes[merged] = {
                    k: v for k, v in {**data[merged], **changes[merged]}.items() if v is not None
                }
        data.update(changes)
        data["args"] = tuple(data["args"])
        new = Definition(**data)
        try:
            version = self.store.set_control(DEFINED + name, new.to_json(), current.version)
        except Conflict as exc:
            raise _changed(name, current.version, exc.found) from None
        return current, _with_version(new, version)

    def remove(self, name: str, expected: int | None = None) -> Definition:
        """Remove a stored schedule (compare-and-set, as :meth:`change`); the one removed.

        Every instance stops scheduling it within a second; a run in progress
        finishes.
        """
        current = self._definition(name)
        if expected is not None and expected != current.version:
            raise _changed(name, expected, current.version)
        try:
            self.store.set_control(DEFINED + name, None, current.version)
        except Conflict as exc:
            raise _changed(name, current.version, exc.found) from None
        return current

    def _definition(self, name: str) -> Definition:
        check_name(name)
        found = self.store.controls(DEFINED + name).get(DEFINED + name)
        if found is None:
            raise UnknownJob(
                f"no schedule named {name!r} is stored in namespace {self.store.namespace!r}"
            )
        return Definition.from_json(name, found[1], found[0])

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The most recent attempts of ``job``, newest first."""
        self._check_known(job)
        return Records.of_job(self.store, job).history(self.store, job, limit)

    def trigger(self, job: str, *, unrecorded: bool = False) -> str:
        """Ask for one run of ``job`` now; the id of the slot it runs as.

        The slot is a real one, of its own (due :data:`RUN_NOW_LEAD` seconds
        from now, so that every instance has read the request by then), claimed once
        across every instance that declares the job, with an attempt, token
        and lease, taken over like any slot, and marked manual in the
        history. While the job's previous run holds its lease the request
        waits for that run's end; if a scheduled slot starts first, that slot
        answers the request (it is then dropped, reported as missed). A paused
        job (or namespace) raises :class:`JobPaused`: resume it first.
        """
        if not unrecorded:
            self._check_known(job)
        check_name(job)
        if self.store.paused().covers(job):
            raise JobPaused(f"job {job!r} is paused (by name or with its namespace): resume it")
        # One millisecond past a whole second: where no cron slot and no every= slot
        # (unless anchored off the second) falls, so its id is its own.
        due = int(time.time() + RUN_NOW_LEAD) * 1000 + 1
        slot = Slot.from_ms(job, due)
        key = f"{RUN_NOW}{job}/{uuid.uuid4().hex[:12]}"
        self.store.set_control(key, json.dumps({"slot_ms": slot.ms}), 0)
        return slot.id

    def backfill(
        self, job: str, start: datetime, end: datetime, *, unrecorded: bool = False
    ) -> str:
        """Run each slot of ``job`` from ``start`` (included) to ``end`` (excluded) once, in order.

        As Temporal's backfill: the slots of the range are those of the job's
        schedule (as the instances declare it), each run once across the
        instances, one at a time (the next once the previous ended), each
        with its normal slot id, so a handler's idempotency keys line up with
        the slots that ran on schedule. The backfill is recorded apart from
        the job's live schedule, which goes on meanwhile; a paused job's
        backfill waits for the resume. Returns the request's key.
        """
        if not unrecorded:
            self._check_known(job)
        check_name(job)
        for name, when in (("start", start), ("end", end)):
            if not isinstance(when, datetime) or when.tzinfo is None:
                raise ConfigurationError(f"backfill {name}={when!r}: an aware datetime")
        if start >= end:
            raise ConfigurationError(f"backfill of {job!r}: start {start} is not before end {end}")
        if end.timestamp() > time.time() + 1:
            raise ConfigurationError(
                f"backfill of {job!r}: end {end} is in the future; a backfill runs past slots"
            )
        key = f"{FILL}{job}/{uuid.uuid4().hex[:12]}"
        value = {
            "from_ms": int(start.timestamp() * 1000),
            "to_ms": int(end.timestamp() * 1000),
            "asked": time.time(),
        }
        self.store.set_control(key, json.dumps(value), 0)
        return key

    def backfills(self) -> list[tuple[str, datetime, datetime]]:
        """The backfills not yet done: (job, start, end), oldest request first."""
        found = []
        for key, (_, value) in self.store.controls(FILL).items():
            data = json.loads(value)
            job = key[len(FILL) :].rpartition("/")[0]
            found.append((data["asked"], job, data["from_ms"], data["to_ms"]))
        return [
            (job, Slot.from_ms(job, a).time, Slot.from_ms(job, b).time)
            for _, job, a, b in sorted(found)
        ]

    def backfill_history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The most recent attempts of ``job``'s backfills, newest first."""
        return self.store.history(job + BACKFILL, limit)

    def pending(self) -> list[tuple[str, str]]:
        """The run-now requests not yet answered: (job, slot id), oldest first."""
        found = []
        for key, (_, value) in self.store.controls(RUN_NOW).items():
            job = key[len(RUN_NOW) :].rpartition("/")[0]
            found.append(Slot.from_ms(job, int(json.loads(value)["slot_ms"])))
        return [(slot.job, slot.id) for slot in sorted(found, key=lambda s: (s.ms, s.job))]

    def manual(self, job: str) -> set[int]:
        """The slots (in ms) of ``job`` that ran on request, the most recent ones."""
        prefix = f"{MANUAL}{job}/"
        return {int(key[len(prefix) :]) for key in self.store.controls(prefix)}

    # -- one-off runs ------------------------------------------------------------

    def once(
        self, job: str, at: datetime | str, *, unrecorded: bool = False, by: str | None = None
    ) -> str:
        """Ask for one run of ``job`` at ``at`` (an aware datetime or an ISO 8601 string
        with its offset); the id of the slot it runs as (``job@<unix ms>``).

        The one-off is kept in the store until its time: the instances that declare
        the job claim its slot then, like any slot, so it runs once (late, within
        the job's catch-up window, if every instance was down at its time; past
        that, it is reported missed). The job's scheduled slots after it wait for
        it. Asking again for the same time changes nothing. ``at`` in the past is
        refused (:meth:`trigger` runs a job now), as is a job whose record is at
        that slot or later already. A job with no trace in the store raises
        :class:`UnknownJob` unless ``unrecorded``; a store that keeps no one-offs
        (RabbitMQ) raises :class:`~anarchon_core.ConfigurationError`.
        """
        store = onces(self.store)
        when = moment("at", at)
        check_name(job)
        now = time.time()
        if when.timestamp() < now:
            raise ConfigurationError(
                f"once {job!r}: at={when.isoformat()} is in the past (now"
                f" {datetime.fromtimestamp(now, timezone.utc):%Y-%m-%d %H:%M:%S} UTC):"
                " `trigger` runs a job now"
            )
        if not unrecorded:
            self._check_known(job)
        slot = Slot(job, when)
        record = self.store.state(job)
        if record is not None and record.slot_ms >= slot.ms:
            raise ConfigurationError(
                f"once {job!r}: its record is at {Slot.from_ms(job, record.slot_ms).id} already,"
                f" not before {slot.id}: a slot that old would never run"
            )
        who = by or f"{getpass.getuser()}@{socket.gethostname()}"
        store.add_once([OnceEntry(slot.ms, job, entry_value(who, now))])
        return slot.id

    def cancel_once(self, job: str, at: datetime | str) -> bool:
        """Remove the one-off of ``job`` at ``at`` not yet run; ``False`` if there is none."""
        return onces(self.store).remove_once(job, Slot(check_name(job), moment("at", at)).ms)

    def pending_once(self, job: str | None = None, limit: int = 100) -> list[OnceEntry]:
        """The one-offs not yet run (of ``job``, or of every job), oldest first (see
        :meth:`once`); empty on a store that keeps none."""
        if not isinstance(self.store, OnceStore):
            return []
        return self.store.pending_once(job, limit)

    def close(self) -> None:
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Control:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_known(self, job: str) -> None:
        check_name(job)
        if not self.known(job):
            raise UnknownJob(
                f"no job named {job!r} is recorded, stored or declared by a live instance"
                f" in namespace {self.store.namespace!r}"
            )


@dataclass(frozen=True)
class Records:
    """A namespace's records, as its jobs show them: a job with ``overlap="allow_all"``
    keeps one record per lane (:data:`~anarchon_core.slots.LANES`), and shows as one job
    whose current record is its newest slot's, with its lanes' counts and history
    together. Backfills' records are left out."""

    #: The jobs with a record of their own or of a lane, sorted.
    jobs: tuple[str, ...]
    #: Per job with lanes recorded, their record names.
    lanes: Mapping[str, tuple[str, ...]]

    @classmethod
    def of(cls, store: Store) -> Records:
        """The records the store lists (:meth:`Store.jobs`), grouped by job."""
        jobs: set[str] = set()
        lanes: dict[str, list[str]] = {}
        for name in store.jobs():
            if name.endswith(BACKFILL):
                continue
            job = record_job(name)
            jobs.add(job)
            if LANE in name:
                lanes.setdefault(job, []).append(name)
        return cls(tuple(sorted(jobs)), {job: tuple(names) for job, names in lanes.items()})

    @classmethod
    def of_job(cls, store: Store, job: str) -> Records:
        """The records of ``job`` alone: its lanes found by one read of their records."""
        lanes = tuple(sorted(store.states(lane_records(job))))
        return cls((job,), {job: lanes} if lanes else {})

    def _read(self, names: Sequence[str]) -> list[str]:
        return [*names, *(lane for name in names for lane in self.lanes.get(name, ()))]

    def _each(self, names: Sequence[str], read: Mapping[str, T]) -> Iterator[tuple[str, list[T]]]:
        """Per name of ``names`` with anything in ``read``: its own and its lanes' values."""
        for name in names:
            values = [read[r] for r in (name, *self.lanes.get(name, ())) if r in read]
            if values:
                yield name, values

    def read(self, store: Store, names: Sequence[str]) -> dict[str, JobState]:
        """The records of ``names`` and of their lanes, by record name (one read)."""
        return store.states(self._read(names))

    def states(
        self, store: Store, names: Sequence[str], read: Mapping[str, JobState] | None = None
    ) -> dict[str, JobState]:
        """The current record of each of ``names``: a job's own, or its lanes' newest
        slot's (``read``: what :meth:`read` answered, if read already)."""
        read = self.read(store, names) if read is None else read
        return {
            name: max(records, key=lambda record: record.slot_ms)
            for name, records in self._each(names, read)
        }

    def stats(self, store: Store, names: Sequence[str]) -> dict[str, JobStats]:
        """The counts of each of ``names`` (one read), its lanes' added up."""
        read = store.stats(self._read(names))
        return {name: _added(name, counts) for name, counts in self._each(names, read)}

    def history(self, store: Store, job: str, limit: int) -> list[RunRecord]:
        """The most recent attempts of ``job``, its lanes' among them, newest first."""
        lanes = self.lanes.get(job, ())
        if not lanes:
            return store.history(job, limit)
        runs = [run for name in (job, *lanes) for run in store.history(name, limit)]
        runs.sort(key=lambda run: (run.started_at, run.slot_ms, run.attempt), reverse=True)
        return [replace(run, job=job) for run in runs[:limit]]


def _added(job: str, counts: Sequence[JobStats]) -> JobStats:
    if len(counts) == 1:
        return counts[0]
    successes = [c.last_success for c in counts if c.last_success is not None]
    failures = [c.last_failure for c in counts if c.last_failure is not None]
    return JobStats(
        job,
        runs=sum(c.runs for c in counts),
        takeovers=sum(c.takeovers for c in counts),
        done=sum(c.done for c in counts),
        failed=sum(c.failed for c in counts),
        last_success=max(successes, default=None),
        last_failure=max(failures, default=None),
    )


def _with_version(definition: Definition, version: int) -> Definition:
    data = asdict(definition)
    data.update(version=version, args=tuple(definition.args))
    return Definition(**data)


def _changed(name: str, expected: int, found: int) -> Conflict:
    now = "removed since" if found == 0 else f"now at v{found}"
    said = f"the schedule of {name!r} changed meanwhile: it was v{expected}, {now}; read it again"
    return Conflict(DEFINED + name, expected, found, said)
