"""The store contract: the few atomic steps the engine asks of a shared store.

A store keeps, per job of a namespace, one record of the job's current slot::

    (job, slot, owner, attempt, token, state, lease end)

and a short history of runs. The engine changes that record only through the
steps below. Each step is **one atomic operation on the server** (a Lua
script, one SQL statement or transaction, one compare-and-set): never a read
in Python followed by a write. Lease expiry is judged by the store's own
clock, so instances whose clocks disagree cannot take a live lease early
(NATS gives clients no clock: its store judges by the observer's monotonic
clock instead, see :mod:`anarchon_core.stores.nats`).

``claim(job, slot, owner, lease)``
    Record that ``owner`` runs ``slot``, unless someone already does.

    - no record yet, or the record holds an older slot that is finished
      (``done``/``failed``), handed over (``released``) or whose lease has
      lapsed: **won**. ``attempt`` is 1, ``token`` is the previous token + 1.
      A previous run left ``running`` (its lease lapsed) is recorded in the
      history as ``abandoned``: a newer slot supersedes it, it is not retried
      (a ``released`` one stays ``released``);
    - the record holds an older slot whose lease is live: **busy** (the
      previous run is still going; this slot is skipped, "overlap");
    - the record holds this very slot: **taken**;
    - the record holds a newer slot: **stale**.

``takeover(job, slot, owner, lease, seen_token)``
    Compare-and-set for backups: succeeds only if the record still holds
    ``slot`` with token ``seen_token`` and is either ``released`` or
    ``running`` with a lapsed lease. Then ``attempt`` and ``token`` grow by
    one and the previous attempt is recorded as ``lost`` (or stays
    ``released``). Otherwise **taken**, with the current holder.

``renew(job, token, lease)`` / ``finish(job, token, outcome)`` / ``release(job, token)``
    Succeed only while the record carries ``token`` and is ``running``: a
    stale token (someone took over since) is refused with ``False``.
    ``renew`` extends the lease to ``lease`` seconds from the store's now,
    ``finish`` ends the run as ``done`` or ``failed``, ``release`` hands the
    run over (state ``released``, lease ended) so a backup takes over at once.

``states(jobs)`` / ``history(job)`` / ``jobs()``
    Reads, for backups, catch-up and ``anarchon status``. ``lease_remaining``
    is computed by the store's clock.

``claim_many`` and ``states`` take a batch, so an instance needs one round
trip per tick whatever the number of jobs due. The base class loops; stores
that can do better override them.

Tokens rise with every claim and takeover of a job and never repeat, so they
serve as fencing values: a handler may pass ``run.token`` to its own storage
and refuse writes carrying a smaller one.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


class ClaimStatus(str, enum.Enum):
    """The answer to a claim or takeover."""

    WON = "won"
    TAKEN = "taken"
    BUSY = "busy"
    STALE = "stale"


class RunState(str, enum.Enum):
    """The state of one attempt of one slot."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"
    LOST = "lost"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class JobState:
    """A job's current record in the store."""

    job: str
    slot_ms: int
    owner: str
    attempt: int
    token: int
    state: RunState
    #: Seconds of lease left by the store's clock; zero or less means lapsed.
    lease_remaining: float

    @property
    def lapsed(self) -> bool:
        """True when a backup may take this record over."""
        return self.state is RunState.RELEASED or (
            self.state is RunState.RUNNING and self.lease_remaining <= 0
        )


@dataclass(frozen=True)
class Claim:
    """The result of :meth:`Store.claim` or :meth:`Store.takeover`.

    ``holder`` is the record after the step: the caller's own when won, the
    current holder's otherwise (``None`` only if the record vanished).
    """

    status: ClaimStatus
    holder: JobState | None

    @property
    def won(self) -> bool:
        return self.status is ClaimStatus.WON


@dataclass(frozen=True)
class ClaimRequest:
    """One entry of a batched claim."""

    job: str
    slot_ms: int
    lease: float


@dataclass(frozen=True)
class RunRecord:
    """One attempt of one slot, as kept in the history."""

    job: str
    slot_ms: int
    attempt: int
    token: int
    owner: str
    state: RunState
    #: Store-clock Unix seconds.
    started_at: float
    ended_at: float | None


class Store(abc.ABC):
    """A shared store bound to one namespace. See the module docstring."""

    #: Whether the store keeps leases (renew, takeover, hand-over). Claim-only
    #: stores pick a winner per slot and nothing more.
    supports_lease: bool = True

    def __init__(self, *, namespace: str) -> None:
        self.namespace = namespace

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> Store:
        """Build the store from its URL; each store module documents its form."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a URL")

    @abc.abstractmethod
    def claim(self, job: str, slot_ms: int, owner: str, lease: float) -> Claim: ...

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """Claim several slots at once; results in the order of ``requests``."""
        return [self.claim(r.job, r.slot_ms, owner, r.lease) for r in requests]

    @abc.abstractmethod
    def takeover(
        self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int
    ) -> Claim: ...

    @abc.abstractmethod
    def renew(self, job: str, token: int, lease: float) -> bool: ...

    @abc.abstractmethod
    def finish(self, job: str, token: int, outcome: RunState) -> bool: ...

    @abc.abstractmethod
    def release(self, job: str, token: int) -> bool: ...

    @abc.abstractmethod
    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        """Current records of ``jobs``; jobs with no record are left out."""

    def state(self, job: str) -> JobState | None:
        return self.states([job]).get(job)

    @abc.abstractmethod
    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The most recent attempts of ``job``, newest first."""

    @abc.abstractmethod
    def jobs(self) -> list[str]:
        """Names of the jobs that have a record in this namespace."""

    def close(self) -> None:  # noqa: B027 - most stores have nothing to close
        """Release connections this store opened itself."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} namespace={self.namespace!r}>"
