"""The engine: jitter, claim, lease heartbeat, watch, takeover, hand-over, catch-up.

One scheduler runs per instance. All of its store traffic happens in
:meth:`Scheduler.run_pending`, which does whatever is due at the current time
and returns how long it may sleep. :meth:`Scheduler.start` calls it from one
background thread; tests call it directly with a :class:`~anarchon_core.clock.FakeClock`.
Handlers run in their own threads and report back through a queue.

Per job, an instance is in at most one of three roles for a slot:

- **claimant**: the slot's time (plus this instance's jitter) has come; the
  claim is sent in one batch with every other job due at the same moment;
- **runner**: it won; it renews the lease every ``renew`` seconds and
  finishes the run when the handler returns;
- **backup**: it lost to a runner; it checks the lease every ``watch``
  seconds and takes the slot over (compare-and-set on the token) once the
  lease lapsed or was released.

The roles and their decisions live in :mod:`anarchon_core.roles`, which makes
no store call; the scheduler asks the store and acts on what they decide. One
step goes through its phases in order: finish the runs whose handler
returned, renew leases, place new jobs on their schedule, check the
backed-up leases, claim the slots due, and finish once more.
"""

from __future__ import annotations

import asyncio
import inspect
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

from .clock import Clock, SystemClock
from .durations import Duration
from .errors import ConfigurationError, DispatchFailed, LeaseLost, StoreUnavailable
from .events import Emitter, Event, EventKind
from .jobs import Job, JobOptions, Run
from .roles import Backup, Completion, JobRuntime, Runner, Verdict
from .schedules import make_schedule
from .slots import Slot
from .store import Claim, ClaimRequest, ClaimStatus, JobState, RunState, Store

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
R = TypeVar("R")

