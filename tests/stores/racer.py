"""A racing claimer for the atomicity test, run in its own process."""

from __future__ import annotations

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
