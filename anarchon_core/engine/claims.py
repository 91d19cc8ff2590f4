"""Claims: placing each job's next slot, claiming the slots due in one batch, and acting on
every claim's answer in one place (:meth:`Answers.act`).

A claim asks the store for a slot; so does a takeover (of a lapsed or
released slot), a run-now or catch-up request, a backfill and a slot that
waited for the job's previous run to end (its overlap policy). Whatever
asked, the answer is acted on by :class:`Answers`: a slot won begins here
(:mod:`.runs`), a slot another instance holds is backed up (:mod:`.backups`).
A slot that comes while the job's previous run holds its lease is skipped,
or queued by the job's overlap policy (:meth:`Answers.queue`); while slots
wait, a scheduled slot is never claimed (it would supersede them): it is
queued or skipped from the record read (:meth:`Answers.arrived`).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from ..durations import Duration, parse_duration, within
from ..errors import Conflict, is_bug
from ..events import EventKind
from ..jobs import MAX_BUFFERED, Overlap
from ..roles import Backup, JobRuntime
from ..slots import Slot, is_own_record
from ..store import HISTORY, Claim, ClaimStatus, JobState, refusal
from .context import Context
from .pacing import Pacer
from .runs import Runs
from .tallies import eligible, group_key

log = logging.getLogger(__name__)

#: Back-off of a job whose claim failed (the loop's longest): tried again, within its
#: catch-up window.
CLAIM_RETRY = 2.0
#: How long a scheduled claim waits, again and again, for a run-now request before it.
REQUEST_WAIT = 0.1
#: How many slot times' jitter draws are kept; past that, the older half is dropped.
TICK_OFFSETS_KEPT = 4096
#: The longest look-ahead of a job's claims, as a share of its lease and of its interval
#: (see :meth:`Claims.lookahead_of`).
LOOKAHEAD_SHARE = 0.1
#: The longest ``lookahead`` a scheduler takes (seconds).
MAX_LOOKAHEAD = 5.0


def check_lookahead(value: Duration, name: str = "lookahead") -> float:
    """A scheduler's ``lookahead`` in seconds, or a ConfigurationError naming ``name``."""
    return within(
        name, parse_duration(name, value), 0.0, MAX_LOOKAHEAD, "(a claim sent ahead is judged then)"
    )


#: The control entries asking the instance that runs a job's slot to stop it
#: (``cancel/<job>/<token>``, ``overlap="cancel_other"``; see :mod:`.requests`).
CANCEL = "cancel/"


class Ask(enum.Enum):
    """What a claim was sent for: the answer is acted on accordingly."""

    #: The job's scheduled slot: every answer is reported.
    SCHEDULED = "scheduled"
    #: A slot asked to run now, or caught up on resume (a control entry).
    REQUESTED = "requested"
    #: A past slot of a backfill.
    BACKFILL = "backfill"
    #: A slot whose lease lapsed or was handed over, as its next attempt.
    TAKEOVER = "takeover"
    #: A slot that waited for the job's previous run to end (its overlap policy).
    BUFFERED = "buffered"


