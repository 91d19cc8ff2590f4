"""Pacing: an instance that cannot keep up runs slots late, or misses them, never twice.

A run's lease lives on its renewals, and a handler that returned is safe
only once its finish reaches the store. Both happen in the loop's steps; a
step that spends longer than the lease claiming (100,000 jobs due at once,
a slow store, a starved CPU) would let leases lapse, and the backups would
run those slots again. So:

- every batch goes to the store in chunks (:class:`Sizer`) of about
  :data:`CHUNK_SHARE` of the shortest lease concerned each, within
  :data:`CHUNK_TIME` and :data:`MAX_CHUNK_TIME` seconds (:func:`chunk_time`),
  so that no one call holds the step for long; between two chunks of the
  long phases (the backups' checks and takeovers, the claims) the runs'
  upkeep (renewals, runs lost, finishes) has its turn: renewals never wait
  behind claims, and finishes wait at most :data:`END_HOLD_SHARE` of their
  lease (their lease stays live, renewed as any other; the step's end sends
  them all);
- a step stops claiming once it has spent :data:`STEP_SHARE` of the
  shortest lease among the jobs due: what is left is claimed at the next
  step, after the upkeep;
- while this instance's own renewals or finishes run late by more than
  :data:`BEHIND_SHARE` of their lease, it defers its claims and takeovers
  altogether (event ``claims_deferred``, at most one every
  :data:`DEFER_REPORT_EVERY` seconds with the count since the last), so
  that other instances, or later steps, take them: lateness, then misses
  past the catch-up window, never a second run.

Together with :mod:`.runs`' rule that no handler starts once its run is
lost, a slot whose handler returned is never started again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from ..clock import Clock
from ..events import EventKind
from ..roles import JobRuntime
from .context import Context

T = TypeVar("T")

#: Between two chunks, the ends of runs whose handler returned are sent once the oldest
#: has waited this share of its lease (else at the step's end, in one go).
END_HOLD_SHARE = 0.1
#: How long one chunk of a batch should take: this share of the shortest lease concerned,
#: within :data:`CHUNK_TIME` and :data:`MAX_CHUNK_TIME` seconds (1 s for a 10 s lease);
#: the size of each kind of chunk adapts to it.
CHUNK_SHARE = 0.1
CHUNK_TIME, MAX_CHUNK_TIME = 0.25, 1.0
#: The bounds of a chunk's size (items).
MIN_CHUNK, MAX_CHUNK = 50, 5000
#: The size of the first chunk, before any was timed.
FIRST_CHUNK = MIN_CHUNK
#: The share of the shortest lease due that one step may spend on claims and takeovers.
STEP_SHARE = 0.25
#: Renewals or finishes later than this share of their lease: claims are deferred.
BEHIND_SHARE = 0.25
#: A run whose handler would start later than this share of its lease after its claim
#: was sent does not start: its end could not be recorded in time (released instead).
START_SHARE = 0.75
#: How long the loop waits before a step after one that deferred its claims (seconds).
DEFER_PAUSE = 0.25
#: The shortest time between two ``claims_deferred`` events (seconds).
DEFER_REPORT_EVERY = 5.0


def chunk_time(lease: float) -> float:
    """How long one chunk should take, for the shortest ``lease`` concerned (0: none)."""
    return min(MAX_CHUNK_TIME, max(CHUNK_TIME, CHUNK_SHARE * lease))


class Lag:
    """How late this instance's own renewals and finishes run: the worst seen since the
    last :meth:`reset`, in seconds and as a share of the run's lease."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.share = 0.0

    def reset(self) -> None:
        self.seconds = self.share = 0.0

    def saw(self, late: float, lease: float) -> None:
        """A renewal or finish of a ``lease``-second run was sent ``late`` seconds late."""
        if late > self.seconds:
            self.seconds = late
        share = late / lease if lease > 0 else 0.0
        if share > self.share:
            self.share = share


