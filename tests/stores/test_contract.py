"""The store contract (anarchon_core/store.py), run against every store."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from anarchon_core import (
    Change,
    ClaimRequest,
    ClaimStatus,
    ConfigurationError,
    JobState,
    RunState,
    Store,
)
from anarchon_core.store import (
    HISTORY,
    MIN_TTL,
    ClaimOnlyStore,
    ControlStore,
    LeaseStore,
    RegistryStore,
)
from tests.stores import racer
from tests.stores.conftest import StoreFactory
from tests.waiting import wait_until

SLOT = 1_700_000_000_000
NEXT = SLOT + 10_000


def _claimed(store: Store, job: str = "job", lease: float = 10, slot: int = SLOT) -> JobState:
    """``job``'s ``slot``, claimed by ``a`` with a ``lease``: its holder (the claim won)."""
    holder = store.claim(job, slot, "a", lease).holder
    assert holder is not None
    return holder


def test_first_claim_wins_attempt_1(store: Store) -> None:
    claim = store.claim("job", SLOT, "a", 10)
    assert claim.status is ClaimStatus.WON
    assert claim.holder is not None
    assert (claim.holder.owner, claim.holder.attempt, claim.holder.slot_ms) == ("a", 1, SLOT)
    if isinstance(store, LeaseStore):
        assert 9 < claim.holder.lease_remaining <= 10


def test_second_claim_of_the_same_slot_is_taken(store: Store) -> None:
    won = store.claim("job", SLOT, "a", 10)
    lost = store.claim("job", SLOT, "b", 10)
    assert won.won
    assert lost.status is ClaimStatus.TAKEN
    if isinstance(store, LeaseStore):
        assert lost.holder is not None and won.holder is not None
        assert lost.holder.owner == "a"
        assert lost.holder.token == won.holder.token


def test_newer_slot_is_busy_while_the_lease_is_live_then_won(lease_store: Store) -> None:
    store = lease_store
    first = _claimed(store)
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
    holder = _claimed(store)
    assert store.renew("job", holder.token, 20)
    state = store.state("job")
    assert state is not None and 19 < state.lease_remaining <= 20
    assert not store.renew("job", holder.token + 1, 20)
    assert not store.finish("job", holder.token - 1, RunState.DONE)
    assert store.finish("job", holder.token, RunState.DONE)
    assert not store.finish("job", holder.token, RunState.FAILED)
    assert not store.renew("job", holder.token, 10)
    state = store.state("job")
    assert state is not None and state.state is RunState.DONE


def test_release_lets_a_backup_take_over_at_once(lease_store: Store) -> None:
    store = lease_store
    holder = _claimed(store, lease=60)
    assert store.takeover("job", SLOT, "b", 10, holder.token).status is ClaimStatus.TAKEN
    assert store.release("job", holder.token)
    released = store.state("job")
    assert released is not None and released.lapsed
    claim = store.takeover("job", SLOT, "b", 10, holder.token)
    assert claim.status is ClaimStatus.WON
    assert claim.holder is not None
    assert (claim.holder.owner, claim.holder.attempt) == ("b", 2)
    assert claim.holder.token > holder.token
    # Anyone else comparing against the old token now loses.
    assert store.takeover("job", SLOT, "c", 10, holder.token).status is ClaimStatus.TAKEN
    assert not store.renew("job", holder.token, 10)
    assert [(r.attempt, r.state) for r in store.history("job")] == [
        (2, RunState.RUNNING),
        (1, RunState.RELEASED),
    ]


def test_lease_expiry_by_the_store_clock_allows_a_takeover(lease_store: Store) -> None:
    store = lease_store
    holder = _claimed(store, lease=0.3)
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
    _claimed(store, lease=0.2)
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
    holder = _claimed(store)
    assert store.finish("job", holder.token, RunState.FAILED)
    assert store.history("job")[0].state is RunState.FAILED
    with pytest.raises(ValueError, match="done or failed"):
        store.finish("job", holder.token, RunState.RELEASED)