class Answers:
    """Acts on the answers to claims and takeovers: begin a run, or back the holder up."""

    def __init__(self, ctx: Context, runs: Runs) -> None:
        self._ctx = ctx
        self._runs = runs

    def starting(self) -> contextlib.AbstractContextManager[None]:
        """Around acting on a batch's answers: the hand-offs of the handlers it starts
        go together (:meth:`.runs.Runs.starting`)."""
        return self._runs.starting()

    def act(
        self,
        rt: JobRuntime,
        slot: Slot,
        claim: Claim,
        sent: float,
        ask: Ask,
        won: EventKind | None = None,
        detail: str = "",
    ) -> None:
        """Act on ``claim``, the answer to ``ask`` for ``rt``'s ``slot``, sent at ``sent``.

        A slot won is reported as ``won`` (a scheduled slot: on time or a
        catch-up) and begins. Otherwise the slot's holder is backed up where
        its run is one this instance may have to take over.
        """
        holder = claim.holder
        if claim.won:
            assert holder is not None
            if ask in (Ask.SCHEDULED, Ask.TAKEOVER, Ask.BUFFERED):
                rt.backup = None  # whatever was backed up, the record moved on to this run
            rt.prune(holder.slot_ms)
            rt.cancel_asked = None
            deferred = 0.0 if ask is Ask.BUFFERED else rt.deferred
            kind = won or rt.won_kind(self._ctx.lateness(slot), deferred)
            self._ctx.emit(
                kind, slot=slot, attempt=holder.attempt, token=holder.token, detail=detail
            )
            # Never before the slot's time; a scheduled slot won ahead (the scheduler's
            # lookahead) at the time its claim would have gone without it.
            start = slot.time.timestamp()
            if ask is Ask.SCHEDULED:
                start = max(start, rt.start_at)
            self._runs.begin(rt, slot, holder, sent, start)
        elif ask is Ask.BUFFERED and self._waits_on(rt, slot, claim):
            pass  # the run before it still holds the lease
        elif claim.status is ClaimStatus.ENDED:
            self._ended(rt, slot, claim)
        elif ask in (Ask.SCHEDULED, Ask.BUFFERED):
            self._refused(rt, slot, claim)
        elif holder is not None and (
            claim.status is ClaimStatus.TAKEN if ask is Ask.REQUESTED else holder.slot_ms == slot.ms
        ):
            self.back_up(rt, holder)
        elif ask is Ask.TAKEOVER:
            rt.backup = None  # another attempt, or another slot, is recorded
        if holder is not None and ask is not Ask.SCHEDULED:
            self.caught_up(rt, holder)
        if rt.waiting:
            self.await_end(rt, holder)

    def _refused(self, rt: JobRuntime, slot: Slot, claim: Claim) -> None:
        """A scheduled slot not won: reported, and its holder backed up if need be."""
        holder, emit = claim.holder, self._ctx.emit
        if claim.status is ClaimStatus.TAKEN:
            attempt, token = (holder.attempt, holder.token) if holder else (None, None)
            emit(EventKind.TAKEN, slot=slot, attempt=attempt, token=token)
            if holder is not None:
                self.back_up(rt, holder)
        elif claim.status is ClaimStatus.BUSY:
            if holder is None or not self.queue(rt, slot, holder):
                emit(EventKind.OVERLAP, slot=slot, detail=self._overlap_detail(rt, slot, holder))
            if holder is not None and rt.backup is None and rt.runner is None:
                self.back_up(rt, holder)
            elif holder is not None and rt.backup is None and not rt.backs_up(holder):
                self._watch_skipped(rt, slot)
        elif claim.status is ClaimStatus.PAUSED:
            emit(EventKind.PAUSED, slot=slot)
            # A slot that started before the pause goes on, backed up as any run.
            if holder is not None and holder.held and rt.backup is None and rt.runner is None:
                self.back_up(rt, holder)
        else:
            emit(EventKind.TAKEN, slot=slot, detail="a newer slot is recorded")

    def _ended(self, rt: JobRuntime, slot: Slot, claim: Claim) -> None:
        """The job has run its limit of slots, by the store's count: no slot of it is
        claimed here any more (every instance hears the same from the store). A run
        still going, its last, is backed up as any."""
        limit = rt.job.rules.limit
        self._ctx.emit(
            EventKind.LIMIT_REACHED, slot=slot, detail=f"limit reached ({limit} of {limit})"
        )
        rt.next_slot = None
        holder = claim.holder
        if holder is not None and holder.held and rt.backup is None and rt.runner is None:
            self.back_up(rt, holder)

    # -- overlap policies ----------------------------------------------------

    def queue(self, rt: JobRuntime, slot: Slot, holder: JobState) -> bool:
        """``slot`` came while ``holder``'s run, of an older slot, holds the job's lease:
        whether it waits for that run to end, by the job's overlap policy
        (:meth:`JobRuntime.enqueue <anarchon_core.roles.JobRuntime.enqueue>`; False:
        skipped). With ``cancel_other``, the run is asked to stop."""
        if rt.overlap is Overlap.SKIP:
            return False
        queued = rt.enqueue(slot, holder.slot_ms, self._began(rt, holder.slot_ms))
        if queued:
            log.debug("anarchon: %s waits for %s to end", slot.id, _id(rt, holder.slot_ms))
        self.ask_cancel(rt, holder)
        return queued

    def caught_up(self, rt: JobRuntime, record: JobState) -> None:
        """``record``'s run holds the lease, and began after its slot's time (it waited,
        or was requested): the slot that came since and waits for it, by the rule every
        instance applies, though it came before this instance heard of the run (a slot
        that comes within the clocks' difference of a run's start)."""
        if rt.overlap is Overlap.SKIP or rt.waiting or not record.held or not rt.watched:
            return
        latest = rt.slot_at_or_before(self._ctx.now())
        if latest is not None and latest.ms > record.slot_ms:
            self.queue(rt, latest, record)

    def derive(self, rt: JobRuntime, previous: Slot, record: JobState) -> None:
        """A job placed (an instance starts, or the job is declared) while the store's
        ``record`` is of a slot older than ``previous``, the latest slot due: the slots
        that wait for that run, by the job's policy, worked out from the record as the
        instances that saw them come did.

        If its run holds the lease, they wait for its end. If its lease ended
        (the run ended, lapsed or was handed over) after ``previous`` came, less
        than an interval ago, they start now, oldest first, as on the instances
        that saw them come (a lapsed run is taken over first, as any backup
        does; with ``cancel_other`` it is superseded). A lease that ended
        before ``previous`` came leaves nothing waiting: catch-up rules apply
        (after every instance was down, say)."""
        if rt.overlap is Overlap.SKIP:
            return
        if not record.held and record.lease_remaining + self._ctx.lateness(previous) <= 0:
            return  # it came after that run's lease ended: missed, not waiting
        self.queue(rt, previous, record)
        self.await_end(rt, record)

    def behind(self, rt: JobRuntime, slot: Slot, record: JobState | None) -> bool:
        """``slot``'s claim is due, nothing waits here, and ``record`` was just read:
        whether slots wait for its run all the same (this instance did not see them
        come: it was cut off or held up). The run is of an older slot, its lease ended
        (it would not be superseded by the claim otherwise), and slots came before
        that end that wait by the job's rule: they start first (a lapsed run is taken
        over first), and ``slot`` is queued or skipped behind them. False: ``slot`` is
        claimed as any."""
        if rt.overlap is Overlap.SKIP or record is None or record.held:
            return False
        if record.slot_ms >= slot.ms:
            return False
        ended = self._ctx.clock.time() + record.lease_remaining
        if rt.following(Slot.from_ms(rt.job.name, record.slot_ms)).time.timestamp() >= ended:
            return False  # the usual case: its lease ended before the next slot came
        decided = rt.decided_ms
        rt.enqueue(slot, record.slot_ms, self._began(rt, record.slot_ms))
        while rt.waiting and rt.waiting[-1].time.timestamp() >= ended:
            rt.waiting.pop()  # came after that end: not waiting for it
        if not rt.waiting:
            rt.decided_ms = decided
            return False
        rt.decided_ms = max(decided, rt.waiting[-1].ms)
        return self.arrived(rt, slot, record)

    def arrived(self, rt: JobRuntime, slot: Slot, record: JobState | None) -> bool:
        """``slot``, scheduled, came while slots of its job wait; ``record`` is the job's
        record, just read. Its claim is not sent (it would supersede the slots waiting):
        it is queued or skipped by the job's policy, as if the run they wait for held the
        lease. False if the record shows that nothing waits any more: the slot is then
        claimed as any."""
        if record is not None:
            rt.prune(record.slot_ms)
        if not rt.waiting:
            return False
        head = rt.waiting[0]
        holder_ms = record.slot_ms if record is not None else head.ms - 1
        if not rt.enqueue(slot, holder_ms, None):
            if rt.overlap is Overlap.BUFFER_ALL:
                why = f"{MAX_BUFFERED} slots wait already (overlap=buffer_all)"
            else:
                why = f"{head.id} waits already (overlap={rt.overlap.value})"
            self._ctx.emit(EventKind.OVERLAP, slot=slot, detail=why)
        if record is not None:
            self.ask_cancel(rt, record)
        self.await_end(rt, record)
        return True

    def _overlap_detail(self, rt: JobRuntime, slot: Slot, holder: JobState | None) -> str:
        """Why a slot that came while ``holder`` held the lease is skipped."""
        running = _id(rt, holder.slot_ms) if holder else "?"
        detail = f"{running} still holds its lease"
        waiting = rt.waiting
        if rt.overlap is Overlap.SKIP:
            return detail
        if rt.overlap is Overlap.BUFFER_ALL and len(waiting) >= MAX_BUFFERED:
            return f"{detail}; {MAX_BUFFERED} slots wait already"
        if waiting and waiting[0].ms != slot.ms:
            return f"{detail}; {waiting[0].id} waits already"
        return f"{detail}; it began after this slot came"

    def _began(self, rt: JobRuntime, holder_ms: int) -> float | None:
        """When the run of the job's slot ``holder_ms`` began, by the store's history (its
        first attempt's start, on the store's clock), for the policies whose waiting slot
        is the first one after that; None when unknown (the slot's time then stands for it)."""
        if rt.overlap not in (Overlap.BUFFER_ONE, Overlap.CANCEL_OTHER):
            return None
        if rt.began is not None and rt.began[0] == holder_ms:
            return rt.began[1]
        try:
            runs = self._ctx.gateway.store.history(rt.job.name, HISTORY)
        except Exception as exc:
            if is_bug(exc):
                raise
            log.warning(
                "anarchon: could not read the history of %s (the slot after %s waits): %s",
                rt.job.name,
                _id(rt, holder_ms),
                exc,
            )
            return None
        starts = [run.started_at for run in runs if run.slot_ms == holder_ms]
        if not starts:
            return None
        rt.began = (holder_ms, min(starts))
        return rt.began[1]

    def ask_cancel(self, rt: JobRuntime, holder: JobState) -> None:
        """Ask ``holder``'s run to stop, once per run, when a newer slot waits for it
        (``cancel_other``): at once when this instance runs it, else through the store
        (a control entry ``cancel/<job>/<token>`` that the instance running it reads within
        a second, see :mod:`.requests`). A request that could not be written is asked
        again at the next check of the run."""
        if (
            rt.overlap is not Overlap.CANCEL_OTHER
            or not rt.waiting
            or not holder.held
            or holder.slot_ms >= rt.waiting[0].ms
            or rt.cancel_asked == holder.token
        ):
            return
        head = rt.waiting[0]
        reason = f"{head.id} waits for it to end (overlap=cancel_other)"
        runner = rt.runner
        if runner is not None and runner.run.token == holder.token:
            if runner.run.cancel(reason):
                log.info("anarchon: %s asked to stop: %s", runner.run.slot_id, reason)
            rt.cancel_asked = holder.token
            return
        gateway = self._ctx.gateway
        if not gateway.controls:
            rt.cancel_asked = holder.token  # no control entries here: the slot waits its end
            return
        value = json.dumps(
            {
                "slot_ms": holder.slot_ms,
                "waits": head.ms,
                "by": self._ctx.instance,
                "asked": self._ctx.clock.time(),
            }
        )
        try:
            gateway.store.set_control(f"{CANCEL}{rt.job.name}/{holder.token}", value, 0)
        except Conflict:
            pass  # asked already, by another instance
        except Exception as exc:
            if is_bug(exc):
                raise
            log.warning("anarchon: could not ask %s to stop: %s", _id(rt, holder.slot_ms), exc)
            return
        rt.cancel_asked = holder.token

    def _waits_on(self, rt: JobRuntime, slot: Slot, claim: Claim) -> bool:
        """The answer to the claim of ``slot``, which waited for the job's previous run:
        True while that run holds the lease (the slot waits on); else the slot waits no
        more (started elsewhere, superseded, or refused), and none after it starts either
        when the job is paused or has run its limit."""
        if claim.status is ClaimStatus.BUSY:
            return True
        holder = claim.holder
        rt.prune(max(slot.ms, holder.slot_ms if holder is not None else slot.ms))
        if claim.status not in (ClaimStatus.TAKEN, ClaimStatus.STALE):
            for later in rt.waiting:
                if claim.status is ClaimStatus.PAUSED:
                    self._ctx.emit(EventKind.PAUSED, slot=later)
            rt.waiting.clear()
        return False

    def await_end(self, rt: JobRuntime, record: JobState | None) -> None:
        """Make sure this instance hears of the end of the run its waiting slots wait for:
        the end of its own run starts them (:mod:`.runs`); another's is backed up
        (checked at once if ``record`` ended already), and its end starts them
        (:mod:`.backups`)."""
        if not rt.waiting or not rt.watched or self._ctx.gateway.leases is None:
            return
        runner, backup = rt.runner, rt.backup
        if record is None:
            if backup is None and runner is None:
                rt.backup = Backup.at_once(rt.waiting[0], 0, self._ctx.clock.monotonic())
            return
        if runner is not None and runner.run.token == record.token and not runner.run.lost:
            return
        if backup is not None and backup.slot.ms == record.slot_ms:
            return
        slot = Slot.from_ms(rt.job.name, record.slot_ms)
        now_mono = self._ctx.clock.monotonic()
        if record.held:
            rt.backup = Backup.of(slot, record, now_mono, rt.options)
        else:
            rt.backup = Backup.at_once(slot, record.token, now_mono)

    def _watch_skipped(self, rt: JobRuntime, slot: Slot) -> None:
        """``slot`` was skipped for this instance's own run, which may end before the
        other instances, waiting for this one, claim the slot: one of them may then win
        it, unseen here. Its record is read before this job's next claim (a backup of
        the slot, checked then or after ``watch``): a run of it is backed up as any, and
        taken over if its lease lapsed, rather than superseded by that claim."""
        if self._ctx.gateway.leases is not None and rt.runs_watched and rt.overlap is Overlap.SKIP:
            rt.backup = Backup(slot, 0, self._ctx.clock.monotonic() + rt.options.watch)

    def back_up(self, rt: JobRuntime, holder: JobState) -> None:
        """Become the backup of ``holder``'s run, if the store keeps leases and it needs one."""
        if self._ctx.gateway.leases is not None and rt.runs_watched and rt.backs_up(holder):
            slot = Slot.from_ms(rt.job.name, holder.slot_ms)
            rt.backup = Backup.of(slot, holder, self._ctx.clock.monotonic(), rt.options)


