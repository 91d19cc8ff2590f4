"""Requests read from the store's control entries: run now, catch up on resume, backfill.

Every :data:`CONTROL_POLL` seconds the engine reads the control entries:
stored schedules (handed to :mod:`.stored`), backfills, run-now and catch-up
requests. A requested slot is claimed like a scheduled one, in one batch per
kind, and its answer acted on in the one place (:class:`.claims.Answers`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import NamedTuple

from ..control import CATCH_UP, DEFINED, FILL, MANUAL, RUN_NOW
from ..errors import Conflict, StoreUnavailable
from ..events import EventKind
from ..roles import ENDED, JobRuntime
from ..schedules import from_ms, to_ms
from ..slots import BACKFILL, Slot
from ..store import Claim, ClaimStatus, JobState
from .claims import Answers, Ask
from .context import Context
from .gateway import describe

log = logging.getLogger(__name__)

#: Seconds between two reads of the store's run-now requests.
CONTROL_POLL = 1.0
#: How many marks of a job's slots run on request (``manual/<job>/<slot ms>``) are kept.
MANUAL_KEPT = 50


class Request(NamedTuple):
    """A run-now or catch-up request of one job's slot, as read from its control entry."""

    slot_ms: int
    key: str
    version: int
    #: The event of a win.
    kind: EventKind


class Fill(NamedTuple):
    """A backfill request of one job: the slots from ``start_ms`` up to ``end_ms``."""

    asked: float
    key: str
    version: int
    start_ms: int
    end_ms: int


class Asked(NamedTuple):
    """A requested slot to claim, and the control entry asking for it."""

    rt: JobRuntime
    slot: Slot
    key: str
    version: int


