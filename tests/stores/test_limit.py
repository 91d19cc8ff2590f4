"""A job's limit of slots (ClaimRequest.limit), run against every store that keeps leases.

A claim that carries a limit is refused as **ended**, writing nothing, once the
job's claims won (runs less takeovers, counted by the store in the claim's own
atomic step) have reached it: exactly at the boundary, whatever the record,
takeovers not counted, and however many instances race for the last one.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from typing import Any

import pytest

from anarchon_core import ClaimRequest, ClaimStatus, JobState, RunState, Store
from anarchon_core.store import LeaseStore
from tests.stores import racer
from tests.stores.conftest import StoreFactory

SLOT = 1_700_000_000_000
STEP = 10_000


def _slot(k: int) -> int:
    """The job's ``k``-th slot (0 the first)."""
    return SLOT + k * STEP


def _fields(state: JobState | None) -> tuple[Any, ...] | None:
    """What a record says, less its lease left (which moves with the clock)."""
    if state is None:
        return None
    return (state.job, state.slot_ms, state.owner, state.attempt, state.token, state.state)


def _snapshot(store: Store, job: str) -> tuple[Any, ...]:
    """Everything the store keeps of ``job``: its record, history and counts."""
    return _fields(store.state(job)), store.history(job, limit=100), store.stats([job])


def _run(store: LeaseStore, job: str, k: int, limit: int | None, owner: str = "a") -> JobState:
    """Claim ``job``'s ``k``-th slot with ``limit`` (it must win), and finish it done."""
    claim = store.claim(job, _slot(k), owner, 10, limit)
    assert claim.status is ClaimStatus.WON, (k, claim)
    assert claim.holder is not None
    assert store.finish(job, claim.holder.token, RunState.DONE)
    return claim.holder


def test_the_claim_past_the_limit_is_ended_and_writes_nothing(lease_store: LeaseStore) -> None:
    store = lease_store
    for k in range(3):  # the third is the last the limit allows: won
        _run(store, "job", k, 3)
    assert store.stats(["job"])["job"].claims == 3
    before = _snapshot(store, "job")

    for k in (3, 4, 100):
        claim = store.claim("job", _slot(k), "b", 10, 3)
        assert claim.status is ClaimStatus.ENDED, (k, claim)
        assert not claim.won
        assert _fields(claim.holder) == before[0]  # the record as it is
    batch = store.claim_many([ClaimRequest("job", _slot(5), 10, 3)], "c")
    assert [c.status for c in batch] == [ClaimStatus.ENDED]
    assert _snapshot(store, "job") == before

    # The count is the store's, the limit the claim's: a higher one lets the next slot
    # in (the refused claims wrote nothing: the snapshot above), no limit as well.
    won = store.claim("job", _slot(6), "b", 10, 4)
    assert won.status is ClaimStatus.WON
    assert won.holder is not None and won.holder.token > before[0][4]
    assert store.finish("job", won.holder.token, RunState.DONE)
    assert store.claim("job", _slot(7), "b", 10, 4).status is ClaimStatus.ENDED
    assert store.claim("job", _slot(7), "b", 10).won


def test_a_limit_of_one_lets_exactly_the_first_slot_in(lease_store: LeaseStore) -> None:
    store = lease_store
    first = store.claim("once", _slot(0), "a", 10, 1)
    assert first.won and first.holder is not None
    assert first.holder.attempt == 1
    assert store.finish("once", first.holder.token, RunState.FAILED)  # failed counts too
    assert store.claim("once", _slot(1), "b", 10, 1).status is ClaimStatus.ENDED
    assert [(r.slot_ms, r.state) for r in store.history("once")] == [(_slot(0), RunState.FAILED)]


def test_a_takeover_is_not_counted_against_the_limit(lease_store: LeaseStore) -> None:
    store = lease_store
    first = store.claim("job", _slot(0), "a", 10, 2)
    assert first.won and first.holder is not None
    assert store.release("job", first.holder.token)  # handed over...
    again = store.takeover("job", _slot(0), "b", 10, first.holder.token)
    assert again.won and again.holder is not None and again.holder.attempt == 2
    assert store.finish("job", again.holder.token, RunState.DONE)  # ...and run by b
    stats = store.stats(["job"])["job"]
    assert (stats.runs, stats.takeovers, stats.claims) == (2, 1, 1)

    _run(store, "job", 1, 2, owner="c")  # the second slot is still allowed
    assert store.claim("job", _slot(2), "a", 10, 2).status is ClaimStatus.ENDED
    # A run of the last slot allowed is still taken over.
    last = store.state("job")
    assert last is not None and last.slot_ms == _slot(1)
    stats = store.stats(["job"])["job"]
    assert (stats.runs, stats.takeovers, stats.claims) == (3, 1, 2)


