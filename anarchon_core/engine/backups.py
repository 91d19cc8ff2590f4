"""Backups: check the leases of slots other instances run, and take lapsed ones over.

A backup reads its slot's record every ``watch`` seconds (and before the
job's next slot is claimed); :meth:`Backup.verdict
<anarchon_core.roles.Backup.verdict>` decides from the record alone, and a
slot whose lease lapsed or was released is taken over as its next attempt.
The takeover's answer is acted on like any claim's (:class:`.claims.Answers`).

A run that slots of its job wait for (the job's overlap policy) is backed
up likewise: once the check finds it ended (or, with ``cancel_other``, its
lease lapsed), the oldest slot waiting is claimed, as its own slot.
"""

from __future__ import annotations

from collections.abc import Callable

from ..events import EventKind
from ..jobs import Overlap
from ..roles import ENDED, Backup, JobRuntime, Verdict
from ..slots import Slot, is_own_record
from ..store import JobState, RunState
from .claims import CLAIM_RETRY, REQUEST_WAIT, Answers, Ask
from .context import Context
from .pacing import Pacer


class Backups:
    """Checks the backed-up leases due, in one read, and takes lapsed slots over.

    ``waits_for_request(rt, slot_ms)``: a run-now request of the job comes
    before ``slot_ms``; a slot waiting after it waits for its answer.
    """

    def __init__(
        self,
        ctx: Context,
        answers: Answers,
        waits_for_request: Callable[[JobRuntime, int], bool] | None = None,
    ) -> None:
        self._ctx = ctx
        self._answers = answers
        self._waits_for_request = waits_for_request or (lambda rt, slot_ms: False)

    def check(self, now_mono: float, due: list[JobRuntime], pacer: Pacer) -> dict[str, float]:
        """Check the leases of the slots this instance backs up, a chunk per read.

        Those due for a check, and those of the jobs ``due`` to be claimed (a
        released older slot must not be superseded unseen). The checks the
        step's budget leaves are made at the next step (see :mod:`.pacing`).

        Returns the jobs ``due`` whose run backed up is **unsettled**, each with
        how long its claim waits: :data:`~.claims.CLAIM_RETRY` when its record
        could not be read or its takeover was refused, 0 (the next step) when its
        check was left to the next step. A claim sent now could supersede that
        run, lapsed, without its takeover.
        """
        table = self._ctx.table
        checked = table.checks_due(now_mono)
        seen = {rt.job.name for rt in checked}
        checked += [rt for rt in due if rt.backup is not None and rt.job.name not in seen]
        if not checked:
            return {}
        due_now = {rt.job.name for rt in due}
        # Each check of a job due settles it once it comes to a verdict (a takeover:
        # once answered); one made and not settled waits CLAIM_RETRY.
        unsettled = {rt.job.name: 0.0 for rt in checked if rt.job.name in due_now}
        try:
            for chunk in pacer.chunks("backups", checked):
                made = {rt.job.name for rt in chunk}
                refused = self._verdicts(chunk, due_now)
                for name in made & unsettled.keys():
                    if name in refused:
                        unsettled[name] = CLAIM_RETRY
                    else:
                        del unsettled[name]
        finally:
            table.checks_moved(checked)
        return unsettled

    def _verdicts(self, checked: list[JobRuntime], due: set[str]) -> set[str]:
        """Read the records ``checked`` back up, act on each verdict: the lapsed ones are
        taken over in one batch; the claim of a job ``due`` whose run is about to lapse
        waits for the lapse (:meth:`~anarchon_core.roles.Backup.hold`). Returns the
        jobs whose record could not be read, or whose takeover was refused."""
        now_mono = self._ctx.clock.monotonic()
        gateway = self._ctx.gateway
        states = gateway.per_job(checked, checked, gateway.states)
        lapsed: list[tuple[JobRuntime, JobState]] = []
        ended: list[tuple[JobRuntime, Slot, JobState | None]] = []
        refused: set[str] = set()
        for rt, record in zip(checked, states, strict=True):
            backup = rt.backup
            if backup is None:  # removed
                continue
            if isinstance(record, Exception):  # refused: read again after a pause
                backup.retry(now_mono, rt.options, CLAIM_RETRY)
                refused.add(rt.job.name)
                continue
            if record is not None and self._newer_run(rt, backup.slot, record):
                # A newer slot's run where the run backed up was: this instance may never
                # have seen it (its claim of that slot was skipped as an overlap of the
                # run before, which ended just after). Backed up from now on, as any.
                backup = rt.backup = Backup(
                    Slot.from_ms(rt.job.name, record.slot_ms), record.token, now_mono
                )
            superseded = rt.overlap is Overlap.CANCEL_OTHER and bool(rt.waiting)
            verdict = backup.verdict(record, now_mono, rt.options, superseded)
            if verdict is Verdict.WATCH:
                assert record is not None
                if rt.job.name in due and rt.next_slot is not None:
                    wait = backup.hold(record, rt.next_slot.ms, now_mono)
                    if wait:
                        rt.claim_at = self._ctx.clock.time() + wait
                if superseded:
                    self._answers.ask_cancel(rt, record)  # if it could not be asked before
            elif verdict in (Verdict.DROP, Verdict.SUPERSEDE):
                rt.backup = None
                if (
                    record is not None
                    and record.slot_ms == backup.slot.ms
                    and record.state in ENDED
                ):
                    # This instance's own run, handed off, ended: its tally may say so.
                    self._ctx.tallies.ended(rt.job.name, backup.token, True)
            elif verdict is Verdict.MISSED:
                assert record is not None
                rt.backup = None
                detail = "handed off but never picked up; not sent again"
                self._ctx.emit(
                    EventKind.MISSED, slot=backup.slot, attempt=record.attempt, detail=detail
                )
            elif verdict is Verdict.TAKE_OVER:
                assert record is not None
                backup.retry(now_mono, rt.options, CLAIM_RETRY)  # should it not happen now
                lapsed.append((rt, record))
            if rt.waiting and rt.backup is None:
                ended.append((rt, backup.slot, record))
            if rt.removed and rt.backup is None:
                self._ctx.table.forget(rt)  # a job removed while it watched this run
        if lapsed:
            answered = self._take_over(lapsed)
            refused.update(rt.job.name for rt, _ in lapsed if rt.job.name not in answered)
        if ended:
            self._start_waiting(ended)
        return refused

    @staticmethod
    def _newer_run(rt: JobRuntime, backed_up: Slot, record: JobState) -> bool:
        """Whether ``record`` is a run of a slot newer than the one ``backed_up``, not
        ended and not this instance's own, of a job whose slots are claimed one at a
        time in its own record (with another overlap policy, slots wait for the run
        before them and are claimed as it ends: :meth:`_start_waiting`)."""
        return (
            record.slot_ms > backed_up.ms
            and rt.overlap is Overlap.SKIP
            and is_own_record(rt.job.name)
            and rt.backs_up(record)
        )

    def _start_waiting(self, ended: list[tuple[JobRuntime, Slot, JobState | None]]) -> None:
        """The runs that slots waited for ended (or lapsed, with ``cancel_other``): claim
        each job's oldest slot waiting, in one batch, as its own slot (attempt 1), however
        late: it was on time when it came. A claim refused alone is tried again after a
        pause; one a run-now request of the job comes before waits for its answer."""
        now_mono = self._ctx.clock.monotonic()
        batch: list[tuple[JobRuntime, Slot]] = []
        details: list[str] = []
        for rt, before, record in ended:
            if record is not None:
                rt.prune(record.slot_ms)
                before = Slot.from_ms(rt.job.name, record.slot_ms)
                if not rt.waiting:  # it began elsewhere: the slot that came since waits for it
                    self._answers.caught_up(rt, record)
                    self._answers.await_end(rt, record)
                    continue
            if not rt.waiting or not rt.watched:
                continue
            head = rt.waiting[0]
            if self._waits_for_request(rt, head.ms):
                rt.backup = Backup(head, 0, now_mono + REQUEST_WAIT)
                continue
            batch.append((rt, head))
            details.append(
                f"waited for {before.id} to end" if before.ms < head.ms else "waited its turn"
            )
        if not batch:
            return
        gateway = self._ctx.gateway
        sent = self._ctx.clock.monotonic()
        claims = gateway.per_job([rt for rt, _ in batch], batch, gateway.claim_slots)
        for (rt, head), detail, claim in zip(batch, details, claims, strict=True):
            if isinstance(claim, Exception):  # refused: checked (and claimed) again after a pause
                rt.backup = Backup(head, 0, now_mono + min(rt.options.watch, CLAIM_RETRY))
                continue
            self._answers.act(rt, head, claim, sent, Ask.BUFFERED, detail=detail)

    def _take_over(self, lapsed: list[tuple[JobRuntime, JobState]]) -> set[str]:
        """Take each record's slot over (compare-and-set on its token), as its next attempt,
        in one batch; a takeover refused alone is tried again after a pause. Returns the
        names of the jobs whose takeover was answered."""
        gateway = self._ctx.gateway
        sent = self._ctx.clock.monotonic()
        claims = gateway.per_job([rt for rt, _ in lapsed], lapsed, gateway.takeovers)
        answered: set[str] = set()
        for (rt, record), claim in zip(lapsed, claims, strict=True):
            if isinstance(claim, Exception):  # refused: checked again after a pause
                continue
            answered.add(rt.job.name)
            how = "hand-over" if record.state is RunState.RELEASED else "lease lapsed"
            slot = Slot.from_ms(rt.job.name, record.slot_ms)
            self._answers.act(rt, slot, claim, sent, Ask.TAKEOVER, EventKind.TAKEOVER, how)
            if rt.removed:
                self._ctx.table.forget(rt)  # taken over elsewhere, or over: gone once ended
        return answered
