"""Runs: a slot won begins, its handler executes, its lease is renewed, its end recorded.

Handlers run on pooled threads (or inline, for handlers that only dispatch
work) and report back through a queue of
:class:`~anarchon_core.roles.Completion`; the step records every end in one
batch, and renews every lease due in one batch. On stop, the runs held are
handed over (released) for backups to take at once.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import inspect
import itertools
import logging
import threading
from functools import partial
from typing import Any

from ..clock import Task
from ..errors import BatchRefused, Cancelled, DispatchFailed, LeaseLost
from ..events import EventKind
from ..jobs import Run
from ..pauses import PauseReason, failed_reason, pause_for
from ..roles import Backup, Completion, JobRuntime, Runner
from ..slots import Slot, shown
from ..store import Change, JobState, RunState
from .context import Context
from .gateway import describe
from .handoffs import HandOffs
from .pacing import END_HOLD_SHARE, START_SHARE, Lag, Sizer, chunk_time

log = logging.getLogger(__name__)

#: The longest wait between two attempts to dispatch a slot the broker refused: a
#: broker back for this long plus ``watch`` within the catch-up window gets the slot.
DISPATCH_RETRY_MAX = 2.0


def dispatch_retry_after(attempt: int, watch: float) -> float:
    """Seconds before the next attempt of a slot whose ``attempt``-th dispatch failed."""
    return float(min(DISPATCH_RETRY_MAX, watch * 2.0 ** min(attempt - 1, 16)))


class Runs:
    """The runs this instance holds: begun, executed, renewed, finished, handed over.

    ``wake`` is set when a handler returns, so that the loop records its end
    at once; ``inline`` runs handlers in the scheduling thread.
    """

    def __init__(self, ctx: Context, wake: threading.Event, inline: bool) -> None:
        self._ctx = ctx
        #: How late the renewals and finishes sent run, and how many go in one call
        #: (see :mod:`.pacing`).
        self.lag = Lag()
        self._renewals, self._ends = Sizer(ctx.clock), Sizer(ctx.clock)
        self._wake = wake
        self._inline = inline
        leases = ctx.gateway.leases
        #: The handler threads' hand-offs, sent together (a group commit).
        self.handoffs = None if leases is None else HandOffs(leases, ctx.clock)
        #: The completions not recorded yet, the oldest first; ``_done_lock`` guards it
        #: (handler threads append, the loop takes).
        self._done: collections.deque[Completion] = collections.deque()
        self._done_lock = threading.Lock()
        self._threads: list[Task] = []
        self._pruned_at = 0
        #: Pauses owed to ``pause_on_failure`` jobs whose run ended failed, by job: sent
        #: after the ends, again at each step until the store takes them.
        self._pauses: dict[str, PauseReason] = {}
        #: Runs won ahead of their time (the scheduler's ``lookahead``), by when their
        #: handler starts (wall-clock): (start, order, runtime, runner).
        self._waiting: list[tuple[float, int, JobRuntime, Runner]] = []
        self._order = itertools.count()

    # -- beginning and executing ---------------------------------------------

    def begin(
        self, rt: JobRuntime, slot: Slot, holder: JobState, sent: float, start_at: float = 0.0
    ) -> None:
        """Become the runner of ``slot``, whose lease ``holder`` grants, and run its handler.

        ``sent`` is when the claim or takeover was sent: the lease is held from
        then, by this instance's clock. A run this instance still held for an
        older slot of the job is told it lost (its own lease lapsed, or the new
        claim could not have won). The handler starts at ``start_at`` (wall-clock),
        at once if that has come: a slot won ahead of its time waits for it, its
        lease renewed meanwhile (:meth:`start_due`).
        """
        ctx = self._ctx
        leases, token, key = ctx.gateway.leases, holder.token, rt.job.name
        handoffs = self.handoffs
        dispatch = None if handoffs is None else partial(self._hand_off, rt, key, token)
        slot = shown(slot)  # a backfill's slot runs as its job's
        run = Run.of(
            slot,
            attempt=holder.attempt,
            token=token,
            instance=ctx.instance,
            # Without a lease there is nothing to hand off: the run is its handler's.
            dispatch=dispatch,
            monotonic=ctx.clock.monotonic,
            key=key if key != slot.job else None,
        )
        previous = rt.runner
        if previous is not None:
            previous.run.mark_lost(
                f"superseded: this instance won {slot.id} (attempt {holder.attempt}) of the job"
            )
            if not previous.reported:
                self.emit_lost(previous)
        runner = rt.runner = Runner.start(slot, run, sent, rt.options)
        ahead = start_at - ctx.clock.time()
        if ahead > 0:
            runner.due = ctx.clock.monotonic() + ahead
            heapq.heappush(self._waiting, (start_at, next(self._order), rt, runner))
            return
        self._too_late_to_start(runner, rt)
        if run.lost:
            # The claim's answer came after the lease it granted could be relied on
            # (or with too little of it left): the handler does not start; the slot
            # goes back for a backup (this instance too) to take over as the next
            # attempt.
            self.emit_lost(runner)
            rt.runner = None
            rt.backup = Backup.of_own(runner, ctx.clock.monotonic(), rt.options)
            if leases is None:
                return  # a claim-only store: nothing to give back
            try:
                leases.release(key, token)
            except Exception as exc:  # its lease lapses instead; the claims after it go on
                log.warning("anarchon: could not give %s back: %s", slot.id, describe(exc))
            return
        self._start(rt, runner)

    def start_due(self) -> None:
        """Start the handlers of the runs won ahead whose time has come. A run this
        instance no longer holds (handed over, superseded) is left alone; one lost
        meanwhile ends without its handler, as any (:meth:`_execute`)."""
        waiting = self._waiting
        if not waiting:
            return
        now = self._ctx.clock.time()
        with self.starting():
            while waiting and waiting[0][0] <= now:
                _, _, rt, runner = heapq.heappop(waiting)
                if rt.runner is runner and not runner.returned:
                    self._start(rt, runner)

    def next_start(self) -> float | None:
        """When the next handler of a run won ahead starts (wall-clock), or None."""
        return self._waiting[0][0] if self._waiting else None

    def starting(self) -> contextlib.AbstractContextManager[None]:
        """Around the start of a batch's handlers: their hand-offs go together. Inline
        handlers run one after the other in this thread, each its hand-off, then its
        send: there is nothing to gather."""
        if self.handoffs is None or self._inline:
            return contextlib.nullcontext()
        return self.handoffs.gathering()

    def _hand_off(self, rt: JobRuntime, key: str, token: int, lease: float) -> bool:
        """A run's hand-off (:meth:`Run.hand_off`), sent with those of its tick."""
        assert self.handoffs is not None
        rt.hands_off = True
        return self.handoffs.dispatch(key, token, lease)

    def _start(self, rt: JobRuntime, runner: Runner) -> None:
        """Run ``runner``'s handler: inline, or on a pooled thread."""
        if self._inline:
            self._execute(rt, runner)
            return
        run = runner.run
        handoffs = self.handoffs if rt.hands_off else None
        if handoffs is not None:
            handoffs.expect(rt.job.name, run.token)
        try:
            thread = self._ctx.clock.spawn(
                lambda: self._execute(rt, runner), f"anarchon:{run.slot_id}"
            )
        except BaseException:
            if handoffs is not None:  # never runs: no hand-off waits for it
                handoffs.left(rt.job.name, run.token)
            raise
        self._threads.append(thread)
        if len(self._threads) > 2 * self._pruned_at + 64:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._pruned_at = len(self._threads)

    def _too_late_to_start(self, runner: Runner, rt: JobRuntime) -> bool:
        """Whether more than :data:`~.pacing.START_SHARE` of the run's lease passed since
        its claim was sent: then its handler does not start (the run is marked lost)."""
        waited = self._ctx.clock.monotonic() - max(runner.granted, runner.due)
        if waited <= START_SHARE * rt.options.lease:
            return False
        runner.run.mark_lost(
            f"not started: {waited:.1f}s of its {rt.options.lease:g}s lease passed"
            " between the claim and the start of its handler"
        )
        return True

    def _execute(self, rt: JobRuntime, runner: Runner) -> None:
        run, outcome, dispatch_failed = runner.run, RunState.DONE, False
        interrupted = False
        if self._too_late_to_start(runner, rt) or run.lost:
            # Lost before its handler began, or so late that its end could not be
            # recorded in time (a starved process, a thread started late): the
            # handler never starts, and the slot goes back for a backup to run it.
            if self.handoffs is not None:
                self.handoffs.left(rt.job.name, run.token)
            self._completed(rt, runner, RunState.RELEASED, interrupted=True, started=False)
            return
        try:
            handler = rt.job.handler
            result = handler(run) if rt.job.takes_run else handler()
            if inspect.isawaitable(result):
                import asyncio  # only for coroutine handlers: slow to import, kept off start-up

                asyncio.run(_await(result))
        except LeaseLost:
            # The handler stopped because its run was lost (run.check()): not a failure.
            # The slot goes back (if the store still has it) for a backup to run.
            outcome, interrupted = RunState.RELEASED, True
        except Cancelled:
            # The handler stopped as asked (run.check(), overlap="cancel_other"): it ends
            # done, as if it returned, and the slot waiting starts; never taken over.
            pass
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
        finally:
            if self.handoffs is not None:
                self.handoffs.left(rt.job.name, run.token)
        self._completed(rt, runner, outcome, dispatch_failed, interrupted)

    def _completed(
        self,
        rt: JobRuntime,
        runner: Runner,
        outcome: RunState,
        dispatch_failed: bool = False,
        interrupted: bool = False,
        *,
        started: bool = True,
    ) -> None:
        """``runner``'s handler returned (or never began): its end is recorded at once."""
        clock = self._ctx.clock
        runner.returned = True
        done = Completion(
            rt,
            runner,
            outcome,
            dispatch_failed,
            interrupted,
            clock.time(),
            clock.monotonic(),
            started,
        )
        with self._done_lock:
            self._done.append(done)
        if not self._wake.is_set():
            self._wake.set()

    def join(self, deadline: float) -> None:
        """Wait for the handlers still running until ``deadline`` (monotonic)."""
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - self._ctx.clock.monotonic()))

    # -- renewing ------------------------------------------------------------

    def renew(self, now_mono: float) -> None:
        """Renew the leases due, a chunk per call (see :mod:`.pacing`).

        A run is held until its deadline: the moment its last accepted renewal
        was sent, plus the lease less a safety margin. A renewal that fails
        leaves the deadline where it was, so the run turns lost on time even
        if the store never answers.
        """
        if self._ctx.gateway.leases is None:
            return
        due = [
            (rt, runner)
            for rt in self._ctx.table.held()
            if (runner := rt.runner) is not None
            and not runner.run.lost
            and runner.run.handed_off_lease is None
            and runner.renewal_due(now_mono)
        ]
        if due:
            self._renewals.target = chunk_time(min(rt.options.lease for rt, _ in due))
        for chunk in self._renewals.split(due):
            self._renew(chunk)

    def _renew(self, due: list[tuple[JobRuntime, Runner]]) -> None:
        """Renew the leases of ``due``, in one call."""
        gateway, leases = self._ctx.gateway, self._ctx.gateway.leases
        assert leases is not None
        sent = self._ctx.clock.monotonic()
        for rt, runner in due:
            self.lag.saw(sent - runner.next_renew, rt.options.lease)
            runner.retry_renewal(sent)
        renewals = [
            Change(runner.run.key, runner.run.token, RunState.RUNNING, rt.options.lease)
            for rt, runner in due
        ]
        answers = gateway.per_job([rt for rt, _ in due], renewals, leases.change_many)
        late: list[Change] = []
        for (rt, runner), accepted in zip(due, answers, strict=True):
            run = runner.run
            if isinstance(accepted, Exception):
                runner.renewal_refused(sent, rt.options)
                continue
            if not accepted:
                run.mark_lost("renewal refused: another instance took the slot over")
            elif not runner.renewed(sent, rt.options) and not runner.returned:
                # Accepted, but after the run's deadline passed: the handler was told
                # it lost, so the lease goes back at once for a backup to take over.
                # (A handler that returned is not: its end, queued, is recorded next.)
                late.append(Change(run.key, run.token, RunState.RELEASED))
        if late:
            with contextlib.suppress(BatchRefused):  # a refused one lapses instead
                leases.change_many(late)

    # -- losing --------------------------------------------------------------

    def report_lost(self) -> None:
        """Report each held run that was lost (deadline passed, told, or refused), once.

        This instance then backs the slot up like any other instance: once the
        store says its lease ended, it may be taken over (by this instance too)
        before the job's next slot is claimed.
        """
        for rt in self._ctx.table.held():
            runner = rt.runner
            if runner is not None and not runner.reported and runner.run.lost:
                self.emit_lost(runner)
                if self._ctx.gateway.leases is not None and rt.backup is None and rt.watched:
                    rt.backup = Backup.of_own(runner, self._ctx.clock.monotonic(), rt.options)

    def emit_lost(self, runner: Runner) -> None:
        run = runner.run
        runner.reported = True
        self._ctx.emit(
            EventKind.LOST,
            slot=runner.slot,
            attempt=run.attempt,
            token=run.token,
            detail=run.lost_reason,
        )

    # -- finishing -----------------------------------------------------------

    def ends_due(self, now_mono: float) -> bool:
        """Whether the oldest end not recorded yet has waited :data:`~.pacing.END_HOLD_SHARE`
        of its run's lease (between two chunks of claims, ends wait that long: the
        run's lease stays live, renewed as any other)."""
        with self._done_lock:
            if not self._done:
                return False
            oldest = self._done[0]
        return now_mono - oldest.ended_mono >= END_HOLD_SHARE * oldest.runtime.options.lease

    def finish(self) -> None:
        """Finish the runs whose handler returned or raised, a chunk per call (see
        :mod:`.pacing`)."""
        pending = self._completions()
        if not pending:
            if self._pauses:
                self.pause_failed()
            return
        now_mono = self._ctx.clock.monotonic()
        for done in pending:
            runner = done.runner
            # How long an end waited for its first send (a lost run's end is late
            # whatever the pace, and one sent again was refused, not held up).
            if not runner.end_sent and not runner.run.lost:
                self.lag.saw(now_mono - done.ended_mono, done.runtime.options.lease)
            runner.end_sent = True
        for done in pending:
            if done.runner.run.lost and not done.runner.reported:
                self.emit_lost(done.runner)
        ends = [self._end_change(done) for done in pending]
        # Every end goes to the store first, chunk after chunk, before anything else is
        # done of them (events, backups): what keeps a returned run from being run
        # again is its end reaching the store within its lease.
        answers: dict[int, bool | Exception] = {}
        try:
            self._send_ends(pending, ends, answers)
        finally:
            kept: list[Completion] = []
            for i, (done, (change, retry)) in enumerate(zip(pending, ends, strict=True)):
                answer = True if change is None else answers.get(i)
                if answer is None or isinstance(answer, Exception):
                    # Not answered (the step failed: it is retried), or this job's end
                    # alone was refused: kept, and sent again later.
                    kept.append(done)
                else:
                    self._ended(done, answer, retry)
            if kept:
                with self._done_lock:  # ahead of those that returned since: older
                    self._done.extendleft(reversed(kept))
        self.pause_failed()

    def pause_failed(self) -> None:
        """Pause the ``pause_on_failure`` jobs whose run ended failed (see :mod:`..pauses`);
        a pause the store did not take is tried again at the next step."""
        for job, reason in list(self._pauses.items()):
            try:
                newly = pause_for(self._ctx.gateway.store, reason)
            except Exception as exc:  # the store failed: tried again at the next step
                log.warning("anarchon: could not pause %s after its failure: %s", job, exc)
                return
            del self._pauses[job]
            if newly:
                self._ctx.emit(
                    EventKind.PAUSED_ON_FAILURE,
                    job=job,
                    slot=Slot.from_id(reason.slot_id) if reason.slot_id else None,
                    detail=reason.reason,
                )

    def _send_ends(
        self,
        pending: list[Completion],
        ends: list[tuple[Change | None, bool]],
        answers: dict[int, bool | Exception],
    ) -> None:
        """Send the ends to record, a chunk per call; each one's answer into ``answers``."""
        gateway, leases = self._ctx.gateway, self._ctx.gateway.leases
        if leases is None:
            return  # a claim-only store: nothing to send (every end is None)
        sent = [(i, change) for i, (change, _) in enumerate(ends) if change is not None]
        if sent:
            self._ends.target = chunk_time(min(pending[i].runtime.options.lease for i, _ in sent))
        for chunk in self._ends.split(sent):
            results = gateway.per_job(
                [pending[i].runtime for i, _ in chunk],
                [change for _, change in chunk],
                leases.change_many,
            )
            for (i, _), result in zip(chunk, results, strict=True):
                answers[i] = result

    def _completions(self) -> list[Completion]:
        """The completions queued so far, oldest slot first (an order threads cannot change)."""
        with self._done_lock:
            pending = list(self._done)
            self._done.clear()
        pending.sort(key=lambda d: (d.runner.slot.ms, d.runner.slot.job, d.runner.run.attempt))
        return pending

    def _end_change(self, done: Completion) -> tuple[Change | None, bool]:
        """The change recording the end of ``done``'s run (None: nothing to send), and
        whether it releases the slot for another attempt."""
        run, rt = done.runner.run, done.runtime
        if done.handed_off:
            return None, False  # it belongs to whoever executes the work now
        if self._ctx.gateway.leases is None:
            # A claim-only store records no end: the run's event is all there is.
            return None, done.interrupted
        if done.interrupted:
            # Stopped on losing the run: released if the store still gives it to this
            # instance, so that a backup runs the slot at once; else already taken over.
            return Change(run.key, run.token, RunState.RELEASED), True
        if done.dispatch_failed:
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
            if (done.handed_off or retry) and rt.runs_watched:
                # Whoever executes it may die too, and a slot given back is sent again
                # by whoever takes it over: back it up like anyone else's run. After
                # a failed dispatch, the others (who may reach the broker) go first.
                rt.backup = Backup.of_own(runner, self._ctx.clock.monotonic(), rt.options)
                if done.dispatch_failed:
                    rt.backup.next_check += dispatch_retry_after(run.attempt, rt.options.watch)
            if rt.waiting and rt.backup is None and rt.watched:
                # Slots wait for this run: the record is read at once, and once it
                # shows the run ended, the oldest of them is claimed (see .backups).
                rt.backup = Backup.at_once(runner.slot, run.token, self._ctx.clock.monotonic())
            if rt.removed:
                self._ctx.table.forget(rt)
        if not done.handed_off:  # a run handed off: settled once seen ended (.backups)
            settled = finished and not (retry or done.interrupted)
            self._ctx.tallies.ended(rt.job.name, run.token, settled)
        if done.interrupted and not finished:
            return  # stopped on losing the run, which another instance holds now
        if finished:
            self._ctx.emit(
                done.kind,
                slot=runner.slot,
                attempt=run.attempt,
                token=run.token,
                detail=self._end_detail(done, retry),
            )
            if done.kind is EventKind.FAILED and rt.job.rules.pause_on_failure:
                job = shown(runner.slot).job  # a backfill's failure pauses its job
                self._pauses[job] = PauseReason(
                    job,
                    failed_reason(runner.slot.id, run.attempt),
                    self._ctx.instance,
                    self._ctx.clock.time(),
                    runner.slot.id,
                )
        else:
            run.mark_lost("finish refused: another instance holds the slot")
            self._ctx.emit(
                EventKind.FINISH_REFUSED, slot=runner.slot, attempt=run.attempt, token=run.token
            )

    def _end_detail(self, done: Completion, retry: bool) -> str:
        """What the event of a recorded end says beyond its kind."""
        if not done.started:
            return "not started: the run was lost before its handler began; released for a backup"
        if done.interrupted:
            return "the handler stopped on losing its lease; released for a backup"
        if retry:
            after = dispatch_retry_after(done.runner.run.attempt, done.runtime.options.watch)
            return f"another attempt in {after:g}s, within the catch-up window"
        if done.runner.run.cancelled:
            return f"cancelled: {done.runner.run.cancel_reason}"
        if done.dispatch_failed:
            return "recorded failed: " + (
                "its catch-up window has passed"
                if self._ctx.gateway.leases is not None
                else "a claim-only store cannot release it"
            )
        return ""

    # -- handing over --------------------------------------------------------

    def hand_over(self) -> bool:
        """Take every held run back from its handler, and release them for backups to take
        over at once, in one batch. False if the store could not be reached."""
        held: list[Runner] = []
        for rt in self._ctx.table.held():
            runner, rt.runner = rt.runner, None
            if runner is not None:
                runner.run.mark_lost("handed over during shutdown")
                held.append(runner)
        if not held or self._ctx.gateway.leases is None:
            return True
        releases = [Change(r.run.key, r.run.token, RunState.RELEASED) for r in held]
        answers, reached = self._ctx.gateway.hand_over(releases)
        for runner, released in zip(held, answers, strict=True):
            if isinstance(released, Exception):  # its lease lapses; a backup takes it over
                log.warning(
                    "anarchon: could not hand %s over: %s", runner.run.slot_id, describe(released)
                )
            elif released:
                self._ctx.emit(
                    EventKind.HANDED_OVER,
                    slot=runner.slot,
                    attempt=runner.run.attempt,
                    token=runner.run.token,
                )
        return reached


async def _await(awaitable: Any) -> None:
    await awaitable
