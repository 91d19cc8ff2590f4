"""The engine: jitter, claim, lease heartbeat, watch, takeover, hand-over, catch-up.

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
no store call; the scheduler asks the store and acts on what they decide. One
step goes through its phases in order: finish the runs whose handler
returned, renew leases, place new jobs on their schedule, announce this
instance in the store's registry, check the backed-up leases, claim the
slots due, and finish once more. Each phase is at most one batch of store
calls and looks only at the jobs due (:mod:`anarchon_core.due`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import inspect
import itertools
import json
import logging
import os
import queue
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from .clock import Clock, SystemClock, Task
from .control import CATCH_UP, DEFINED, MANUAL, RUN_NOW, Control, Definition
from .due import Agenda
from .durations import Duration
from .errors import (
    BatchRefused,
    ConfigurationError,
    Conflict,
    DispatchFailed,
    LeaseLost,
    StoreUnavailable,
)
from .events import Emitter, Event, EventKind, Health
from .jobs import Job, JobOptions, Run, check_name
from .peers import ANNOUNCE_EVERY, ANNOUNCE_TTL, Peers
from .roles import ENDED, Backup, Completion, JobRuntime, Runner, Verdict
from .schedules import from_ms, make_schedule, to_ms
from .slots import BACKFILL, Slot, shown
from .store import Change, Claim, ClaimRequest, ClaimStatus, JobState, Paused, RunState, Store

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
R = TypeVar("R")

#: Seconds between two reads of the store's run-now requests.
CONTROL_POLL = 1.0
#: How long a scheduled claim waits, again and again, for a run-now request before it.
REQUEST_WAIT = 0.1
#: The prefix of backfill requests among the control entries.
FILL = "fill/"
#: How many marks of a job's slots run on request (``manual/<job>/<slot ms>``) are kept.
MANUAL_KEPT = 50
#: Back-off after a store error, doubling up to the maximum.
BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
#: The longest the loop sleeps, so that wall-clock jumps are noticed.
MAX_SLEEP = 1.0
#: A loop with no step begun for this long is not live (:meth:`Scheduler.health`).
LOOP_STALL = 30.0
#: The longest :meth:`Scheduler.stop` waits for the hand-over to reach the store.
HANDOVER_WAIT = 10.0
#: How often :meth:`Scheduler.run_forever` looks whether a stop signal came.
SIGNAL_POLL = 0.05
#: The longest wait between two attempts to dispatch a slot the broker refused: a
#: broker back for this long plus ``watch`` within the catch-up window gets the slot.
DISPATCH_RETRY_MAX = 2.0
#: How many slot times' jitter draws are kept; past that, the older half is dropped.
TICK_OFFSETS_KEPT = 4096


def _version() -> str:
    try:
        return importlib.metadata.version("anarchon")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


#: This package's version, as instances record it in the registry.
VERSION = _version()


def dispatch_retry_after(attempt: int, watch: float) -> float:
    """Seconds before the next attempt of a slot whose ``attempt``-th dispatch failed."""
    return float(min(DISPATCH_RETRY_MAX, watch * 2.0 ** min(attempt - 1, 16)))


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
    of a schedule stored at run time from its definition (None: this instance
    has none); by default, the handler registered under its name with
    :meth:`handler`.
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
        resolve: Callable[[Definition], Callable[..., Any] | None] | None = None,
    ) -> None:
        self._defaults = JobOptions.build(
            lease=lease, renew=renew, jitter=jitter, catch_up=catch_up, watch=watch
        )
        if isinstance(store, str):
            from .urls import open_store

            self.store = open_store(store, namespace=namespace or "default")
            self._owns_store = True
        elif isinstance(store, Store):
            if namespace is not None and namespace != store.namespace:
                raise ConfigurationError(
                    f"namespace={namespace!r} differs from the store's ({store.namespace!r}):"
                    " set it on the store"
                )
            self.store = store
            self._owns_store = False
        else:
            raise ConfigurationError(f"store={store!r}: expected a Store or a store URL")
        self.namespace = self.store.namespace
        self.instance = check_name(instance or default_instance(), "instance name")
        self._emit = Emitter(instance=self.instance, namespace=self.namespace, logger=log)
        if listener:
            self._emit.add_listener(listener)
        self._clock: Clock = clock or SystemClock()
        self._random = random.Random(seed)
        self._lock = threading.RLock()
        self._runtimes: dict[str, JobRuntime] = {}
        #: What is due for the jobs, so that a step looks at those alone.
        self._agenda = Agenda()
        #: Jobs declared and not yet placed on their schedule.
        self._unplaced: dict[str, JobRuntime] = {}
        self._seq = itertools.count()
        self._done: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._tick_offsets: dict[int, float] = {}
        #: The other live instances, and who claims each job's slots first.
        self._registry = self.store.keeps_registry
        self._peers = Peers(self.instance, self._registry)
        self._announce_at = 0.0
        #: Whether the store keeps control entries (run-now requests), and when to read them.
        self._controls = self.store.keeps_controls
        self._controls_at = 0.0
        #: Run-now and catch-up requests read from the store, per job: (slot ms, key,
        #: version, the event of a win), oldest first.
        self._requests: dict[str, list[tuple[int, str, int, EventKind]]] = {}
        #: Handlers that stored schedules may name (:meth:`handler`).
        self._handlers: dict[str, Callable[..., Any]] = {}
        #: What makes a stored schedule's handler here (None: this instance has none).
        self.resolve: Callable[[Definition], Callable[..., Any] | None] = resolve or self._resolve
        #: The stored schedules applied here: name -> the definition's version.
        self._stored: dict[str, int] = {}
        #: Stored schedules not applied here, and why (reported once per version).
        self._skipped: dict[str, int] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = 0.0
        self._retry_at = 0.0
        self._handler_threads: list[Task] = []
        self._handlers_pruned_at = 0
        self._inline = inline
        #: The thread inside :meth:`run_pending`, and whether a stop waits for its end.
        self._stepping: int | None = None
        self._stop_after_step = False
        #: When the last step began, and when the last step that reached the store ended
        #: (monotonic), for :meth:`health`.
        self._step_began: float | None = None
        self._step_ok_at: float | None = None

    # -- declaring jobs -------------------------------------------------

    def job(
        self,
        name: str | None = None,
        *,
        every: float | int | timedelta | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        anchor: datetime | None = None,
        lease: Duration | None = None,
        renew: Duration | None = None,
        jitter: Duration | None = None,
        catch_up: Duration | None = None,
        watch: Duration | None = None,
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
                lease=lease,
                renew=renew,
                jitter=jitter,
                catch_up=catch_up,
                watch=watch,
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
        lease: Duration | None = None,
        renew: Duration | None = None,
        jitter: Duration | None = None,
        catch_up: Duration | None = None,
        watch: Duration | None = None,
    ) -> Job:
        """Declare a job. Every error is raised before anything is registered."""
        if name is None:
            name = str(getattr(handler, "__qualname__", None) or getattr(handler, "__name__", ""))
        schedule = make_schedule(every=every, cron=cron, timezone=timezone, anchor=anchor)
        options = self._defaults.merged(
            lease=lease, renew=renew, jitter=jitter, catch_up=catch_up, watch=watch
        )
        job = Job(name=name, handler=handler, schedule=schedule, options=options)
        with self._lock:
            existing = self._runtimes.get(job.name)
            if existing is None:
                rt = self._runtimes[job.name] = JobRuntime(job, self._agenda, next(self._seq))
            elif not existing.removed:
                raise ConfigurationError(f"duplicate job name {job.name!r}")
            else:
                # Removed while its last run goes on: that run keeps its lease under
                # the new declaration, which schedules the slots after it.
                rt = existing
                rt.job, rt.removed, rt.ready = job, False, False
            self._unplaced[job.name] = rt
        self._wake.set()
        return job

    def handler(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator: make a function available to schedules defined in the store.

        A stored schedule (:meth:`Control.add <anarchon_core.Control.add>`)
        names its handler; the instances that registered a handler of that
        name run its slots, the others leave them be. Handlers are only ever
        code: the store holds their names.
        """

        def register(function: F) -> F:
            key = name or str(getattr(function, "__qualname__", "") or function.__name__)
            check_name(key, "handler name")
            with self._lock:
                self._handlers[key] = function
            return function

        return register

    def remove_job(self, name: str) -> None:
        """Stop scheduling ``name``. A run in progress keeps its lease and finishes."""
        with self._lock:
            rt = self._runtimes[name]
            rt.removed = True
            rt.next_slot = rt.backup = None
            self._unplaced.pop(name, None)
            if rt.runner is None:
                del self._runtimes[name]

    @property
    def jobs(self) -> dict[str, Job]:
        with self._lock:
            return {
                name: rt.job for name, rt in self._runtimes.items() if not name.endswith(BACKFILL)
            }

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        self._emit.add_listener(listener)

    @property
    def clock(self) -> Clock:
        """The clock this scheduler reads the time from (read-only)."""
        return self._clock

    @property
    def stats(self) -> dict[str, int]:
        """How many events of each kind this instance has seen (a metric)."""
        return self._emit.counts

    def running(self) -> list[Run]:
        """The runs this instance currently holds."""
        with self._lock:
            return [rt.runner.run for rt in list(self._agenda.held.values()) if rt.runner]

    def health(self, stall: float = LOOP_STALL) -> Health:
        """Whether the scheduling loop is alive, and whether the store answered its last step.

        Live: a step began within ``stall`` seconds (the loop steps at least
        every :data:`MAX_SLEEP`; a step blocked in a store call, or a loop
        that died, stops that). Ready: live, and the last step reached the
        store (not backing off after an error). See :mod:`anarchon_core.probes`.
        """
        now = self._clock.monotonic()
        began, ok_at = self._step_began, self._step_ok_at
        if began is None:
            return Health(False, False, "the scheduling loop has not started")
        if now - began > stall:
            return Health(False, False, f"no scheduling step for {now - began:.1f}s")
        if self._backoff or ok_at is None:
            return Health(True, False, "the store does not answer")
        return Health(True, True, f"last step {now - ok_at:.1f}s ago")

    def upcoming(self) -> dict[str, tuple[float | None, float | None]]:
        """Per job declared here: its next slot's time (epoch seconds) and, for a run
        this instance holds, the seconds of lease it surely has left."""
        with self._lock:
            runtimes = [rt for rt in self._runtimes.values() if not rt.removed]
        shown_jobs: dict[str, tuple[float | None, float | None]] = {}
        for rt in runtimes:
            name = rt.job.name
            if name.endswith(BACKFILL):
                continue
            runner = rt.runner
            left = runner.run.lease_left() if runner is not None else None
            nxt = rt.next_slot.ms / 1000 if rt.next_slot is not None else None
            shown_jobs[name] = (nxt, left)
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
        with self._lock:
            declared = job in self._runtimes
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
        with self._lock:
            declared = job in self._runtimes
        return Control(self.store).trigger(job, unrecorded=declared)

    # -- lifecycle ------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling thread and return at once."""
        if self._thread is not None:
            raise RuntimeError("scheduler already started")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="anarchon-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop gracefully: hand every held run over to a backup at once.

        Runs that already returned are finished first. The hand-over itself is
        always waited for (at most ``HANDOVER_WAIT`` seconds if the store hangs).
        Handlers still running are told (``run.lost``, ``run.check()``) and
        given what is left of ``timeout`` seconds to return.
        """
        deadline = self._clock.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        if self._stepping == threading.get_ident():
            # Called from within a step of this very thread (a signal handler): the
            # interrupted step may hold the store's connection, so the hand-over
            # waits for the step's end (see run_pending) instead of blocking here.
            self._stop_after_step = True
            return
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(timeout, HANDOVER_WAIT))
        else:
            self._shutdown()
        for handler_thread in list(self._handler_threads):
            handler_thread.join(max(0.0, deadline - self._clock.monotonic()))
        if self._owns_store and (thread is None or not thread.is_alive()):
            self.store.close()

    def run_forever(self) -> None:
        """Run until SIGTERM or SIGINT (or :meth:`stop`), then stop gracefully."""
        signalled: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                # The handler runs between any two steps of this thread: it takes no
                # lock (Event.set would, and this thread may hold it: a hang).
                signal.signal(sig, lambda signum, _frame: signalled.append(signum))
        self.start()
        try:
            while not signalled and not self._stopping.is_set():
                time.sleep(SIGNAL_POLL)
        finally:
            self.stop()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                delay = self.run_pending()
            except Exception:  # the loop must never die
                log.exception("anarchon: unexpected error in the scheduling loop")
                delay = BACKOFF_MAX
            self._clock.wait(self._wake, min(delay, MAX_SLEEP))
            self._wake.clear()
        self._shutdown()

    def _shutdown(self) -> None:
        """Finish what returned, then hand every held run over; survives any store error."""
        try:
            self._finish_completed()
        except Exception as exc:  # any store error: the hand-over below still runs
            log.warning("anarchon: could not finish runs while stopping: %s", _describe(exc))
        held: list[Runner] = []
        for rt in list(self._agenda.held.values()):
            runner, rt.runner = rt.runner, None
            if runner is not None:
                runner.run.mark_lost("handed over during shutdown")
                held.append(runner)
        reached = self._hand_over(held) if held and self.store.supports_lease else True
        if self._registry and self._announce_at and reached:
            try:
                self.store.withdraw(self.instance)
            except Exception as exc:  # its record expires instead
                log.debug("anarchon: could not leave the registry: %s", _describe(exc))

    def _hand_over(self, held: list[Runner]) -> bool:
        """Release ``held`` runs for backups to take over at once, in one batch.

        False if the store could not be reached.
        """
        releases = [Change(r.run.key, r.run.token, RunState.RELEASED) for r in held]
        reached = True
        try:
            answers: list[bool | Exception] = list(self.store.change_many(releases))
        except StoreUnavailable as exc:
            answers, reached = [exc] * len(held), False
        except BatchRefused as partial:  # the others went through
            answers = partial.answers
        except Exception:  # a refusal of one: each is handed over on its own
            answers = []
            for release in releases:
                try:
                    answers.append(self.store.change_many([release])[0])
                except Exception as exc:
                    answers.append(exc)
        for runner, released in zip(held, answers, strict=True):
            if isinstance(released, Exception):  # its lease lapses; a backup takes it over
                log.warning(
                    "anarchon: could not hand %s over: %s", runner.run.slot_id, _describe(released)
                )
            elif released:
                self._emit(
                    EventKind.HANDED_OVER,
                    slot=runner.slot,
                    attempt=runner.run.attempt,
                    token=runner.run.token,
                )
        return reached

    # -- one step: run_pending and its phases ---------------------------

    def run_pending(self) -> float:
        """Do everything that is due now; return the seconds until more is due."""
        self._stepping = threading.get_ident()
        try:
            return self._step()
        finally:
            self._stepping = None
            if self._stop_after_step:
                # stop() was called from inside this step: hand over now that it ended.
                self._stop_after_step = False
                self._shutdown()
                if self._owns_store and self._thread is None:
                    self.store.close()

    def _step(self) -> float:
        now_mono = self._step_began = self._clock.monotonic()
        if now_mono < self._retry_at:
            self._report_lost()
            return self._retry_at - now_mono
        try:
            if self._backoff:
                # The store must answer before it counts as back: a step that happens
                # to need no store call would otherwise end the outage on its own.
                self.store.ping()
            # Runs whose handler returned since the last step are finished first: the
            # claim of their job's next slot would otherwise find their lease live and
            # skip that slot as an overlap (and renewing them would be wasted).
            self._finish_completed()
            self._renew(now_mono)
            # Runs lost by now (a call may have blocked past their deadline) are
            # backed up before the claims, like anyone else's lapsed run.
            self._report_lost()
            self._initialise()
            self._announce(now_mono)
            self._poll_controls(now_mono)
            due = self._due_claims()
            try:
                # Backups before claims: a job's older slot, handed over or lapsed, is
                # taken over before its next slot's claim could supersede it.
                self._check_backups(now_mono, due)
                self._claim_due(due)
            finally:
                # Taken out of the agenda: back in at their time now, whatever happened.
                for rt in due:
                    self._agenda.claim_moved(rt)
            # And once more last: handlers begun in this step (inline ones always)
            # may have returned already. Their slot is then finished or handed off
            # within this step, before the engine sleeps.
            self._finish_completed()
        except Exception as exc:  # any store error fails the step alike
            self._store_failed(exc)
            return self._backoff
        finally:
            # Runs whose deadline passed (even during a blocked call) are reported.
            self._report_lost()
        if self._backoff:
            self._backoff = 0.0
            self._emit(EventKind.STORE_RECOVERED)
        self._step_ok_at = self._clock.monotonic()
        return self._next_delay()

    def _store_failed(self, exc: Exception) -> None:
        """A step failed: back off. Every error counts, not only "unavailable".

        A server that answers with an error (a replica that is read-only, a
        primary refusing writes without replicas) changed nothing, as for an
        unreachable one: completions stay queued, leases run out by their
        deadline, and the step is retried.
        """
        if not self._backoff:
            if not isinstance(exc, StoreUnavailable):  # once per outage, with its traceback
                log.warning("anarchon: a scheduling step failed", exc_info=exc)
            self._emit(EventKind.STORE_UNAVAILABLE, detail=_describe(exc))
        self._backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, self._backoff * 2))
        self._retry_at = self._clock.monotonic() + self._backoff

    def _report_lost(self) -> None:
        """Report each held run that was lost (deadline passed, told, or refused), once.

        This instance then backs the slot up like any other instance: once the
        store says its lease ended, it may be taken over (by this instance too)
        before the job's next slot is claimed.
        """
        for rt in list(self._agenda.held.values()):
            runner = rt.runner
            if runner is not None and not runner.reported and runner.run.lost:
                self._emit_lost(runner)
                if self.store.supports_lease and rt.backup is None and not rt.removed:
                    rt.backup = Backup.of_own(runner, self._clock.monotonic(), rt.options)

    def _completions(self) -> list[Completion]:
        """The completions queued so far, oldest slot first (an order threads cannot change)."""
        pending: list[Completion] = []
        while True:
            try:
                pending.append(self._done.get_nowait())
            except queue.Empty:
                break
        pending.sort(key=lambda d: (d.runner.slot.ms, d.runner.slot.job, d.runner.run.attempt))
        return pending

    def _finish_completed(self) -> None:
        """Phase 1 (and 6): finish the runs whose handler returned or raised, in one batch."""
        pending = self._completions()
        if not pending:
            return
        for done in pending:
            if done.runner.run.lost and not done.runner.reported:
                self._emit_lost(done.runner)
        ends = [self._end_change(done) for done in pending]
        sent = [(done, change) for done, (change, _) in zip(pending, ends, strict=True) if change]
        try:
            results = self._per_job(
                [done.runtime for done, _ in sent],
                [change for _, change in sent],
                self.store.change_many,
            )
        except Exception:  # kept until recorded: the step fails and is retried
            for unrecorded in pending:
                self._done.put(unrecorded)
            raise
        answers = iter(results)
        for done, (change, retry) in zip(pending, ends, strict=True):
            answer = True if change is None else next(answers)
            if isinstance(answer, Exception):
                self._done.put(done)  # this job's end alone was refused: tried again later
                continue
            self._ended(done, answer, retry)

    def _end_change(self, done: Completion) -> tuple[Change | None, bool]:
        """The change recording the end of ``done``'s run (None: nothing to send), and
        whether it releases the slot for another attempt."""
        run, rt = done.runner.run, done.runtime
        if done.handed_off:
            return None, False  # it belongs to whoever executes the work now
        if done.interrupted:
            # Stopped on losing the run: released if the store still gives it to this
            # instance, so that a backup runs the slot at once; else already taken over.
            if not self.store.supports_lease:
                return None, True
            return Change(run.key, run.token, RunState.RELEASED), True
        if done.dispatch_failed and self.store.supports_lease:
            lateness = done.ended_at - done.runner.slot.time.timestamp()
            if not rt.too_late(done.runner.slot, lateness):
                # Not run, so not failed: the lease is cut to a back-off that doubles
                # with each attempt, then whoever can reach the broker takes it over.
                backoff = dispatch_retry_after(run.attempt, rt.options.watch)
                return Change(run.key, run.token, RunState.RUNNING, backoff), True
        return Change(run.key, run.token, done.outcome), False

    def _ended(self, done: Completion, finished: bool, retry: bool) -> None:
        """The store answered the end of ``done``'s run: ``finished`` if it took it."""
        rt, runner, run = done.runtime, done.runner, done.runner.run
        if rt.runner is runner:
            rt.runner = None
            if (done.handed_off or retry) and not rt.removed:
                # Whoever executes it may die too, and a slot given back is sent again
                # by whoever takes it over: back it up like anyone else's run. After
                # a failed dispatch, the others (who may reach the broker) go first.
                rt.backup = Backup.of_own(runner, self._clock.monotonic(), rt.options)
                if done.dispatch_failed:
                    rt.backup.next_check += dispatch_retry_after(run.attempt, rt.options.watch)
            if rt.removed:
                with self._lock:
                    self._runtimes.pop(run.key, None)
        if done.interrupted and not finished:
            return  # stopped on losing the run, which another instance holds now
        if finished:
            detail = ""
            if done.interrupted:
                detail = "the handler stopped on losing its lease; released for a backup"
            elif retry:
                after = dispatch_retry_after(run.attempt, rt.options.watch)
                detail = f"another attempt in {after:g}s, within the catch-up window"
            elif done.dispatch_failed:
                detail = "recorded failed: " + (
                    "its catch-up window has passed"
                    if self.store.supports_lease
                    else "a claim-only store cannot release it"
                )
            self._emit(
                done.kind, slot=runner.slot, attempt=run.attempt, token=run.token, detail=detail
            )
        else:
            run.mark_lost("finish refused: another instance holds the slot")
            self._emit(
                EventKind.FINISH_REFUSED, slot=runner.slot, attempt=run.attempt, token=run.token
            )

    def _renew(self, now_mono: float) -> None:
        """Phase 2: renew the leases due, in one batch.

        A run is held until its deadline: the moment its last accepted renewal
        was sent, plus the lease less a safety margin. A renewal that fails
        leaves the deadline where it was, so the run turns lost on time even
        if the store never answers.
        """
        if not self.store.supports_lease:
            return
        due = [
            (rt, runner)
            for rt in list(self._agenda.held.values())
            if (runner := rt.runner) is not None
            and not runner.run.lost
            and runner.run.handed_off_lease is None
            and runner.renewal_due(now_mono)
        ]
        if not due:
            return
        sent = self._clock.monotonic()
        for _, runner in due:
            runner.retry_renewal(sent)
        renewals = [
            Change(runner.run.key, runner.run.token, RunState.RUNNING, rt.options.lease)
            for rt, runner in due
        ]
        answers = self._per_job([rt for rt, _ in due], renewals, self.store.change_many)
        late: list[Change] = []
        for (rt, runner), accepted in zip(due, answers, strict=True):
            run = runner.run
            if isinstance(accepted, Exception):
                continue  # tried again at the next step
            if not accepted:
                run.mark_lost("renewal refused: another instance took the slot over")
            elif not runner.renewed(sent, rt.options):
                # Accepted, but after the run's deadline passed: the handler was told
                # it lost, so the lease goes back at once for a backup to take over.
                late.append(Change(run.key, run.token, RunState.RELEASED))
        if late:
            with contextlib.suppress(BatchRefused):  # a refused one lapses instead
                self.store.change_many(late)

    def _emit_lost(self, runner: Runner) -> None:
        run = runner.run
        runner.reported = True
        self._emit(
            EventKind.LOST,
            slot=runner.slot,
            attempt=run.attempt,
            token=run.token,
            detail=run.lost_reason,
        )

    def _initialise(self) -> None:
        """Phase 3: place new jobs on their schedule; catch up, or back up a running slot."""
        with self._lock:
            new = [rt for rt in self._unplaced.values() if not rt.ready and not rt.removed]
        if not new:
            return
        states = self._per_job(new, new, self._states)
        now = self._now()
        for rt, record in zip(new, states, strict=True):
            if isinstance(record, Exception):
                continue  # placed at a later step, once the store takes this job's read
            rt.ready = True
            with self._lock:
                if self._unplaced.get(rt.job.name) is rt:
                    del self._unplaced[rt.job.name]
            previous = rt.slot_at_or_before(now)
            rt.next_slot = rt.slot_after(now)
            if record is None or previous is None:
                # A job never seen before starts with its next slot, not a catch-up.
                pass
            elif record.slot_ms == previous.ms or (
                record.held and not self.store.leases_by_observation
            ):
                # The latest slot's run, or an older one still going (a run longer
                # than the interval): back it up like the instances that saw it start.
                # (Where leases are measured by observation, an old record left
                # running would look live: only the latest slot's is backed up.)
                self._back_up(rt, record)
            elif rt.catches_up(previous, record, self._lateness(previous)):
                rt.next_slot = previous
            self._place(rt)

    def _announce(self, now_mono: float) -> None:
        """Record this instance in the store's registry, and read the live peers back.

        Every :data:`~anarchon_core.peers.ANNOUNCE_EVERY` seconds. A store
        that answers with an error other than an outage (a role that may not
        create the registry's table) leaves this instance without a registry:
        it learns its peers from claims alone.
        """
        if not self._registry or now_mono < self._announce_at:
            return
        info = {"host": socket.gethostname(), "pid": os.getpid(), "version": VERSION}
        info["jobs"] = len(self._runtimes)
        try:
            live = self.store.announce(self.instance, info, ANNOUNCE_TTL)
        except StoreUnavailable:
            raise
        except Exception as exc:
            self._registry = self._peers.registry = False
            log.warning("anarchon: the store's registry is unusable: %s", _describe(exc))
            return
        self._announce_at = now_mono + ANNOUNCE_EVERY
        version = self._peers.version
        self._peers.refresh(live)
        if self._peers.version != version:
            self._replace_deferred()

    def _poll_controls(self, now_mono: float) -> None:
        """Every :data:`CONTROL_POLL` seconds: read the stored schedules, backfills and
        run-now requests, and act on them (see :meth:`_claim_requests`)."""
        if self._controls and now_mono >= self._controls_at:
            self._controls_at = now_mono + CONTROL_POLL
            try:
                entries = self.store.controls(DEFINED, RUN_NOW, FILL, CATCH_UP)
            except StoreUnavailable:
                raise
            except Exception as exc:
                self._controls = False
                log.warning(
                    "anarchon: the store's control entries are unusable: %s", _describe(exc)
                )
                return
            defined, requests, fills, catch_ups = (
                {k: v for k, v in entries.items() if k.startswith(prefix)}
                for prefix in (DEFINED, RUN_NOW, FILL, CATCH_UP)
            )
            self._apply_definitions(defined)
            if fills:
                self._backfill(fills)
            self._requests = {}
            for key, (version, value) in requests.items():
                job = key[len(RUN_NOW) :].rpartition("/")[0]
                try:
                    slot_ms = int(json.loads(value)["slot_ms"])
                except (ValueError, KeyError, TypeError):
                    continue
                self._requests.setdefault(job, []).append((slot_ms, key, version, EventKind.MANUAL))
            if catch_ups:
                self._catch_up(catch_ups)
            for pending in self._requests.values():
                pending.sort()
        if self._requests:
            self._claim_requests()

    def _catch_up(self, requests: dict[str, tuple[int, str]]) -> None:
        """Add to the requests the last slot before each job was resumed with
        ``catch_up`` (see :meth:`Control.resume`), if within its catch-up window.

        Every instance that declares the job works out the same slot, from the
        request's time: the last one missed while paused. The request is made
        while the job is still paused (the resume waits for every instance to
        read it), so that no scheduled slot after it is claimed first.
        """
        done: list[tuple[str, int]] = []
        for key, (version, value) in requests.items():
            job = key[len(CATCH_UP) :].rpartition("/")[0]
            rt = self._runtimes.get(job)
            if rt is None or rt.removed or not rt.ready or rt.next_slot is None:
                continue
            try:
                resumed = datetime.fromtimestamp(float(json.loads(value)["asked"]), timezone.utc)
            except (ValueError, KeyError, TypeError, OverflowError):
                continue
            latest = rt.slot_at_or_before(resumed)
            if latest is None or rt.next_slot.ms <= latest.ms:
                continue  # its scheduled claim comes first
            if self._lateness(latest) > rt.job.catch_up_for(latest.time, rt.next_slot.time):
                done.append((key, version))  # nothing within the window: nothing to run
                continue
            self._requests.setdefault(job, []).append((latest.ms, key, version, EventKind.CATCH_UP))
        for key, version in done:
            with contextlib.suppress(Conflict):
                self.store.set_control(key, None, version)

    def _claim_asked(
        self,
        batch: list[tuple[JobRuntime, Slot, str, int]],
        kind: EventKind,
        waits: tuple[ClaimStatus, ...],
    ) -> list[tuple[Slot, Claim]]:
        """Claim the slots that requests ask for: ``batch`` of (job, slot, request key,
        its version); the answered ones, in order.

        A request whose claim failed, or was answered one of ``waits``, stays
        to be asked again; any other answer removes it (whoever removes it
        first). A slot won begins here, reported as ``kind``; one another
        instance holds is backed up.
        """
        if not batch:
            return []
        sent = self._clock.monotonic()
        claims = self._per_job(
            [rt for rt, *_ in batch], [(rt, slot) for rt, slot, *_ in batch], self._claims
        )
        answered = []
        for (rt, slot, key, version), claim in zip(batch, claims, strict=True):
            if isinstance(claim, Exception) or claim.status in waits:
                continue
            answered.append((slot, claim))
            with contextlib.suppress(Conflict):  # another instance removed it first
                self.store.set_control(key, None, version)
            if claim.won:
                assert claim.holder is not None
                self._emit(kind, slot=slot, attempt=claim.holder.attempt, token=claim.holder.token)
                self._begin(rt, slot, claim.holder, sent)
            elif claim.status is ClaimStatus.TAKEN and claim.holder is not None:
                self._back_up(rt, claim.holder)
        return answered

    def _pending_before(self, rt: JobRuntime, slot_ms: int) -> int | None:
        """The time (ms) of a run-now request of ``rt``'s job due before ``slot_ms``, if any."""
        pending = self._requests.get(rt.job.name)
        return pending[0][0] if pending and pending[0][0] < slot_ms else None

    def _claim_requests(self) -> None:
        """Claim the slots asked to run now (``run/<job>/<id>``, see :meth:`Control.trigger`).

        A request names a slot of its own, a little ahead of when it was made
        (:data:`~anarchon_core.control.RUN_NOW_LEAD`), so that every instance
        reads it before that time. It is claimed at its time like any slot,
        by every instance that declares the job, once each has dealt with the
        job's scheduled slots before it; and no instance claims a scheduled
        slot after it until it is answered (:meth:`_claim_due` waits), so a
        scheduled slot does not supersede it. It is removed once recorded
        (won here, or by another), or superseded by a newer slot (an
        instance that had not read it); it waits while the job's previous run
        holds its lease, or while paused.
        """
        now_ms = int(self._clock.time() * 1000)
        batches: dict[EventKind, list[tuple[JobRuntime, Slot, str, int]]] = {}
        for job, pending in self._requests.items():
            rt = self._runtimes.get(job)
            if rt is None or rt.removed or not rt.ready or not pending:
                continue  # another instance's job, or not placed yet
            slot_ms, key, version, kind = pending[0]
            if slot_ms > now_ms:
                continue  # not its time yet
            if rt.next_slot is not None and rt.next_slot.ms <= slot_ms:
                continue  # this instance's scheduled slots before it come first
            batches.setdefault(kind, []).append((rt, Slot.from_ms(job, slot_ms), key, version))
        waits = (ClaimStatus.BUSY, ClaimStatus.PAUSED)  # asked again at a later step
        for kind, batch in batches.items():
            for slot, claim in self._claim_asked(batch, kind, waits):
                self._requests[slot.job].pop(0)
                holder = claim.holder
                if claim.won and kind is EventKind.MANUAL:
                    self._mark_manual(slot)
                elif not claim.won and holder is not None and holder.slot_ms != slot.ms:
                    what = "run-now request" if kind is EventKind.MANUAL else "catch-up"
                    self._emit(EventKind.MISSED, slot=slot, detail=f"{what} superseded")

    def _resolve(self, definition: Definition) -> Callable[..., Any] | None:
        """The handler registered under the definition's handler name, given its args."""
        with self._lock:
            function = self._handlers.get(definition.handler)
        if function is None:
            return None
        if not definition.args and not definition.kwargs:
            return function
        args, kwargs = tuple(definition.args), dict(definition.kwargs)

        def call(run: Run) -> Any:  # with arguments, the run comes first
            return function(run, *args, **kwargs)

        call.__name__ = getattr(function, "__name__", definition.handler)
        return call

    def _apply_definitions(self, entries: dict[str, tuple[int, str]]) -> None:
        """Add, change and remove the jobs whose schedule is stored (see :class:`Definition`).

        A job declared in code keeps its code schedule: a stored one of the
        same name is ignored here (reported once). A stored schedule whose
        handler this instance lacks is left to the instances that have it.
        """
        seen: set[str] = set()
        for key, (version, text) in entries.items():
            name = key[len(DEFINED) :]
            seen.add(name)
            if self._stored.get(name) == version or self._skipped.get(name) == version:
                continue
            self._skipped.pop(name, None)
            with self._lock:
                rt = self._runtimes.get(name)
            if rt is not None and not rt.removed and name not in self._stored:
                self._skip(name, version, "a job of that name is declared in code here")
                continue
            try:
                definition = Definition.from_json(name, text, version)
                handler = self.resolve(definition)
            except Exception as exc:
                self._skip(name, version, _describe(exc))
                continue
            if handler is None:
                self._skip(name, version, f"no handler named {definition.handler!r} here")
                if name in self._stored:
                    self._drop_stored(name)
                continue
            if name in self._stored:
                self._drop_stored(name)
            try:
                self.add_job(
                    handler,
                    name=name,
                    every=definition.every,
                    cron=definition.cron,
                    timezone=definition.timezone,
                    anchor=None
                    if definition.anchor is None
                    else datetime.fromtimestamp(definition.anchor, timezone.utc),
                    **definition.job_options,
                )
            except ConfigurationError as exc:
                self._skip(name, version, str(exc))
                continue
            self._stored[name] = version
            log.info("anarchon: stored schedule %s v%d: %s", name, version, definition.describe())
        for name in [name for name in self._stored if name not in seen]:
            self._drop_stored(name)
            log.info("anarchon: stored schedule %s removed", name)
        for name in [name for name in self._skipped if name not in seen]:
            del self._skipped[name]

    def _drop_stored(self, name: str) -> None:
        del self._stored[name]
        with contextlib.suppress(KeyError):
            self.remove_job(name)

    def _skip(self, name: str, version: int, why: str) -> None:
        self._skipped[name] = version
        log.warning("anarchon: stored schedule %s v%d not run here: %s", name, version, why)

    def _backfill(self, requests: dict[str, tuple[int, str]]) -> None:
        """Run the slots of each backfill request (``fill/<job>/<id>``), in order, one at a time.

        A job's backfill has a record of its own in the store (the job's name
        and :data:`~anarchon_core.slots.BACKFILL`), so its past slots are
        claimed there, each once across the instances, with their normal slot
        ids, apart from the job's live schedule. The next slot is claimed once
        the previous one ended (done or failed); a run that lapses is taken
        over as any. A job's requests run oldest first; once its range is
        done, the request is removed.
        """
        oldest: dict[str, tuple[float, str, int, int, int]] = {}
        for key, (version, value) in requests.items():
            job = key[len(FILL) :].rpartition("/")[0]
            try:
                data = json.loads(value)
                order = (
                    float(data["asked"]),
                    key,
                    version,
                    int(data["from_ms"]),
                    int(data["to_ms"]),
                )
            except (ValueError, KeyError, TypeError):
                continue
            if job not in oldest or order < oldest[job]:
                oldest[job] = order
        todo: list[tuple[JobRuntime, tuple[float, str, int, int, int]]] = []
        for job, request in sorted(oldest.items()):
            rt = self._runtimes.get(job)
            if rt is None or rt.removed or not rt.ready:
                continue
            fill = self._runtimes.get(job + BACKFILL)
            if fill is None:
                fill = self._runtimes[job + BACKFILL] = JobRuntime(
                    rt.job.backfill(), self._agenda, next(self._seq)
                )
                fill.ready = True
            else:
                fill.job = rt.job.backfill()  # the job's handler and options as they are now
            if fill.runner is None and fill.backup is None:
                todo.append((fill, request))
        if not todo:
            return
        paused = self.store.paused()
        records = self._per_job([f for f, _ in todo], [f for f, _ in todo], self._states)
        batch: list[tuple[JobRuntime, Slot]] = []
        for (fill, (_, key, version, start_ms, end_ms)), record in zip(todo, records, strict=True):
            if isinstance(record, Exception):
                continue
            job = fill.job.name[: -len(BACKFILL)]
            going = record is not None and record.state not in ENDED and not record.unpicked
            if going and record is not None and record.slot_ms >= start_ms:
                self._back_up(fill, record)  # still going, or lapsed: taken over as any run
                continue
            after = from_ms(start_ms - 1)
            if record is not None and start_ms <= record.slot_ms < end_ms:
                after = from_ms(record.slot_ms)
            next_time = fill.job.schedule.next_after(after)
            if to_ms(next_time) >= end_ms:
                with contextlib.suppress(Conflict):  # another instance removed it first
                    self.store.set_control(key, None, version)
                log.info("anarchon: backfill of %s done (%s)", job, key)
                continue
            if not paused.covers(job):
                batch.append((fill, Slot(fill.job.name, next_time)))
        if not batch:
            return
        sent = self._clock.monotonic()
        claims = self._per_job([f for f, _ in batch], batch, self._claims)
        for (fill, slot), claim in zip(batch, claims, strict=True):
            if isinstance(claim, Exception):
                continue
            if claim.won:
                assert claim.holder is not None
                self._emit(
                    EventKind.WON, slot=slot, attempt=claim.holder.attempt, token=claim.holder.token
                )
                self._begin(fill, slot, claim.holder, sent)
            elif claim.holder is not None and claim.holder.slot_ms == slot.ms:
                self._back_up(fill, claim.holder)

    def _mark_manual(self, slot: Slot) -> None:
        """Record ``slot`` among its job's manual slots (the newest :data:`MANUAL_KEPT`)."""
        prefix = f"{MANUAL}{slot.job}/"
        try:
            with contextlib.suppress(Conflict):
                self.store.set_control(f"{prefix}{slot.ms}", "{}", 0)
            marks = self.store.controls(prefix)
            old = sorted(marks, key=lambda k: int(k.rpartition("/")[2]))[:-MANUAL_KEPT]
            for key in old:
                with contextlib.suppress(Conflict):
                    self.store.set_control(key, None, marks[key][0])
        except Exception as exc:  # the run goes on; only its manual mark is missing
            log.warning("anarchon: could not mark %s as manual: %s", slot.id, _describe(exc))

    def _due_claims(self) -> list[JobRuntime]:
        """The jobs whose claim is due, taken out of the agenda (see :meth:`_claim_due`)."""
        runtimes = self._runtimes

        def claim_at(name: str) -> float | None:
            rt = runtimes.get(name)
            return None if rt is None or rt.next_slot is None or rt.removed else rt.claim_at

        names = self._agenda.claims.pop_due(self._clock.time(), claim_at)
        due = [runtimes[name] for name in names]
        due.sort(key=lambda rt: rt.seq)
        return due

    def _claim_due(self, due: list[JobRuntime]) -> None:
        """Phase 5: claim every slot due, in one batch."""
        now = self._clock.time()
        now_dt = datetime.fromtimestamp(now, timezone.utc)
        batch: list[tuple[JobRuntime, Slot]] = []
        for rt in due:
            if rt.next_slot is None or rt.claim_at > now:  # removed, or moved meanwhile
                continue
            slot = rt.next_slot
            latest = rt.slot_at_or_before(now_dt) if rt.following(slot).time <= now_dt else None
            if latest is not None and latest.time > slot.time:
                # Slots passed while this instance could not claim (paused, store down):
                # only the most recent one may still be claimed, never a backlog.
                self._emit(EventKind.MISSED, slot=slot, detail="skipped")
                slot = rt.next_slot = latest
            if rt.too_late(slot, now - slot.time.timestamp()):
                self._emit(EventKind.MISSED, slot=slot, detail="too late")
                self._advance(rt, slot)
                continue
            if self._requests and self._pending_before(rt, slot.ms) is not None:
                # A run-now request comes first: this slot waits for its answer.
                rt.claim_at = now + REQUEST_WAIT
                continue
            batch.append((rt, slot))
        if not batch:
            return
        sent = self._clock.monotonic()
        claims = self._answers(batch)
        version = self._peers.version
        for (rt, _), claim in zip(batch, claims, strict=True):
            if isinstance(claim, Exception):
                rt.claim_at = now + BACKOFF_MAX  # tried again, within its catch-up window
            else:
                self._peers.learn(claim, rt.preferred if rt.deferred else None)
        # The handlers of the slots won start first; then each job's next slot is
        # placed, once the batch taught what it could of the peers.
        try:
            for (rt, slot), claim in zip(batch, claims, strict=True):
                if not isinstance(claim, Exception):
                    self._claimed(rt, slot, claim, sent, rt.deferred)
        finally:
            for (rt, slot), claim in zip(batch, claims, strict=True):
                if not isinstance(claim, Exception) and not rt.removed:
                    self._advance(rt, slot)
        if self._peers.version != version:
            self._replace_deferred()

    def _replace_deferred(self) -> None:
        """Place again the claims deferred for a peer that is no longer live."""
        with self._lock:
            runtimes = list(self._runtimes.values())
        for rt in runtimes:
            waited_for = rt.preferred
            if rt.next_slot is not None and waited_for and waited_for not in self._peers:
                self._place(rt)

    def _answers(self, batch: list[tuple[JobRuntime, Slot]]) -> list[Claim | Exception]:
        """The answers to the claims of ``batch``, one round trip for each kind of call.

        A claim that waited for the slot's preferred instance reads the record
        first: when it holds the slot (the usual case) or a run that holds its
        lease, the read answers as the claim would have, without a write. Only
        the slots nobody claimed are claimed.
        """
        answers: list[Claim | Exception | None] = [None] * len(batch)
        waited = [i for i, (rt, _) in enumerate(batch) if rt.deferred]
        if waited:
            jobs = [batch[i][0] for i in waited]
            records = self._per_job(jobs, jobs, self._states)
            for i, record in zip(waited, records, strict=True):
                if isinstance(record, Exception):
                    answers[i] = record
                else:
                    answers[i] = Store._refusal(batch[i][1].ms, record)
        rest = [i for i, answer in enumerate(answers) if answer is None]
        if rest:
            jobs = [batch[i][0] for i in rest]
            claims = self._per_job(jobs, [batch[i] for i in rest], self._claims)
            for i, claim in zip(rest, claims, strict=True):
                answers[i] = claim
        return [answer for answer in answers if answer is not None]

    def _claims(self, due: list[tuple[JobRuntime, Slot]]) -> list[Claim]:
        requests = [ClaimRequest(rt.job.name, slot.ms, rt.options.lease) for rt, slot in due]
        return self.store.claim_many(requests, self.instance)

    def _states(self, jobs: list[JobRuntime]) -> list[JobState | None]:
        states = self.store.states(rt.job.name for rt in jobs)
        return [states.get(rt.job.name) for rt in jobs]

    def _per_job(
        self, jobs: list[JobRuntime], items: list[T], call: Callable[[list[T]], list[R]]
    ) -> list[R | Exception]:
        """``call(items)`` (item i about ``jobs[i]``), one batch; on an error, one at a time.

        A value one job carries may be what the store refuses: the other jobs
        then still go on, and that job's own error is reported (once, as
        ``store_refused``) and given back in its place. An outage
        (StoreUnavailable) fails the step, as any store error does. So does a
        batch in which every item failed, once: when its jobs fail alike again
        they fail alone, so that jobs the store keeps refusing cannot stop
        every step.
        """
        results: list[R | Exception]
        try:
            results = list(call(items))
        except StoreUnavailable:
            raise
        except BatchRefused as partial:  # each item answered: the refused ones fail alone
            results = partial.answers
        except Exception as batch:  # applied whole or not at all: each on its own
            results = [batch] if len(items) == 1 else []
            for item in items if len(items) > 1 else []:
                try:
                    results.extend(call([item]))
                except StoreUnavailable:
                    raise
                except BatchRefused as refused:
                    results.extend(refused.answers)
                except Exception as exc:
                    results.append(exc)
        failed = [result for result in results if isinstance(result, Exception)]
        if len(failed) == len(results) and not all(rt.refused or rt.suspect for rt in jobs):
            # Every item failed alike: a failure of the store, reported as such.
            # Should these jobs fail alike again, they fail alone.
            for rt in jobs:
                rt.suspect = True
            raise failed[0]
        for rt, result in zip(jobs, results, strict=True):
            if isinstance(result, Exception) and not rt.refused:
                self._emit(EventKind.STORE_REFUSED, job=rt.job.name, detail=_describe(result))
            rt.refused = isinstance(result, Exception)
            rt.suspect = False
        return results

    def _claimed(
        self, rt: JobRuntime, slot: Slot, claim: Claim, sent: float, deferred: float = 0.0
    ) -> None:
        holder = claim.holder
        if claim.won:
            assert holder is not None
            rt.backup = None
            kind = rt.won_kind(self._lateness(slot), deferred)
            self._emit(kind, slot=slot, attempt=holder.attempt, token=holder.token)
            self._begin(rt, slot, holder, sent)
        elif claim.status is ClaimStatus.TAKEN:
            self._emit(
                EventKind.TAKEN,
                slot=slot,
                attempt=holder.attempt if holder else None,
                token=holder.token if holder else None,
            )
            if holder is not None:
                self._back_up(rt, holder)
        elif claim.status is ClaimStatus.BUSY:
            running = Slot.from_ms(slot.job, holder.slot_ms).id if holder else "?"
            self._emit(EventKind.OVERLAP, slot=slot, detail=f"{running} still holds its lease")
            if holder is not None and rt.backup is None and rt.runner is None:
                self._back_up(rt, holder)
        elif claim.status is ClaimStatus.PAUSED:
            self._emit(EventKind.PAUSED, slot=slot)
            # A slot that started before the pause goes on, backed up as any run.
            if holder is not None and holder.held and rt.backup is None and rt.runner is None:
                self._back_up(rt, holder)
        else:
            self._emit(EventKind.TAKEN, slot=slot, detail="a newer slot is recorded")

    def _advance(self, rt: JobRuntime, slot: Slot) -> None:
        rt.next_slot = rt.following(slot)
        self._place(rt)
        rt.following(rt.next_slot)  # worked out now, not when its claim is due

    def _place(self, rt: JobRuntime) -> None:
        """Set when this instance claims ``rt.next_slot``: the slot time plus jitter, and
        plus a deferral if another instance claims it first."""
        assert rt.next_slot is not None
        slot_ms = rt.next_slot.ms
        offset = self._tick_offsets.get(slot_ms)
        if offset is None:
            # One draw per slot time, shared by the jobs due then, so they batch.
            offset = self._tick_offsets[slot_ms] = self._random.random()
            if len(self._tick_offsets) > TICK_OFFSETS_KEPT:
                for old in sorted(self._tick_offsets)[: TICK_OFFSETS_KEPT // 2]:
                    del self._tick_offsets[old]
        rt.place(offset, deferred=self._peers.preferred(rt, slot_ms) is not None)

    def _check_backups(self, now_mono: float, due: list[JobRuntime]) -> None:
        """Phase 4: check the leases of the slots this instance backs up.

        Those due for a check, and those of the jobs ``due`` to be claimed (a
        released older slot must not be superseded unseen).
        """
        runtimes = self._runtimes

        def next_check(name: str) -> float | None:
            rt = runtimes.get(name)
            return None if rt is None or rt.backup is None else rt.backup.next_check

        names = self._agenda.checks.pop_due(now_mono, next_check)
        checked = [runtimes[name] for name in names]
        seen = set(names)
        checked += [rt for rt in due if rt.backup is not None and rt.job.name not in seen]
        if not checked:
            return
        try:
            self._check(checked, now_mono)
        finally:
            for rt in checked:
                self._agenda.backup_moved(rt)

    def _check(self, checked: list[JobRuntime], now_mono: float) -> None:
        """Read the records ``checked`` back up, and act on each verdict."""
        states = self._per_job(checked, checked, self._states)
        for rt, record in zip(checked, states, strict=True):
            backup = rt.backup
            if backup is None or isinstance(record, Exception):  # removed, or checked later
                continue
            verdict = backup.verdict(record, now_mono, rt.options)
            if verdict is Verdict.DROP:
                rt.backup = None
            elif verdict is Verdict.MISSED:
                assert record is not None
                rt.backup = None
                detail = "handed off but never picked up; not sent again"
                self._emit(
                    EventKind.MISSED, slot=backup.slot, attempt=record.attempt, detail=detail
                )
            elif verdict is Verdict.TAKE_OVER:
                assert record is not None
                self._take_over(rt, record)

    def _take_over(self, rt: JobRuntime, record: JobState) -> None:
        job = rt.job
        sent = self._clock.monotonic()
        claim = self.store.takeover(
            job.name, record.slot_ms, self.instance, job.options.lease, record.token
        )
        if claim.won:
            assert claim.holder is not None
            rt.backup = None
            how = "hand-over" if record.state is RunState.RELEASED else "lease lapsed"
            slot = Slot.from_ms(job.name, record.slot_ms)
            self._emit(
                EventKind.TAKEOVER,
                slot=slot,
                attempt=claim.holder.attempt,
                token=claim.holder.token,
                detail=how,
            )
            self._begin(rt, slot, claim.holder, sent)
        elif claim.holder is not None and claim.holder.slot_ms == record.slot_ms:
            self._back_up(rt, claim.holder)
        else:
            rt.backup = None

    # -- taking up a role -----------------------------------------------

    def _back_up(self, rt: JobRuntime, holder: JobState) -> None:
        """Become the backup of ``holder``'s run, if the store keeps leases and it needs one."""
        if self.store.supports_lease and rt.backs_up(holder):
            slot = Slot.from_ms(rt.job.name, holder.slot_ms)
            rt.backup = Backup.of(slot, holder, self._clock.monotonic(), rt.options)

    def _begin(self, rt: JobRuntime, slot: Slot, holder: JobState, sent: float) -> None:
        """Become the runner of ``slot``, whose lease ``holder`` grants, and run its handler.

        ``sent`` is when the claim or takeover was sent: the lease is held from
        then, by this instance's clock. A run this instance still held for an
        older slot of the job is told it lost (its own lease lapsed, or the new
        claim could not have won).
        """
        token, key = holder.token, rt.job.name
        slot = shown(slot)  # a backfill's slot runs as its job's
        run = Run.of(
            slot,
            attempt=holder.attempt,
            token=token,
            instance=self.instance,
            dispatch=lambda lease: self.store.dispatch(key, token, lease),
            monotonic=self._clock.monotonic,
            key=key if key != slot.job else None,
        )
        previous = rt.runner
        if previous is not None:
            previous.run.mark_lost(
                f"superseded: this instance won {slot.id} (attempt {holder.attempt}) of the job"
            )
            if not previous.reported:
                self._emit_lost(previous)
        runner = rt.runner = Runner.start(slot, run, sent, rt.options)
        if run.lost:
            # The claim's answer came after the lease it granted could be relied on:
            # the handler does not start; the slot goes back for a backup (this
            # instance too) to take over as the next attempt.
            self._emit_lost(runner)
            rt.runner = None
            rt.backup = Backup.of_own(runner, self._clock.monotonic(), rt.options)
            try:
                self.store.release(key, token)
            except Exception as exc:  # its lease lapses instead; the claims after it go on
                log.warning("anarchon: could not give %s back: %s", slot.id, _describe(exc))
            return
        if self._inline:
            self._execute(rt, runner)
            return
        thread = self._clock.spawn(lambda: self._execute(rt, runner), f"anarchon:{run.slot_id}")
        self._handler_threads.append(thread)
        if len(self._handler_threads) > 2 * self._handlers_pruned_at + 64:
            self._handler_threads = [t for t in self._handler_threads if t.is_alive()]
            self._handlers_pruned_at = len(self._handler_threads)

    def _execute(self, rt: JobRuntime, runner: Runner) -> None:
        run, outcome, dispatch_failed = runner.run, RunState.DONE, False
        interrupted = False
        try:
            handler = rt.job.handler
            result = handler(run) if rt.job.takes_run else handler()
            if inspect.isawaitable(result):
                asyncio.run(_await(result))
        except LeaseLost:
            # The handler stopped because its run was lost (run.check()): not a failure.
            # The slot goes back (if the store still has it) for a backup to run.
            outcome, interrupted = RunState.RELEASED, True
        except DispatchFailed as exc:
            outcome, dispatch_failed = RunState.FAILED, True
            log.warning(
                "anarchon: could not dispatch %s attempt %d: %s", run.slot_id, run.attempt, exc
            )
        except BaseException:  # even SystemExit: the run must end, not hold its lease forever
            outcome = RunState.FAILED
            log.exception(
                "anarchon: job %s failed (%s attempt %d)", run.job, run.slot_id, run.attempt
            )
        ended_at = self._clock.time()
        self._done.put(Completion(rt, runner, outcome, dispatch_failed, interrupted, ended_at))
        self._wake.set()

    # -- time and state -------------------------------------------------

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.time(), timezone.utc)

    def _lateness(self, slot: Slot) -> float:
        return self._clock.time() - slot.time.timestamp()

    def _next_delay(self) -> float:
        now, now_mono = self._clock.time(), self._clock.monotonic()
        delays = [MAX_SLEEP]
        claim_at, check_at = self._agenda.claims.next_at(), self._agenda.checks.next_at()
        if claim_at is not None:
            delays.append(claim_at - now)
        if check_at is not None:
            delays.append(check_at - now_mono)
        for rt in list(self._agenda.held.values()):
            runner = rt.runner
            if runner is not None and not runner.run.lost:
                delays.append(runner.next_renew - now_mono)
        if self._controls:
            delays.append(self._controls_at - now_mono)
        for pending in self._requests.values():
            if pending:
                delays.append(pending[0][0] / 1000 - now)
        return max(0.0, min(delays))


async def _await(awaitable: Any) -> None:
    await awaitable


def _describe(exc: BaseException) -> str:
    """An error in one line: its message, with its type when that says more."""
    if isinstance(exc, StoreUnavailable):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