#: A pickup lease: short, since the tests wait for it to lapse.
#: A short lease, long enough that a loaded machine (the suite on 2 cores) checks it
#: while it holds: a lease that lapsed between two calls would read as another answer.
PICKUP = 3.0


def _lapse(store: Store) -> None:
    """Wait until the store shows the :data:`PICKUP` lease of ``job`` ended."""

    def ended() -> bool:
        state = store.state("job")
        return state is not None and state.lease_remaining <= 0

    wait_until(ended, PICKUP + 10, "the job's lease to end")


def test_dispatch_needs_the_current_token_and_a_held_state(lease_store: Store) -> None:
    store = lease_store
    holder = _claimed(store)
    assert not store.dispatch("job", holder.token + 1, PICKUP)
    assert not store.dispatch("job", holder.token - 1, PICKUP)
    assert not store.dispatch("other", holder.token, PICKUP)
    assert store.dispatch("job", holder.token, PICKUP)
    state = store.state("job")
    assert state is not None and state.state is RunState.DISPATCHED
    assert 0 < state.lease_remaining <= PICKUP  # the pickup lease, not the job's
    assert state.held and not state.unpicked and not state.lapsed
    assert store.dispatch("job", holder.token, PICKUP)  # a retried message: again
    assert store.takeover("job", SLOT, "b", 10, holder.token).status is ClaimStatus.TAKEN
    _lapse(store)
    state = store.state("job")
    assert state is not None and state.state is RunState.DISPATCHED
    assert state.lease_remaining <= 0
    assert state.unpicked and not state.held and not state.lapsed
    # Never taken over: the work may run where nothing renews it.
    lost = store.takeover("job", SLOT, "b", 10, holder.token)
    assert lost.status is ClaimStatus.TAKEN
    assert lost.holder is not None and lost.holder.token == holder.token
    assert lost.holder.state is RunState.DISPATCHED
    # Nothing to dispatch once the run ended.
    ended = _claimed(store, "ended")
    assert store.finish("ended", ended.token, RunState.DONE)
    assert not store.dispatch("ended", ended.token, PICKUP)
    released = _claimed(store, "released")
    assert store.release("released", released.token)
    assert not store.dispatch("released", released.token, PICKUP)
    state = store.state("released")
    assert state is not None and state.state is RunState.RELEASED


def test_renewing_a_dispatched_run_picks_it_up(lease_store: Store) -> None:
    store = lease_store
    holder = _claimed(store)
    assert store.dispatch("job", holder.token, 10)
    assert not store.renew("job", holder.token + 1, PICKUP)
    assert store.renew("job", holder.token, PICKUP)  # the executor's first renewal
    state = store.state("job")
    assert state is not None and state.state is RunState.RUNNING
    assert 0 < state.lease_remaining <= PICKUP  # the job lease now
    assert state.held and not state.unpicked
    assert store.takeover("job", SLOT, "b", 10, holder.token).status is ClaimStatus.TAKEN
    _lapse(store)
    state = store.state("job")
    assert state is not None and state.lapsed
    claim = store.takeover("job", SLOT, "b", 10, holder.token)
    assert claim.won
    assert claim.holder is not None and claim.holder.token > holder.token
    assert [(r.attempt, r.state) for r in store.history("job")] == [
        (2, RunState.RUNNING),
        (1, RunState.LOST),
    ]


def test_a_newer_slot_is_busy_while_dispatched_then_supersedes_it(lease_store: Store) -> None:
    store = lease_store
    holder = _claimed(store)
    assert store.dispatch("job", holder.token, PICKUP)
    busy = store.claim("job", NEXT, "b", 10)
    assert busy.status is ClaimStatus.BUSY
    assert busy.holder is not None and busy.holder.state is RunState.DISPATCHED
    _lapse(store)
    won = store.claim("job", NEXT, "b", 10)
    assert won.status is ClaimStatus.WON
    assert won.holder is not None and won.holder.token > holder.token
    assert won.holder.attempt == 1 and won.holder.state is RunState.RUNNING
    history = store.history("job")
    assert [(r.slot_ms, r.state) for r in history] == [
        (NEXT, RunState.RUNNING),
        (SLOT, RunState.ABANDONED),
    ]
    assert history[1].ended_at is not None
    # The superseded run's token is stale for every step.
    assert not store.renew("job", holder.token, 10)
    assert not store.dispatch("job", holder.token, 10)
    assert not store.finish("job", holder.token, RunState.DONE)


