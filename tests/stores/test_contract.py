"""The store contract (anarchon_core/store.py), run against every store."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from anarchon_core import ClaimRequest, ClaimStatus, RunState, Store
from tests.stores.conftest import StoreFactory
from tests.stores.racer import race

SLOT = 1_700_000_000_000
NEXT = SLOT + 10_000


def test_first_claim_wins_attempt_1(store: Store) -> None:
    claim = store.claim("job", SLOT, "a", 10)
    assert claim.status is ClaimStatus.WON
    assert claim.holder is not None
    assert (claim.holder.owner, claim.holder.attempt, claim.holder.slot_ms) == ("a", 1, SLOT)
    if store.supports_lease:
        assert 9 < claim.holder.lease_remaining <= 10


def test_second_claim_of_the_same_slot_is_taken(store: Store) -> None:
    won = store.claim("job", SLOT, "a", 10)
    lost = store.claim("job", SLOT, "b", 10)
    assert won.won
    assert lost.status is ClaimStatus.TAKEN
    if store.supports_lease:
        assert lost.holder is not None and won.holder is not None
        assert lost.holder.owner == "a"
        assert lost.holder.token == won.holder.token


def test_newer_slot_is_busy_while_the_lease_is_live_then_won(lease_store: Store) -> None:
    store = lease_store
    first = store.claim("job", SLOT, "a", 10).holder
    assert first is not None
    busy = store.claim("job", NEXT, "b", 10)
    assert busy.status is ClaimStatus.BUSY
    assert busy.holder is not None and busy.holder.slot_ms == SLOT
    assert store.finish("job", first.token, RunState.DONE)
    won = store.claim("job", NEXT, "b", 10)
    assert won.status is ClaimStatus.WON
    assert won.holder is not None and won.holder.token > first.token
    assert won.holder.attempt == 1


def test_older_slot_is_stale(lease_store: Store) -> None:
    store = lease_store
    store.claim("job", NEXT, "a", 10)
    assert store.claim("job", SLOT, "b", 10).status is ClaimStatus.STALE


def test_renew_and_finish_need_the_current_token(lease_store: Store) -> None:
    store = lease_store
    holder = store.claim("job", SLOT, "a", 10).holder
    assert holder is not None
    assert store.renew("job", holder.token, 20)
    state = store.state("job")
    assert state is not None and 19 < state.lease_remaining <= 20
    assert not store.renew("job", holder.token + 1, 20)
    assert not store.finish("job", holder.token - 1, RunState.DONE)
    assert store.finish("job", holder.token, RunState.DONE)
    assert not store.finish("job", holder.token, RunState.DONE)
    assert not store.renew("job", holder.token, 10)
    state = store.state("job")
    assert state is not None and state.state is RunState.DONE


def test_release_lets_a_backup_take_over_at_once(lease_store: Store) -> None:
    store = lease_store
    holder = store.claim("job", SLOT, "a", 60).holder
    assert holder is not None
    assert store.takeover("job", SLOT, "b", 10, holder.token).status is ClaimStatus.TAKEN
    assert store.release("job", holder.token)
    released = store.state("job")
    assert released is not None and released.lapsed
    claim = store.takeover("job", SLOT, "b", 10, holder.token)
    assert claim.status is ClaimStatus.WON
    assert claim.holder is not None
    assert (claim.holder.owner, claim.holder.attempt) == ("b", 2)
    assert claim.holder.token == holder.token + 1
    # Anyone else comparing against the old token now loses.
    assert store.takeover("job", SLOT, "c", 10, holder.token).status is ClaimStatus.TAKEN
    assert not store.renew("job", holder.token, 10)
    assert [(r.attempt, r.state) for r in store.history("job")] == [
        (2, RunState.RUNNING),
        (1, RunState.RELEASED),
    ]


def test_lease_expiry_by_the_store_clock_allows_a_takeover(lease_store: Store) -> None:
    store = lease_store
    holder = store.claim("job", SLOT, "a", 0.3).holder
    assert holder is not None
    assert store.takeover("job", SLOT, "b", 10, holder.token).status is ClaimStatus.TAKEN
    time.sleep(0.4)
    state = store.state("job")
    assert state is not None and state.lapsed and state.lease_remaining <= 0
    claim = store.takeover("job", SLOT, "b", 10, holder.token)
    assert claim.won
    assert not store.finish("job", holder.token, RunState.DONE)  # the frozen original
    history = store.history("job")
    assert [(r.attempt, r.owner, r.state) for r in history] == [
        (2, "b", RunState.RUNNING),
        (1, "a", RunState.LOST),
    ]


def test_a_newer_slot_supersedes_a_lapsed_run_as_abandoned(lease_store: Store) -> None:
    store = lease_store
    holder = store.claim("job", SLOT, "a", 0.2).holder
    assert holder is not None
    time.sleep(0.3)
    claim = store.claim("job", NEXT, "b", 10)
    assert claim.won
    assert claim.holder is not None and claim.holder.attempt == 1
    history = store.history("job")
    assert [(r.slot_ms, r.state) for r in history] == [
        (NEXT, RunState.RUNNING),
        (SLOT, RunState.ABANDONED),
    ]
    assert history[1].ended_at is not None


def test_failed_runs_are_recorded(lease_store: Store) -> None:
    store = lease_store
    holder = store.claim("job", SLOT, "a", 10).holder
    assert holder is not None
    assert store.finish("job", holder.token, RunState.FAILED)
    assert store.history("job")[0].state is RunState.FAILED
    with pytest.raises(ValueError, match="done or failed"):
        store.finish("job", holder.token, RunState.RELEASED)


def test_claim_many_answers_in_order(store: Store) -> None:
    store.claim("b", SLOT, "x", 10)
    claims = store.claim_many(
        [ClaimRequest("a", SLOT, 10), ClaimRequest("b", SLOT, 10), ClaimRequest("c", SLOT, 5)],
        "y",
    )
    assert [c.status for c in claims] == [ClaimStatus.WON, ClaimStatus.TAKEN, ClaimStatus.WON]
    assert store.claim_many([], "y") == []
    if store.supports_lease:
        assert claims[2].holder is not None and claims[2].holder.lease_remaining <= 5
        assert sorted(store.states(["a", "b", "c", "missing"])) == ["a", "b", "c"]
        assert store.jobs() == ["a", "b", "c"]


def test_tokens_keep_rising_across_slots(lease_store: Store) -> None:
    store = lease_store
    tokens = []
    for k in range(5):
        holder = store.claim("job", SLOT + k * 1000, "a", 10).holder
        assert holder is not None
        tokens.append(holder.token)
        assert store.finish("job", holder.token, RunState.DONE)
    assert tokens == sorted(set(tokens))


def test_namespaces_are_isolated(make_store: StoreFactory) -> None:
    billing, mail = make_store("billing"), make_store("mail")
    assert billing.claim("job", SLOT, "a", 10).won
    assert mail.claim("job", SLOT, "b", 10).won
    assert not billing.claim("job", SLOT, "c", 10).won
    if billing.supports_lease:
        assert billing.jobs() == ["job"] and mail.jobs() == ["job"]
        state = mail.state("job")
        assert state is not None and state.owner == "b"


def test_history_is_bounded(lease_store: Store) -> None:
    store = lease_store
    for k in range(60):
        holder = store.claim("job", SLOT + k * 1000, "a", 10).holder
        assert holder is not None
        store.finish("job", holder.token, RunState.DONE)
    history = store.history("job", limit=100)
    assert 40 <= len(history) <= 50
    assert history[0].slot_ms == SLOT + 59_000


def test_racing_claimers_get_exactly_one_winner(
    kind: str, store_url: str, make_store: StoreFactory
) -> None:
    """16 instances race for the same slot, 500 rounds: one winner every round.

    Each racer is a process with its own connection (threads for the memory
    store, which lives in one process).
    """
    racers, rounds = 16, 500
    if kind == "memory":
        stores = [make_store() for _ in range(racers)]
        barrier = threading.Barrier(racers, timeout=60)
        wins = [[0] * rounds for _ in stores]

        def run(i: int) -> None:
            for r in range(rounds):
                barrier.wait()
                claim = stores[i].claim("race", SLOT + r, f"i{i}", 10)
                wins[i][r] = int(claim.won)
                if claim.won and claim.holder is not None:
                    stores[i].finish("race", claim.holder.token, RunState.DONE)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        namespace = make_store().namespace
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, context.Pool(racers) as pool:
            barrier = manager.Barrier(racers, timeout=60)
            args = [(store_url, namespace, i, rounds, SLOT, barrier) for i in range(racers)]
            wins = pool.starmap(race, args)
    per_round = [sum(w[r] for w in wins) for r in range(rounds)]
    assert per_round == [1] * rounds
