"""Jobs ordered by when something is next due for them, so that a step's cost
does not grow with the jobs that are not due.

:class:`DueIndex` keeps, per time, the jobs due then (in the order they were
scheduled), and a heap of the distinct times, with lazy deletion: each job
has at most one live entry, the earliest time it was scheduled at. A job
whose time moved later keeps its entry until it comes up, and is then put
back at its current time; a job whose time moved earlier gets a new entry.
Jobs on one grid share their times, so that the jobs of a tick come up
together, in one pop of the heap, whatever their number. The engine keeps
one index of claims (wall-clock times) and one of backup checks (monotonic
times); each entry asks the engine, when it comes up, for the job's current
time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .roles import JobRuntime


class DueIndex:
    """Job names by the time something is next due for them."""

    __slots__ = ("_at", "_live", "_times")

    def __init__(self) -> None:
        #: The distinct times of the entries, a heap.
        self._times: list[float] = []
        #: The jobs of each time's entries, in the order they were scheduled.
        self._at: dict[float, list[str]] = {}
        #: The time of each job's live entry.
        self._live: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._live)

    def schedule(self, job: str, at: float | None) -> None:
        """Make sure ``job`` comes up by ``at`` (``None``: nothing due for it)."""
        if at is None:
            return  # an entry it may have is dropped when it comes up
        live = self._live.get(job)
        if live is None or at < live:
            self._live[job] = at
            jobs = self._at.get(at)
            if jobs is None:
                self._at[at] = [job]
                heapq.heappush(self._times, at)
            else:
                jobs.append(job)

    def pop_due(self, now: float, current: Callable[[str], float | None]) -> list[str]:
        """The jobs due at ``now``, in the order of their times, taken out of the index.

        ``current(job)`` is the job's time now, or ``None`` if nothing is due
        for it any more; a job found later than its entry is put back at its
        time. The caller schedules the jobs it was given again once it dealt
        with them.
        """
        times, by_time, live, due = self._times, self._at, self._live, []
        while times and times[0] <= now:
            at = heapq.heappop(times)
            for job in by_time.pop(at):
                if live.get(job) != at:
                    continue  # superseded by an earlier entry of the same job, or done
                del live[job]
                actual = current(job)
                if actual is None:
                    continue
                if actual > now:
                    self.schedule(job, actual)
                else:
                    due.append(job)
        return due

    def next_at(self) -> float | None:
        """The earliest time in the index (a job may turn out later then), or ``None``."""
        times, by_time, live = self._times, self._at, self._live
        while times:
            at = times[0]
            jobs = by_time[at]
            if live.get(jobs[0]) == at:
                return at
            jobs[:] = [job for job in jobs if live.get(job) == at]
            if jobs:
                return at
            heapq.heappop(times)
            del by_time[at]
        return None


class Agenda:
    """What is due for one scheduler's jobs: claims, backup checks, and the runs it holds.

    The jobs' runtimes tell it of every change (it is their
    :class:`~anarchon_core.roles.Watcher`), so that a step looks only at what
    is due.
    """

    __slots__ = ("checks", "claims", "held")

    def __init__(self) -> None:
        #: Claims, by wall-clock time (``JobRuntime.claim_at``).
        self.claims = DueIndex()
        #: Backup checks, by monotonic time (``Backup.next_check``).
        self.checks = DueIndex()
        #: The jobs whose run this instance holds, in the order they were won.
        self.held: dict[str, JobRuntime] = {}

    def claim_moved(self, rt: JobRuntime) -> None:
        if rt.next_slot is not None:
            self.claims.schedule(rt.job.name, rt.claim_at)

    def backup_moved(self, rt: JobRuntime) -> None:
        if rt.backup is not None:
            self.checks.schedule(rt.job.name, rt.backup.next_check)

    def runner_moved(self, rt: JobRuntime) -> None:
        name = rt.job.name
        if rt.runner is not None:
            self.held[name] = rt
        elif self.held.get(name) is rt:
            del self.held[name]