def test_finish_and_release_are_idempotent(lease_store: Store) -> None:
    store = lease_store
    done = _claimed(store, "done")
    assert store.finish("done", done.token, RunState.DONE)
    before, history = store.state("done"), store.history("done")
    time.sleep(0.05)
    assert store.finish("done", done.token, RunState.DONE)  # its reply was lost: re-sent
    after = store.state("done")
    assert before is not None and after is not None and after.state is RunState.DONE
    assert after.lease_remaining <= before.lease_remaining  # the end was not moved
    assert store.history("done") == history
    assert not store.finish("done", done.token, RunState.FAILED)
    assert not store.release("done", done.token)
    assert not store.finish("done", done.token + 1, RunState.DONE)
    assert not store.finish("done", done.token - 1, RunState.DONE)

    released = _claimed(store, "released")
    assert store.release("released", released.token)
    history = store.history("released")
    assert store.release("released", released.token)
    assert store.history("released") == history
    assert not store.finish("released", released.token, RunState.DONE)
    assert not store.finish("released", released.token, RunState.FAILED)
    assert store.takeover("released", SLOT, "b", 10, released.token).won
    assert not store.release("released", released.token)  # stale once taken over

    failed = _claimed(store, "failed")
    assert store.dispatch("failed", failed.token, 10)
    assert store.finish("failed", failed.token, RunState.FAILED)  # ended while dispatched
    assert store.finish("failed", failed.token, RunState.FAILED)
    assert not store.finish("failed", failed.token, RunState.DONE)
    assert not store.dispatch("failed", failed.token, 10)
    assert not store.renew("failed", failed.token, 10)
    assert [r.state for r in store.history("failed")] == [RunState.FAILED]


def test_history_keeps_a_dispatched_run_open_until_it_ends(lease_store: Store) -> None:
    store = lease_store
    holder = _claimed(store)

    def latest() -> tuple[int, RunState, bool]:
        run = store.history("job")[0]
        return run.token, run.state, run.ended_at is None

    assert store.dispatch("job", holder.token, 10)
    assert latest() == (holder.token, RunState.DISPATCHED, True)
    assert store.renew("job", holder.token, 10)
    assert latest() == (holder.token, RunState.RUNNING, True)
    assert store.renew("job", holder.token, 10)
    assert latest() == (holder.token, RunState.RUNNING, True)
    assert store.dispatch("job", holder.token, 10)  # a retried message, sent again
    assert latest() == (holder.token, RunState.DISPATCHED, True)
    assert store.renew("job", holder.token, 10)
    assert store.finish("job", holder.token, RunState.DONE)
    assert latest() == (holder.token, RunState.DONE, False)
    assert len(store.history("job")) == 1


def test_a_won_claim_is_dispatched_where_the_store_keeps_leases(store: Store) -> None:
    holder = _claimed(store)
    if isinstance(store, LeaseStore):
        assert store.dispatch("job", holder.token, PICKUP)
    else:  # a claim-only store has no lease to hand off or end, and does not pretend to
        for step in ("change_many", "dispatch", "finish", "release"):
            assert not hasattr(store, step)


def test_claim_many_answers_in_order(store: Store) -> None:
    store.claim("b", SLOT, "x", 10)
    claims = store.claim_many(
        [ClaimRequest("a", SLOT, 10), ClaimRequest("b", SLOT, 10), ClaimRequest("c", SLOT, 5)],
        "y",
    )
    assert [c.status for c in claims] == [ClaimStatus.WON, ClaimStatus.TAKEN, ClaimStatus.WON]
    assert store.claim_many([], "y") == []
    if isinstance(store, LeaseStore):
        assert claims[2].holder is not None and claims[2].holder.lease_remaining <= 5
        assert sorted(store.states(["a", "b", "c", "missing"])) == ["a", "b", "c"]
        assert store.jobs() == ["a", "b", "c"]


