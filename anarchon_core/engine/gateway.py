"""The store as the engine calls it: what it can do, and its batch calls' answers per job.

A batch call answers item by item. Three things can go wrong, and each is
handled once, here:

- an **outage** of the whole call (:class:`~anarchon_core.StoreUnavailable`)
  fails the step, which is retried after a back-off;
- a **refusal** of some items (:class:`~anarchon_core.BatchRefused`, whose
  ``answers`` hold each item's value or exception, or an error of the store
  other than a bug, which is then retried item by item) fails those jobs
  alone, reported once as ``store_refused``; when every item failed alike,
  the step fails as for an outage, once;
- a **bug** (:func:`~anarchon_core.errors.is_bug`: an error of code, not of
  I/O) is neither: it is logged at ERROR with its traceback, and the job
  concerned is left alone here (no store call about it any more) until it
  is declared again. No event kind fits a bug, and retrying it would only
  repeat it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import BatchRefused, ConfigurationError, StoreUnavailable, is_bug
from ..events import Emitter, EventKind
from ..slots import is_own_record
from ..store import (
    Change,
    Claim,
    ClaimRequest,
    ControlStore,
    JobState,
    LeasesByObservation,
    LeaseStore,
    RegistryStore,
    Store,
    TakeoverRequest,
)

if TYPE_CHECKING:
    from ..jobs import Job
    from ..roles import JobRuntime
    from ..slots import Slot

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def describe(exc: BaseException) -> str:
    """An error in one line: its message, with its type when that says more."""
    if isinstance(exc, StoreUnavailable):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class Gateway:
    """The store, and what it can do, read once from its type (the parts ask these)."""

    def __init__(self, store: Store, emit: Emitter, instance: str) -> None:
        self.store = store
        self._emit = emit
        self._instance = instance
        #: The store, if it keeps leases: runs are renewed, ended, released and taken
        #: over through it. None for a claim-only store: nothing is sent about a run
        #: after its claim, and its end is told by its event alone.
        self.leases: LeaseStore | None = store if isinstance(store, LeaseStore) else None
        #: The store keeps a registry of live instances (cleared once it proves unusable).
        self.registry = isinstance(store, RegistryStore)
        #: The store keeps control entries (cleared once they prove unusable).
        self.controls = isinstance(store, ControlStore)
        #: Leases are judged by an observer's clock: an old running record may look live.
        self.by_observation = isinstance(store, LeasesByObservation)

    def lease_store(self) -> LeaseStore:
        """The store, for a step of a lease; only asked where leases are kept."""
        if self.leases is None:
            raise TypeError(f"{type(self.store).__name__} keeps no lease")
        return self.leases

    def claim_slots(self, due: list[tuple[JobRuntime, Slot]]) -> list[Claim]:
        """One batch of claims, each of a job's slot, for its lease, with the job's limit.

        A backfill's claims carry none: its record is its own, and its slots
        are not counted against the job's limit (nor do a lane's, whose job has none).
        """
        requests = [
            ClaimRequest(
                rt.job.name,
                slot.ms,
                rt.options.lease,
                rt.job.rules.limit if is_own_record(rt.job.name) else None,
            )
            for rt, slot in due
        ]
        return self.store.claim_many(requests, self._instance)

    def check(self, job: Job) -> None:
        """Refuse ``job`` if this store cannot keep what it asks: a ``limit`` needs the
        store's count of the job's claims, which a claim-only store does not keep."""
        if job.rules.limit is not None and self.leases is None:
            raise ConfigurationError(
                f"job {job.name!r}: limit={job.rules.limit} needs a store that counts the"
                f" job's slots; {type(self.store).__name__} only takes claims (use a lease"
                " store: Redis, Valkey, PostgreSQL, MySQL, SQLite, libSQL or NATS)"
            )
        overlap = job.rules.overlap.value
        if overlap != "skip" and self.leases is None:
            # A slot waits for the run before it to end: only a lease tells that end.
            raise ConfigurationError(
                f"job {job.name!r}: overlap={overlap!r} needs a store that keeps leases;"
                f" {type(self.store).__name__} only takes claims (use a lease store:"
                " Redis, Valkey, PostgreSQL, MySQL, SQLite, libSQL or NATS)"
            )

    def states(self, jobs: list[JobRuntime]) -> list[JobState | None]:
        """The store's record of each job, in one read."""
        states = self.store.states(rt.job.name for rt in jobs)
        return [states.get(rt.job.name) for rt in jobs]

    def per_job(
        self, jobs: list[JobRuntime], items: list[T], call: Callable[[list[T]], list[R]]
    ) -> list[R | Exception]:
        """``call(items)`` (item i about ``jobs[i]``) in one batch; each job's answer.

        A job's answer is an exception when its item failed: refused, or
        broken by a bug. A job left alone after a bug is not sent again; its
        bug is its answer. An outage raises, as does a batch in which every
        item was refused alike, once (see the module's docstring).
        """
        broken = [rt.broken for rt in jobs]
        if not any(broken):
            return self._answers(jobs, items, call)
        sent = [i for i, bug in enumerate(broken) if bug is None]
        answered: list[R | Exception] = (
            self._answers([jobs[i] for i in sent], [items[i] for i in sent], call) if sent else []
        )
        answers = iter(answered)
        results: list[R | Exception] = []
        for bug in broken:
            results.append(bug if bug is not None else next(answers))
        return results

    def _answers(
        self, jobs: list[JobRuntime], items: list[T], call: Callable[[list[T]], list[R]]
    ) -> list[R | Exception]:
        results: list[R | Exception]
        try:
            results = list(call(items))
        except StoreUnavailable:
            raise
        except BatchRefused as partial:  # each item answered: the refused ones fail alone
            results = partial.answers
        except Exception as batch:  # applied whole or not at all: each on its own
            results = [batch] if len(items) == 1 else self._one_by_one(items, call)
        refusals = []
        for rt, result in zip(jobs, results, strict=True):
            if isinstance(result, Exception) and is_bug(result):
                self._broken(rt, result)
            else:
                refusals.append((rt, result))
        failed = [result for _, result in refusals if isinstance(result, Exception)]
        if (
            failed
            and len(failed) == len(refusals)
            and not all(rt.refused or rt.suspect for rt, _ in refusals)
        ):
            # Every item failed alike: a failure of the store, reported as such.
            # Should these jobs fail alike again, they fail alone.
            for rt, _ in refusals:
                rt.suspect = True
            raise failed[0]
        for rt, result in refusals:
            if isinstance(result, Exception) and not rt.refused:
                self._emit(EventKind.STORE_REFUSED, job=rt.job.name, detail=describe(result))
            rt.refused = isinstance(result, Exception)
            rt.suspect = False
        return results

    @staticmethod
    def _one_by_one(items: list[T], call: Callable[[list[T]], list[R]]) -> list[R | Exception]:
        results: list[R | Exception] = []
        for item in items:
            try:
                results.extend(call([item]))
            except StoreUnavailable:
                raise
            except BatchRefused as refused:
                results.extend(refused.answers)
            except Exception as exc:
                results.append(exc)
        return results

    def takeovers(self, lapsed: list[tuple[JobRuntime, JobState]]) -> list[Claim]:
        """One batch of takeovers, each of a record's slot (compare-and-set on its token)."""
        requests = [
            TakeoverRequest(rt.job.name, record.slot_ms, rt.options.lease, record.token)
            for rt, record in lapsed
        ]
        return self.lease_store().takeover_many(requests, self._instance)

    def _broken(self, rt: JobRuntime, bug: Exception) -> None:
        """Leave ``rt``'s job alone after ``bug``: logged once, with its traceback.

        Its next slot is not claimed, nothing of it is backed up, and a run
        of it in progress is told it lost: its lease is no longer renewed.
        """
        if rt.broken is None:
            log.error(
                "anarchon: a store call about job %s raised a bug; the job is left alone"
                " here until it is declared again",
                rt.job.name,
                exc_info=bug,
            )
        rt.broken = bug
        rt.next_slot = rt.backup = None
        if rt.runner is not None:
            rt.runner.run.mark_lost(f"a store call about its job raised a bug: {describe(bug)}")

    def hand_over(self, releases: list[Change]) -> tuple[list[bool | Exception], bool]:
        """Send ``releases`` in one batch, whatever fails: each one's answer, and whether
        the store could be reached at all."""
        leases = self.lease_store()
        try:
            return list(leases.change_many(releases)), True
        except StoreUnavailable as exc:
            return [exc] * len(releases), False
        except BatchRefused as partial:  # the others went through
            return partial.answers, True
        except Exception:  # a refusal of one: each is handed over on its own
            answers: list[bool | Exception] = []
            for release in releases:
                try:
                    answers.append(leases.change_many([release])[0])
                except Exception as exc:
                    answers.append(exc)
            return answers, True
