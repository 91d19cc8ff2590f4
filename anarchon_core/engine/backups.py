"""Backups: check the leases of slots other instances run, and take lapsed ones over.

A backup reads its slot's record every ``watch`` seconds (and before the
job's next slot is claimed); :meth:`Backup.verdict
<anarchon_core.roles.Backup.verdict>` decides from the record alone, and a
slot whose lease lapsed or was released is taken over as its next attempt.
The takeover's answer is acted on like any claim's (:class:`.claims.Answers`).
"""

from __future__ import annotations

from ..events import EventKind
from ..roles import JobRuntime, Verdict
from ..slots import Slot
from ..store import JobState, RunState
from .claims import CLAIM_RETRY, Answers, Ask
from .context import Context
from .pacing import Pacer


class Backups:
    """Checks the backed-up leases due, in one read, and takes lapsed slots over."""

    def __init__(self, ctx: Context, answers: Answers) -> None:
        self._ctx = ctx
        self._answers = answers

    def check(self, now_mono: float, due: list[JobRuntime], pacer: Pacer) -> None:
        """Check the leases of the slots this instance backs up, a chunk per read.

        Those due for a check, and those of the jobs ``due`` to be claimed (a
        released older slot must not be superseded unseen). The checks the
        step's budget leaves are made at the next step (see :mod:`.pacing`).
        """
        table = self._ctx.table
        checked = table.checks_due(now_mono)
        seen = {rt.job.name for rt in checked}
        checked += [rt for rt in due if rt.backup is not None and rt.job.name not in seen]
        if not checked:
            return
        due_now = {rt.job.name for rt in due}
        try:
            for chunk in pacer.chunks("backups", checked):
                self._verdicts(chunk, due_now)
        finally:
            table.checks_moved(checked)

    def _verdicts(self, checked: list[JobRuntime], due: set[str]) -> None:
        """Read the records ``checked`` back up, act on each verdict: the lapsed ones are
        taken over in one batch; the claim of a job ``due`` whose run is about to lapse
        waits for the lapse (:meth:`~anarchon_core.roles.Backup.hold`)."""
        now_mono = self._ctx.clock.monotonic()
        gateway = self._ctx.gateway
        states = gateway.per_job(checked, checked, gateway.states)
        lapsed: list[tuple[JobRuntime, JobState]] = []
        for rt, record in zip(checked, states, strict=True):
            backup = rt.backup
            if backup is None:  # removed
                continue
            if isinstance(record, Exception):  # refused: read again after a pause
                backup.retry(now_mono, rt.options, CLAIM_RETRY)
                continue
            verdict = backup.verdict(record, now_mono, rt.options)
            if verdict is Verdict.WATCH:
                assert record is not None
                if rt.job.name in due and rt.next_slot is not None:
                    wait = backup.hold(record, rt.next_slot.ms, now_mono)
                    if wait:
                        rt.claim_at = self._ctx.clock.time() + wait
            elif verdict is Verdict.DROP:
                rt.backup = None
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
        if lapsed:
            self._take_over(lapsed)

    def _take_over(self, lapsed: list[tuple[JobRuntime, JobState]]) -> None:
        """Take each record's slot over (compare-and-set on its token), as its next attempt,
        in one batch; a takeover refused alone is tried again after a pause."""
        gateway = self._ctx.gateway
        sent = self._ctx.clock.monotonic()
        claims = gateway.per_job([rt for rt, _ in lapsed], lapsed, gateway.takeovers)
        for (rt, record), claim in zip(lapsed, claims, strict=True):
            if isinstance(claim, Exception):  # refused: checked again after a pause
                continue
            how = "hand-over" if record.state is RunState.RELEASED else "lease lapsed"
            slot = Slot.from_ms(rt.job.name, record.slot_ms)
            self._answers.act(rt, slot, claim, sent, Ask.TAKEOVER, EventKind.TAKEOVER, how)
