"""The roles an instance plays for a job's slots, and their decisions; no store I/O here.

Per job, :class:`JobRuntime` holds what this instance knows: the next slot it
will claim, the :class:`Runner` of a slot it won, the :class:`Backup` of a
slot another instance runs, and the slots that wait for the running one to
end (the job's overlap policy, :meth:`JobRuntime.enqueue`). Their methods decide from what the store
answered and from the time they are given; the engine
(:mod:`anarchon_core.engine`) asks the store and acts.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol

from .events import EventKind
from .jobs import MAX_BUFFERED, Job, JobOptions, Overlap, Run, held_for
from .slots import BACKFILL, Slot
from .store import JobState, RunState

#: How far past its time (beyond jitter) a slot still counts as on time.
ON_TIME = 1.0
#: How long, beyond the jitter, an instance waits for a slot's preferred
#: instance to claim it before claiming it itself (see docs/concepts.md,
#: "Who runs a slot"): room for the preferred instance's claim batch to reach
#: the store on a busy host, and for clocks that differ a little. At most a
#: tenth of the schedule's interval.
PEER_MARGIN = 1.0
#: Seconds before a renewal the store refused alone (an error about this run only) is
#: sent again: soon, for the lease's sake, but not in a loop.
RENEW_RETRY = 0.1
#: A job's next slot is due while the run its instance backs up has less than this left
#: of its lease: the claim waits for the lapse (see :meth:`Backup.hold`).
CLAIM_HOLD = 1.0
#: How long past the lapse such a claim waits: the store's clock decides the lapse.
LAPSE_MARGIN = 0.1
#: The slot after a slot, for every job on one grid (jobs with equal schedules share
#: one, :func:`~anarchon_core.schedules.shared`): (id of the schedule, the slot's ms) ->
#: (the schedule, the next slot's time). Emptied past :data:`FOLLOWING_KEPT` entries.
_following: dict[tuple[int, int], tuple[object, datetime]] = {}
FOLLOWING_KEPT = 65536
#: States of a run that has ended: nothing to back up.
ENDED = (RunState.DONE, RunState.FAILED)


class Verdict(enum.Enum):
    """What a backup makes of the record it checked."""

    #: The lease is live: check again later.
    WATCH = "watch"
    #: The run ended, or the record moved on to another slot: stop backing it up.
    DROP = "drop"
    #: The lease lapsed or was handed over: take the slot over.
    TAKE_OVER = "take_over"
    #: The lease lapsed or was handed over, and a newer slot waits to supersede the
    #: run (``overlap="cancel_other"``): that slot is claimed, the run not taken over.
    SUPERSEDE = "supersede"
    #: Dispatched but never picked up (the store's record says so): the work may
    #: run where nothing renews it, so it is not sent again; the job's next slot
    #: supersedes it.
    MISSED = "missed"


@dataclass
class Runner:
    """A run this instance holds, and when its lease is renewed.

    The run's own deadline (:meth:`Run.hold_until`) is what makes it lost when
    no renewal succeeds in time, even while a store call is blocked.
    """

    slot: Slot
    run: Run
    next_renew: float
    #: When the claim or takeover that granted the run was sent (monotonic).
    granted: float = 0.0
    #: When its handler was due to start (monotonic): later than ``granted`` for a slot
    #: won ahead of its time (the scheduler's ``lookahead``).
    due: float = 0.0
    #: Whether the loss of this run was reported (event ``lost``).
    reported: bool = False
    #: Its handler returned (or never began): its end is on its way to the store, and
    #: the run, renewed meanwhile, is never given back before it.
    returned: bool = False
    #: Its end was sent to the store once (it may be sent again).
    end_sent: bool = False

    @classmethod
    def start(cls, slot: Slot, run: Run, sent_mono: float, options: JobOptions) -> Runner:
        """The runner of ``run``, whose lease the claim sent at ``sent_mono`` was granted."""
        run.hold_until(sent_mono + held_for(options.lease))
        return cls(slot, run, sent_mono + options.renew_every, sent_mono)

    def renewal_due(self, now_mono: float) -> bool:
        return self.next_renew <= now_mono

    def renewed(self, sent_mono: float, options: JobOptions) -> bool:
        """The renewal sent at ``sent_mono`` was accepted; False if the run was lost meanwhile."""
        self.next_renew = sent_mono + options.renew_every
        return self.run.hold_until(sent_mono + held_for(options.lease))

    def retry_renewal(self, now_mono: float) -> None:
        """A renewal is on its way: should it fail, it is tried again soon, not after a
        whole renewal period."""
        self.next_renew = now_mono

    def renewal_refused(self, now_mono: float, options: JobOptions) -> None:
        """The store refused this renewal alone: tried again after :data:`RENEW_RETRY`
        (at once, it would only be refused again, in a loop)."""
        self.next_renew = now_mono + min(RENEW_RETRY, options.renew_every)


@dataclass
class Backup:
    """A slot another instance runs, which this instance takes over if its lease lapses."""

    slot: Slot
    token: int
    next_check: float
    #: The job's slot (ms) whose claim waited for this run's lapse (see :meth:`hold`).
    held_ms: int | None = None

    @classmethod
    def of(cls, slot: Slot, holder: JobState, now_mono: float, options: JobOptions) -> Backup:
        """A backup of ``holder``'s run, checked at once if its lease already lapsed."""
        backup = cls(slot, holder.token, now_mono)
        if not holder.lapsed and not holder.unpicked:
            backup.next_check += options.watch
        return backup

    @classmethod
    def at_once(cls, slot: Slot, token: int, now_mono: float) -> Backup:
        """A backup of ``slot``'s record checked at once: a run ended or about to, with
        slots waiting for it (they start when the check finds it ended)."""
        return cls(slot, token, now_mono)

    @classmethod
    def of_own(cls, runner: Runner, now_mono: float, options: JobOptions) -> Backup:
        """A backup of this instance's own run, handed off or released, checked after ``watch``."""
        return cls(runner.slot, runner.run.token, now_mono + options.watch)

    def retry(self, now_mono: float, options: JobOptions, pause: float) -> None:
        """A check or takeover of this slot did not happen (the store refused it): tried
        again after ``pause`` (its ``watch`` if shorter), not at once, in a loop."""
        self.next_check = now_mono + min(options.watch, pause)

    def verdict(
        self,
        record: JobState | None,
        now_mono: float,
        options: JobOptions,
        superseded: bool = False,
    ) -> Verdict:
        """What to do about ``record``, the job's current record in the store.

        Decided from the record alone (its state and the store's lease), so that
        every instance, whenever it started and whatever its options, decides
        the same. ``superseded``: a newer slot waits to supersede this run
        (``overlap="cancel_other"``), so a lapsed run is not taken over.
        """
        if record is None or record.slot_ms != self.slot.ms or record.state in ENDED:
            return Verdict.DROP
        self.token = record.token
        if record.unpicked:
            return Verdict.MISSED
        if not record.lapsed:
            self.next_check = now_mono + options.watch
            return Verdict.WATCH
        return Verdict.SUPERSEDE if superseded else Verdict.TAKE_OVER

    def hold(self, record: JobState, next_ms: int, now_mono: float) -> float:
        """Seconds the claim of the job's slot ``next_ms``, due now, waits; 0: none.

        ``record`` is this run's, just checked and still live (:attr:`Verdict.WATCH`).
        A claim sent now supersedes the run if it reaches the store after the lease
        lapsed, and the run is then never taken over. So when the lease has less than
        :data:`CLAIM_HOLD` left, the claim waits until just past the lapse, and this
        backup is checked again then: a run that lapsed is taken over, and the claim
        finds it going (an overlap). Once per slot: a run renewed meanwhile is alive,
        and the claim then goes.
        """
        left = record.lease_remaining
        if left >= CLAIM_HOLD or self.held_ms == next_ms:
            return 0.0
        self.held_ms = next_ms
        wait = max(0.0, left) + LAPSE_MARGIN
        self.next_check = now_mono + wait
        return wait


