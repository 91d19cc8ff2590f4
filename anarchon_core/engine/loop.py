"""The loop: one thread stepping the engine, each step one slot's path through the parts.

:meth:`Loop.run_pending` does whatever is due now and returns how long the
loop may sleep; :meth:`Loop.start` calls it from one thread, tests call it
with a :class:`~anarchon_core.clock.FakeClock`. A step that the store fails
backs off (doubling, up to :data:`BACKOFF_MAX`); :meth:`Loop.health` says
whether the loop steps and the store answers. :meth:`Loop.stop` hands every
held run over; a stop asked from inside a step (a signal handler) waits for
the step's end (:class:`~anarchon_core.deferral.StepGuard`).
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from collections.abc import Callable

from ..deferral import StepGuard
from ..errors import StoreUnavailable, is_bug
from ..events import EventKind, Health
from .backups import Backups
from .claims import Claims
from .context import Context
from .gateway import describe
from .pacing import DEFER_PAUSE, Pacer
from .registry import Registry
from .requests import Requests
from .runs import Runs

log = logging.getLogger(__name__)

#: Back-off after a store error, doubling up to the maximum.
BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
#: The longest the loop sleeps, so that wall-clock jumps are noticed.
MAX_SLEEP = 1.0
#: A loop with no step begun for this long is not live (:meth:`Loop.health`).
LOOP_STALL = 30.0
#: The longest :meth:`Loop.stop` waits for the hand-over to reach the store.
HANDOVER_WAIT = 10.0
#: How often :meth:`Loop.run_forever` looks whether a stop signal came.
SIGNAL_POLL = 0.05


class Loop:
    """The scheduling thread and its steps, back-off and health, start and stop.

    ``close_store`` closes a store the scheduler opened itself (None: the
    caller's store, left open).
    """

    def __init__(
        self,
        ctx: Context,
        *,
        runs: Runs,
        claims: Claims,
        backups: Backups,
        requests: Requests,
        registry: Registry,
        wake: threading.Event,
        close_store: Callable[[], None] | None,
    ) -> None:
        self._ctx = ctx
        self._runs, self._claims, self._backups = runs, claims, backups
        self._requests, self._registry = requests, registry
        self.wake = wake
        self._close_store = close_store
        self.guard = StepGuard()
        self.pacer = Pacer(ctx, functools.partial(self._upkeep, between_chunks=True), runs.lag)
        #: The last step deferred its claims: the next one waits a little.
        self._deferred = False
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self._backoff = 0.0
        self._retry_at = 0.0
        #: When the last step began, and when the last step that reached the store ended
        #: (monotonic), for :meth:`health`.
        self._step_began: float | None = None
        self._step_ok_at: float | None = None

    # -- one step ------------------------------------------------------------

    def run_pending(self) -> float:
        """Do everything that is due now; return the seconds until more is due.

        After a failed step, nothing is done until its back-off ends; then
        the store must answer a ping before the step counts as recovered.
        """
        clock = self._ctx.clock
        with self.guard.step():
            now_mono = self._step_began = clock.monotonic()
            if now_mono < self._retry_at:
                self._runs.report_lost()
                return self._retry_at - now_mono
            try:
                if self._backoff:
                    # The store must answer before it counts as back: a step that happens
                    # to need no store call would otherwise end the outage on its own.
                    self._ctx.gateway.store.ping()
                self._step(now_mono)
            except Exception as exc:
                return self._failed(exc)
            finally:
                # Runs whose deadline passed (even during a blocked call) are reported.
                self._runs.report_lost()
            if self._backoff:
                self._backoff = 0.0
                self._ctx.emit(EventKind.STORE_RECOVERED)
            self._step_ok_at = clock.monotonic()
            return self._next_delay()

    def _step(self, now_mono: float) -> None:
        """One slot's path through the parts, phase by phase.

        The claims and takeovers go in chunks, with the runs' upkeep between
        two (see :mod:`.pacing`): renewals and finishes never wait behind them.
        """
        self._runs.lag.reset()
        # Start the handlers of the slots won ahead whose time has come, before anything
        # else (their claims' round trips were done before).
        self._runs.start_due()
        # Finish: runs whose handler returned since the last step are finished first:
        # the claim of their job's next slot would otherwise find their lease live and
        # skip that slot as an overlap (and renewing them would be wasted).
        # Renew the leases due. Runs lost by now (a call may have blocked past their
        # deadline) are backed up before the claims, like anyone else's lapsed run.
        self._upkeep()
        self.pacer.noted()
        # Place the new jobs on their schedule.
        self._claims.place_new()
        # Announce this instance in the registry, read the live peers.
        self._registry.announce(now_mono)
        # Controls: stored schedules, backfills, run-now and catch-up requests.
        self._requests.poll(now_mono)
        due = self._claims.due()
        pacer = self.pacer
        pacer.begin(due)
        self._deferred = False
        try:
            if pacer.defers(due):
                # Behind on its own runs: this step claims nothing, and backs nothing up.
                self._deferred = True
                return
            # Backups before claims: a job's older slot, handed over or lapsed, is
            # taken over before its next slot's claim could supersede it. A job whose
            # run backed up could not be checked or taken over is claimed later.
            unsettled = self._backups.check(now_mono, due, pacer)
            claimed = self._claims.hold_back(due, unsettled) if unsettled else due
            self._claims.claim(claimed, pacer)
        finally:
            # Taken out of the agenda: back in at their time now, whatever happened
            # (those not claimed yet are due again at once).
            self._ctx.table.claims_moved(due)
        # Finish once more: handlers begun in this step (inline ones always) may have
        # returned already. Their slot is then finished or handed off within this
        # step, before the engine sleeps.
        self._runs.finish()
        # This instance's tally: the slots it claimed first that it won and ended, so
        # that the instances that waited for it need not read their records.
        self._ctx.tallies.write()

    def _upkeep(self, between_chunks: bool = False) -> None:
        """The runs' upkeep: record the ends, renew the leases due, report the runs lost.

        ``between_chunks`` (of claims or takeovers): the ends wait for the step's end
        unless the oldest has waited long (:data:`~.pacing.END_HOLD_SHARE`), so that
        they go in few calls; the leases due are renewed all the same.
        """
        self._runs.start_due()
        now_mono = self._ctx.clock.monotonic()
        if not between_chunks or self._runs.ends_due(now_mono):
            self._runs.finish()
        self._runs.renew(self._ctx.clock.monotonic())
        self._runs.report_lost()

    def _failed(self, exc: Exception) -> float:
        """A step failed: back off; the seconds until the next step.

        Every error of the store counts, not only "unavailable": a server
        that answers with an error (a replica that is read-only, a primary
        refusing writes without replicas) changed nothing, as for an
        unreachable one: completions stay queued, leases run out by their
        deadline, and the step is retried. A bug (see
        :func:`~anarchon_core.errors.is_bug`) is no outage: it is logged with
        its traceback and the step is tried again after the longest back-off.
        """
        now_mono = self._ctx.clock.monotonic()
        if is_bug(exc):
            log.error("anarchon: a scheduling step failed on a bug", exc_info=exc)
            self._retry_at = now_mono + BACKOFF_MAX
            return BACKOFF_MAX
        if not self._backoff:
            if not isinstance(exc, StoreUnavailable):  # once per outage, with its traceback
                log.warning("anarchon: a scheduling step failed", exc_info=exc)
            self._ctx.emit(EventKind.STORE_UNAVAILABLE, detail=describe(exc))
        self._backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, self._backoff * 2))
        self._retry_at = now_mono + self._backoff
        return self._backoff

    def _next_delay(self) -> float:
        clock, agenda = self._ctx.clock, self._ctx.table.agenda
        now, now_mono = clock.time(), clock.monotonic()
        delays = [MAX_SLEEP]
        if self._deferred:
            # Claims deferred are due at once: wait a little, for the runs to catch up.
            delays.append(DEFER_PAUSE)
            claim_at = check_at = None
        else:
            claim_at, check_at = agenda.claims.next_at(), agenda.checks.next_at()
        if claim_at is not None:
            delays.append(claim_at - now)
        start_at = self._runs.next_start()
        if start_at is not None:
            delays.append(start_at - now)
        if check_at is not None:
            delays.append(check_at - now_mono)
        for rt in self._ctx.table.held():
            runner = rt.runner
            if runner is not None and not runner.run.lost:
                delays.append(runner.next_renew - now_mono)
        if self._ctx.gateway.controls:
            delays.append(self._requests.poll_at - now_mono)
        delays += [at - now for at in self._requests.next_at()]
        tally_at = self._ctx.tallies.next_at()
        if tally_at is not None:
            delays.append(tally_at - now)
        return max(0.0, min(delays))

    def health(self, stall: float = LOOP_STALL) -> Health:
        """Whether the loop is alive, and whether the store answered its last step."""
        now = self._ctx.clock.monotonic()
        began, ok_at = self._step_began, self._step_ok_at
        pacer = self.pacer

        def health(live: bool, ready: bool, detail: str) -> Health:
            return Health(live, ready, detail, pacer.behind, pacer.deferred_total)

        if began is None:
            return health(False, False, "the scheduling loop has not started")
        if now - began > stall:
            return health(False, False, f"no scheduling step for {now - began:.1f}s")
        if self._backoff or ok_at is None:
            return health(True, False, "the store does not answer")
        return health(True, True, f"last step {now - ok_at:.1f}s ago")

    # -- the thread ----------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling thread and return at once."""
        if self.thread is not None:
            raise RuntimeError("scheduler already started")
        self.stopping.clear()
        self.thread = threading.Thread(target=self._run, name="anarchon-scheduler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                delay = self.run_pending()
            except Exception:  # the loop must never die
                log.exception("anarchon: unexpected error in the scheduling loop")
                delay = BACKOFF_MAX
            self._ctx.clock.wait(self.wake, min(delay, MAX_SLEEP))
            self.wake.clear()
        self._shutdown()

    def stop(self, timeout: float) -> None:
        """Stop: hand every held run over, then give handlers what is left of ``timeout``."""
        deadline = self._ctx.clock.monotonic() + timeout
        self.stopping.set()
        self.wake.set()
        if self.guard.defer(self._stopped_in_step):
            # Called from within a step of this very thread (a signal handler): the
            # interrupted step may hold the store's connection, so the hand-over
            # waits for the step's end instead of blocking here.
            return
        thread, self.thread = self.thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(timeout, HANDOVER_WAIT))
        else:
            self._shutdown()
        self._runs.join(deadline)
        if self._close_store is not None and (thread is None or not thread.is_alive()):
            self._close_store()

    def _stopped_in_step(self) -> None:
        """stop() was called from inside a step: hand over now that it ended."""
        self._shutdown()
        if self._close_store is not None and self.thread is None:
            self._close_store()

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
            while not signalled and not self.stopping.is_set():
                time.sleep(SIGNAL_POLL)
        finally:
            self.stop(5.0)

    def _shutdown(self) -> None:
        """Finish what returned, then hand every held run over; survives any store error."""
        try:
            self._runs.finish()
        except Exception as exc:  # any store error: the hand-over below still runs
            log.warning("anarchon: could not finish runs while stopping: %s", describe(exc))
        if self._runs.hand_over():
            self._registry.withdraw()
            self._ctx.tallies.withdraw()
