"""An in-process store for tests and single-process use.

Every step runs under one lock, which makes it atomic within the process.
Instances in other processes cannot see it: use SQLite or a server store to
share slots between processes.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from .. import decide
from ..clock import Clock, SystemClock
from ..decide import Decision, Record
from ..errors import Conflict
from ..store import (
    HELD_STATES,
    HISTORY,
    NAMESPACE_PAUSE,
    Change,
    Claim,
    ClaimRequest,
    ControlStore,
    InstanceRecord,
    JobState,
    JobStats,
    LeaseStore,
    OnceEntry,
    OnceStore,
    RegistryStore,
    RunRecord,
    RunState,
    TakeoverRequest,
)
from ..urls import url_options

A = TypeVar("A")


class MemoryStore(LeaseStore, RegistryStore, ControlStore, OnceStore):
    """The store contract kept in a dict. ``clock`` plays the server's clock.

    Each step applies the decision of :mod:`anarchon_core.decide` under the lock.
    """

    def __init__(self, *, namespace: str = "default", clock: Clock | None = None) -> None:
        super().__init__(namespace=namespace)
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}
        self._history: dict[str, deque[RunRecord]] = {}
        #: Instance -> (info JSON, announced at, expires at).
        self._registry: dict[str, tuple[str, float, float]] = {}
        #: Pause marks: job names, and NAMESPACE_PAUSE for the whole namespace.
        self._paused: set[str] = set()
        #: Counts per job: runs, takeovers, done, failed, last done, last failed.
        self._counts: dict[str, list[Any]] = {}
        #: Control entries: key -> (version, value).
        self._entries: dict[str, tuple[int, str]] = {}
        self._versions = 0
        #: One-off runs: (due ms, job) -> value, and their keys in order (the index).
        self._once: dict[tuple[int, str], str] = {}
        self._once_order: list[tuple[int, str]] = []

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> MemoryStore:
        """``memory://``: a new, empty store private to this process."""
        url_options(url, "memory", ())
        return cls(namespace=namespace, **options)

    def _apply(self, job: str, decision: Decision[A], now: float) -> A:
        """Write what ``decision`` says (record, history, counts) and give its answer."""
        new = decision.record
        if new is None:
            return decision.answer
        runs = self._history.setdefault(job, deque(maxlen=HISTORY))
        if decision.previous is not None and runs and runs[0].ended_at is None:
            ended = None if decision.previous in HELD_STATES else now
            runs[0] = replace(runs[0], state=decision.previous, ended_at=ended)
        if decision.started:
            self._count(job, 0)
            if new.attempt > 1:
                self._count(job, 1)
            runs.appendleft(
                RunRecord(job, new.slot_ms, new.attempt, new.token, new.owner, new.state, now, None)
            )
        if decision.ended is RunState.DONE:
            self._count(job, 2, now)
        elif decision.ended is RunState.FAILED:
            self._count(job, 3, now)
        self._records[job] = new
        return decision.answer

    def _count(self, job: str, field: int, at: float | None = None) -> None:
        counts = self._counts.setdefault(job, [0, 0, 0, 0, None, None])
        counts[field] += 1
        if at is not None:
            counts[field + 2] = at

    def stats(self, jobs: Iterable[str]) -> dict[str, JobStats]:
        with self._lock:
            return {job: JobStats(job, *self._counts[job]) for job in jobs if job in self._counts}

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        with self._lock:
            now = self._clock.time()
            claims = []
            for r in requests:
                paused = bool(self._paused & {r.job, NAMESPACE_PAUSE})
                old = self._records.get(r.job)
                counts = self._counts.get(r.job, [0, 0])
                step = decide.claim(
                    old,
                    r.job,
                    r.slot_ms,
                    owner,
                    r.lease,
                    now,
                    paused=paused,
                    limit=r.limit,
                    claims=counts[0] - counts[1],
                    clock_token=decide.first_token(now),
                )
                claims.append(self._apply(r.job, step, now))
            return claims

    def _set_pause(self, key: str, on: bool) -> bool:
        with self._lock:
            changed = (key in self._paused) != on
            if on:
                self._paused.add(key)
            else:
                self._paused.discard(key)
            return changed

    def _pause_marks(self) -> set[str]:
        with self._lock:
            return set(self._paused)

    def _controls(self, prefixes: tuple[str, ...]) -> dict[str, tuple[int, str]]:
        with self._lock:
            return {k: v for k, v in self._entries.items() if k.startswith(prefixes)}

    def _set_control(self, key: str, value: str | None, expected: int) -> int:
        with self._lock:
            found = self._entries.get(key, (0, ""))[0]
            if found != expected:
                raise Conflict(key, expected, found)
            if value is None:
                self._entries.pop(key, None)
                return 0
            self._versions += 1
            self._entries[key] = (self._versions, value)
            return self._versions

    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        with self._lock:
            now = self._clock.time()
            return [
                self._apply(
                    r.job,
                    decide.takeover(
                        self._records.get(r.job),
                        r.job,
                        r.slot_ms,
                        owner,
                        r.lease,
                        r.seen_token,
                        now,
                        clock_token=decide.first_token(now),
                    ),
                    now,
                )
                for r in requests
            ]

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        with self._lock:
            now = self._clock.time()
            return [
                self._apply(c.job, decide.change(self._records.get(c.job), c, now), now)
                for c in changes
            ]

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        with self._lock:
            now = self._clock.time()
            return {
                job: rec.view(now) for job in jobs if (rec := self._records.get(job)) is not None
            }

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        with self._lock:
            return list(self._history.get(job, ()))[:limit]

    def jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    def namespaces(self) -> list[str]:
        """This store's namespace once it holds a record: a memory store is one namespace's
        (another namespace is another store, of its own)."""
        with self._lock:
            return [self.namespace] if self._records else []

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        with self._lock:
            now = self._clock.time()
            self._registry[instance] = (info, now, now + ttl)
            return self._live(now)

    def withdraw(self, instance: str) -> None:
        with self._lock:
            self._registry.pop(instance, None)

    def instances(self) -> list[InstanceRecord]:
        with self._lock:
            return self._live(self._clock.time())

    def _live(self, now: float) -> list[InstanceRecord]:
        for name in [n for n, (_, _, until) in self._registry.items() if until <= now]:
            del self._registry[name]
        return [
            self._instance_record((name, info, now - seen, until - now))
            for name, (info, seen, until) in sorted(self._registry.items())
        ]

    # -- one-off runs: a sorted list of (due ms, job) beside a dict of values ----------

    def _add_once(self, entries: list[OnceEntry]) -> None:
        with self._lock:
            for entry in entries:
                if entry.key not in self._once:
                    bisect.insort(self._once_order, entry.key)
                self._once[entry.key] = entry.value

    def _once_due(
        self, until_ms: int, limit: int, after: tuple[int, str] | None
    ) -> list[OnceEntry]:
        with self._lock:
            order = self._once_order
            start = 0 if after is None else bisect.bisect_right(order, after)
            end = bisect.bisect_left(order, (until_ms + 1, ""), lo=start)
            keys = order[start : min(end, start + limit)]
            return [OnceEntry(*key, self._once[key]) for key in keys]

    def _remove_once(self, job: str, due_ms: int) -> bool:
        with self._lock:
            if self._once.pop((due_ms, job), None) is None:
                return False
            del self._once_order[bisect.bisect_left(self._once_order, (due_ms, job))]
            return True

    def _pending_once(self, job: str | None, limit: int) -> list[OnceEntry]:
        with self._lock:
            keys = [key for key in self._once_order if job is None or key[1] == job][:limit]
            return [OnceEntry(*key, self._once[key]) for key in keys]
