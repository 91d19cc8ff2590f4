"""The Scheduler: the public API of the engine, wiring its parts (:mod:`anarchon_core.engine`).

One scheduler runs per instance. All of its store traffic happens in
:meth:`Scheduler.run_pending`, which does whatever is due at the current time
and returns how long it may sleep. :meth:`Scheduler.start` calls it from one
background thread; tests call it directly with a :class:`~anarchon_core.clock.FakeClock`.
Handlers run on pooled threads and report back through a queue.

Per job, an instance is in at most one of three roles for a slot:

- **claimant**: the slot's time (plus this instance's jitter, plus a wait
  when another instance is the slot's preferred one, see
  :mod:`anarchon_core.peers`) has come; the claim is sent in one batch with
  every other job due at the same moment;
- **runner**: it won; it renews the lease every ``renew`` seconds and
  finishes the run when the handler returns;
- **backup**: it lost to a runner; it checks the lease every ``watch``
  seconds and takes the slot over (compare-and-set on the token) once the
  lease lapsed or was released.

The roles and their decisions live in :mod:`anarchon_core.roles`, which makes
no store call; the parts of :mod:`anarchon_core.engine` ask the store and act
on what they decide, one step at a time (:mod:`anarchon_core.engine.loop`).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from .clock import HANDLER_THREADS, Clock, SystemClock
from .control import Control
from .durations import Duration
from .engine.backups import Backups
from .engine.claims import REQUEST_WAIT, TICK_OFFSETS_KEPT, Answers, Claims, check_lookahead
from .engine.context import Context
from .engine.gateway import Gateway
from .engine.loop import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    HANDOVER_WAIT,
    LOOP_STALL,
    MAX_SLEEP,
    SIGNAL_POLL,
    Loop,
)
from .engine.registry import VERSION, Registry
from .engine.requests import CONTROL_POLL, MANUAL_KEPT, Requests
from .engine.runs import DISPATCH_RETRY_MAX, Runs, dispatch_retry_after
from .engine.stored import Handlers, Resolve, StoredSchedules
from .engine.table import JobTable
from .engine.tallies import Tallies
from .errors import ConfigurationError
from .events import Emitter, Event, Health
from .jobs import Job, JobOptions, Overlap, Rules, Run
from .names import check_name
from .once import ONCE_EVERY
from .peers import Peers
from .schedules import NEVER, make_schedule, moment, preview, slot_id, to_ms
from .slots import LANE, is_own_record, record_job
from .store import Paused, Store, onces

__all__ = [
    "BACKOFF_MAX",
    "BACKOFF_MIN",
    "CONTROL_POLL",
    "DISPATCH_RETRY_MAX",
    "HANDOVER_WAIT",
    "LOOP_STALL",
    "MANUAL_KEPT",
    "MAX_SLEEP",
    "REQUEST_WAIT",
    "SIGNAL_POLL",
    "TICK_OFFSETS_KEPT",
    "VERSION",
    "Scheduler",
    "default_instance",
    "dispatch_retry_after",
]

#: Events are logged by this module's logger, whichever part reports them.
log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def default_instance() -> str:
    """``host:pid:random``: unique per process, readable in ``anarchon status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(16):04x}"