def test_ended_comes_after_paused_taken_and_stale_and_before_busy(
    lease_store: LeaseStore,
) -> None:
    store = lease_store
    running = store.claim("job", _slot(1), "a", 10, 1)  # the only slot allowed, still going
    assert running.won and running.holder is not None

    # This very slot: taken (its backup watches it); an older one: stale.
    taken = store.claim("job", _slot(1), "b", 10, 1)
    assert taken.status is ClaimStatus.TAKEN
    assert taken.holder is not None and taken.holder.token == running.holder.token
    assert store.claim("job", _slot(0), "b", 10, 1).status is ClaimStatus.STALE
    # A newer one: ended, not busy (the job has no slot left to overlap).
    ended = store.claim("job", _slot(2), "b", 10, 1)
    assert ended.status is ClaimStatus.ENDED
    assert ended.holder is not None and ended.holder.state is RunState.RUNNING
    assert ended.holder.lease_remaining > 0
    # Without a limit the same claim is busy.
    assert store.claim("job", _slot(2), "b", 10).status is ClaimStatus.BUSY
    # Paused comes first.
    assert store.pause("job")
    assert store.claim("job", _slot(2), "b", 10, 1).status is ClaimStatus.PAUSED
    assert store.resume("job")
    # The run goes on, and ends, as any.
    assert store.renew("job", running.holder.token, 10)
    assert store.finish("job", running.holder.token, RunState.DONE)
    assert store.claim("job", _slot(2), "b", 10, 1).status is ClaimStatus.ENDED


def test_claim_many_answers_ended_for_the_jobs_at_their_limit_only(
    lease_store: LeaseStore,
) -> None:
    store = lease_store
    _run(store, "spent", 0, 1)
    _run(store, "room", 0, 2)
    _run(store, "unlimited", 0, None)
    before = _snapshot(store, "spent")
    requests = [
        ClaimRequest("spent", _slot(1), 10, 1),
        ClaimRequest("room", _slot(1), 10, 2),
        ClaimRequest("new", _slot(1), 10, 1),
        ClaimRequest("unlimited", _slot(1), 10),
    ]
    claims = store.claim_many(requests, "b")
    assert [c.status for c in claims] == [
        ClaimStatus.ENDED,
        ClaimStatus.WON,
        ClaimStatus.WON,
        ClaimStatus.WON,
    ]
    assert _snapshot(store, "spent") == before
    for claim in claims[1:]:
        assert claim.holder is not None
        assert store.finish(claim.holder.job, claim.holder.token, RunState.DONE)
    again = store.claim_many([ClaimRequest(r.job, _slot(2), 10, r.limit) for r in requests], "c")
    assert [c.status for c in again] == [
        ClaimStatus.ENDED,
        ClaimStatus.ENDED,
        ClaimStatus.ENDED,
        ClaimStatus.WON,
    ]


@pytest.mark.parametrize("kind", ["rabbitmq"])
def test_a_claim_only_store_keeps_no_count(make_store: StoreFactory) -> None:
    """RabbitMQ keeps no counts: its claims are not limited (the scheduler refuses a job
    with a limit on it, see tests/unit/test_limit.py)."""
    store = make_store()
    assert not isinstance(store, LeaseStore)
    assert store.claim("job", _slot(0), "a", 10, 1).won
    assert store.claim("job", _slot(1), "a", 10, 1).won
    assert store.stats(["job"]) == {}


#: The race's limit, and its rounds: enough for every racer to see the job ended.
LIMIT, ROUNDS = 25, 40


@pytest.mark.background  # many racers, no time measured: it yields the CPU to those timed
@pytest.mark.timeout(600)
def test_racing_claimers_win_exactly_the_limit(
    kind: str, store_url: str, make_store: StoreFactory
) -> None:
    """16 instances (8 on libSQL, as the other races) claim a slot of their own each round
    with a limit of 25, in lockstep; a won run ends at once, so that several claims of
    a round may win while the count is under the limit. 25 win in all, never one more.

    Each racer is a process with its own connection (threads for the memory store,
    which lives in one process).
    """
    store = make_store()
    if not isinstance(store, LeaseStore):
        pytest.skip(f"{type(store).__name__} is claim-only: it keeps no count")
    racers = 8 if kind == "libsql" else 16
    answers: list[list[str]]
    if kind == "memory":
        barrier = threading.Barrier(racers, timeout=300)
        answers = [[] for _ in range(racers)]

        def run(i: int) -> None:
            for r in range(ROUNDS):
                slot = SLOT + r * 1000
                answers[i].append(racer._limited_claim(store, i, slot, LIMIT, barrier))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([racer.__name__])
        barrier = context.Barrier(racers, timeout=300)
        with context.Pool(racers, initializer=racer.join, initargs=(barrier,)) as pool:
            args = [(store_url, store.namespace, i, ROUNDS, SLOT, LIMIT) for i in range(racers)]
            answers = pool.starmap(racer.race_to_limit, args)
    assert all(len(mine) == ROUNDS for mine in answers)
    total = Counter(status for mine in answers for status in mine)
    assert total[ClaimStatus.WON.value] == LIMIT, total
    assert store.stats(["limited"])["limited"].claims == LIMIT
    # Once reached, every racer hears it: its last claim is ended.
    assert [mine[-1] for mine in answers] == [ClaimStatus.ENDED.value] * racers
    # Each won slot ran once: as many runs in the history as wins, all done.
    history = store.history("limited", limit=100)
    assert len(history) == LIMIT and {r.state for r in history} == {RunState.DONE}
