"""Racing claimers: one for the atomicity test, run in its own process, and threads
claiming batches in any order (the SQL stores' row locks)."""

from __future__ import annotations

import random
import threading
from typing import Any

from anarchon_core import RunState, open_store
from anarchon_core.store import LeaseStore

#: The racers' barrier, given to each racer process as it starts (:func:`join`).
_barrier: Any = None


def join(barrier: Any) -> None:
    """A pool's initializer: the barrier the racers of this pool meet at each round."""
    global _barrier
    _barrier = barrier


def race(url: str, namespace: str, index: int, rounds: int, slot: int) -> list[int]:
    """Claim ``rounds`` slots in lockstep with the other racers; 1 where this one won."""
    barrier = _barrier
    store = open_store(url, namespace=namespace)
    won = []
    try:
        for r in range(rounds):
            barrier.wait()
            claim = store.claim("race", slot + r, f"racer{index}", 10)
            won.append(int(claim.won))
            if claim.won and isinstance(store, LeaseStore):
                assert claim.holder is not None
                store.finish("race", claim.holder.token, RunState.DONE)
    finally:
        store.close()
    return won


def batches_in_any_order(stores: list[Any], slot: int, rounds: int = 10) -> None:
    """``stores`` (of one namespace, one per instance) claim the same 40 jobs each round,
    each batch in its own order, from threads that meet at a barrier: no call fails
    (no deadlock), every job is won once per round, and every answer names that round.
    """
    from anarchon_core import ClaimRequest

    jobs = [f"job{k:02}" for k in range(40)]
    barrier = threading.Barrier(len(stores))
    wins: list[list[str]] = [[] for _ in range(rounds)]
    errors: list[BaseException] = []

    def tick(i: int) -> None:
        order = random.Random(i).sample(jobs, len(jobs))
        try:
            for r in range(rounds):
                barrier.wait()
                requests = [ClaimRequest(job, slot + r * 1000, 0) for job in order]
                claims = stores[i].claim_many(requests, f"i{i}")
                assert all(
                    c.holder is not None and c.holder.slot_ms == slot + r * 1000 for c in claims
                )
                wins[r] += [req.job for req, c in zip(requests, claims, strict=True) if c.won]
        except BaseException as exc:  # the test reads every error
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=tick, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert [sorted(won) for won in wins] == [jobs] * rounds


def race_to_limit(
    url: str, namespace: str, index: int, rounds: int, slot: int, limit: int
) -> list[str]:
    """Claim a slot of one's own each round, with ``limit``, in lockstep with the other
    racers (who claim theirs); a won run ends at once. Each claim's answer."""
    barrier = _barrier
    store = open_store(url, namespace=namespace)
    try:
        return [
            _limited_claim(store, index, slot + r * 1000, limit, barrier) for r in range(rounds)
        ]
    finally:
        store.close()


def _limited_claim(store: Any, index: int, round_slot: int, limit: int, barrier: Any) -> str:
    """One racer's claim of a round (its own slot of it), once every racer is there."""
    barrier.wait()
    claim = store.claim("limited", round_slot + index, f"racer{index}", 10, limit)
    if claim.won:
        assert claim.holder is not None
        assert store.finish("limited", claim.holder.token, RunState.DONE)
    return str(claim.status.value)