def test_tokens_keep_rising_across_slots(lease_store: Store) -> None:
    store = lease_store
    tokens = []
    for k in range(5):
        holder = _claimed(store, slot=SLOT + k * 1000)
        tokens.append(holder.token)
        assert store.finish("job", holder.token, RunState.DONE)
    assert tokens == sorted(set(tokens))


def test_namespaces_are_isolated(make_store: StoreFactory) -> None:
    billing, mail = make_store("billing"), make_store("mail")
    assert billing.claim("job", SLOT, "a", 10).won
    assert mail.claim("job", SLOT, "b", 10).won
    assert not billing.claim("job", SLOT, "c", 10).won
    if isinstance(billing, LeaseStore):
        assert billing.jobs() == ["job"] and mail.jobs() == ["job"]
        state = mail.state("job")
        assert state is not None and state.owner == "b"


def test_history_is_bounded_to_the_newest_attempts(lease_store: Store) -> None:
    """The newest HISTORY attempts are kept, counted as attempts: tokens are not
    consecutive (each is the store's clock in ms when that is above the previous + 1)."""
    store = lease_store
    for k in range(HISTORY + 10):
        holder = _claimed(store, slot=SLOT + k * 1000)
        store.finish("job", holder.token, RunState.DONE)
    history = store.history("job", limit=100)
    newest = [SLOT + k * 1000 for k in range(HISTORY + 9, 9, -1)]
    assert [run.slot_ms for run in history] == newest


@pytest.mark.background  # many rounds, no time measured: it yields the CPU to those timed
@pytest.mark.timeout(600)
def test_racing_claimers_get_exactly_one_winner(
    kind: str, store_url: str, make_store: StoreFactory
) -> None:
    """16 instances race for the same slot, 500 rounds: one winner every round.

    Each racer is a process with its own connection (threads for the memory
    store, which lives in one process). libSQL races with 8: sqld 0.24 stops
    answering writes when about 16 connections write at once (docs/backends.md).
    A round waits for every racer: at a low priority, a racer may wait long.
    """
    racers, rounds = (8 if kind == "libsql" else 16), 500
    if kind == "memory":
        stores = [make_store() for _ in range(racers)]
        barrier = threading.Barrier(racers, timeout=300)
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
        # Forked from a server that imported the store clients once, each racer starts
        # without importing them again; they meet at a barrier in shared memory.
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([racer.__name__])
        barrier = context.Barrier(racers, timeout=300)
        with context.Pool(racers, initializer=racer.join, initargs=(barrier,)) as pool:
            args = [(store_url, namespace, i, rounds, SLOT) for i in range(racers)]
            wins = pool.starmap(racer.race, args)
    per_round = [sum(w[r] for w in wins) for r in range(rounds)]
    assert per_round == [1] * rounds


def test_change_many_answers_each_change_as_its_own_step(lease_store: Store) -> None:
    store = lease_store
    renewed, dispatched, done, released = (_claimed(store, job) for job in "wxyz")
    stale = _claimed(store, "s")
    changes = [
        Change("w", renewed.token, RunState.RUNNING, 20),
        Change("x", dispatched.token, RunState.DISPATCHED, 5),
        Change("y", done.token, RunState.DONE),
        Change("s", stale.token + 1, RunState.DONE),  # a token nobody holds
        Change("z", released.token, RunState.RELEASED),
        Change("missing", 1, RunState.FAILED),
    ]
    assert store.change_many(changes) == [True, True, True, False, True, False]
    states = store.states(["w", "x", "y", "s", "z"])
    assert states["w"].state is RunState.RUNNING and 19 < states["w"].lease_remaining <= 20
    assert states["x"].state is RunState.DISPATCHED and states["x"].lease_remaining <= 5
    assert states["y"].state is RunState.DONE
    assert states["s"].state is RunState.RUNNING  # untouched by the refused change
    assert states["z"].state is RunState.RELEASED
    # An end re-sent after its reply was lost answers yes again; a renewal of an
    # ended run is refused; nothing in an empty batch.
    again = [Change("y", done.token, RunState.DONE), Change("y", done.token, RunState.RUNNING, 9)]
    assert store.change_many(again) == [True, False]
    assert store.change_many([]) == []
    assert [r.state for r in store.history("y")] == [RunState.DONE]
    assert store.takeover("z", SLOT, "b", 10, released.token).won


