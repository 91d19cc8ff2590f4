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

from ..control import CATCH_UP, DEFINED, FILL, MANUAL, RUN_NOW, RUN_NOW_LEAD
from ..errors import Conflict, StoreUnavailable
from ..events import EventKind
from ..once import entry_value
from ..roles import ENDED, JobRuntime
from ..schedules import from_ms, to_ms
from ..slots import BACKFILL, Slot
from ..store import Claim, ClaimStatus, JobState, OnceEntry, OnceStore
from .claims import CANCEL, Answers, Ask
from .context import Context
from .gateway import describe

log = logging.getLogger(__name__)

#: Seconds between two reads of the store's run-now requests.
CONTROL_POLL = 1.0
#: How many marks of a job's slots run on request (``manual/<job>/<slot ms>``) are kept.
MANUAL_KEPT = 50
#: Seconds ahead of now that the one-offs are read: every instance knows of one before its
#: time, so that none claims a scheduled slot after it first.
ONCE_LOOKAHEAD = RUN_NOW_LEAD
#: The most one-off entries one poll reads (one read of the store's index).
ONCE_PAGE = 500
#: What a request is, by the event of its win (a one-off's is computed when won).
_WHAT = {EventKind.MANUAL: "run-now request", EventKind.CATCH_UP: "catch-up"}


