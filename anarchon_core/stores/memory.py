"""An in-process store for tests and single-process use.

Every step runs under one lock, which makes it atomic within the process.
Instances in other processes cannot see it: use SQLite or a server store to
share slots between processes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..clock import Clock, SystemClock
from ..errors import Conflict
from ..store import (
    HELD_STATES,
    HISTORY,
    NAMESPACE_PAUSE,
    Claim,
    ClaimStatus,
    InstanceRecord,
    JobState,
    JobStats,
    RunRecord,
    RunState,
    Store,
)
from ..urls import url_options


@dataclass
class _Record:
    slot_ms: int
    owner: str
    attempt: int
    token: int
    state: RunState
    lease_until: float


class MemoryStore(Store):
    """The store contract kept in a dict. ``clock`` plays the server's clock."""

    def __init__(self, *, namespace: str = "default", clock: Clock | None = None) -> None:
        super().__init__(namespace=namespace)
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._records: dict[str, _Record] = {}
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

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> MemoryStore:
        """``memory://``: a new, empty store private to this process."""
        url_options(url, "memory", ())
        return cls(namespace=namespace, **options)

    def _state(self, job: str, rec: _Record, now: float) -> JobState:
        return JobState(
            job, rec.slot_ms, rec.owner, rec.attempt, rec.token, rec.state, rec.lease_until - now
        )

    def _end_current(self, job: str, state: RunState, now: float) -> None:
        runs = self._history.get(job)
        if runs and runs[0].ended_at is None:
            runs[0] = replace(runs[0], state=state, ended_at=now)

    def _count(self, job: str, field: int, at: float | None = None) -> None:
        counts = self._counts.setdefault(job, [0, 0, 0, 0, None, None])
        counts[field] += 1
        if at is not None:
            counts[field + 2] = at

    def stats(self, jobs: Iterable[str]) -> dict[str, JobStats]:
        with self._lock:
            return {job: JobStats(job, *self._counts[job]) for job in jobs if job in self._counts}

    def _start(self, job: str, rec: _Record, now: float) -> None:
        self._count(job, 0)
        if rec.attempt > 1:
            self._count(job, 1)
        runs = self._history.setdefault(job, deque(maxlen=HISTORY))
        runs.appendleft(
            RunRecord(job, rec.slot_ms, rec.attempt, rec.token, rec.owner, rec.state, now, None)
        )

    def claim(self, job: str, slot_ms: int, owner: str, lease: float) -> Claim:
        with self._lock:
            now = self._clock.time()
            rec = self._records.get(job)
            if self._paused & {job, NAMESPACE_PAUSE}:
                return Claim(ClaimStatus.PAUSED, self._state(job, rec, now) if rec else None)
            if rec is not None:
                refusal = self._refusal(slot_ms, self._state(job, rec, now))
                if refusal is not None:
                    return refusal
                if rec.state not in (RunState.DONE, RunState.FAILED):
                    self._end_current(job, RunState.ABANDONED, now)
            token = rec.token + 1 if rec else 1
            rec = _Record(slot_ms, owner, 1, token, RunState.RUNNING, now + lease)
            self._records[job] = rec
            self._start(job, rec, now)
            return Claim(ClaimStatus.WON, self._state(job, rec, now))

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

    def takeover(self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int) -> Claim:
        with self._lock:
            now = self._clock.time()
            rec = self._records.get(job)
            if rec is None:
                return Claim(ClaimStatus.TAKEN, None)
            current = self._state(job, rec, now)
            if rec.slot_ms != slot_ms or rec.token != seen_token or not current.lapsed:
                return Claim(ClaimStatus.TAKEN, current)
            if rec.state is RunState.RUNNING:
                self._end_current(job, RunState.LOST, now)
            rec = _Record(
                slot_ms, owner, rec.attempt + 1, rec.token + 1, RunState.RUNNING, now + lease
            )
            self._records[job] = rec
            self._start(job, rec, now)
            return Claim(ClaimStatus.WON, self._state(job, rec, now))

    def _held(self, job: str, token: int) -> _Record | None:
        """The record of ``job`` if it carries ``token`` and holds the lease."""
        rec = self._records.get(job)
        if rec is None or rec.token != token or rec.state not in HELD_STATES:
            return None
        return rec

    def renew(self, job: str, token: int, lease: float) -> bool:
        return self._hold(job, token, RunState.RUNNING, lease)

    def dispatch(self, job: str, token: int, pickup: float) -> bool:
        return self._hold(job, token, RunState.DISPATCHED, pickup)

    def _hold(self, job: str, token: int, state: RunState, lease: float) -> bool:
        with self._lock:
            rec = self._held(job, token)
            if rec is None:
                return False
            rec.state, rec.lease_until = state, self._clock.time() + float(lease)
            runs = self._history.get(job)
            if runs and runs[0].token == token and runs[0].ended_at is None:
                runs[0] = replace(runs[0], state=state)
            return True

    def _end(self, job: str, token: int, state: RunState) -> bool:
        with self._lock:
            current = self._records.get(job)
            if current is not None and current.token == token and current.state is state:
                return True  # the same end, re-sent after its reply was lost
            rec = self._held(job, token)
            if rec is None:
                return False
            now = self._clock.time()
            rec.state, rec.lease_until = state, now
            self._end_current(job, state, now)
            if state is RunState.DONE:
                self._count(job, 2, now)
            elif state is RunState.FAILED:
                self._count(job, 3, now)
            return True

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        with self._lock:
            now = self._clock.time()
            return {
                job: self._state(job, rec, now)
                for job in jobs
                if (rec := self._records.get(job)) is not None
            }

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        with self._lock:
            return list(self._history.get(job, ()))[:limit]

    def jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    keeps_registry = True

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