class Watcher(Protocol):
    """Told when a job's claim time, backup or runner changes (the engine's indexes)."""

    def claim_moved(self, rt: JobRuntime) -> None: ...

    def backup_moved(self, rt: JobRuntime) -> None: ...

    def runner_moved(self, rt: JobRuntime) -> None: ...


class JobRuntime:
    """What this instance knows of one job: its next slot, its runner and its backup."""

    __slots__ = (
        "_backup",
        "_claim_at",
        "_following",
        "_runner",
        "began",
        "broken",
        "cancel_asked",
        "decided_ms",
        "deferred",
        "hands_off",
        "job",
        "keep_watching",
        "next_slot",
        "peers_seen",
        "preferred",
        "ranks",
        "ready",
        "refused",
        "removed",
        "seq",
        "start_at",
        "suspect",
        "waiting",
        "watcher",
    )

    def __init__(self, job: Job, watcher: Watcher | None = None, seq: int = 0) -> None:
        self.job = job
        self.watcher = watcher
        #: The order in which jobs were declared: a batch lists them in that order.
        self.seq = seq
        self.next_slot: Slot | None = None
        self._claim_at = 0.0
        #: When the handler of ``next_slot`` starts, at the earliest, if its claim is won:
        #: its claim's time but for the look-ahead (see :meth:`place`).
        self.start_at = 0.0
        self._backup: Backup | None = None
        self._runner: Runner | None = None
        #: The slot after one slot, remembered: (schedule, slot ms, the slot after).
        self._following: tuple[object, int, Slot] | None = None
        #: How long past its time plus jitter the claim of ``next_slot`` waits for
        #: ``preferred``, the instance that claims it first (0: this one does).
        self.deferred = 0.0
        self.preferred: str | None = None
        #: The base ranks of the live instances for this job, and the version of
        #: the instance's peers they are of (see peers.py).
        self.ranks: list[tuple[int, str]] = []
        self.peers_seen = -1
        #: Placed on its schedule (after reading the store's record of it).
        self.ready = False
        #: Removed while a run of it goes on; it goes once that run ends.
        self.removed = False
        #: Removed, and still watching (``remove_job(keep_watching=True)``): the slot
        #: due at the removal is claimed, and the job's runs, this instance's or
        #: another's, are backed up to their end; no later slot.
        self.keep_watching = False
        #: The store refused a call about this job alone (reported once until it answers).
        self.refused = False
        #: A batch about this job failed on every item, and failed the step.
        self.suspect = False
        #: A store call about this job raised a bug (see
        #: :mod:`anarchon_core.engine.gateway`): no call about it is made any more.
        self.broken: Exception | None = None
        #: The slots that wait, oldest first, for the run holding the job's lease to
        #: end (its overlap policy, see :meth:`enqueue`); each starts as its own slot.
        self.waiting: deque[Slot] = deque()
        #: When the run of a slot began, by the store's history: (slot ms, Unix seconds).
        self.began: tuple[int, float] | None = None
        #: The token of the run asked to stop for the slot waiting (``cancel_other``).
        self.cancel_asked: int | None = None
        #: Its handler hands its runs off (it called :meth:`Run.hand_off`): the
        #: hand-offs of a tick's handlers are gathered (see engine/handoffs.py).
        self.hands_off = False
        #: The newest slot (ms) the overlap policy queued or skipped here: a slot skipped
        #: once (``buffer_all`` had its bound waiting) is never queued afterwards.
        self.decided_ms = 0

    @property
    def claim_at(self) -> float:
        """When this instance claims ``next_slot`` (wall-clock Unix seconds)."""
        return self._claim_at

    @claim_at.setter
    def claim_at(self, at: float) -> None:
        self._claim_at = at
        if self.watcher is not None:
            self.watcher.claim_moved(self)

    @property
    def backup(self) -> Backup | None:
        """The slot another instance runs that this instance backs up."""
        return self._backup

    @backup.setter
    def backup(self, backup: Backup | None) -> None:
        self._backup = backup
        if self.watcher is not None:
            self.watcher.backup_moved(self)

    @property
    def runner(self) -> Runner | None:
        """The run this instance holds."""
        return self._runner

    @runner.setter
    def runner(self, runner: Runner | None) -> None:
        self._runner = runner
        if self.watcher is not None:
            self.watcher.runner_moved(self)

    @property
    def watched(self) -> bool:
        """Whether its slots are still this instance's concern: not removed, not left
        alone after a bug."""
        return not self.removed and self.broken is None

    @property
    def runs_watched(self) -> bool:
        """Whether its runs are still this instance's concern (backed up to their end):
        as :attr:`watched`, or removed while it keeps watching them."""
        return (not self.removed or self.keep_watching) and self.broken is None

    @property
    def options(self) -> JobOptions:
        return self.job.options

    def slot_after(self, t: datetime) -> Slot:
        """The job's first slot strictly after ``t``."""
        return Slot(self.job.name, self.job.schedule.next_after(t))

    def following(self, slot: Slot) -> Slot:
        """The job's slot after ``slot``, remembered: the claim of ``slot`` asks
        first (for a backlog), its advance and its catch-up window next."""
        schedule, memo, ms = self.job.schedule, self._following, slot.ms
        if memo is not None and memo[0] is schedule and memo[1] == ms:
            return memo[2]
        key = (id(schedule), ms)
        known = _following.get(key)
        if known is not None and known[0] is schedule:
            time = known[1]
        else:
            time = schedule.next_after(slot.time)
            if len(_following) >= FOLLOWING_KEPT:
                _following.clear()
            _following[key] = (schedule, time)
        after = Slot(self.job.name, time)
        self._following = (schedule, ms, after)
        return after

    def slot_at_or_before(self, t: datetime) -> Slot | None:
        """The job's last slot at or before ``t``."""
        latest = self.job.schedule.latest_at_or_before(t)
        return None if latest is None else Slot(self.job.name, latest)

    def place(self, offset: float, deferred: bool = False, lookahead: float = 0.0) -> None:
        """Claim ``next_slot`` at its time plus ``offset`` (0 to 1) of the jitter.

        ``deferred``: another instance claims it first; this one only after
        :meth:`deferral` more, should that one not have. ``lookahead``: the
        claim is sent that many seconds earlier, and a slot won ahead starts
        its handler at the time the claim would have gone (:attr:`start_at`).
        """
        assert self.next_slot is not None
        self.deferred = self.deferral if deferred else 0.0
        self.start_at = self.next_slot.time.timestamp() + offset * self.job.jitter + self.deferred
        self.claim_at = self.start_at - lookahead

    @property
    def deferral(self) -> float:
        """How long a claim waits for the slot's preferred instance: its jitter and a margin."""
        job = self.job
        return job.jitter + min(PEER_MARGIN, job.interval / 10)

    def catches_up(self, previous: Slot, record: JobState, lateness: float) -> bool:
        """Whether a starting instance still claims ``previous``, ``lateness`` seconds late.

        Only if the store's record is of an older slot, ``previous`` is within
        the catch-up window, and it was missed rather than skipped as an
        overlap (it came after the older run's lease had ended).
        """
        return (
            record.slot_ms < previous.ms
            and lateness <= self.job.catch_up_for(previous.time)
            and record.lease_remaining + lateness <= 0
        )

    def too_late(self, slot: Slot, lateness: float) -> bool:
        """Whether ``slot``, ``lateness`` seconds past its time, may no longer be claimed."""
        if lateness <= self.job.jitter + self.deferral + ON_TIME:
            return False  # on time: no need to work out the catch-up window
        return lateness > self.job.catch_up_for(slot.time, self.following(slot).time)

    def won_kind(self, lateness: float, deferred: float = 0.0) -> EventKind:
        """A won claim ``lateness`` seconds after its slot, placed ``deferred`` late: on
        time, or a catch-up."""
        on_time = self.job.jitter + deferred + ON_TIME
        return EventKind.CATCH_UP if lateness > on_time else EventKind.WON

    # -- overlap policies ----------------------------------------------------

    @property
    def overlap(self) -> Overlap:
        """The job's overlap policy as its slots' claims see it: a backfill's slots run one
        after another (``skip``); so do each lane's of a job with ``allow_all``, whose
        slots never wait for one another (each is claimed in its lane, see
        :meth:`~anarchon_core.engine.table.JobTable.runs_in`)."""
        policy = self.job.rules.overlap
        if policy is Overlap.ALLOW_ALL or self.job.name.endswith(BACKFILL):
            return Overlap.SKIP
        return policy

    def prune(self, recorded_ms: int) -> None:
        """Forget the waiting slots that the store's record reached (``recorded_ms``, the
        slot it holds): started, here or elsewhere, or superseded."""
        waiting = self.waiting
        while waiting and waiting[0].ms <= recorded_ms:
            waiting.popleft()

    def first_after(self, holder_ms: int, began: float | None) -> Slot:
        """The slot that waits behind the run of the job's slot ``holder_ms`` when one slot
        waits (``buffer_one``, ``cancel_other``): the job's first slot after that run began.

        ``began`` is when its first attempt was claimed, by the store's history
        (Unix seconds; None if unknown: its slot's time). A slot that came
        between its slot's time and then came while the run before it held
        the lease, and was dealt with then.
        """
        start = max(holder_ms / 1000, began if began is not None else 0.0)
        return self.slot_after(datetime.fromtimestamp(start, timezone.utc))

    def enqueue(self, slot: Slot, holder_ms: int, began: float | None) -> bool:
        """``slot`` came while the run of the job's slot ``holder_ms`` held its lease:
        whether it waits for that run to end (it is queued), by the job's overlap policy;
        False: it is skipped.

        Every instance decides alike, from the schedule and the store's record
        (``holder_ms``, and ``began`` from its history, see :meth:`first_after`),
        whenever it started: ``skip`` queues nothing; ``buffer_one`` and
        ``cancel_other`` queue the first slot after the run began, and skip the
        later ones; ``buffer_all`` queues every slot after the run's slot, in
        order, up to :data:`~anarchon_core.jobs.MAX_BUFFERED`. A slot this
        instance did not see come (it started, or was held up, meanwhile) is
        queued all the same when the rule says it waits.
        """
        policy = self.overlap
        if policy is Overlap.SKIP:
            return False
        self.prune(holder_ms)
        waiting = self.waiting
        if policy is Overlap.BUFFER_ALL:
            after = max(holder_ms, waiting[-1].ms if waiting else 0, self.decided_ms)
            last = Slot.from_ms(self.job.name, after)
            while len(waiting) < MAX_BUFFERED and last.ms < slot.ms:
                last = self.slot_after(last.time)
                if last.ms > slot.ms:
                    break  # off the grid (a run-now slot), or past the schedule's end
                waiting.append(last)
            self.decided_ms = max(self.decided_ms, slot.ms)
            return any(waiting_slot.ms == slot.ms for waiting_slot in waiting)
        if not waiting:
            first = self.first_after(holder_ms, began)
            if first.ms <= slot.ms:
                waiting.append(first)
        return bool(waiting) and waiting[0].ms == slot.ms

    def backs_up(self, holder: JobState) -> bool:
        """Whether ``holder``'s run is one to back up: not ended, and not this instance's.

        Judged by token, not by owner name: a restarted process may reuse its name.
        """
        held = self.runner is not None and self.runner.run.token == holder.token
        return not held and holder.state not in ENDED