class Scheduler:
    """Runs each slot of each job on exactly one of the instances sharing ``store``.

    ``store`` is a :class:`~anarchon_core.store.Store` or a URL
    (``sqlite:///jobs.db``, ``redis://...``; see :func:`anarchon_core.open_store`).
    ``lease``, ``renew``, ``jitter``, ``catch_up`` and ``watch`` are the defaults
    of every job (see :class:`~anarchon_core.jobs.JobOptions`); each job may
    override them. ``listener`` receives every :class:`~anarchon_core.Event`.
    ``inline=True`` runs handlers in the scheduling thread, for handlers that
    only dispatch work elsewhere (Celery, Dramatiq): their slot is then
    finished or handed off within the same step. ``resolve`` makes the handler
    of a schedule defined in the store (None: this instance has none); by
    default, the function registered under its name with :meth:`handler`.
    ``handler_threads`` bounds the threads that run handlers at once (default
    :data:`~anarchon_core.clock.HANDLER_THREADS`, 100; ``None``: no bound):
    past it, a won slot's handler waits for a thread, in the order the slots
    were won, while the engine renews its lease as for any run.
    ``lookahead`` (default 0: off) sends each scheduled claim that much ahead
    of its time, at most a tenth of the job's lease and of its interval, so
    that the claim's round trip is over when the slot comes: a slot won ahead
    starts its handler at its time. Only for jobs with ``overlap="skip"`` (see
    docs/concepts.md, "Claims sent ahead").
    """

    def __init__(
        self,
        store: Store | str,
        *,
        namespace: str | None = None,
        instance: str | None = None,
        lease: Duration | None = None,
        renew: Duration | None = None,
        jitter: Duration | None = None,
        catch_up: Duration | None = None,
        watch: Duration | None = None,
        clock: Clock | None = None,
        seed: int | None = None,
        listener: Callable[[Event], None] | None = None,
        inline: bool = False,
        resolve: Resolve | None = None,
        handler_threads: int | None = HANDLER_THREADS,
        lookahead: Duration = 0.0,
    ) -> None:
        if clock is not None and handler_threads != HANDLER_THREADS:
            raise ConfigurationError(
                f"handler_threads={handler_threads!r} bounds the scheduler's own clock's"
                " threads; a clock= given starts handlers its own way"
            )
        self._defaults = JobOptions.build(
            lease=lease, renew=renew, jitter=jitter, catch_up=catch_up, watch=watch
        )
        self.store, owns_store = _store_of(store, namespace)
        self.namespace = self.store.namespace
        self._instance = check_name(instance or default_instance(), "instance name")
        self._emit = Emitter(instance=self.instance, namespace=self.namespace, logger=log)
        if listener:
            self._emit.add_listener(listener)
        try:
            self._clock: Clock = clock or SystemClock(handler_threads)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        self._lookahead = check_lookahead(lookahead)
        self._wire(inline, seed, resolve, owns_store)

    @property
    def instance(self) -> str:
        """This instance's name, fixed at construction: its claims, events and registry
        record all carry it."""
        return self._instance

    def _wire(self, inline: bool, seed: int | None, resolve: Resolve | None, owns: bool) -> None:
        """Build the engine's parts and connect them."""
        self._gateway = gateway = Gateway(self.store, self._emit, self.instance)
        self._table = table = JobTable()
        peers = Peers(self.instance, gateway.registry)
        tallies = Tallies(self.instance, self._clock, gateway, peers)
        ctx = Context(self.instance, self._clock, self._emit, gateway, table, peers, tallies)
        self._wake = threading.Event()
        self._handlers = Handlers(table)
        self._stored = StoredSchedules(
            table, resolve or self._handlers.resolve, self.add_job, self.remove_job
        )
        runs = Runs(ctx, self._wake, inline)
        answers = Answers(ctx, runs)
        self._requests = requests = Requests(ctx, answers, self._stored.apply)
        claims = Claims(ctx, answers, requests.waits_for_request, seed, self._lookahead)
        self._loop = Loop(
            ctx,
            runs=runs,
            claims=claims,
            backups=Backups(ctx, answers, requests.waits_for_request),
            requests=requests,
            registry=Registry(ctx, claims.replace_deferred, self._load),
            wake=self._wake,
            close_store=self.store.close if owns else None,
        )

    @property
    def clock(self) -> Clock:
        """The clock this scheduler reads the time from."""
        return self._clock

    @property
    def resolve(self) -> Resolve:
        """What makes a stored schedule's handler here (see the ``resolve`` parameter)."""
        return self._stored.resolve

    # -- declaring jobs -------------------------------------------------

    def job(
        self,
        name: str | None = None,
        *,
        every: float | int | timedelta | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        anchor: datetime | None = None,
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        lease: Duration | None = None,
        renew: Duration | None = None,
        jitter: Duration | None = None,
        catch_up: Duration | None = None,
        watch: Duration | None = None,
        overlap: Overlap | str | None = None,
        limit: int | None = None,
        pause_on_failure: bool | None = None,
    ) -> Callable[[F], F]:
        """Decorator declaring a job; the name defaults to the function's qualified name."""

        def decorate(handler: F) -> F:
            self.add_job(
                handler,
                name=name,
                every=every,
                cron=cron,
                timezone=timezone,
                anchor=anchor,
                start=start,
                end=end,
                lease=lease,
                renew=renew,
                jitter=jitter,
                catch_up=catch_up,
                watch=watch,
                overlap=overlap,
                limit=limit,
                pause_on_failure=pause_on_failure,
            )
            return handler

        return decorate

    def add_job(
        self,
        handler: Callable[..., Any],
        *,
        name: str | None = None,
        every: float | int | timedelta | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        anchor: datetime | None = None,
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        lease: Duration | None = None,
        renew: Duration | None = None,
        jitter: Duration | None = None,
        catch_up: Duration | None = None,
        watch: Duration | None = None,
        overlap: Overlap | str | None = None,
        limit: int | None = None,
        pause_on_failure: bool | None = None,
    ) -> Job:
        """Declare a job. Every error is raised before anything is registered.

        ``start=`` and ``end=`` (aware datetimes or ISO 8601 strings with an
        offset) bound its slots, both included: none before the start, none
        after the end (the job has then ended; ``anarchon status`` says so).
        """
        if name is None:
            name = str(getattr(handler, "__qualname__", None) or getattr(handler, "__name__", ""))
        schedule = make_schedule(
            every=every, cron=cron, timezone=timezone, anchor=anchor, start=start, end=end
        )
        options = self._defaults.merged(
            lease=lease, renew=renew, jitter=jitter, catch_up=catch_up, watch=watch
        )
        rules = Rules.build(overlap, limit, pause_on_failure)
        job = Job(name=name, handler=handler, schedule=schedule, options=options, rules=rules)
        self._gateway.check(job)  # what the store cannot keep (a limit on a claim-only one)
        self._table.add(job)
        self._wake.set()
        return job

    def once(
        self,
        name: str,
        at: datetime | str,
        handler: Callable[..., Any],
        *,
        lease: Duration | None = None,
        renew: Duration | None = None,
        jitter: Duration | None = None,
        catch_up: Duration | None = None,
        watch: Duration | None = None,
    ) -> str:
        """Declare a job that runs once, at ``at`` (an aware datetime or an ISO 8601 string
        with its offset), on one instance; the id of its slot (``name@<unix ms>``).

        Its one slot is kept in the store until a claim settles it (see
        :mod:`anarchon_core.once`): it runs once across every instance that
        declares it, at its time, or late within its catch-up window (default one
        hour) if every instance was down then; past that window it is reported
        missed, never run. Declaring it again (a restart, after it ran) does not run
        it again: the job's record in the store says it ran. The store entry is
        written by the engine's next step; a store that keeps no one-offs
        (RabbitMQ) raises :class:`~anarchon_core.ConfigurationError` here.
        """
        onces(self.store)
        when = moment("at", at)
        self.add_job(
            handler,
            name=name,
            every=ONCE_EVERY,
            anchor=when,
            start=when,
            end=when,
            lease=lease,
            renew=renew,
            jitter=jitter,
            catch_up=catch_up,
            watch=watch,
        )
        self._requests.declare_once(name, to_ms(when))
        return slot_id(name, when)

    def handler(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator: make a function available to schedules defined in the store.

        A stored schedule (:meth:`Control.add <anarchon_core.Control.add>`)
        names its handler; the instances that registered a handler of that
        name run its slots, the others leave them be. Handlers are only ever
        code: the store holds their names.
        """

        def register(function: F) -> F:
            key = name or str(getattr(function, "__qualname__", "") or function.__name__)
            self._handlers.register(check_name(key, "handler name"), function)
            return function

        return register

    def remove_job(self, name: str, *, keep_watching: bool = False) -> None:
        """Stop scheduling ``name``. A run in progress keeps its lease and finishes.

        ``keep_watching``: the slot due now is still claimed (its claim may wait for
        another instance), and the runs of the job another instance holds are still
        backed up to their end, taken over if their lease lapses, as if the job were
        declared; no later slot. For a job whose removal is part of its run (a
        one-off that disables itself as it runs)."""
        self._table.remove(name, keep_watching, self._clock.time())

    @property
    def jobs(self) -> dict[str, Job]:
        """The jobs declared here, by name (a new dict: for a look-up, see :meth:`job_named`)."""
        return self._table.jobs()

    def job_named(self, name: str) -> Job:
        """The job ``name`` declared here (or removed with a run going on); KeyError if none.

        One look-up, whatever the number of jobs: the per-run paths use it.
        """
        rt = self._table.get(name)
        if rt is None:
            raise KeyError(name)
        return rt.job

    def next_slots(self, job: str, n: int = 10, after: datetime | None = None) -> list[datetime]:
        """The next ``n`` slots of the job ``job`` declared here, after ``after`` (default:
        now by the scheduler's clock), as aware UTC datetimes; fewer once its ``end=``
        comes. The same slots every instance computes (see :func:`anarchon_core.preview`
        for them in the job's time zone, with DST gaps and folds marked)."""
        schedule = self.job_named(job).schedule
        return [
            p.slot
            for p in preview(
                schedule, n, after or datetime.fromtimestamp(self._clock.time(), timezone.utc)
            )
        ]

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        """Call ``listener`` with every :class:`~anarchon_core.Event` of this instance."""
        self._emit.add_listener(listener)

    @property
    def stats(self) -> dict[str, int]:
        """How many events of each kind this instance has seen (a metric)."""
        return self._emit.counts

    def running(self) -> list[Run]:
        """The runs this instance currently holds."""
        return [rt.runner.run for rt in self._table.held() if rt.runner]

    def _load(self) -> tuple[float, int]:
        """How late this instance's own runs' upkeep ran at worst since the last call, and
        the claims it deferred."""
        pacer = self._loop.pacer
        return pacer.peak(), pacer.deferred_total

    def health(self, stall: float = LOOP_STALL) -> Health:
        """Whether the scheduling loop is alive, and whether the store answered its last step.

        Live: a step began within ``stall`` seconds (the loop steps at least
        every :data:`MAX_SLEEP`; a step blocked in a store call, or a loop
        that died, stops that). Ready: live, and the last step reached the
        store (not backing off after an error). See :mod:`anarchon_core.probes`.
        """
        return self._loop.health(stall)

    def upcoming(self) -> dict[str, tuple[float | None, float | None]]:
        """Per job declared here: its next slot's time (epoch seconds) and, for a run
        this instance holds, the seconds of lease it surely has left."""
        runtimes = [rt for rt in self._table.runtimes() if not rt.removed]
        shown_jobs: dict[str, tuple[float | None, float | None]] = {}
        # The runs of a job with overlap="allow_all" are its lanes': the least lease left.
        lanes: dict[str, float] = {}
        for rt in runtimes:
            name, runner = rt.job.name, rt.runner
            left = runner.run.lease_left() if runner is not None else None
            if not is_own_record(name):  # a backfill's or a lane's record
                if left is not None and LANE in name:
                    job = record_job(name)
                    lanes[job] = min(left, lanes.get(job, left))
                continue
            nxt = None
            if rt.next_slot is not None and rt.next_slot.time != NEVER:
                nxt = rt.next_slot.ms / 1000
            shown_jobs[name] = (nxt, left)
        for job, left in lanes.items():
            if job in shown_jobs:
                shown_jobs[job] = (shown_jobs[job][0], left)
        return shown_jobs

    # -- runtime control (shared by every instance, through the store) ---

    def pause(self, job: str | None = None) -> bool:
        """Pause ``job`` (``None``: the whole namespace) on every instance.

        No slot of it starts from the next claim on, on any instance (the
        pause is read inside the claim's atomic step); a run in progress goes
        on. ``False`` if it was paused already. A name that is neither
        declared here nor recorded in the store raises
        :class:`~anarchon_core.UnknownJob`. See :class:`~anarchon_core.Control`.
        """
        declared = job is not None and job in self._table
        return Control(self.store).pause(job, unrecorded=declared)

    def resume(self, job: str | None = None, *, catch_up: bool = False) -> bool:
        """Undo :meth:`pause`; the next slot due runs, not those missed meanwhile
        (with ``catch_up``, the most recent one too: see :meth:`Control.resume`)."""
        return Control(self.store).resume(job, catch_up=catch_up)

    def paused(self) -> Paused:
        """What is paused in this scheduler's namespace."""
        return self.store.paused()

    def trigger(self, job: str) -> str:
        """Run ``job`` once now, on whichever instance claims it; the slot's id.

        See :meth:`anarchon_core.Control.trigger`.
        """
        return Control(self.store).trigger(job, unrecorded=job in self._table)

    # -- lifecycle ------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling thread and return at once."""
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop gracefully: hand every held run over to a backup at once.

        Runs that already returned are finished first. The hand-over itself is
        always waited for (at most ``HANDOVER_WAIT`` seconds if the store hangs).
        Handlers still running are told (``run.lost``, ``run.check()``) and
        given what is left of ``timeout`` seconds to return.
        """
        self._loop.stop(timeout)

    def run_forever(self) -> None:
        """Run until SIGTERM or SIGINT (or :meth:`stop`), then stop gracefully."""
        self._loop.run_forever()

    def run_pending(self) -> float:
        """Do everything that is due now; return the seconds until more is due."""
        return self._loop.run_pending()

    # Read by tests that watch the loop's thread; not part of the API.
    @property
    def _thread(self) -> threading.Thread | None:
        return self._loop.thread

    @property
    def _stopping(self) -> threading.Event:
        return self._loop.stopping


def _store_of(store: Store | str, namespace: str | None) -> tuple[Store, bool]:
    """The store, and whether the scheduler opened it (and so closes it)."""
    if isinstance(store, str):
        from .urls import open_store

        return open_store(store, namespace=namespace or "default"), True
    if isinstance(store, Store):
        if namespace is not None and namespace != store.namespace:
            raise ConfigurationError(
                f"namespace={namespace!r} differs from the store's ({store.namespace!r}):"
                " set it on the store"
            )
        return store, False
    raise ConfigurationError(f"store={store!r}: expected a Store or a store URL")