class Claims:
    """Places each job's next slot, and claims the slots due in one batch per step.

    ``waits_for_request(rt, slot_ms)``: a run-now request of the job comes
    before ``slot_ms``, and the scheduled slot waits for its answer.
    """

    def __init__(
        self,
        ctx: Context,
        answers: Answers,
        waits_for_request: Callable[[JobRuntime, int], bool],
        seed: int | None = None,
        lookahead: float = 0.0,
    ) -> None:
        self._ctx = ctx
        self._answers = answers
        self._waits_for_request = waits_for_request
        self._lookahead = lookahead
        self._random = random.Random(seed)
        self._tick_offsets: dict[int, float] = {}

    # -- placing -------------------------------------------------------------

    def place_new(self) -> None:
        """Place new jobs on their schedule; catch up, or back up a running slot."""
        ctx = self._ctx
        new = ctx.table.unplaced()
        if not new:
            return
        lanes = [rt for rt in new if rt.job.rules.overlap is Overlap.ALLOW_ALL]
        if lanes:
            self._place_lanes(lanes)
            new = [rt for rt in new if rt not in lanes]
        states = ctx.gateway.per_job(new, new, ctx.gateway.states)
        now = ctx.now()
        for rt, record in zip(new, states, strict=True):
            if isinstance(record, Exception):
                continue  # placed at a later step, once the store takes this job's read
            ctx.table.placed(rt)
            previous = rt.slot_at_or_before(now)
            rt.next_slot = rt.slot_after(now)
            rt.waiting.clear()
            rt.began = rt.cancel_asked = None
            rt.decided_ms = 0
            if record is None or previous is None:
                # A job never seen before starts with its next slot, not a catch-up.
                pass
            elif record.slot_ms == previous.ms or (record.held and not ctx.gateway.by_observation):
                # The latest slot's run, or an older one still going (a run longer
                # than the interval): back it up like the instances that saw it start.
                # (Where leases are measured by observation, an old record left
                # running would look live: only the latest slot's is backed up.)
                self._answers.back_up(rt, record)
                if record.slot_ms < previous.ms:
                    self._answers.derive(rt, previous, record)
            elif rt.catches_up(previous, record, ctx.lateness(previous)):
                rt.next_slot = previous
            elif record.slot_ms < previous.ms and not ctx.gateway.by_observation:
                # An older run whose lease ended after the latest slot came: that slot
                # (and those before it) came while it held the lease.
                self._answers.derive(rt, previous, record)
            self.place(rt)

    def _place_lanes(self, jobs: list[JobRuntime]) -> None:
        """Place jobs with ``overlap="allow_all"``: their lanes' records read in one batch;
        each run holding a lane's lease is backed up, and the latest slot due is caught up
        when its lane's record shows it missed (as :meth:`place_new` does for a job's own
        record). Where leases are judged by observation, only the latest slot's run is
        backed up (an old record left running would look live)."""
        ctx = self._ctx
        per_job = [ctx.table.lanes(rt) for rt in jobs]
        lanes = [lane for each in per_job for lane in each]
        answers = ctx.gateway.per_job(lanes, lanes, ctx.gateway.states)
        records = iter(answers)
        now = ctx.now()
        for rt, lane_rts in zip(jobs, per_job, strict=True):
            read = {lane.job.name: (lane, next(records)) for lane in lane_rts}
            if any(isinstance(record, Exception) for _, record in read.values()):
                continue  # placed at a later step, once the store takes this job's read
            ctx.table.placed(rt)
            previous = rt.slot_at_or_before(now)
            rt.next_slot = rt.slot_after(now)
            latest_ms = previous.ms if previous is not None else None
            for lane_rt, record in read.values():
                assert not isinstance(record, Exception)
                if record is None or not (record.held or record.slot_ms == latest_ms):
                    continue
                if ctx.gateway.by_observation and record.slot_ms != latest_ms:
                    continue
                self._answers.back_up(lane_rt, record)
            seen = any(record is not None for _, record in read.values())
            if previous is not None and seen:
                # The latest slot due, missed (its lane's record is older, or none:
                # a lane not used yet) while no run held that lane: caught up.
                _, record = read[ctx.table.runs_in(rt, previous)[1].job]
                assert not isinstance(record, Exception)
                late = ctx.lateness(previous)
                if (
                    rt.catches_up(previous, record, late)
                    if record is not None
                    else late <= rt.job.catch_up_for(previous.time)
                ):
                    rt.next_slot = previous
            self.place(rt)

    def place(self, rt: JobRuntime) -> None:
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
        deferred = self._ctx.peers.preferred(rt, slot_ms) is not None
        rt.place(offset, deferred, self.lookahead_of(rt))

    def lookahead_of(self, rt: JobRuntime) -> float:
        """How long before its time ``rt``'s scheduled claim goes: the scheduler's
        ``lookahead``, at most :data:`LOOKAHEAD_SHARE` of the job's lease and of its
        interval; none for a job whose slots may wait for one another or run side by
        side (an overlap policy other than ``skip``), nor for a backfill."""
        lookahead = self._lookahead
        if not lookahead:
            return 0.0
        job = rt.job
        if job.rules.overlap is not Overlap.SKIP or not is_own_record(job.name):
            return 0.0
        return min(lookahead, LOOKAHEAD_SHARE * job.options.lease, LOOKAHEAD_SHARE * job.interval)

    def advance(self, rt: JobRuntime, slot: Slot) -> None:
        """Place ``rt``'s slot after ``slot``; a job removed has none (it goes once
        nothing of it is left)."""
        if rt.removed:
            rt.next_slot = None
            self._ctx.table.forget(rt)
            return
        rt.next_slot = rt.following(slot)
        self.place(rt)
        rt.following(rt.next_slot)  # worked out now, not when its claim is due

    def replace_deferred(self) -> None:
        """Place again the claims deferred for a peer that is no longer live."""
        for rt in self._ctx.table.runtimes():
            waited_for = rt.preferred
            if rt.next_slot is not None and waited_for and waited_for not in self._ctx.peers:
                self.place(rt)

    # -- claiming ------------------------------------------------------------

    def due(self) -> list[JobRuntime]:
        """The jobs whose claim is due, taken out of the agenda (see :meth:`claim`)."""
        return self._ctx.table.claims_due(self._ctx.clock.time())

    def hold_back(self, due: list[JobRuntime], waits: dict[str, float]) -> list[JobRuntime]:
        """Of ``due``, those to claim now. The claims of the jobs of ``waits`` (whose run
        backed up is not settled: see :meth:`.backups.Backups.check`) go after the next
        check of that run: each waits its seconds (a check refused: :data:`CLAIM_RETRY`,
        as a claim refused does, within its catch-up window), or none (a check left to
        the next step: claimed then)."""
        now = self._ctx.clock.time()
        claimed = []
        for rt in due:
            wait = waits.get(rt.job.name)
            if wait is None:
                claimed.append(rt)
            elif wait:
                rt.claim_at = now + wait
        return claimed

    def claim(self, due: list[JobRuntime], pacer: Pacer) -> None:
        """Claim the slots ``due``, a chunk per batch, and act on the answers.

        The runs' upkeep goes between two chunks; the chunks the step's
        budget leaves are claimed at the next step (see :mod:`.pacing`).
        """
        due = self._settle(due)
        for chunk in pacer.chunks("claims", due):
            # Each chunk's slots worked out when it is sent: the misses a backlog
            # reports are work too, and the runs' upkeep goes between two chunks.
            batch = self._batch(chunk, self._ctx.clock.time())
            queued = [(rt, slot) for rt, slot in batch if rt.overlap is not Overlap.SKIP]
            if queued:
                claimed = self._arrive(queued)
                batch = [(rt, s) for rt, s in batch if rt.overlap is Overlap.SKIP or rt in claimed]
            if batch:
                self._claim_chunk(batch)

    def _settle(self, due: list[JobRuntime]) -> list[JobRuntime]:
        """Of ``due``, the jobs whose claim still goes, as the tallies of the instances
        they waited for say (:mod:`.tallies`): a job whose slot was won and its run ended
        is done with here, as if its record had been read (a claim would be refused: the
        slot is taken, and there is no run to back up), and its next slot placed; one
        whose run still goes is looked at once more, a peer margin later
        (:func:`.tallies.wait_until`), then read as any."""
        tallies, now = self._ctx.tallies, self._ctx.clock.time()
        if not tallies.kept:
            return due
        waited = [
            (rt, group_key(rt.next_slot.ms, rt, self.lookahead_of(rt)))
            for rt in due
            if rt.deferred and rt.next_slot is not None and rt.claim_at <= now and eligible(rt)
        ]
        told = tallies.read(waited)
        if not told.settled and not told.going:
            return due
        rest: list[JobRuntime] = []
        emit = self._ctx.emit
        for rt in due:
            writer = told.settled.get(id(rt))
            until = told.going.get(id(rt))
            slot = rt.next_slot
            if (
                (writer is None and until is None)
                or slot is None
                or rt.removed
                or rt.backup is not None
                or rt.runner is not None
                or rt.following(slot).time.timestamp() <= now  # a backlog: see _batch
                or rt.too_late(slot, now - slot.time.timestamp())
                or self._waits_for_request(rt, slot.ms)
            ):
                rest.append(rt)
            elif writer is not None:
                emit(EventKind.TAKEN, slot=slot, detail=f"won and ended by {writer}")
                self.advance(rt, slot)
            elif until is not None:
                rt.claim_at = until
        return rest

    def _arrive(self, queued: list[tuple[JobRuntime, Slot]]) -> list[JobRuntime]:
        """The slots of ``queued``, of jobs whose overlap policy queues slots: the record
        is read first, in one batch. While slots of the job wait, its slot is never
        claimed (it would supersede them), but queued or skipped by the job's policy
        (:meth:`Answers.arrived`); likewise when the record shows slots waiting that
        this instance did not see come (:meth:`Answers.behind`). A job whose read
        failed is tried again after a pause. The others: their slot is claimed as any."""
        gateway, now, answers = self._ctx.gateway, self._ctx.clock.time(), self._answers
        jobs = [rt for rt, _ in queued]
        records = gateway.per_job(jobs, jobs, gateway.states)
        claimed: list[JobRuntime] = []
        for (rt, slot), record in zip(queued, records, strict=True):
            if isinstance(record, Exception):
                rt.claim_at = now + CLAIM_RETRY  # within its catch-up window
            elif (answers.arrived if rt.waiting else answers.behind)(rt, slot, record):
                self.advance(rt, slot)
            else:
                claimed.append(rt)
        return claimed

    def _claim_chunk(self, batch: Sequence[tuple[JobRuntime, Slot]]) -> None:
        """Claim every slot of ``batch`` in one round trip, and act on the answers."""
        now = self._ctx.clock.time()
        peers = self._ctx.peers
        sent = self._ctx.clock.monotonic()
        # Each slot claimed in its record: the job's own, or its lane's (allow_all).
        runs_in = [self._runs_in(rt, slot) for rt, slot in batch]
        claims = self._send(runs_in)
        version = peers.version
        tallying = self._ctx.tallies.peers_wait
        ahead: set[int] = set()
        for i, ((rt, _), claim) in enumerate(zip(batch, claims, strict=True)):
            if isinstance(claim, Exception):
                rt.claim_at = now + CLAIM_RETRY  # within its catch-up window
                continue
            peers.learn(claim, rt.preferred if rt.deferred else None)
            if now < rt.start_at and claim.status in (ClaimStatus.BUSY, ClaimStatus.PAUSED):
                # Sent ahead (lookahead), and refused for the job's state: a run that
                # holds the lease, or a pause, is judged when the claim would have gone
                # without the look-ahead, as it always was: claimed again then.
                ahead.add(i)
        # The handlers of the slots won start first; then each job's next slot is
        # placed, once the batch taught what it could of the peers.
        try:
            with self._answers.starting():
                for i, ((run_rt, run_slot), claim) in enumerate(zip(runs_in, claims, strict=True)):
                    if not isinstance(claim, Exception) and i not in ahead:
                        self._answers.act(run_rt, run_slot, claim, sent, Ask.SCHEDULED)
                        if tallying and not run_rt.deferred:
                            self._tally(run_rt, run_slot, claim)
        finally:
            for i, ((rt, slot), claim) in enumerate(zip(batch, claims, strict=True)):
                if isinstance(claim, Exception):
                    continue
                if i in ahead:
                    rt.claim_at = rt.start_at
                elif claim.status is not ClaimStatus.ENDED or rt.removed:
                    # An ended job has no next slot; a removed one goes (Claims.advance).
                    self.advance(rt, slot)
        if peers.version != version:
            self.replace_deferred()

    def _tally(self, rt: JobRuntime, slot: Slot, claim: Claim) -> None:
        """This instance claimed ``rt``'s ``slot`` first: its tally will say so."""
        holder = claim.holder
        won = claim.won and holder is not None and rt.runner is not None
        token = holder.token if won and holder is not None else None
        self._ctx.tallies.claimed(rt, token, won, group_key(slot.ms, rt, self.lookahead_of(rt)))

    def _runs_in(self, rt: JobRuntime, slot: Slot) -> tuple[JobRuntime, Slot]:
        """The runtime and slot that ``rt``'s ``slot`` is claimed and run as: a lane's, for
        a job with ``overlap="allow_all"`` (placed as its job's: deferred alike)."""
        run_rt, run_slot = self._ctx.table.runs_in(rt, slot)
        if run_rt is not rt:
            run_rt.deferred, run_rt.preferred = rt.deferred, rt.preferred
        return run_rt, run_slot

    def _batch(self, due: list[JobRuntime], now: float) -> list[tuple[JobRuntime, Slot]]:
        """The slots of ``due`` to claim at ``now``: the latest of a backlog, none too late."""
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
                self._ctx.emit(EventKind.MISSED, slot=slot, detail="skipped")
                slot = rt.next_slot = latest
            if rt.too_late(slot, now - slot.time.timestamp()):
                self._ctx.emit(EventKind.MISSED, slot=slot, detail="too late")
                self.advance(rt, slot)
                continue
            if self._waits_for_request(rt, slot.ms):
                # A run-now request comes first: this slot waits for its answer.
                rt.claim_at = now + REQUEST_WAIT
                continue
            batch.append((rt, slot))
        return batch

    def _send(self, batch: Sequence[tuple[JobRuntime, Slot]]) -> list[Claim | Exception]:
        """The answers to the claims of ``batch``, one round trip for each kind of call.

        A claim that waited for the slot's preferred instance reads the record
        first: when it holds the slot (the usual case) or a run that holds its
        lease, the read answers as the claim would have, without a write. Only
        the slots nobody claimed are claimed.
        """
        gateway = self._ctx.gateway
        answers: list[Claim | Exception | None] = [None] * len(batch)
        waited = [i for i, (rt, _) in enumerate(batch) if rt.deferred]
        if waited:
            jobs = [batch[i][0] for i in waited]
            records = gateway.per_job(jobs, jobs, gateway.states)
            for i, record in zip(waited, records, strict=True):
                if isinstance(record, Exception):
                    answers[i] = record
                else:
                    # The store's own rule for a claim's refusal. A job with a limit
                    # is claimed when busy: the store may answer that it ended.
                    answer = refusal(batch[i][1].ms, record)
                    limited = batch[i][0].job.rules.limit is not None
                    if not (limited and answer and answer.status is ClaimStatus.BUSY):
                        answers[i] = answer
        rest = [i for i, answer in enumerate(answers) if answer is None]
        if rest:
            jobs = [batch[i][0] for i in rest]
            claims = gateway.per_job(jobs, [batch[i] for i in rest], gateway.claim_slots)
            for i, claim in zip(rest, claims, strict=True):
                answers[i] = claim
        return [answer for answer in answers if answer is not None]


def _id(rt: JobRuntime, slot_ms: int) -> str:
    """The id of the job's slot ``slot_ms``."""
    return Slot.from_ms(rt.job.name, slot_ms).id
