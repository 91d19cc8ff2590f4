"""The store contract: the few atomic steps the engine asks of a shared store.

A store keeps, per job of a namespace, one record of the job's current slot
(job, slot, owner, attempt, token, state, lease end) and a short history of
its runs. The engine reads and changes them only through the methods of
:class:`Store`, each documented on itself.

Atomicity: each step is **one atomic operation on the server** (a Lua script,
one SQL statement or transaction, one compare-and-set), never a read in Python
followed by a write.

Clock: lease expiry is judged by the store's own clock, so instances whose
clocks disagree cannot take a live lease early (NATS gives clients no clock:
its store judges by the observer's monotonic clock instead, see
:mod:`anarchon_core.stores.nats`).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: How many attempts per job a store's history keeps.
HISTORY = 50


class ClaimStatus(str, enum.Enum):
    """The answer to a claim or takeover."""

    WON = "won"
    TAKEN = "taken"
    BUSY = "busy"
    STALE = "stale"


class RunState(str, enum.Enum):
    """The state of one attempt of one slot."""

    RUNNING = "running"
    #: Handed off (:meth:`Store.dispatch`): the work waits for its executor,
    #: whose first renewal makes the run ``running`` again.
    DISPATCHED = "dispatched"
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"
    LOST = "lost"
    ABANDONED = "abandoned"


#: States in which a run holds its slot's lease (renewed, finished or released by token).
HELD_STATES = (RunState.RUNNING, RunState.DISPATCHED)


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

    @property
    def held(self) -> bool:
        """True while a live lease holds the slot: running, or dispatched and awaiting pickup."""
        return self.state in HELD_STATES and self.lease_remaining > 0

    @property
    def unpicked(self) -> bool:
        """True when the slot was dispatched and no executor picked it up within its lease.

        Such a slot is never taken over (its work may run where nothing renews
        it); the job's next slot supersedes it.
        """
        return self.state is RunState.DISPATCHED and self.lease_remaining <= 0


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
    """A shared store bound to one namespace.

    Subclasses implement the abstract methods, each one atomic step (see the
    module docstring); :meth:`finish` and :meth:`release` both come down to
    :meth:`_end`. The protected helpers below are for implementations only.
    """

    #: Whether the store keeps leases (renew, takeover, hand-over). Claim-only
    #: stores pick a winner per slot and nothing more (see :class:`ClaimOnlyStore`).
    supports_lease: bool = True
    #: Whether a lease's end is measured from when the reader first saw the record
    #: (NATS: no server clock) rather than by the store's clock: a record left
    #: running long ago then looks live to an instance that just started.
    leases_by_observation: bool = False

    def __init__(self, *, namespace: str) -> None:
        """Bind the store to ``namespace``: 1-100 letters, digits, ``_``, ``-``, ``.`` or ``:``.

        Namespaces end up in keys, table, bucket and queue names; any other
        raises :class:`~anarchon_core.errors.ConfigurationError`.
        """
        from .urls import check_namespace  # urls imports this module

        self.namespace = check_namespace(namespace)

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> Store:
        """Build the store from its URL; each store module documents its form."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a URL")

    @abc.abstractmethod
    def claim(self, job: str, slot_ms: int, owner: str, lease: float) -> Claim:
        """Record that ``owner`` runs ``slot_ms`` of ``job``, unless someone already does.

        When won, the lease runs for ``lease`` seconds by the store's clock.

        - no record yet, or the record holds an older slot that is finished
          (``done``/``failed``), handed over (``released``) or whose lease has
          lapsed (or a dispatched run never picked up): **won**. ``attempt`` is
          1, ``token`` is the previous token + 1. A previous run left
          ``running`` or ``dispatched`` (its lease lapsed) is recorded in the
          history as ``abandoned``: a newer slot supersedes it, it is not retried
          (a ``released`` one stays ``released``);
        - the record holds an older slot whose lease is live (``running``, or
          ``dispatched`` and awaiting pickup): **busy** (the previous run is
          still going; this slot is skipped, "overlap");
        - the record holds this very slot: **taken**;
        - the record holds a newer slot: **stale**.

        Tokens rise with every claim and takeover of a job and never repeat, so
        they serve as fencing values: a handler may pass ``run.token`` to its own
        storage and refuse writes carrying a smaller one.
        """

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """Claim several slots at once; results in the order of ``requests``.

        A batch lets an instance make one round trip per tick whatever the
        number of jobs due. This loops over :meth:`claim`; stores that can do
        better override it.
        """
        return [self.claim(r.job, r.slot_ms, owner, r.lease) for r in requests]

    @abc.abstractmethod
    def takeover(self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int) -> Claim:
        """Compare-and-set for backups: take ``slot_ms`` of ``job`` over from a lapsed run.

        Succeeds only if the record still holds ``slot_ms`` with token
        ``seen_token`` and is either ``released`` or ``running`` with a lapsed
        lease. Then ``attempt`` and ``token`` grow by one, the lease runs for
        ``lease`` seconds, and the previous attempt is recorded as ``lost`` (or
        stays ``released``): **won**. Otherwise **taken**, with the current holder.
        """

    @abc.abstractmethod
    def renew(self, job: str, token: int, lease: float) -> bool:
        """Extend the lease of the run carrying ``token`` to ``lease`` seconds from the store's now.

        Only while the record carries ``token`` and is ``running`` or
        ``dispatched``: a stale token (someone took over since) is refused with
        ``False``. The state becomes ``running``: the first renewal of a
        dispatched run is its executor picking it up.
        """

    @abc.abstractmethod
    def dispatch(self, job: str, token: int, pickup: float) -> bool:
        """Hand the run carrying ``token`` off to whoever executes its work.

        State ``dispatched``, lease ``pickup`` seconds from the store's now:
        the time the work may wait for an executor, whose first
        :meth:`renew` makes it ``running``. Only while the record carries
        ``token`` and is ``running`` or ``dispatched`` (a retried message is
        dispatched again), else ``False``. A dispatched run is never taken
        over: once its pickup lease lapses it stays unpicked until the job's
        next slot supersedes it.
        """

    def finish(self, job: str, token: int, outcome: RunState) -> bool:
        """End the run carrying ``token`` as ``done`` or ``failed``, and its lease.

        Only while the record carries ``token`` and is ``running`` or
        ``dispatched``: a stale token is refused with ``False``. Idempotent: a
        finish re-sent after its reply was lost answers ``True`` again. Any
        other ``outcome`` raises ``ValueError``.
        """
        if outcome not in (RunState.DONE, RunState.FAILED):
            raise ValueError(f"a run finishes as done or failed, not {outcome.value}")
        return self._end(job, token, outcome)

    def release(self, job: str, token: int) -> bool:
        """Hand the run carrying ``token`` over: state ``released``, lease ended.

        A backup takes it over at once. Only while the record carries ``token``
        and is ``running`` or ``dispatched``: a stale token is refused with
        ``False``. Idempotent, as :meth:`finish`.
        """
        return self._end(job, token, RunState.RELEASED)

    @abc.abstractmethod
    def _end(self, job: str, token: int, state: RunState) -> bool:
        """End the run carrying ``token`` as ``state`` and its lease at the store's now.

        The one step behind :meth:`finish` (``done``, ``failed``) and
        :meth:`release` (``released``): only while the record carries ``token``
        and is ``running`` or ``dispatched``; ``True`` also when it carries
        ``token`` and already is ``state`` (the same step re-sent); else
        ``False``. The history records the end.
        """

    @abc.abstractmethod
    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        """Current records of ``jobs``; jobs with no record are left out.

        One batch, for backups and catch-up: ``lease_remaining`` is computed by
        the store's clock.
        """

    def state(self, job: str) -> JobState | None:
        """The current record of ``job``, or ``None``."""
        return self.states([job]).get(job)

    @abc.abstractmethod
    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The most recent attempts of ``job``, newest first (at most :data:`HISTORY` kept)."""

    @abc.abstractmethod
    def jobs(self) -> list[str]:
        """Names of the jobs that have a record in this namespace, sorted."""

    def ping(self) -> None:
        """Reach the store once: StoreUnavailable if it cannot, or refuses this client."""
        self.jobs()

    def close(self) -> None:  # noqa: B027 - most stores have nothing to close
        """Release connections this store opened itself."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} namespace={self.namespace!r}>"

    # -- helpers for implementations ----------------------------------------

    @staticmethod
    def _refusal(slot_ms: int, holder: JobState | None) -> Claim | None:
        """The answer to a claim of ``slot_ms`` that ``holder`` refuses, or ``None`` if it wins.

        **taken** when ``holder`` holds this slot, **stale** when a newer one,
        **busy** when an older one whose lease is live (see :meth:`claim`).
        """
        if holder is None:
            return None
        if holder.slot_ms == slot_ms:
            return Claim(ClaimStatus.TAKEN, holder)
        if holder.slot_ms > slot_ms:
            return Claim(ClaimStatus.STALE, holder)
        if holder.held:
            return Claim(ClaimStatus.BUSY, holder)
        return None

    @classmethod
    def _lost(cls, slot_ms: int, holder: JobState | None) -> Claim:
        """The answer to a claim of ``slot_ms`` that the server refused; ``holder`` read since.

        As :meth:`_refusal`, except that no holder means **taken** and an older
        slot means **busy** even if its lease has lapsed since the refusal.
        """
        if holder is None:
            return Claim(ClaimStatus.TAKEN, None)
        refusal = cls._refusal(slot_ms, holder)
        return refusal if refusal is not None else Claim(ClaimStatus.BUSY, holder)

    @staticmethod
    def _job_state(row: Sequence[Any]) -> JobState:
        """A record from a database row of its fields, in order."""
        job, slot_ms, owner, attempt, token, state, remaining = row
        state = RunState(state)
        return JobState(job, int(slot_ms), owner, int(attempt), int(token), state, remaining)

    @staticmethod
    def _run_record(row: Sequence[Any]) -> RunRecord:
        """An attempt from a database row of its fields, in order."""
        job, slot_ms, attempt, token, owner, state, started_at, ended_at = row
        state = RunState(state)
        return RunRecord(
            job, int(slot_ms), int(attempt), int(token), owner, state, started_at, ended_at
        )


class ClaimOnlyStore(Store):
    """A store that picks the one winner of each slot and records nothing else.

    Subclasses implement :meth:`claim`. There is no lease: a won claim runs
    with nothing to renew, finish, hand over or take over, and nothing is
    read back. The engine knows this from ``supports_lease``.
    """

    supports_lease = False

    def takeover(self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int) -> Claim:
        """Always **taken**: a lost run is never taken over."""
        return Claim(ClaimStatus.TAKEN, None)

    def renew(self, job: str, token: int, lease: float) -> bool:
        """``True``: there is no lease to extend."""
        return True

    def dispatch(self, job: str, token: int, pickup: float) -> bool:
        """``True``: there is no lease to hand off."""
        return True

    def _end(self, job: str, token: int, state: RunState) -> bool:
        """``True``: the end of a run is not recorded, and there is nothing to hand over."""
        return True

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        """Empty: no job record is kept."""
        return {}

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """Empty: no run history is kept."""
        return []

    def jobs(self) -> list[str]:
        """Empty: no job record is kept."""
        return []