class Request(NamedTuple):
    """A run-now or catch-up request of one job's slot, as read from its control entry."""

    slot_ms: int
    key: str
    version: int
    #: The event of a win.
    kind: EventKind
    #: A one-off (a store entry of its own, not a control entry; its win is reported
    #: as a scheduled slot's: on time, or a catch-up).
    once: bool = False


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
        #: One-offs (see :meth:`_poll_once`): those read of the jobs declared here, the
        #: read's cursor, those declared here to write, and whether the store keeps them.
        self._once_known: dict[tuple[int, str], Request] = {}
        self._once_after: tuple[int, str] | None = None
        self._once_new: dict[tuple[int, str], OnceEntry] = {}
        self._once_on = isinstance(ctx.gateway.store, OnceStore)

    # -- reading -------------------------------------------------------------

    def poll(self, now_mono: float) -> None:
        """Every :data:`CONTROL_POLL` seconds: read the stored schedules, backfills and
        run-now requests, and act on them (see :meth:`_run_requested`)."""
        gateway = self._ctx.gateway
        if gateway.controls and now_mono >= self.poll_at:
            self.poll_at = now_mono + CONTROL_POLL
            try:
                entries = gateway.store.controls(DEFINED, RUN_NOW, FILL, CATCH_UP, CANCEL)
            except StoreUnavailable:
                raise
            except Exception as exc:
                gateway.controls = False
                log.warning("anarchon: the store's control entries are unusable: %s", describe(exc))
                return
            defined, requests, fills, catch_ups, cancels = (
                {k: v for k, v in entries.items() if k.startswith(prefix)}
                for prefix in (DEFINED, RUN_NOW, FILL, CATCH_UP, CANCEL)
            )
            if cancels:
                self._cancel(cancels)
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
            if self._once_on:
                self._poll_once()
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
            slot_ms, key, version, kind, once = pending[0]
            if slot_ms > now_ms:
                continue  # not its time yet
            if rt.next_slot is not None and rt.next_slot.ms <= slot_ms:
                continue  # this instance's scheduled slots before it come first
            if rt.waiting and rt.waiting[0].ms < slot_ms:
                continue  # so do the slots waiting for the job's previous run (overlap)
            if once and self._once_too_late(rt, Slot.from_ms(job, slot_ms)):
                continue
            batches.setdefault(kind, []).append(Asked(rt, Slot.from_ms(job, slot_ms), key, version))
        for kind, batch in batches.items():
            for slot, claim in self._ask(batch, kind):
                self._pending[slot.job].pop(0)
                holder = claim.holder
                if claim.won and kind is EventKind.MANUAL:
                    self._mark_manual(slot)
                elif claim.status is not ClaimStatus.ENDED and (  # ended: reported as such
                    not claim.won and holder is not None and holder.slot_ms != slot.ms
                ):
                    what = _WHAT.get(kind, "one-off")
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
        # A job with overlap="allow_all" claims each slot in its lane's record.
        runs_in = [self._ctx.table.runs_in(a.rt, a.slot) for a in batch]
        claims = gateway.per_job([rt for rt, _ in runs_in], runs_in, gateway.claim_slots)
        answered = []
        for (_, slot, key, version), (rt, run_slot), claim in zip(
            batch, runs_in, claims, strict=True
        ):
            if isinstance(claim, Exception) or claim.status in (
                ClaimStatus.BUSY,
                ClaimStatus.PAUSED,
            ):
                continue  # asked again at a later step
            answered.append((slot, claim))
            if key:
                self._remove(key, version)
                self._answers.act(rt, run_slot, claim, sent, Ask.REQUESTED, kind)
            else:  # a one-off: its entry goes, its win is reported as a slot's
                self._remove_once(slot)
                self._answers.act(rt, run_slot, claim, sent, Ask.REQUESTED, None, "one-off")
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

    # -- stopping runs (overlap="cancel_other") ------------------------------

    def _cancel(self, entries: dict[str, tuple[int, str]]) -> None:
        """Tell the runs held here that a newer slot of their job waits (``cancel/<job>/<token>``,
        written by whichever instance queued that slot, see
        :meth:`Answers.ask_cancel <.claims.Answers.ask_cancel>`): ``run.cancelled`` turns
        true, and the entry is removed. An entry whose run no longer holds the job's
        record (it ended, lapsed, or was superseded) is removed by any instance."""
        unheld: dict[str, list[tuple[str, int, int]]] = {}
        for key, (version, value) in entries.items():
            job, _, token_text = key[len(CANCEL) :].rpartition("/")
            try:
                token = int(token_text)
                waits = Slot.from_ms(job, int(json.loads(value)["waits"])).id
            except (ValueError, KeyError, TypeError, OverflowError):
                self._remove(key, version)  # not one anarchon wrote: nothing to tell
                continue
            rt = self._ctx.table.get(job)
            runner = rt.runner if rt is not None else None
            if runner is not None and runner.run.token == token:
                reason = f"{waits} waits for it to end (overlap=cancel_other)"
                if runner.run.cancel(reason):
                    log.info("anarchon: %s asked to stop: %s", runner.run.slot_id, reason)
                self._remove(key, version)
            else:
                unheld.setdefault(job, []).append((key, version, token))
        if not unheld:
            return
        try:
            records = self._ctx.gateway.store.states(list(unheld))
        except StoreUnavailable:
            raise
        except Exception as exc:  # read again at the next poll
            log.warning("anarchon: could not read the runs asked to stop: %s", describe(exc))
            return
        for job, asked in unheld.items():
            record = records.get(job)
            for key, version, token in asked:
                if record is None or record.token != token or not record.held:
                    self._remove(key, version)

    # -- one-offs ------------------------------------------------------------

    def declare_once(self, job: str, due_ms: int) -> None:
        """A one-off of ``job`` declared here (``Scheduler.once``): its store entry is
        written at the next poll (no store call from a declaration), unless the job's
        record shows it ran, or it is past its catch-up window already."""
        self._once_new[(due_ms, job)] = OnceEntry(
            due_ms, job, entry_value(self._ctx.instance, self._ctx.clock.time())
        )

    def _poll_once(self) -> None:
        """Write the one-offs declared here, then read the entries due (up to
        :data:`ONCE_LOOKAHEAD` ahead) and add those of the jobs declared here to the
        pending requests.

        One read of the store's index per poll: the oldest :data:`ONCE_PAGE` entries
        due. When more are due than a page holds, the next poll reads the page after
        this one (and so on, starting over after the last), so that entries of jobs
        declared only by other instances never keep this instance's from being read.
        Those are left to the instances that declare them. An entry read before and
        missing from a read that covers its place was settled by another instance.
        """
        store = self._ctx.gateway.store
        assert isinstance(store, OnceStore)
        try:
            if self._once_new:
                self._write_declared(store)
            now_ms = int(self._ctx.clock.time() * 1000)
            after = self._once_after
            page = store.once_due(now_ms + int(ONCE_LOOKAHEAD * 1000), ONCE_PAGE, after)
        except StoreUnavailable:
            raise
        except Exception as exc:
            self._once_on = False
            log.warning("anarchon: the store's one-off runs are unusable: %s", describe(exc))
            return
        full = len(page) == ONCE_PAGE
        self._once_after = page[-1].key if full else None
        last = page[-1].key if full else None
        read = {entry.key for entry in page}
        for key in list(self._once_known):
            covered = (after is None or key > after) and (last is None or key <= last)
            if covered and key not in read:
                del self._once_known[key]  # settled (or removed) elsewhere
        table = self._ctx.table
        for entry in page:
            if entry.key not in self._once_known:
                self._once_known[entry.key] = Request(entry.due_ms, "", 0, EventKind.WON, True)
        for key, request in list(self._once_known.items()):
            rt = table.get(key[1])
            if rt is None or rt.removed:
                del self._once_known[key]  # another instance's job: left to those that declare it
            else:
                self._pending.setdefault(key[1], []).append(request)

    def _write_declared(self, store: OnceStore) -> None:
        """Write the entries of the one-offs declared here, but those the job's record
        shows ran (its slot is theirs or newer) and those past their catch-up window."""
        table, now = self._ctx.table, self._ctx.clock.time()
        new = [e for e in self._once_new.values() if (rt := table.get(e.job)) and rt.watched]
        records = store.states({entry.job for entry in new})
        written = []
        for entry in new:
            record = records.get(entry.job)
            rt = table.get(entry.job)
            assert rt is not None
            slot = Slot.from_ms(entry.job, entry.due_ms)
            if record is not None and record.slot_ms >= entry.due_ms:
                continue  # it ran (or a newer slot superseded it): the record is the proof
            if now - entry.due_ms / 1000 > rt.job.catch_up_for(slot.time):
                log.info("anarchon: one-off %s is past its catch-up window: not run", slot.id)
                continue
            written.append(entry)
        store.add_once(written)
        self._once_new = {}

    def _once_too_late(self, rt: JobRuntime, slot: Slot) -> bool:
        """Whether the one-off ``slot``, due, is past its job's catch-up window: then it
        is reported missed and its entry removed."""
        lateness = self._ctx.lateness(slot)
        if lateness <= rt.job.catch_up_for(slot.time):
            return False
        self._ctx.emit(
            EventKind.MISSED, slot=slot, detail=f"one-off {lateness:.0f}s late: past its catch-up"
        )
        self._remove_once(slot)
        self._pending[slot.job].pop(0)
        return True

    def _remove_once(self, slot: Slot) -> None:
        """Remove a one-off's entry, settled; another instance may have removed it first."""
        self._once_known.pop((slot.ms, slot.job), None)
        store = self._ctx.gateway.store
        assert isinstance(store, OnceStore)
        try:
            store.remove_once(slot.job, slot.ms)
        except Exception as exc:  # read again at the next poll, and settled then
            log.warning("anarchon: could not remove the one-off %s: %s", slot.id, describe(exc))

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
