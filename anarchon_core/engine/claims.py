"""Claims: placing each job's next slot, claiming the slots due in one batch, and acting on
every claim's answer in one place (:meth:`Answers.act`).

A claim asks the store for a slot; so does a takeover (of a lapsed or
released slot), a run-now or catch-up request and a backfill. Whatever
asked, the answer is acted on by :class:`Answers`: a slot won begins here
(:mod:`.runs`), a slot another instance holds is backed up (:mod:`.backups`).
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from ..events import EventKind
from ..roles import Backup, JobRuntime
from ..slots import Slot
from ..store import Claim, ClaimStatus, JobState, refusal
from .context import Context
from .pacing import Pacer
from .runs import Runs

log = logging.getLogger(__name__)

#: Back-off of a job whose claim failed (the loop's longest): tried again, within its
#: catch-up window.
CLAIM_RETRY = 2.0
#: How long a scheduled claim waits, again and again, for a run-now request before it.
REQUEST_WAIT = 0.1
#: How many slot times' jitter draws are kept; past that, the older half is dropped.
TICK_OFFSETS_KEPT = 4096


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


class Answers:
    """Acts on the answers to claims and takeovers: begin a run, or back the holder up."""

    def __init__(self, ctx: Context, runs: Runs) -> None:
        self._ctx = ctx
        self._runs = runs

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
            if ask in (Ask.SCHEDULED, Ask.TAKEOVER):
                rt.backup = None  # whatever was backed up, the record moved on to this run
            kind = won or rt.won_kind(self._ctx.lateness(slot), rt.deferred)
            self._ctx.emit(
                kind, slot=slot, attempt=holder.attempt, token=holder.token, detail=detail
            )
            self._runs.begin(rt, slot, holder, sent)
        elif ask is Ask.SCHEDULED:
            self._refused(rt, slot, claim)
        elif holder is not None and (
            claim.status is ClaimStatus.TAKEN if ask is Ask.REQUESTED else holder.slot_ms == slot.ms
        ):
            self.back_up(rt, holder)
        elif ask is Ask.TAKEOVER:
            rt.backup = None  # another attempt, or another slot, is recorded

    def _refused(self, rt: JobRuntime, slot: Slot, claim: Claim) -> None:
        """A scheduled slot not won: reported, and its holder backed up if need be."""
        holder, emit = claim.holder, self._ctx.emit
        if claim.status is ClaimStatus.TAKEN:
            attempt, token = (holder.attempt, holder.token) if holder else (None, None)
            emit(EventKind.TAKEN, slot=slot, attempt=attempt, token=token)
            if holder is not None:
                self.back_up(rt, holder)
        elif claim.status is ClaimStatus.BUSY:
            running = Slot.from_ms(slot.job, holder.slot_ms).id if holder else "?"
            emit(EventKind.OVERLAP, slot=slot, detail=f"{running} still holds its lease")
            if holder is not None and rt.backup is None and rt.runner is None:
                self.back_up(rt, holder)
        elif claim.status is ClaimStatus.PAUSED:
            emit(EventKind.PAUSED, slot=slot)
            # A slot that started before the pause goes on, backed up as any run.
            if holder is not None and holder.held and rt.backup is None and rt.runner is None:
                self.back_up(rt, holder)
        else:
            emit(EventKind.TAKEN, slot=slot, detail="a newer slot is recorded")

    def back_up(self, rt: JobRuntime, holder: JobState) -> None:
        """Become the backup of ``holder``'s run, if the store keeps leases and it needs one."""
        if self._ctx.gateway.leases is not None and rt.broken is None and rt.backs_up(holder):
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
    ) -> None:
        self._ctx = ctx
        self._answers = answers
        self._waits_for_request = waits_for_request
        self._random = random.Random(seed)
        self._tick_offsets: dict[int, float] = {}

    # -- placing -------------------------------------------------------------

    def place_new(self) -> None:
        """Place new jobs on their schedule; catch up, or back up a running slot."""
        ctx = self._ctx
        new = ctx.table.unplaced()
        if not new:
            return
        states = ctx.gateway.per_job(new, new, ctx.gateway.states)
        now = ctx.now()
        for rt, record in zip(new, states, strict=True):
            if isinstance(record, Exception):
                continue  # placed at a later step, once the store takes this job's read
            ctx.table.placed(rt)
            previous = rt.slot_at_or_before(now)
            rt.next_slot = rt.slot_after(now)
            if record is None or previous is None:
                # A job never seen before starts with its next slot, not a catch-up.
                pass
            elif record.slot_ms == previous.ms or (record.held and not ctx.gateway.by_observation):
                # The latest slot's run, or an older one still going (a run longer
                # than the interval): back it up like the instances that saw it start.
                # (Where leases are measured by observation, an old record left
                # running would look live: only the latest slot's is backed up.)
                self._answers.back_up(rt, record)
            elif rt.catches_up(previous, record, ctx.lateness(previous)):
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
        rt.place(offset, deferred=self._ctx.peers.preferred(rt, slot_ms) is not None)

    def advance(self, rt: JobRuntime, slot: Slot) -> None:
        """Place ``rt``'s slot after ``slot``."""
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

    def claim(self, due: list[JobRuntime], pacer: Pacer) -> None:
        """Claim the slots ``due``, a chunk per batch, and act on the answers.

        The runs' upkeep goes between two chunks; the chunks the step's
        budget leaves are claimed at the next step (see :mod:`.pacing`).
        """
        for chunk in pacer.chunks("claims", due):
            # Each chunk's slots worked out when it is sent: the misses a backlog
            # reports are work too, and the runs' upkeep goes between two chunks.
            batch = self._batch(chunk, self._ctx.clock.time())
            if batch:
                self._claim_chunk(batch)

    def _claim_chunk(self, batch: Sequence[tuple[JobRuntime, Slot]]) -> None:
        """Claim every slot of ``batch`` in one round trip, and act on the answers."""
        now = self._ctx.clock.time()
        peers = self._ctx.peers
        sent = self._ctx.clock.monotonic()
        claims = self._send(batch)
        version = peers.version
        for (rt, _), claim in zip(batch, claims, strict=True):
            if isinstance(claim, Exception):
                rt.claim_at = now + CLAIM_RETRY  # within its catch-up window
            else:
                peers.learn(claim, rt.preferred if rt.deferred else None)
        # The handlers of the slots won start first; then each job's next slot is
        # placed, once the batch taught what it could of the peers.
        try:
            for (rt, slot), claim in zip(batch, claims, strict=True):
                if not isinstance(claim, Exception):
                    self._answers.act(rt, slot, claim, sent, Ask.SCHEDULED)
        finally:
            for (rt, slot), claim in zip(batch, claims, strict=True):
                if not isinstance(claim, Exception) and not rt.removed:
                    self.advance(rt, slot)
        if peers.version != version:
            self.replace_deferred()

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
                    # The store's own rule for a claim's refusal.
                    answers[i] = refusal(batch[i][1].ms, record)
        rest = [i for i, answer in enumerate(answers) if answer is None]
        if rest:
            jobs = [batch[i][0] for i in rest]
            claims = gateway.per_job(jobs, [batch[i] for i in rest], gateway.claim_slots)
            for i, claim in zip(rest, claims, strict=True):
                answers[i] = claim
        return [answer for answer in answers if answer is not None]
