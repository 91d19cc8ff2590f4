"""The decision table of a lease store: every step as a pure function, no I/O.

Each function takes the job's record before the step (``None``: no record
yet), the request and the store's ``now``, and answers a :class:`Decision`:
the answer the caller gets, the record after the step, and what the step does
to the job's history. Nothing here reads a clock or a store.

The memory, NATS and MySQL stores apply these functions as they are, inside
their own atomic step (a lock, a compare-and-set, a transaction holding the
rows' locks). The Redis script and the SQL
statements of SQLite, libSQL and PostgreSQL decide on the server, in one
atomic step each; ``tests/stores/test_decisions.py`` checks them against this
table with random sequences of operations, so there is one rule to read:

============  ==============================================  ======================
step          wins (writes) when                              else
============  ==============================================  ======================
claim         no record, or an older slot whose run ended     paused, taken, stale,
              or whose lease lapsed (also a dispatched run    ended, busy (in that
              never picked up); not paused; fewer claims      order; :func:`refusal`)
              won than the request's limit
takeover      the record holds this slot and token, and is    taken
              ``released``, or ``running`` with a lapsed
              lease
renew         the record carries the token and is held        ``False``
              (``running`` or ``dispatched``)
dispatch      as renew                                        ``False``
finish        as renew (``True``, unwritten, when it already  ``False``
release       carries the token with that very end)
============  ==============================================  ======================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from .store import (
    HELD_STATES,
    Change,
    Claim,
    ClaimStatus,
    JobState,
    RunState,
    lost,
    refusal,
)

__all__ = [
    "END_STATES",
    "Decision",
    "Record",
    "change",
    "claim",
    "dispatch",
    "end",
    "finish",
    "lost",
    "refusal",
    "release",
    "renew",
    "takeover",
]

A = TypeVar("A")

#: The states a run ends in by :func:`finish` and :func:`release`.
END_STATES = (RunState.DONE, RunState.FAILED, RunState.RELEASED)


@dataclass(frozen=True)
class Record:
    """A job's current record as a store keeps it; ``lease_until`` is on the store's clock."""

    job: str
    slot_ms: int
    owner: str
    attempt: int
    token: int
    state: RunState
    lease_until: float

    def view(self, now: float) -> JobState:
        """The record as callers see it at ``now``: the lease as seconds left."""
        return JobState(
            self.job,
            self.slot_ms,
            self.owner,
            self.attempt,
            self.token,
            self.state,
            self.lease_until - now,
        )

    @classmethod
    def of(cls, state: JobState, now: float) -> Record:
        """The record behind ``state``, read at ``now``."""
        return cls(
            state.job,
            state.slot_ms,
            state.owner,
            state.attempt,
            state.token,
            state.state,
            now + state.lease_remaining,
        )


@dataclass(frozen=True)
class Decision(Generic[A]):
    """The outcome of one step: the answer, and what to write.

    ``record`` is the record to write, or ``None`` when the step writes
    nothing. ``previous`` is what the attempt open before the step becomes in
    the history (``None``: it stays as it is); a state outside
    :data:`~anarchon_core.store.HELD_STATES` ends it. ``started`` says a new
    attempt begins (the record's), to be added to the history and counted.
    """

    answer: A
    record: Record | None = None
    previous: RunState | None = None
    started: bool = False

    @property
    def written(self) -> bool:
        """Whether the step writes the record."""
        return self.record is not None

    @property
    def ended(self) -> RunState | None:
        """``done`` or ``failed`` when the step finishes a run (to be counted), else ``None``."""
        if self.previous in (RunState.DONE, RunState.FAILED):
            return self.previous
        return None


def first_token(wall: float) -> int:
    """The lowest token a new attempt may carry: the store's wall clock in
    milliseconds (``wall``, Unix seconds).

    An attempt's token is the previous one + 1 or this, whichever is higher
    (:func:`next_token`). A record the store lost (restarted empty, failed over to
    a replica that never got the last writes) is then no reason for a token to
    come again: a job's tokens rise by one per attempt, far more slowly than the
    clock, so every token handed out before the loss is below the clock at the
    next attempt, and a handler fencing with the token still refuses the older
    attempts.
    """
    return max(1, int(wall * 1000))


def next_token(previous: int | None, clock_token: int) -> int:
    """The token of an attempt after ``previous`` (``None``: no record of the job),
    no lower than ``clock_token`` (:func:`first_token` of the store's clock)."""
    return clock_token if previous is None else max(previous + 1, clock_token)


def claim(
    old: Record | None,
    job: str,
    slot_ms: int,
    owner: str,
    lease: float,
    now: float,
    *,
    paused: bool = False,
    limit: int | None = None,
    claims: int = 0,
    clock_token: int = 1,
) -> Decision[Claim]:
    """Claim ``slot_ms`` of ``job`` for ``owner``, the lease ``lease`` seconds from ``now``.

    A won claim is attempt 1 with the next token (:func:`next_token`: the previous
    + 1, or the store's clock in ms, ``clock_token``, if that is higher, so that
    tokens keep rising after a store lost records); the previous attempt, if its
    run still held the slot, is abandoned.
    ``claims`` is the job's count of claims won so far
    (:attr:`~anarchon_core.store.JobStats.claims`): once it reaches ``limit``
    the claim is **ended**, unless it is taken or stale (ended comes before
    busy: a job that ran its limit has no slot left to overlap).
    """
    current = old.view(now) if old is not None else None
    if paused:
        return Decision(Claim(ClaimStatus.PAUSED, current))
    refused = refusal(slot_ms, current)
    if refused is not None and refused.status is not ClaimStatus.BUSY:
        return Decision(refused)
    if limit is not None and claims >= limit:
        return Decision(Claim(ClaimStatus.ENDED, current))
    if refused is not None:
        return Decision(refused)
    token = next_token(old.token if old is not None else None, clock_token)
    new = Record(job, slot_ms, owner, 1, token, RunState.RUNNING, now + lease)
    previous = RunState.ABANDONED if old is not None and old.state in HELD_STATES else None
    return Decision(_won(new, lease), new, previous, started=True)


def takeover(
    old: Record | None,
    job: str,
    slot_ms: int,
    owner: str,
    lease: float,
    seen_token: int,
    now: float,
    *,
    clock_token: int = 1,
) -> Decision[Claim]:
    """Take ``slot_ms`` of ``job`` over from the run carrying ``seen_token``, if it lapsed.

    Won as the next attempt with the next token (:func:`next_token`); a running run
    taken over is lost (a released one stays released).
    """
    if old is None:
        return Decision(Claim(ClaimStatus.TAKEN, None))
    current = old.view(now)
    if (old.slot_ms, old.token) != (slot_ms, seen_token) or not current.lapsed:
        return Decision(Claim(ClaimStatus.TAKEN, current))
    token = next_token(old.token, clock_token)
    new = Record(job, slot_ms, owner, old.attempt + 1, token, RunState.RUNNING, now + lease)
    previous = RunState.LOST if old.state is RunState.RUNNING else None
    return Decision(_won(new, lease), new, previous, started=True)


def _won(new: Record, lease: float) -> Claim:
    """A won claim or takeover: the new record, with all of its ``lease`` left.

    Given as granted rather than as ``lease_until - now``, which float rounding
    could make a hair longer than the lease.
    """
    holder = JobState(
        new.job, new.slot_ms, new.owner, new.attempt, new.token, new.state, float(lease)
    )
    return Claim(ClaimStatus.WON, holder)


def _hold(
    old: Record | None, token: int, state: RunState, lease: float, now: float
) -> Decision[bool]:
    """The held run carrying ``token`` goes to ``state`` (running or dispatched) for ``lease``."""
    if old is None or old.token != token or old.state not in HELD_STATES:
        return Decision(False)
    new = replace(old, state=state, lease_until=now + float(lease))
    return Decision(True, new, state if state is not old.state else None)


def renew(old: Record | None, token: int, lease: float, now: float) -> Decision[bool]:
    """Extend the lease of the held run carrying ``token``; a dispatched one is picked up."""
    return _hold(old, token, RunState.RUNNING, lease, now)


def dispatch(old: Record | None, token: int, pickup: float, now: float) -> Decision[bool]:
    """Hand the held run carrying ``token`` off, for ``pickup`` seconds."""
    return _hold(old, token, RunState.DISPATCHED, pickup, now)


def end(old: Record | None, token: int, state: RunState, now: float) -> Decision[bool]:
    """End the held run carrying ``token`` as ``state`` (done, failed, released) at ``now``.

    The same end re-sent (its reply was lost) answers ``True`` and writes nothing.
    """
    if state not in END_STATES:
        raise ValueError(f"a run ends as done, failed or released, not {state.value}")
    if old is None or old.token != token:
        return Decision(False)
    if old.state is state:
        return Decision(True)
    if old.state not in HELD_STATES:
        return Decision(False)
    return Decision(True, replace(old, state=state, lease_until=now), state)


def finish(old: Record | None, token: int, outcome: RunState, now: float) -> Decision[bool]:
    """End the run carrying ``token`` as ``done`` or ``failed`` (else ``ValueError``)."""
    if outcome not in (RunState.DONE, RunState.FAILED):
        raise ValueError(f"a run finishes as done or failed, not {outcome.value}")
    return end(old, token, outcome, now)


def release(old: Record | None, token: int, now: float) -> Decision[bool]:
    """Hand the run carrying ``token`` over: ``released``, for a backup to take over at once."""
    return end(old, token, RunState.RELEASED, now)


def change(old: Record | None, step: Change, now: float) -> Decision[bool]:
    """The step a :class:`~anarchon_core.store.Change` stands for."""
    if step.state is RunState.RUNNING:
        return renew(old, step.token, step.lease, now)
    if step.state is RunState.DISPATCHED:
        return dispatch(old, step.token, step.lease, now)
    return end(old, step.token, step.state, now)
