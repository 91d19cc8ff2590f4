"""The jobs declared here, and what this instance knows of each, behind the engine's only lock.

The table is the one owner of the jobs' runtimes: declaring, removing and
looking them up, and taking what is due off the agenda, all happen under its
lock, so that a job removed from another thread (``remove_job``) while a
step runs is either still there for the whole lookup or already gone. The
runtimes' own fields are the step's to change (see :mod:`anarchon_core.roles`).
"""

from __future__ import annotations

import itertools
import threading

from ..due import Agenda
from ..errors import ConfigurationError
from ..jobs import Job
from ..roles import JobRuntime
from ..slots import BACKFILL, LANES, Slot, is_own_record, lane_of, lane_record, lane_records


class JobTable:
    """Each job's :class:`~anarchon_core.roles.JobRuntime` by name, and its agenda."""

    def __init__(self) -> None:
        #: The only lock of the engine's job state; re-entrant (a listener may declare).
        self.lock = threading.RLock()
        self._runtimes: dict[str, JobRuntime] = {}
        #: Jobs declared and not yet placed on their schedule.
        self._unplaced: dict[str, JobRuntime] = {}
        #: What is due for the jobs, so that a step looks at those alone.
        self.agenda = Agenda()
        self._seq = itertools.count()
        #: Per lane's runtime (``overlap="allow_all"``), the job its own was made from.
        self._lane_of: dict[str, Job] = {}
        #: Counts the declarations and removals: what is worked out from the jobs
        #: declared (their number, the registry's copy) is kept until it moves.
        self.version = 0
        self._count: tuple[int, int] = (-1, 0)

    def add(self, job: Job) -> JobRuntime:
        """Declare ``job``; a job of that name removed while its last run goes on comes back."""
        with self.lock:
            existing = self._runtimes.get(job.name)
            if existing is None:
                rt = self._runtimes[job.name] = JobRuntime(job, self.agenda, next(self._seq))
            elif not existing.removed:
                raise ConfigurationError(f"duplicate job name {job.name!r}")
            else:
                # Removed while its last run goes on: that run keeps its lease under
                # the new declaration, which schedules the slots after it.
                rt = existing
                rt.job, rt.removed, rt.ready, rt.broken = job, False, False, None
                rt.keep_watching = False
            self._unplaced[job.name] = rt
            self.version += 1
            return rt

    def remove(self, name: str, keep_watching: bool = False, now: float = 0.0) -> None:
        """Stop scheduling ``name`` (KeyError if unknown); a run going on keeps it until it ends.

        ``keep_watching``: the slot due at ``now`` (its claim not sent yet, or
        deferred for another instance) is still claimed, and the runs of the job
        that another instance holds are still backed up, to their end (taken
        over if they lapse); the job goes once nothing of it is left.
        Its lanes (``overlap="allow_all"``) go with it, each once its run ended."""
        with self.lock:
            rt = self._runtimes[name]
            self.version += 1
            lanes = [self._runtimes.get(lane) for lane in lane_records(name)]
            for each in [rt, *lanes]:
                if each is None:
                    continue
                each.removed, each.keep_watching = True, keep_watching
                slot = each.next_slot
                if not (keep_watching and slot is not None and slot.time.timestamp() <= now):
                    each.next_slot = None
                self._unplaced.pop(each.job.name, None)
                self._drop(each)

    def forget(self, rt: JobRuntime) -> None:
        """Drop a removed job once nothing of it is left: no run held here, and, if it
        keeps watching, no run backed up and no slot left to claim."""
        with self.lock:
            if rt.removed:
                self._drop(rt)

    def _drop(self, rt: JobRuntime) -> None:
        """(Lock held.) A removed job that does not keep watching watches nothing more."""
        if not rt.keep_watching:
            rt.next_slot = rt.backup = None
        if rt.runner is not None or rt.backup is not None or rt.next_slot is not None:
            return
        if self._runtimes.get(rt.job.name) is rt:
            del self._runtimes[rt.job.name]
            self._lane_of.pop(rt.job.name, None)
            self.version += 1

    def get(self, name: str) -> JobRuntime | None:
        with self.lock:
            return self._runtimes.get(name)

    def __contains__(self, name: str) -> bool:
        with self.lock:
            return name in self._runtimes

    def __len__(self) -> int:
        """How many jobs are declared (or removed with a run going on): their
        backfills' and lanes' records left out."""
        with self.lock:
            version, count = self._count
            if version != self.version:
                count = sum(1 for name in self._runtimes if is_own_record(name))
                self._count = (self.version, count)
            return count

    def runtimes(self) -> list[JobRuntime]:
        """Every job's runtime, removed ones with a run going on included."""
        with self.lock:
            return list(self._runtimes.values())

    def jobs(self) -> dict[str, Job]:
        """The jobs declared, by name (backfills left out)."""
        with self.lock:
            return {name: rt.job for name, rt in self._runtimes.items() if is_own_record(name)}

    def held(self) -> list[JobRuntime]:
        """The jobs whose run this instance holds, in the order they were won."""
        with self.lock:
            return list(self.agenda.held.values())

    def unplaced(self) -> list[JobRuntime]:
        """The jobs declared and not placed on their schedule yet."""
        with self.lock:
            return [rt for rt in self._unplaced.values() if not rt.ready and not rt.removed]

    def placed(self, rt: JobRuntime) -> None:
        """``rt`` is placed on its schedule."""
        with self.lock:
            rt.ready = True
            if self._unplaced.get(rt.job.name) is rt:
                del self._unplaced[rt.job.name]

    def runs_in(self, rt: JobRuntime, slot: Slot) -> tuple[JobRuntime, Slot]:
        """The runtime whose record ``slot`` of ``rt`` is claimed in, and the slot as that
        record names it: ``rt`` itself, or, for a job with ``overlap="allow_all"``, the
        runtime of the slot's lane (:func:`~anarchon_core.slots.lane_of`)."""
        job = rt.job
        if not job.has_lanes:
            return rt, slot
        lane = self.lane(rt, lane_of(slot.ms, job.lane_ms, LANES))
        return lane, Slot(lane.job.name, slot.time)

    def lanes(self, rt: JobRuntime) -> list[JobRuntime]:
        """The runtimes of the lanes of ``rt``'s job, in lane order (``overlap="allow_all"``;
        none for another job)."""
        return [self.lane(rt, i) for i in range(LANES)] if rt.job.has_lanes else []

    def lane(self, rt: JobRuntime, lane: int) -> JobRuntime:
        """The runtime of lane ``lane`` of ``rt``'s job: a record of its own, made on first
        use, with the job as it is now (made again only once the job was declared anew)."""
        with self.lock:
            name = lane_record(rt.job.name, lane)
            runtime = self._runtimes.get(name)
            if runtime is None:
                runtime = self._runtimes[name] = JobRuntime(
                    rt.job.lane(lane), self.agenda, next(self._seq)
                )
                runtime.ready = True
            elif self._lane_of.get(name) is not rt.job:
                runtime.job = rt.job.lane(lane)  # the job's handler and options as they are now
            runtime.removed = False
            self._lane_of[name] = rt.job
            return runtime

    def backfill_of(self, rt: JobRuntime) -> JobRuntime:
        """The runtime of ``rt``'s backfill: a record of its own, with the job as it is now."""
        with self.lock:
            name = rt.job.name + BACKFILL
            fill = self._runtimes.get(name)
            if fill is None:
                fill = self._runtimes[name] = JobRuntime(
                    rt.job.backfill(), self.agenda, next(self._seq)
                )
                fill.ready = True
            else:
                fill.job = rt.job.backfill()  # the job's handler and options as they are now
            return fill

    def claims_due(self, now: float) -> list[JobRuntime]:
        """The jobs whose claim is due at ``now``, taken out of the agenda, in declaration order."""
        with self.lock:
            runtimes = self._runtimes

            def claim_at(name: str) -> float | None:
                rt = runtimes.get(name)
                if rt is None or rt.next_slot is None or (rt.removed and not rt.keep_watching):
                    return None
                return rt.claim_at

            names = self.agenda.claims.pop_due(now, claim_at)
            due = [rt for name in names if (rt := runtimes.get(name)) is not None]
        due.sort(key=lambda rt: rt.seq)
        return due

    def checks_due(self, now_mono: float) -> list[JobRuntime]:
        """The jobs whose backup check is due at ``now_mono``, taken out of the agenda."""
        with self.lock:
            runtimes = self._runtimes

            def next_check(name: str) -> float | None:
                rt = runtimes.get(name)
                return None if rt is None or rt.backup is None else rt.backup.next_check

            names = self.agenda.checks.pop_due(now_mono, next_check)
            return [rt for name in names if (rt := runtimes.get(name)) is not None]

    def claims_moved(self, due: list[JobRuntime]) -> None:
        """Put the claims taken out of the agenda back in, at their time now."""
        with self.lock:
            for rt in due:
                self.agenda.claim_moved(rt)

    def checks_moved(self, checked: list[JobRuntime]) -> None:
        """Put the backup checks taken out of the agenda back in, at their time now."""
        with self.lock:
            for rt in checked:
                self.agenda.backup_moved(rt)