@dataclass(frozen=True)
class Completion:
    """A handler returned (``done``) or raised (``failed``): the engine finishes its run."""

    runtime: JobRuntime
    runner: Runner
    outcome: RunState

    #: The handler could not hand the work off (the broker was unreachable).
    dispatch_failed: bool = False
    #: The handler stopped on losing its run (it raised LeaseLost): not a failure.
    interrupted: bool = False
    #: When the handler ended (wall-clock seconds): a dispatch that failed within
    #: the catch-up window is released, however late the store hears of it.
    ended_at: float = 0.0
    #: When the handler ended (monotonic): how long its end waited to be recorded.
    ended_mono: float = 0.0
    #: False for a run lost before its handler began: the handler never ran.
    started: bool = True

    @property
    def handed_off(self) -> bool:
        """The handler returned after handing the run off: its executor finishes it."""
        return self.runner.run.handed_off_lease is not None and self.outcome is RunState.DONE

    @property
    def kind(self) -> EventKind:
        """The event reporting the run's end."""
        if self.interrupted:
            return EventKind.HANDED_OVER
        if self.dispatch_failed:
            return EventKind.DISPATCH_FAILED
        if self.handed_off:
            return EventKind.DISPATCHED
        return EventKind.FINISHED if self.outcome is RunState.DONE else EventKind.FAILED