class Requests:
    """Reads the control entries and claims the slots they ask for.

    ``apply_definitions`` receives the stored schedules' entries (see
    :mod:`.stored`).
    """

    def __init__(
        self,
        ctx: Context,
        answers: Answers,
        apply_definitions: Callable[[dict[str, tuple[int, str]]], None],
    ) -> None:
        self._ctx = ctx
        self._answers = answers
        self._apply_definitions = apply_definitions
        #: When to read the control entries next (monotonic).
        self.poll_at = 0.0
        #: Run-now and catch-up requests read from the store, per job, oldest first.
        self._pending: dict[str, list[Request]] = {}

    # -- reading -------------------------------------------------------------

    def poll(self, now_mono: float) -> None:
        """Every :data:`CONTROL_POLL` seconds: read the stored schedules, backfills and
        run-now requests, and act on them (see :meth:`_run_requested`)."""
        gateway = self._ctx.gateway
        if gateway.controls and now_mono >= self.poll_at:
            self.poll_at = now_mono + CONTROL_POLL
            try:
                entries = gateway.store.controls(DEFINED, RUN_NOW, FILL, CATCH_UP)
            except StoreUnavailable:
                raise
            except Exception as exc:
                gateway.controls = False
                log.warning("anarchon: the store's control entries are unusable: %s", describe(exc))
                return
            defined, requests, fills, catch_ups = (
                {k: v for k, v in entries.items() if k.startswith(prefix)}
                for prefix in (DEFINED, RUN_NOW, FILL, CATCH_UP)
            )
            self._apply_definitions(defined)
            if fills:
                self._backfill(fills)
            self._pending = {}
            for key, (version, value) in requests.items():
                job = key[len(RUN_NOW) :].rpartition("/")[0]
                try:
                    slot_ms = int(json.loads(value)["slot_ms"])
                except (ValueError, KeyError, TypeError):
                    continue
                self._pending.setdefault(job, []).append(
                    Request(slot_ms, key, version, EventKind.MANUAL)
                )
            if catch_ups:
                self._catch_up(catch_ups)
            for pending in self._pending.values():
                pending.sort()
        if self._pending:
            self._run_requested()

    def waits_for_request(self, rt: JobRuntime, slot_ms: int) -> bool:
        """Whether a run-now request of ``rt``'s job is due before ``slot_ms``: that slot waits."""
        pending = self._pending.get(rt.job.name)
        return pending is not None and bool(pending) and pending[0].slot_ms < slot_ms

    def next_at(self) -> list[float]:
        """When each job's oldest request is due (wall-clock seconds)."""
        table = self._ctx.table
        return [
            pending[0].slot_ms / 1000
            for job, pending in self._pending.items()
            if pending and ((rt := table.get(job)) is None or rt.broken is None)
        ]

    # -- run now and catch up ------------------------------------------------

    def _catch_up(self, requests: dict[str, tuple[int, str]]) -> None:
        """Add to the requests the last slot before each job was resumed with
        ``catch_up`` (see :meth:`Control.resume <anarchon_core.Control.resume>`), if
        within its catch-up window.

        Every instance that declares the job works out the same slot, from the
        request's time: the last one missed while paused. The request is made
        while the job is still paused (the resume waits for every instance to
        read it), so that no scheduled slot after it is claimed first.
        """
        ctx = self._ctx
        done: list[tuple[str, int]] = []
        for key, (version, value) in requests.items():
            job = key[len(CATCH_UP) :].rpartition("/")[0]
            rt = ctx.table.get(job)
            if rt is None or rt.removed or not rt.ready or rt.next_slot is None:
                continue
            try:
                resumed = datetime.fromtimestamp(float(json.loads(value)["asked"]), timezone.utc)
            except (ValueError, KeyError, TypeError, OverflowError):
                continue
            latest = rt.slot_at_or_before(resumed)
            if latest is None or rt.next_slot.ms <= latest.ms:
                continue  # its scheduled claim comes first
            if ctx.lateness(latest) > rt.job.catch_up_for(latest.time, rt.next_slot.time):
                done.append((key, version))  # nothing within the window: nothing to run
                continue
            self._pending.setdefault(job, []).append(
                Request(latest.ms, key, version, EventKind.CATCH_UP)
            )
        for key, version in done:
            self._remove(key, version)

    def _run_requested(self) -> None:
        """Claim the slots asked to run now (``run/<job>/<id>``, see :meth:`Control.trigger
        <anarchon_core.Control.trigger>`) or caught up.

        A request names a slot of its own, a little ahead of when it was made
        (:data:`~anarchon_core.control.RUN_NOW_LEAD`), so that every instance
        reads it before that time. It is claimed at its time like any slot,
        by every instance that declares the job, once each has dealt with the
        job's scheduled slots before it; and no instance claims a scheduled
        slot after it until it is answered (scheduled claims wait), so a
        scheduled slot does not supersede it. It is removed once recorded
        (won here, or by another), or superseded by a newer slot (an
        instance that had not read it); it waits while the job's previous run
        holds its lease, or while paused.
        """
        now_ms = int(self._ctx.clock.time() * 1000)
        batches: dict[EventKind, list[Asked]] = {}
        for job, pending in self._pending.items():
            rt = self._ctx.table.get(job)
            if rt is None or not rt.watched or not rt.ready or not pending:
                continue  # another instance's job, not placed yet, or left alone
            slot_ms, key, version, kind = pending[0]
            if slot_ms > now_ms:
                continue  # not its time yet
            if rt.next_slot is not None and rt.next_slot.ms <= slot_ms:
                continue  # this instance's scheduled slots before it come first
            batches.setdefault(kind, []).append(Asked(rt, Slot.from_ms(job, slot_ms), key, version))
        for kind, batch in batches.items():
            for slot, claim in self._ask(batch, kind):
                self._pending[slot.job].pop(0)
                holder = claim.holder
                if claim.won and kind is EventKind.MANUAL:
                    self._mark_manual(slot)
                elif not claim.won and holder is not None and holder.slot_ms != slot.ms:
                    what = "run-now request" if kind is EventKind.MANUAL else "catch-up"
                    self._ctx.emit(EventKind.MISSED, slot=slot, detail=f"{what} superseded")

    def _ask(self, batch: list[Asked], kind: EventKind) -> list[tuple[Slot, Claim]]:
        """Claim the slots ``batch`` asks for; the answered ones, in order.

        A request whose claim failed, or that waits (the job's previous run
        holds its lease, or it is paused), stays to be asked again; any
        other answer removes it (whoever removes it first). A slot won
        begins, reported as ``kind``.
        """
        gateway = self._ctx.gateway
        sent = self._ctx.clock.monotonic()
        claims = gateway.per_job(
            [asked.rt for asked in batch], [(a.rt, a.slot) for a in batch], gateway.claim_slots
        )
        answered = []
        for (rt, slot, key, version), claim in zip(batch, claims, strict=True):
            if isinstance(claim, Exception) or claim.status in (
                ClaimStatus.BUSY,
                ClaimStatus.PAUSED,
            ):
                continue  # asked again at a later step
            answered.append((slot, claim))
            self._remove(key, version)
            self._answers.act(rt, slot, claim, sent, Ask.REQUESTED, kind)
        return answered

    def _mark_manual(self, slot: Slot) -> None:
        """Record ``slot`` among its job's manual slots (the newest :data:`MANUAL_KEPT`)."""
        store, prefix = self._ctx.gateway.store, f"{MANUAL}{slot.job}/"
        try:
            with contextlib.suppress(Conflict):
                store.set_control(f"{prefix}{slot.ms}", "{}", 0)
            marks = store.controls(prefix)
            old = sorted(marks, key=lambda k: int(k.rpartition("/")[2]))[:-MANUAL_KEPT]
            for key in old:
                with contextlib.suppress(Conflict):
                    store.set_control(key, None, marks[key][0])
        except Exception as exc:  # the run goes on; only its manual mark is missing
            log.warning("anarchon: could not mark %s as manual: %s", slot.id, describe(exc))

    def _remove(self, key: str, version: int) -> None:
        """Remove a control entry answered; another instance may have removed it first."""
        with contextlib.suppress(Conflict):
            self._ctx.gateway.store.set_control(key, None, version)

    # -- backfill ------------------------------------------------------------

    def _backfill(self, requests: dict[str, tuple[int, str]]) -> None:
        """Run the slots of each backfill request (``fill/<job>/<id>``), in order, one at a time.

        A job's backfill has a record of its own in the store (the job's name
        and :data:`~anarchon_core.slots.BACKFILL`), so its past slots are
        claimed there, each once across the instances, with their normal slot
        ids, apart from the job's live schedule. The next slot is claimed once
        the previous one ended (done or failed); a run that lapses is taken
        over as any. A job's requests run oldest first; once its range is
        done, the request is removed.
        """
        todo: list[tuple[JobRuntime, Fill]] = []
        for job, fill_request in sorted(_oldest_fills(requests).items()):
            rt = self._ctx.table.get(job)
            if rt is None or rt.removed or not rt.ready:
                continue
            fill = self._ctx.table.backfill_of(rt)
            if fill.runner is None and fill.backup is None:
                todo.append((fill, fill_request))
        if not todo:
            return
        gateway = self._ctx.gateway
        paused = gateway.store.paused()
        records = gateway.per_job([f for f, _ in todo], [f for f, _ in todo], gateway.states)
        batch: list[tuple[JobRuntime, Slot]] = []
        for (fill, fill_request), record in zip(todo, records, strict=True):
            if isinstance(record, Exception):
                continue
            slot = self._next_fill(fill, fill_request, record)
            if slot is not None and not paused.covers(fill.job.name[: -len(BACKFILL)]):
                batch.append((fill, slot))
        if not batch:
            return
        sent = self._ctx.clock.monotonic()
        claims = gateway.per_job([f for f, _ in batch], batch, gateway.claim_slots)
        for (fill, slot), claim in zip(batch, claims, strict=True):
            if not isinstance(claim, Exception):
                self._answers.act(fill, slot, claim, sent, Ask.BACKFILL, EventKind.WON)

    def _next_fill(self, fill: JobRuntime, request: Fill, record: JobState | None) -> Slot | None:
        """The backfill's next slot to claim, after ``record`` (its last one); None while a
        run of it goes on (backed up), or once its range is done (request removed)."""
        going = record is not None and record.state not in ENDED and not record.unpicked
        if going and record is not None and record.slot_ms >= request.start_ms:
            self._answers.back_up(fill, record)  # still going, or lapsed: taken over as any run
            return None
        after = from_ms(request.start_ms - 1)
        if record is not None and request.start_ms <= record.slot_ms < request.end_ms:
            after = from_ms(record.slot_ms)
        next_time = fill.job.schedule.next_after(after)
        if to_ms(next_time) >= request.end_ms:
            self._remove(request.key, request.version)
            log.info(
                "anarchon: backfill of %s done (%s)", fill.job.name[: -len(BACKFILL)], request.key
            )
            return None
        return Slot(fill.job.name, next_time)


def _oldest_fills(requests: dict[str, tuple[int, str]]) -> dict[str, Fill]:
    """Each job's oldest readable backfill request."""
    oldest: dict[str, Fill] = {}
    for key, (version, value) in requests.items():
        job = key[len(FILL) :].rpartition("/")[0]
        try:
            data = json.loads(value)
            request = Fill(
                float(data["asked"]), key, version, int(data["from_ms"]), int(data["to_ms"])
            )
        except (ValueError, KeyError, TypeError):
            continue
        if job not in oldest or request < oldest[job]:
            oldest[job] = request
    return oldest