class Sizer:
    """How many items one store call carries: about ``target`` seconds' worth (by default
    :data:`CHUNK_TIME`), learnt from how long the last chunks took."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        #: Items per chunk.
        self.size = FIRST_CHUNK
        #: How long one chunk should take (seconds).
        self.target = CHUNK_TIME

    def split(self, items: list[T]) -> Iterator[list[T]]:
        """``items`` in chunks of the current size, each timed to size the next."""
        done = 0
        while done < len(items):
            started = self._clock.monotonic()
            chunk = items[done : done + self.size]
            yield chunk
            done += len(chunk)
            self._learn(len(chunk), self._clock.monotonic() - started)

    def _learn(self, size: int, took: float) -> None:
        """Size the next chunk to take about ``target``, from how long ``size`` took.

        A chunk smaller than the size that was quick says nothing (a round
        trip's own cost would make a few items look slow); one that took too
        long always shrinks the size.
        """
        if size < self.size and took <= self.target:
            return
        wanted = MAX_CHUNK if took <= 0 else int(size * self.target / took)
        # Grow by at most 4 times at once: one quick answer is no promise.
        self.size = max(MIN_CHUNK, min(MAX_CHUNK, 4 * self.size, wanted))


class Pacer:
    """Splits a step's long phases into chunks, with the runs' ``upkeep`` between them.

    :meth:`begin` starts a step's budget; :meth:`chunks` yields the chunks
    of a phase until the budget is spent; :meth:`defers` says whether this
    step claims nothing because the runs' upkeep is behind.
    """

    def __init__(self, ctx: Context, upkeep: Callable[[], None], lag: Lag) -> None:
        self._ctx = ctx
        self._upkeep = upkeep
        self.lag = lag
        #: One chunk size per phase: an item of each costs its own (a claim won starts
        #: a handler; a backup's check is a read).
        self._sizers: dict[str, Sizer] = {}
        self._began = 0.0
        self._budget = float("inf")
        self._chunk_time = CHUNK_TIME
        #: How late the runs' upkeep ran at the last step (seconds); 0 when on time.
        self.behind = 0.0
        self._peak = 0.0
        #: Claims and takeovers deferred since the start, and since the last report.
        self.deferred_total = 0
        self._unreported = 0
        self._reported_at: float | None = None

    @property
    def _clock(self) -> Clock:
        return self._ctx.clock

    def noted(self) -> None:
        """The runs' upkeep of a step is done: how late it ran is this instance's lag."""
        self.behind = self.lag.seconds
        self._peak = max(self._peak, self.behind)

    def peak(self) -> float:
        """The worst lag since the last call (for the registry's record, every 5 s)."""
        peak, self._peak = self._peak, self.behind
        return peak

    def begin(self, due: Sequence[JobRuntime]) -> None:
        """A step's phases begin: they may spend a share of the shortest lease ``due``."""
        self._began = self._clock.monotonic()
        shortest = min((rt.options.lease for rt in due), default=0.0)
        self._budget = STEP_SHARE * shortest if shortest else float("inf")
        self._chunk_time = chunk_time(shortest)

    def defers(self, due: Sequence[JobRuntime]) -> bool:
        """Whether this step defers its claims and takeovers: the runs' upkeep is behind.

        Reported as ``claims_deferred`` (with how many, and how late).
        """
        lag = self.lag
        if lag.share <= BEHIND_SHARE:
            return False
        if not due:
            return True  # the backups' checks wait too; no claim to report
        self.deferred_total += len(due)
        self._unreported += len(due)
        now = self._clock.monotonic()
        if self._reported_at is None or now - self._reported_at >= DEFER_REPORT_EVERY:
            self._ctx.emit(
                EventKind.CLAIMS_DEFERRED,
                detail=(
                    f"{self._unreported} claims deferred: this instance's renewals and"
                    f" finishes run {lag.seconds:.1f}s late ({lag.share:.0%} of their lease)"
                ),
            )
            self._reported_at, self._unreported = now, 0
        return True

    def chunks(self, phase: str, items: list[T]) -> Iterator[list[T]]:
        """``items`` of ``phase`` in chunks; the runs' upkeep between two; none once the
        budget is spent. The items not yielded wait for the next step.
        """
        sizer = self._sizers.get(phase)
        if sizer is None:
            sizer = self._sizers[phase] = Sizer(self._clock)
        sizer.target = self._chunk_time
        for n, chunk in enumerate(sizer.split(items)):
            if n:
                self._upkeep()
                if self._clock.monotonic() - self._began >= self._budget:
                    return
            yield chunk
