"""A job's counts (Store.stats): kept by the store in the steps they count, on every store."""

from __future__ import annotations

import time

from anarchon_core import Change, RunState, Store
from anarchon_core.store import LeaseStore
from tests.stores.conftest import StoreFactory

SLOT = 1_700_000_000_000


def test_counts_follow_claims_takeovers_and_ends(lease_store: Store) -> None:
    store = lease_store
    assert store.stats(["job"]) == {}
    first = store.claim("job", SLOT, "a", 10).holder
    assert first is not None
    assert store.finish("job", first.token, RunState.DONE)
    assert store.finish("job", first.token, RunState.DONE)  # re-sent: counted once
    before_second = time.time()
    second = store.claim("job", SLOT + 1000, "a", 0.3).holder
    assert second is not None
    assert store.renew("job", second.token, 0.3)  # a renewal counts nothing
    time.sleep(1.0)  # the lease lapses
    taken = store.takeover("job", SLOT + 1000, "b", 10, second.token).holder
    assert taken is not None and taken.attempt == 2
    assert store.finish("job", taken.token, RunState.FAILED)
    third = store.claim("job", SLOT + 2000, "a", 10).holder
    assert third is not None
    assert store.release("job", third.token)  # handed over: neither done nor failed

    stats = store.stats(["job", "never"])
    assert set(stats) == {"job"}
    counted = stats["job"]
    assert (counted.runs, counted.takeovers, counted.done, counted.failed) == (4, 1, 1, 1)
    assert counted.last_success is not None and counted.last_failure is not None
    # Store-clock times: the failure after the success, both about now.
    assert counted.last_success <= counted.last_failure
    assert abs(counted.last_failure - time.time()) < 30
    assert counted.last_success < before_second + 30


def test_counts_are_shared_and_batched_ends_count(make_store: StoreFactory) -> None:
    one, other = make_store("x"), make_store("x")
    if not isinstance(one, LeaseStore):
        assert one.stats(["job"]) == {}
        return
    holders = [one.claim(job, SLOT, "a", 10).holder for job in ("p", "q", "r")]
    assert all(holders)
    changes = [
        Change("p", holders[0].token, RunState.DONE),  # type: ignore[union-attr]
        Change("q", holders[1].token, RunState.FAILED),  # type: ignore[union-attr]
        Change("r", holders[2].token, RunState.RUNNING, 10),  # type: ignore[union-attr]
    ]
    assert one.change_many(changes) == [True, True, True]
    seen = other.stats(["p", "q", "r"])
    assert [(seen[j].runs, seen[j].done, seen[j].failed) for j in "pqr"] == [
        (1, 1, 0),
        (1, 0, 1),
        (1, 0, 0),
    ]
    assert seen["r"].last_success is None and seen["r"].last_failure is None
    assert make_store("elsewhere").stats(["p"]) == {}
