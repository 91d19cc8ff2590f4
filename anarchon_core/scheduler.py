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
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from .clock import Clock, SystemClock
from .durations import Duration
from .errors import ConfigurationError, StoreUnavailable
from .events import Emitter, Event, EventKind
from .jobs import Job, JobOptions, Run
from .schedules import make_schedule
from .slots import Slot
from .store import Claim, ClaimRequest, ClaimStatus, JobState, RunState, Store

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: How far past its time (beyond jitter) a slot still counts as on time.
ON_TIME = 1.0
#: Back-off after a store error, doubling up to the maximum.
BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
#: The longest the loop sleeps, so that wall-clock jumps are noticed.
MAX_SLEEP = 1.0
#: The longest :meth:`Scheduler.stop` waits for the hand-over to reach the store.
HANDOVER_WAIT = 10.0
#: How often :meth:`Scheduler.run_forever` looks whether a stop signal came.
SIGNAL_POLL = 0.05

#: The log level of each event kind, by name.
_LEVELS = {kind.value: kind.level for kind in EventKind}


def default_instance() -> str:
    """``host:pid:random``: unique per process, readable in ``anarchon status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(16):04x}"


@dataclass
class _Active:
    """A run this instance holds."""

    slot: Slot
    run: Run
    next_renew: float
    last_renewed: float


@dataclass
class _Watch:
    """A slot this instance backs up, and what it has seen of its lease."""

    slot: Slot
    token: int
    next_check: float
    #: The furthest lease end seen for this token, on this instance's monotonic clock.
    furthest: float = 0.0
    #: A lease longer than the job's own was seen: the run was handed off (Run.hand_off).
    handed_off: bool = False
    #: The lease end then moved earlier: an executor took the run and renews it.
    picked_up: bool = False

    def observe(self, record: JobState, now_mono: float, lease: float) -> None:
        if record.token != self.token:
            self.token, self.furthest, self.handed_off, self.picked_up = (
                record.token,
                0,
                False,
                False,
            )
        if record.state is not RunState.RUNNING:
            return
        end = now_mono + record.lease_remaining
        if record.lease_remaining > lease + 1.0:
            self.handed_off = True
        if self.furthest and end < self.furthest - 1.0:
            self.picked_up = True
        self.furthest = max(self.furthest, end)


class _Runtime:
    """Per-job state of this instance."""

    __slots__ = ("active", "claim_at", "job", "next_slot", "ready", "removed", "watch")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.next_slot: Slot | None = None
        self.claim_at = 0.0
        self.watch: _Watch | None = None
        self.active: _Active | None = None
        self.ready = False
        self.removed = False

    def slot_after(self, t: datetime) -> Slot:
        """The job's first slot strictly after ``t``."""
        return Slot(self.job.name, self.job.schedule.next_after(t))

    def slot_at_or_before(self, t: datetime) -> Slot | None:
        """The job's last slot at or before ``t``."""
        latest = self.job.schedule.latest_at_or_before(t)
        return None if latest is None else Slot(self.job.name, latest)


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
        self._runtimes: dict[str, _Runtime] = {}
        self._done: queue.SimpleQueue[tuple[_Runtime, Run, RunState]] = queue.SimpleQueue()
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
                self._runtimes[job.name] = _Runtime(job)
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
            rt.next_slot = rt.watch = None
            if rt.active is None:
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
            return [rt.active.run for rt in self._runtimes.values() if rt.active]

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
            except Exception:  # pragma: no cover - the loop must never die
                log.exception("anarchon: unexpected error in the scheduling loop")
                delay = BACKOFF_MAX
            self._clock.wait(self._wake, min(delay, MAX_SLEEP))
            self._wake.clear()
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._finish_completed()
        except StoreUnavailable as exc:
            log.warning("anarchon: could not finish runs while stopping: %s", exc)
        for rt in self._snapshot():
            active = rt.active
            if active is None:
                continue
            rt.active = None
            run = active.run
            run._lose("handed over during shutdown")
            if not self.store.supports_lease:
                continue
            try:
                released = self.store.release(run.job, run.token)
            except StoreUnavailable as exc:
                log.warning("anarchon: could not hand %s over: %s", run.slot_id, exc)
                continue
            if released:
                self._emit(EventKind.HANDED_OVER, slot=active.slot, attempt=run.attempt)

    # -- the engine -----------------------------------------------------

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
            return self._retry_at - now_mono
        try:
            self._finish_completed()
            self._renew(now_mono)
            self._initialise()
            self._claim_due()
            self._check_watches(now_mono)
            self._finish_completed()
        except StoreUnavailable as exc:
            self._store_failed(exc)
            return self._backoff
        if self._backoff:
            self._backoff = 0.0
            self._emit(EventKind.STORE_RECOVERED)
        return self._next_delay()

    def _snapshot(self) -> list[_Runtime]:
        with self._lock:
            return list(self._runtimes.values())

    def _store_failed(self, exc: StoreUnavailable) -> None:
        if not self._backoff:
            self._emit(EventKind.STORE_UNAVAILABLE, detail=str(exc))
        self._backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, self._backoff * 2))
        self._retry_at = self._clock.monotonic() + self._backoff
        # A runner that cannot renew for longer than its lease must give the run up.
        self._renew(self._clock.monotonic(), reachable=False)

    def _initialise(self) -> None:
        """Place new jobs on their schedule: catch up, or back up a running slot."""
        new = [rt for rt in self._snapshot() if not rt.ready and not rt.removed]
        if not new:
            return
        states = self.store.states(rt.job.name for rt in new)
        now = self._now()
        for rt in new:
            rt.ready = True
            previous = rt.slot_at_or_before(now)
            record = states.get(rt.job.name)
            rt.next_slot = rt.slot_after(now)
            if record is None or previous is None:
                # A job never seen before starts with its next slot, not a catch-up.
                pass
            elif record.slot_ms == previous.ms:
                self._watch(rt, record)
            elif (
                record.slot_ms < previous.ms
                and self._lateness(previous) <= rt.job.catch_up_for(previous.time)
                # A slot that came while the previous run still held its lease was
                # skipped as an overlap, not missed: it is not caught up.
                and record.lease_remaining + self._lateness(previous) <= 0
            ):
                rt.next_slot = previous
            self._place(rt)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.time(), timezone.utc)

    def _lateness(self, slot: Slot) -> float:
        return self._clock.time() - slot.time.timestamp()

    def _place(self, rt: _Runtime) -> None:
        """Set when this instance claims ``rt.next_slot``: the slot time plus jitter."""
        assert rt.next_slot is not None
        slot_ms = rt.next_slot.ms
        offset = self._tick_offsets.get(slot_ms)
        if offset is None:
            # One draw per slot time, shared by the jobs due then, so they batch.
            offset = self._tick_offsets[slot_ms] = self._random.random()
            if len(self._tick_offsets) > 4096:
                for old in sorted(self._tick_offsets)[:2048]:
                    del self._tick_offsets[old]
        rt.claim_at = rt.next_slot.time.timestamp() + offset * rt.job.jitter

    def _claim_due(self) -> None:
        now = self._clock.time()
        due: list[tuple[_Runtime, Slot]] = []
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
            limit = max(rt.job.catch_up_for(slot.time), rt.job.jitter + ON_TIME)
            if now - slot.time.timestamp() > limit:
                self._emit(EventKind.MISSED, slot=slot, detail="too late")
                self._advance(rt, slot)
                continue
            due.append((rt, slot))
        if not due:
            return
        requests = [ClaimRequest(rt.job.name, slot.ms, rt.job.options.lease) for rt, slot in due]
        claims = self.store.claim_many(requests, self.instance)
        for (rt, slot), claim in zip(due, claims, strict=False):
            self._advance(rt, slot)
            self._claimed(rt, slot, claim)

    def _advance(self, rt: _Runtime, slot: Slot) -> None:
        rt.next_slot = rt.slot_after(slot.time)
        self._place(rt)

    def _claimed(self, rt: _Runtime, slot: Slot, claim: Claim) -> None:
        holder = claim.holder
        if claim.won:
            assert holder is not None
            rt.watch = None
            late = self._lateness(slot) > rt.job.jitter + ON_TIME
            self._emit(
                EventKind.CATCH_UP if late else EventKind.WON, slot=slot, attempt=holder.attempt
            )
            self._begin(rt, slot, holder)
        elif claim.status is ClaimStatus.TAKEN:
            self._emit(EventKind.TAKEN, slot=slot, attempt=holder.attempt if holder else None)
            if holder is not None:
                self._watch(rt, holder)
        elif claim.status is ClaimStatus.BUSY:
            running = Slot.from_ms(slot.job, holder.slot_ms).id if holder else "?"
            self._emit(EventKind.OVERLAP, slot=slot, detail=f"{running} still holds its lease")
            if holder is not None and rt.watch is None and rt.active is None:
                self._watch(rt, holder)
        else:
            self._emit(EventKind.TAKEN, slot=slot, detail="a newer slot is recorded")

    def _watch(self, rt: _Runtime, holder: JobState) -> None:
        if not self.store.supports_lease:
            return
        # Judged by token, not by name: a restarted process may reuse its name.
        held = rt.active is not None and rt.active.run.token == holder.token
        if held or holder.state in (RunState.DONE, RunState.FAILED):
            return
        now_mono = self._clock.monotonic()
        rt.watch = _Watch(Slot.from_ms(rt.job.name, holder.slot_ms), holder.token, now_mono)
        rt.watch.observe(holder, now_mono, rt.job.options.lease)
        if not holder.lapsed:
            rt.watch.next_check += rt.job.options.watch

    def _check_watches(self, now_mono: float) -> None:
        watched = [rt for rt in self._snapshot() if rt.watch and rt.watch.next_check <= now_mono]
        if not watched:
            return
        states = self.store.states(rt.job.name for rt in watched)
        for rt in watched:
            watch = rt.watch
            record = states.get(rt.job.name)
            if (
                watch is None
                or record is None
                or record.slot_ms != watch.slot.ms
                or record.state in (RunState.DONE, RunState.FAILED)
            ):
                rt.watch = None
            else:
                watch.observe(record, now_mono, rt.job.options.lease)
                if not record.lapsed:
                    watch.next_check = now_mono + rt.job.options.watch
                elif watch.handed_off and not watch.picked_up and record.state is RunState.RUNNING:
                    # Handed off but never picked up: the work may be running somewhere
                    # that cannot renew (or was lost). Sending it again could run it twice;
                    # the job's next slot supersedes it instead.
                    rt.watch = None
                    detail = "handed off but never picked up; not sent again"
                    self._emit(
                        EventKind.MISSED, slot=watch.slot, attempt=record.attempt, detail=detail
                    )
                else:
                    self._take_over(rt, record)

    def _take_over(self, rt: _Runtime, record: JobState) -> None:
        job = rt.job
        claim = self.store.takeover(
            job.name, record.slot_ms, self.instance, job.options.lease, record.token
        )
        if claim.won:
            assert claim.holder is not None
            rt.watch = None
            how = "hand-over" if record.state is RunState.RELEASED else "lease lapsed"
            slot = Slot.from_ms(job.name, record.slot_ms)
            self._emit(EventKind.TAKEOVER, slot=slot, attempt=claim.holder.attempt, detail=how)
            self._begin(rt, slot, claim.holder)
        elif claim.holder is not None and claim.holder.slot_ms == record.slot_ms:
            self._watch(rt, claim.holder)
        else:
            rt.watch = None

    def _begin(self, rt: _Runtime, slot: Slot, holder: JobState) -> None:
        run = Run.of(slot, attempt=holder.attempt, token=holder.token, instance=self.instance)
        run._extend = lambda lease: self.store.renew(run.job, run.token, lease)
        now_mono = self._clock.monotonic()
        rt.active = _Active(slot, run, now_mono + rt.job.options.renew_every, now_mono)
        if self._inline:
            self._execute(rt, run)
            return
        thread = self._clock.spawn(lambda: self._execute(rt, run), f"anarchon:{run.slot_id}")
        self._handler_threads = [t for t in self._handler_threads if t.is_alive()]
        self._handler_threads.append(thread)

    def _execute(self, rt: _Runtime, run: Run) -> None:
        outcome = RunState.DONE
        try:
            handler = rt.job.handler
            result = handler(run) if rt.job.takes_run else handler()
            if inspect.isawaitable(result):
                asyncio.run(_await(result))
        except BaseException:  # even SystemExit: the run must end, not hold its lease forever
            outcome = RunState.FAILED
            log.exception(
                "anarchon: job %s failed (%s attempt %d)", run.job, run.slot_id, run.attempt
            )
        self._done.put((rt, run, outcome))
        self._wake.set()

    def _finish_completed(self) -> None:
        while True:
            try:
                rt, run, outcome = self._done.get_nowait()
            except queue.Empty:
                return
            handed_off = run._hand_off is not None and outcome is RunState.DONE
            try:
                # A handed-off run belongs to whoever executes the work now.
                finished = handed_off or self.store.finish(run.job, run.token, outcome)
            except StoreUnavailable:
                self._done.put((rt, run, outcome))
                raise
            active = rt.active
            if active is not None and active.run is run:
                rt.active = None
                if handed_off and not rt.removed:
                    # Whoever executes it may die too: back it up like anyone else's run.
                    now_mono = self._clock.monotonic()
                    assert run._hand_off is not None
                    rt.watch = _Watch(
                        active.slot,
                        run.token,
                        now_mono + rt.job.options.watch,
                        furthest=now_mono + run._hand_off,
                        handed_off=run._hand_off > rt.job.options.lease + 1.0,
                    )
                if rt.removed:
                    with self._lock:
                        self._runtimes.pop(run.job, None)
            slot = Slot(run.job, run.slot)
            if finished:
                kind = EventKind.FINISHED if outcome is RunState.DONE else EventKind.FAILED
                kind = EventKind.DISPATCHED if handed_off else kind
                self._emit(kind, slot=slot, attempt=run.attempt)
            else:
                run._lose("finish refused: another instance holds the slot")
                self._emit(EventKind.FINISH_REFUSED, slot=slot, attempt=run.attempt)

    def _renew(self, now_mono: float, *, reachable: bool = True) -> None:
        if not self.store.supports_lease:
            return
        for rt in self._snapshot():
            active = rt.active
            if active is None or active.run.lost:
                continue
            run, lease = active.run, rt.job.options.lease
            if reachable and active.next_renew <= now_mono:
                if self.store.renew(run.job, run.token, lease):
                    active.last_renewed = now_mono
                    active.next_renew = now_mono + rt.job.options.renew_every
                elif run._lose("renewal refused: another instance took the slot over"):
                    self._emit(
                        EventKind.LOST,
                        slot=active.slot,
                        attempt=run.attempt,
                        detail=run.lost_reason,
                    )
            elif (
                not reachable
                and now_mono - active.last_renewed >= lease
                and run._lose("the store was unreachable for longer than the lease")
            ):
                self._emit(
                    EventKind.LOST, slot=active.slot, attempt=run.attempt, detail=run.lost_reason
                )

    def _next_delay(self) -> float:
        now, now_mono = self._clock.time(), self._clock.monotonic()
        delays = [MAX_SLEEP]
        for rt in self._snapshot():
            if rt.next_slot is not None:
                delays.append(rt.claim_at - now)
            if rt.watch is not None:
                delays.append(rt.watch.next_check - now_mono)
            if rt.active is not None and not rt.active.run.lost:
                delays.append(rt.active.next_renew - now_mono)
        return max(0.0, min(delays))


async def _await(awaitable: Any) -> None:
    await awaitable
