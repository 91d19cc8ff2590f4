"""Runtime control of a namespace through its store, with or without a scheduler running.

:class:`Control` is what admin scripts, the ``anarchon`` command and the
Celery and Dramatiq commands use; :class:`~anarchon_core.Scheduler` offers the
same verbs on its own store. Every decision lives in the shared store, so
every instance sees it at its next claim: a pause is read inside the claim's
own atomic step (see :meth:`anarchon_core.store.Store.claim`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from .errors import ConfigurationError, Conflict
from .errors import JobPaused as JobPaused  # defined with every error; importable here as before
from .errors import UnknownJob as UnknownJob
from .jobs import JobOptions
from .names import check_name
from .schedules import Schedule, make_schedule
from .slots import BACKFILL, Slot
from .store import JobState, JobStats, Paused, RunRecord, Store

#: Prefixes of the control entries: run-now requests, the marks of slots run on
#: request, and the schedules defined in the store.
RUN_NOW, MANUAL, DEFINED, FILL, CATCH_UP = "run/", "manual/", "def/", "fill/", "catchup/"
#: Seconds ahead of the request that a run-now slot is due: every instance (each
#: reads the requests once a second) knows of it before its time, so none claims
#: a scheduled slot after it first.
RUN_NOW_LEAD = 2.0
#: The options a stored schedule may set, as in ``Scheduler.add_job``.
OPTIONS = ("lease", "renew", "jitter", "catch_up", "watch")


@dataclass(frozen=True)
class Definition:
    """A job whose schedule lives in the store, read by every instance at run time.

    ``handler`` names code, never holds it: a handler registered with
    :meth:`Scheduler.handler <anarchon_core.Scheduler.handler>` (core), a Celery
    task's name, a Dramatiq actor's name. ``args``, ``kwargs`` and ``options``
    are JSON values passed to it (Celery: ``apply_async`` options; Dramatiq:
    message options). ``job_options`` holds ``lease``, ``renew``, ``jitter``,
    ``catch_up``, ``watch`` in seconds. ``version`` is the store's (0 before
    it was written).
    """

    name: str
    handler: str
    every: float | None = None
    cron: str | None = None
    timezone: str | None = None
    #: Unix seconds of the every= grid's anchor (default: the Unix epoch).
    anchor: float | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    job_options: Mapping[str, float] = field(default_factory=dict)
    version: int = 0

    def __post_init__(self) -> None:
        check_name(self.name)
        check_name(self.handler, "handler name")
        self.schedule()  # every error now, naming it, before anything is written
        unknown = set(self.job_options) - set(OPTIONS)
        if unknown:
            raise ConfigurationError(f"job {self.name!r}: unknown options {sorted(unknown)}")
        JobOptions.build(**self.job_options)
        try:
            json.dumps([list(self.args), dict(self.kwargs), dict(self.options)], allow_nan=False)
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
                every=self.every, cron=self.cron, timezone=self.timezone, anchor=anchor
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"job {self.name!r}: {exc}") from None

    def to_json(self) -> str:
        data = asdict(self)
        del data["name"], data["version"]
        data["args"] = list(self.args)
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
        when = f"every {self.every:g}s" if self.every is not None else f"cron {self.cron!r}"
        if self.timezone:
            when += f" ({self.timezone})"
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

    def known(self, job: str) -> bool:
        """Whether ``job`` has a record (or its backfill has), a pause mark or a stored schedule."""
        if self.store.states([job, job + BACKFILL]) or job in self.store.paused().jobs:
            return True  # a record of its own, or of its backfill
        return DEFINED + job in self.store.controls(DEFINED + job)

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
        every job the store has recorded. The resume then waits
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
        return self.store.resume(job)

    def paused(self) -> Paused:
        return self.store.paused()

    def jobs(self) -> list[JobStatus]:
        """Every job with a record, a pause mark or a stored schedule, sorted by name."""
        return self.listing()[0]

    def listing(
        self, limit: int | None = None, paused: Paused | None = None
    ) -> tuple[list[JobStatus], int]:
        """The first ``limit`` jobs of :meth:`jobs` (only theirs are read), and how many
        jobs there are in all. ``paused``: what :meth:`paused` said, if read already."""
        paused = self.store.paused() if paused is None else paused
        defined = self.definitions()
        recorded = {name for name in self.store.jobs() if not name.endswith(BACKFILL)}
        every = sorted(recorded | set(paused.jobs) | set(defined))
        names = every[:limit]
        states = self.store.states(names)
        stats = self.store.stats(names)
        shown = [
            JobStatus(
                name, states.get(name), name in paused.jobs, defined.get(name), stats.get(name)
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
        return self.store.history(job, limit)

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
                f"no job named {job!r} is recorded in namespace {self.store.namespace!r}"
            )


def _with_version(definition: Definition, version: int) -> Definition:
    data = asdict(definition)
    data.update(version=version, args=tuple(definition.args))
    return Definition(**data)


def _changed(name: str, expected: int, found: int) -> Conflict:
    now = "removed since" if found == 0 else f"now at v{found}"
    said = f"the schedule of {name!r} changed meanwhile: it was v{expected}, {now}; read it again"
    return Conflict(DEFINED + name, expected, found, said)