def test_change_many_hands_off_then_finishes_in_one_batch(lease_store: LeaseStore) -> None:
    holder = _claimed(lease_store)
    changes = [Change("job", holder.token, RunState.DISPATCHED, 5)]
    changes.append(Change("job", holder.token, RunState.DONE))
    assert lease_store.change_many(changes) == [True, True]
    state = lease_store.state("job")
    assert state is not None and state.state is RunState.DONE


def test_change_many_applies_the_changes_of_one_job_in_the_order_listed(
    lease_store: Store,
) -> None:
    """40 runs, each renewed then finished in one batch: never finished first.

    A store that runs a batch's steps together must still run one job's
    steps one after the other; a finish applied before the renewal would
    refuse the renewal (the run already ended).
    """
    store = lease_store
    holders = [_claimed(store, f"j{i:02}") for i in range(40)]
    changes = []
    for holder in holders:
        changes.append(Change(holder.job, holder.token, RunState.RUNNING, 10))
        changes.append(Change(holder.job, holder.token, RunState.DONE))
    assert store.change_many(changes) == [True] * 80
    states = store.states([h.job for h in holders])
    assert {state.state for state in states.values()} == {RunState.DONE}


def test_a_change_to_lost_or_abandoned_is_refused() -> None:
    for state in (RunState.LOST, RunState.ABANDONED):
        with pytest.raises(ValueError, match=state.value):
            Change("job", 1, state)


def test_the_registry_answers_the_live_instances(store: Store) -> None:
    if not isinstance(store, RegistryStore):
        assert store.announce("a", {"host": "h"}, 5) == [] and store.instances() == []
        return
    [a] = store.announce("a", {"host": "h", "pid": 1}, 5)
    assert (a.instance, a.info) == ("a", {"host": "h", "pid": 1})
    assert 0 <= a.age < 1 and 4 < a.expires_in <= 5
    live = store.announce("b", {"host": "h2"}, 0.6 + MIN_TTL)
    assert [r.instance for r in live] == ["a", "b"]
    # Announcing again renews the record and replaces what it says.
    [a_again, _] = store.announce("a", {"host": "h", "pid": 2}, 5)
    assert a_again.info == {"host": "h", "pid": 2}
    assert [r.instance for r in store.instances()] == ["a", "b"]
    time.sleep(1.7)  # b's record expires; a's does not
    assert [r.instance for r in store.instances()] == ["a"]
    assert [r.instance for r in store.announce("c", {}, 5)] == ["a", "c"]
    store.withdraw("a")
    store.withdraw("never-announced")
    assert [r.instance for r in store.instances()] == ["c"]
    # The registry is not a job: nothing of it in the jobs or their records.
    assert store.jobs() == []


def test_the_registry_refuses_bad_input_before_writing(store: Store) -> None:
    with pytest.raises(ConfigurationError, match="instance name"):
        store.announce("bad\nname", {}, 5)
    with pytest.raises(ValueError, match="1 s to 1 h"):
        store.announce("a", {}, 0.5)
    with pytest.raises(ValueError, match="over 4096 bytes"):
        store.announce("a", {"x": "y" * 5000}, 5)
    with pytest.raises(TypeError):
        store.announce("a", {"x": object()}, 5)
    assert store.instances() == []


def test_what_a_store_can_do_is_its_type(store: Store) -> None:
    # Said by the type alone: no flag derived from it.
    for flag in ("supports_lease", "keeps_registry", "keeps_controls", "leases_by_observation"):
        assert not hasattr(store, flag)
    # Every store keeps leases, a registry and controls, but the claim-only one.
    kinds = (LeaseStore, RegistryStore, ControlStore)
    if isinstance(store, ClaimOnlyStore):
        assert not any(isinstance(store, kind) for kind in kinds)
    else:
        assert all(isinstance(store, kind) for kind in kinds)