#: Back-off after a store error, doubling up to the maximum.
BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
#: The longest the loop sleeps, so that wall-clock jumps are noticed.
MAX_SLEEP = 1.0
#: The longest :meth:`Scheduler.stop` waits for the hand-over to reach the store.
HANDOVER_WAIT = 10.0
#: How often :meth:`Scheduler.run_forever` looks whether a stop signal came.
SIGNAL_POLL = 0.05
#: The longest wait between two attempts to dispatch a slot the broker refused: a
#: broker back for this long plus ``watch`` within the catch-up window gets the slot.
DISPATCH_RETRY_MAX = 2.0
#: How many slot times' jitter draws are kept; past that, the older half is dropped.
TICK_OFFSETS_KEPT = 4096


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
    finished or handed off within the same step.
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
        self.instance = instance or default_instance()
        self._emit = Emitter(instance=self.instance, namespace=self.namespace, logger=log)
        if listener:
            self._emit.add_listener(listener)
        self._clock: Clock = clock or SystemClock()
        self._random = random.Random(seed)
        self._lock = threading.RLock()
        self._runtimes: dict[str, JobRuntime] = {}
        self._done: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._tick_offsets: dict[int, float] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = 0.0
        self._retry_at = 0.0
        self._handler_threads: list[threading.Thread] = []
        self._inline = inline
        #: The thread inside :meth:`run_pending`, and whether a stop waits for its end.
        self._stepping: int | None = None
        self._stop_after_step = False

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
                self._runtimes[job.name] = JobRuntime(job)
            elif not existing.removed:
                raise ConfigurationError(f"duplicate job name {job.name!r}")
            else:
                # Removed while its last run goes on: that run keeps its lease under
                # the new declaration, which schedules the slots after it.
                existing.job, existing.removed, existing.ready = job, False, False
        self._wake.set()
        return job

    def remove_job(self, name: str) -> None:
        """Stop scheduling ``name``. A run in progress keeps its lease and finishes."""
        with self._lock:
            rt = self._runtimes[name]
            rt.removed = True
            rt.next_slot = rt.backup = None
            if rt.runner is None:
                del self._runtimes[name]

    @property
    def jobs(self) -> dict[str, Job]:
        with self._lock:
            return {name: rt.job for name, rt in self._runtimes.items()}

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        self._emit.add_listener(listener)

    @property
    def stats(self) -> dict[str, int]:
        """How many events of each kind this instance has seen (a metric)."""
        return self._emit.counts

    def running(self) -> list[Run]:
        """The runs this instance currently holds."""
        with self._lock:
            return [rt.runner.run for rt in self._runtimes.values() if rt.runner]

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
        for rt in self._snapshot():
            runner = rt.runner
            if runner is None:
                continue
            rt.runner = None
            run = runner.run
            run.mark_lost("handed over during shutdown")
            if not self.store.supports_lease:
                continue
            try:
                released = self.store.release(run.job, run.token)
            except Exception as exc:  # its lease lapses instead; a backup takes it over
                log.warning("anarchon: could not hand %s over: %s", run.slot_id, _describe(exc))
                continue
            if released:
                self._emit(EventKind.HANDED_OVER, slot=runner.slot, attempt=run.attempt)

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
        now_mono = self._clock.monotonic()
        if now_mono < self._retry_at:
            self._report_lost()
            return self._retry_at - now_mono
        try:
            # Runs whose handler returned since the last step are finished first: the
            # claim of their job's next slot would otherwise find their lease live and
            # skip that slot as an overlap (and renewing them would be wasted).
            self._finish_completed()
            self._renew(now_mono)
            # Runs lost by now (a call may have blocked past their deadline) are
            # backed up before the claims, like anyone else's lapsed run.
            self._report_lost()
            self._initialise()
            # Backups before claims: a job's older slot, handed over or lapsed, is
            # taken over before its next slot's claim could supersede it.
            self._check_backups(now_mono)
            self._claim_due()
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
        for rt in self._snapshot():
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
        """Phase 1 (and 6): finish the runs whose handler returned or raised."""
        pending = self._completions()
        for index, done in enumerate(pending):
            rt, runner, run = done.runtime, done.runner, done.runner.run
            if run.lost and not runner.reported:
                self._emit_lost(runner)
            try:
                finished, retry = self._end_run(done)
            except Exception:  # kept until recorded: the step fails and is retried
                for unrecorded in pending[index:]:
                    self._done.put(unrecorded)
                raise
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
                        self._runtimes.pop(run.job, None)
            if done.interrupted and not finished:
                continue  # stopped on losing the run, which another instance holds now
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
                self._emit(done.kind, slot=runner.slot, attempt=run.attempt, detail=detail)
            else:
                run.mark_lost("finish refused: another instance holds the slot")
                self._emit(EventKind.FINISH_REFUSED, slot=runner.slot, attempt=run.attempt)

    def _end_run(self, done: Completion) -> tuple[bool, bool]:
        """Record the end of ``done``'s run: (accepted by the store, released for a retry)."""
        run, rt = done.runner.run, done.runtime
        if done.handed_off:
            return True, False  # it belongs to whoever executes the work now
        if done.interrupted:
            # Stopped on losing the run: released if the store still gives it to this
            # instance, so that a backup runs the slot at once; else already taken over.
            return (not self.store.supports_lease or self.store.release(run.job, run.token)), True
        if done.dispatch_failed and self.store.supports_lease:
            lateness = done.ended_at - done.runner.slot.time.timestamp()
            if not rt.too_late(done.runner.slot, lateness):
                # Not run, so not failed: the lease is cut to a back-off that doubles
                # with each attempt, then whoever can reach the broker takes it over.
                backoff = dispatch_retry_after(run.attempt, rt.options.watch)
                return self.store.renew(run.job, run.token, backoff), True
        return self.store.finish(run.job, run.token, done.outcome), False

    def _renew(self, now_mono: float) -> None:
        """Phase 2: renew the leases due.

        A run is held until its deadline: the moment its last accepted renewal
        was sent, plus the lease less a safety margin. A renewal that fails
        leaves the deadline where it was, so the run turns lost on time even
        if the store never answers.
        """
        if not self.store.supports_lease:
            return
        for rt in self._snapshot():
            runner = rt.runner
            if runner is None or runner.run.lost or runner.run.handed_off_lease is not None:
                continue
            run = runner.run
            if not runner.renewal_due(now_mono):
                continue
            sent = self._clock.monotonic()
            runner.retry_renewal(sent)
            if not self.store.renew(run.job, run.token, rt.options.lease):
                run.mark_lost("renewal refused: another instance took the slot over")
            elif not runner.renewed(sent, rt.options):
                # Accepted, but after the run's deadline passed: the handler was told
                # it lost, so the lease goes back at once for a backup to take over.
                self.store.release(run.job, run.token)

    def _emit_lost(self, runner: Runner) -> None:
        run = runner.run
        runner.reported = True
        self._emit(EventKind.LOST, slot=runner.slot, attempt=run.attempt, detail=run.lost_reason)

    def _initialise(self) -> None:
        """Phase 3: place new jobs on their schedule; catch up, or back up a running slot."""
        new = [rt for rt in self._snapshot() if not rt.ready and not rt.removed]
        if not new:
            return
        states = self._per_job(new, new, self._states)
        now = self._now()
        for rt, record in zip(new, states, strict=True):
            if isinstance(record, Exception):
                continue  # placed at a later step, once the store takes this job's read
            rt.ready = True
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

    def _claim_due(self) -> None:
        """Phase 5: claim every slot due, in one batch."""
        now = self._clock.time()
        due: list[tuple[JobRuntime, Slot]] = []
        for rt in self._snapshot():
            if rt.next_slot is None or rt.claim_at > now:
                continue
            slot = rt.next_slot
            latest = rt.slot_at_or_before(self._now())
            if latest is not None and latest.time > slot.time:
                # Slots passed while this instance could not claim (paused, store down):
                # only the most recent one may still be claimed, never a backlog.
                self._emit(EventKind.MISSED, slot=slot, detail="skipped")
                slot = rt.next_slot = latest
            if rt.too_late(slot, now - slot.time.timestamp()):
                self._emit(EventKind.MISSED, slot=slot, detail="too late")
                self._advance(rt, slot)
                continue
            due.append((rt, slot))
        if not due:
            return
        sent = self._clock.monotonic()
        claims = self._per_job([rt for rt, _ in due], due, self._claims)
        for (rt, slot), claim in zip(due, claims, strict=True):
            if isinstance(claim, Exception):
                rt.claim_at = now + BACKOFF_MAX  # tried again, within its catch-up window
                continue
            self._advance(rt, slot)
            self._claimed(rt, slot, claim, sent)

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
        then still go on, and that job's own error is reported (once) and given
        back in its place. An outage (StoreUnavailable), or an error on every
        item alike, fails the step as any store error does; except for jobs
        already found refused while others were taken, which fail alone.
        """
        results: list[R | Exception]
        try:
            results = list(call(items))
        except StoreUnavailable:
            raise
        except Exception as batch:
            results = []
            for item in items if len(items) > 1 else []:
                try:
                    results.extend(call([item]))
                except StoreUnavailable:
                    raise
                except Exception as exc:
                    results.append(exc)
            if len(items) == 1:
                results = [batch]
            if all(isinstance(result, Exception) for result in results) and not all(
                rt.refused for rt in jobs
            ):
                raise batch from None
        for rt, result in zip(jobs, results, strict=True):
            if isinstance(result, Exception) and not rt.refused:
                self._emit(EventKind.STORE_REFUSED, job=rt.job.name, detail=_describe(result))
            rt.refused = isinstance(result, Exception)
        return results

    def _claimed(self, rt: JobRuntime, slot: Slot, claim: Claim, sent: float) -> None:
        holder = claim.holder
        if claim.won:
            assert holder is not None
            rt.backup = None
            self._emit(rt.won_kind(self._lateness(slot)), slot=slot, attempt=holder.attempt)
            self._begin(rt, slot, holder, sent)
        elif claim.status is ClaimStatus.TAKEN:
            self._emit(EventKind.TAKEN, slot=slot, attempt=holder.attempt if holder else None)
            if holder is not None:
                self._back_up(rt, holder)
        elif claim.status is ClaimStatus.BUSY:
            running = Slot.from_ms(slot.job, holder.slot_ms).id if holder else "?"
            self._emit(EventKind.OVERLAP, slot=slot, detail=f"{running} still holds its lease")
            if holder is not None and rt.backup is None and rt.runner is None:
                self._back_up(rt, holder)
        else:
            self._emit(EventKind.TAKEN, slot=slot, detail="a newer slot is recorded")

    def _advance(self, rt: JobRuntime, slot: Slot) -> None:
        rt.next_slot = rt.slot_after(slot.time)
        self._place(rt)

    def _place(self, rt: JobRuntime) -> None:
        """Set when this instance claims ``rt.next_slot``: the slot time plus jitter."""
        assert rt.next_slot is not None
        slot_ms = rt.next_slot.ms
        offset = self._tick_offsets.get(slot_ms)
        if offset is None:
            # One draw per slot time, shared by the jobs due then, so they batch.
            offset = self._tick_offsets[slot_ms] = self._random.random()
            if len(self._tick_offsets) > TICK_OFFSETS_KEPT:
                for old in sorted(self._tick_offsets)[: TICK_OFFSETS_KEPT // 2]:
                    del self._tick_offsets[old]
        rt.place(offset)

    def _check_backups(self, now_mono: float) -> None:
        """Phase 4: check the leases of the slots this instance backs up.

        Those due for a check, and those of jobs whose next slot is about to be
        claimed (a released older slot must not be superseded unseen).
        """
        now = self._clock.time()
        checked = [
            rt
            for rt in self._snapshot()
            if rt.backup
            and (rt.backup.next_check <= now_mono or (rt.next_slot and rt.claim_at <= now))
        ]
        if not checked:
            return
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
            self._emit(EventKind.TAKEOVER, slot=slot, attempt=claim.holder.attempt, detail=how)
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
        token = holder.token
        run = Run.of(
            slot,
            attempt=holder.attempt,
            token=token,
            instance=self.instance,
            dispatch=lambda lease: self.store.dispatch(slot.job, token, lease),
            monotonic=self._clock.monotonic,
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
                self.store.release(slot.job, token)
            except Exception as exc:  # its lease lapses instead; the claims after it go on
                log.warning("anarchon: could not give %s back: %s", slot.id, _describe(exc))
            return
        if self._inline:
            self._execute(rt, runner)
            return
        thread = self._clock.spawn(lambda: self._execute(rt, runner), f"anarchon:{run.slot_id}")
        self._handler_threads = [t for t in self._handler_threads if t.is_alive()]
        self._handler_threads.append(thread)

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

    def _snapshot(self) -> list[JobRuntime]:
        with self._lock:
            return list(self._runtimes.values())

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.time(), timezone.utc)

    def _lateness(self, slot: Slot) -> float:
        return self._clock.time() - slot.time.timestamp()

    def _next_delay(self) -> float:
        now, now_mono = self._clock.time(), self._clock.monotonic()
        delays = [MAX_SLEEP]
        for rt in self._snapshot():
            delays.extend(rt.deadlines(now, now_mono))
        return max(0.0, min(delays))


async def _await(awaitable: Any) -> None:
    await awaitable


def _describe(exc: BaseException) -> str:
    """An error in one line: its message, with its type when that says more."""
    if isinstance(exc, StoreUnavailable):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
