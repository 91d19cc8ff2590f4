"""Fencing tokens keep rising after a store forgot its records.

A store restarted without persistence, or failed over to a replica that never got
the last writes, holds no record of a job, or an older one: its next claim is the
job's first again, or follows a token already handed out. A token is therefore the
previous one + 1 or the store's clock in milliseconds, whichever is higher
(``decide.next_token``): a job's tokens rise by one per attempt, far more slowly than
the clock, so the claim after the loss carries a token above every one handed out
before it, and a handler that fences its writes with the token refuses the attempts
from before the loss. (tests/stores/test_redis.py restarts a real server empty between
two attempts; tests/scenarios/test_failover.py checks that no token is handed out twice
across real failovers that lose writes.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from anarchon_core.store import LeaseStore, RunState
from anarchon_core.stores.memory import MemoryStore
from tests.cleanup import drop_namespace
from tests.stores.conftest import StoreFactory
from tests.waiting import wait_until

SLOT = 1_796_000_000_000


def _lease(store: object) -> LeaseStore:
    if not isinstance(store, LeaseStore):
        pytest.skip(f"{type(store).__name__} is claim-only: its token is the slot's time")
    return store


def test_a_jobs_tokens_are_the_stores_clock_or_the_previous_one_plus_one(
    make_store: StoreFactory,
) -> None:
    store = _lease(make_store())
    before = time.time()
    first = store.claim("job", SLOT, "a", 30)
    after = time.time()
    assert first.won and first.holder is not None
    token = first.holder.token
    # The server's clock, on this machine: within a few seconds of the test's.
    assert (before - 5) * 1000 <= token <= (after + 5) * 1000, token
    assert store.finish("job", token, RunState.DONE)
    # Some milliseconds on (a store's clock reads to about one), the clock is above the
    # previous token + 1: the next claim and takeover carry the clock.
    wait_until(lambda: time.time() * 1000 > token + 20, 5, "the clock to move")
    second = store.claim("job", SLOT + 1000, "b", 30)
    assert second.holder is not None
    assert token + 1 < second.holder.token <= (time.time() + 5) * 1000, second.holder.token
    assert store.release("job", second.holder.token)
    third = store.takeover("job", SLOT + 1000, "c", 30, second.holder.token)
    assert third.holder is not None and third.holder.token > second.holder.token
    assert [run.token for run in store.history("job", 5)] == [
        third.holder.token,
        second.holder.token,
        token,
    ]


def _forget(kind: str, url: str, store: LeaseStore) -> LeaseStore | None:
    """The store's records of ``store``'s namespace gone, as after a restart without them;
    a new store for the memory kind (its server is the process)."""
    namespace = store.namespace
    if kind == "memory":
        return MemoryStore(namespace=namespace)
    if kind in ("sqlite", "libsql"):
        rows = {"ns": namespace}
        store._write(  # type: ignore[attr-defined]
            [
                ("DELETE FROM anarchon_jobs WHERE namespace = :ns", rows),
                ("DELETE FROM anarchon_runs WHERE namespace = :ns", rows),
                ("DELETE FROM anarchon_stats WHERE namespace = :ns", rows),
            ]
        )
        return None
    if kind.startswith(("redis", "valkey")):  # a cluster's and a sentinel's too
        client = store.client  # type: ignore[attr-defined]
        for key in list(client.scan_iter(match=f"anarchon:{{{namespace}*", count=1000)):
            client.delete(key)
        return None
    drop_namespace(url, namespace)
    return None


def test_tokens_rise_after_the_store_forgot_every_record(
    kind: str, make_store: StoreFactory, store_url: str, tmp_path: Path
) -> None:
    store = _lease(make_store())
    first = store.claim("job", SLOT, "a", 30)
    assert first.holder is not None and store.finish("job", first.holder.token, RunState.DONE)
    # The attempt that will be stale: running when the store forgets.
    stale = store.claim("job", SLOT + 1000, "a", 30)
    assert stale.holder is not None
    assert store.state("job") is not None
    fresh = _forget(kind, store_url, store)
    if fresh is None:
        store.close()
        fresh = _lease(make_store())  # the same namespace, opened again
    assert fresh.state("job") is None, "the store still holds the job"
    # Some milliseconds on, as any claim after a restart or a failover is.
    wait_until(lambda: time.time() * 1000 > stale.holder.token + 20, 5, "the clock to move")
    again = fresh.claim("job", SLOT + 2000, "b", 30)
    assert again.won and again.holder is not None
    assert again.holder.token > stale.holder.token, (again.holder.token, stale.holder.token)
    # The stale attempt's token is no longer the job's: its end is refused.
    assert not fresh.finish("job", stale.holder.token, RunState.DONE)
