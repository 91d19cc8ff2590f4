"""A batch with one job the store refuses: the others go through, and are answered.

Redis (one script call for many jobs, or one per job on a cluster) and NATS
(one compare-and-set per job at once) apply a batch's items one by one. A
record one job carries that the server refuses (here: a key of the wrong
type, a value that is not a record) must cost that job alone: the other
claims of the batch were won and their answers are given back, not lost with
the failed item (which would leave their slots to wait out a lease).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from anarchon_core import (
    BatchRefused,
    Change,
    ClaimRequest,
    ClaimStatus,
    Event,
    RunState,
    Scheduler,
    Store,
    open_store,
)
from tests.cleanup import drop_namespace

SLOT = 1_700_000_000_000

KINDS = ["redis_url", "valkey_url", "redis_cluster_url", "nats_url"]


def poisoner(url: str, store: Store) -> Callable[[str], None]:
    """Something that writes, where ``job``'s record lives, a value no record can be."""
    if url.startswith("nats"):
        from anarchon_core.stores.nats import job_key

        async def put(job: str) -> None:
            import nats

            client = await nats.connect(url)
            try:
                kv = await client.jetstream().key_value(store.bucket)  # type: ignore[attr-defined]
                await kv.put(job_key(job), b"not a record")
            finally:
                await client.close()

        return lambda job: asyncio.run(put(job))
    client = store.client  # type: ignore[attr-defined]
    return lambda job: client.set(f"anarchon:{{{store.namespace}/{job}}}:rec", "not a hash")


@pytest.fixture(params=KINDS, ids=[k.removesuffix("_url") for k in KINDS])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


@pytest.fixture
def namespace(url: str) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    drop_namespace(url, name)


def test_the_other_claims_and_changes_of_the_batch_go_through_and_are_answered(
    url: str, namespace: str
) -> None:
    store = open_store(url, namespace=namespace)
    try:
        store.claim("bad", SLOT - 10_000, "x", 10)  # its record exists: the write replaces it
        poisoner(url, store)("bad")
        requests = [ClaimRequest(job, SLOT, 10) for job in ("a", "bad", "c")]
        with pytest.raises(BatchRefused) as refused:
            store.claim_many(requests, "x")
        a, bad, c = refused.value.answers
        assert isinstance(bad, Exception)
        assert a.won and c.won and a.holder and c.holder
        # Won for real: another instance finds them taken by x.
        again = store.claim_many([ClaimRequest(job, SLOT, 10) for job in ("a", "c")], "y")
        assert [(claim.status, claim.holder and claim.holder.owner) for claim in again] == [
            (ClaimStatus.TAKEN, "x"),
            (ClaimStatus.TAKEN, "x"),
        ]
        changes = [
            Change("a", a.holder.token, RunState.DONE),
            Change("bad", 1, RunState.DONE),
            Change("c", c.holder.token, RunState.DONE),
        ]
        with pytest.raises(BatchRefused) as refused:
            store.change_many(changes)
        done_a, bad_end, done_c = refused.value.answers
        assert (done_a, done_c) == (True, True) and isinstance(bad_end, Exception)
        assert [store.state(job).state for job in ("a", "c")] == [RunState.DONE] * 2  # type: ignore[union-attr]
        # A single call raises the store's own error, as before.
        with pytest.raises(Exception) as single:
            store.claim("bad", SLOT, "x", 10)
        assert not isinstance(single.value, BatchRefused)
    finally:
        store.close()


def test_a_job_the_store_refuses_does_not_delay_the_others(url: str, namespace: str) -> None:
    events: list[Event] = []
    runs: list[tuple[str, float]] = []
    poisoned_ran, ran = threading.Event(), threading.Event()

    def healthy(run: object) -> None:
        if poisoned_ran.is_set():  # counted once the other job's record went bad
            runs.append((run.slot_id, time.time() - run.slot.timestamp()))  # type: ignore[attr-defined]
        if len(runs) >= 3:
            ran.set()

    cron = Scheduler(url, namespace=namespace, instance="a", listener=events.append)
    cron.add_job(healthy, name="healthy", every=1, jitter=0)
    cron.add_job(lambda: poisoned_ran.set(), name="poisoned", every=1, jitter=0)
    cron.start()
    try:
        # Both jobs claimed together each second; then one's record goes bad.
        assert poisoned_ran.wait(5), [str(e) for e in events]
        poisoner(url, cron.store)("poisoned")
        assert ran.wait(8), "\n".join(str(e) for e in events)
    finally:
        cron.stop()
    # Every slot of the healthy job ran on time, once, by its claim: none waited
    # for a lease to lapse and was taken over.
    assert len({slot for slot, _ in runs}) == len(runs)
    assert all(late < 1.0 for _, late in runs), (runs, [str(e) for e in events])
    assert not [e for e in events if e.kind in ("takeover", "lost") and e.job == "healthy"]
    refused = [e for e in events if e.kind == "store_refused"]
    assert refused and {e.job for e in refused} == {"poisoned"}


@pytest.mark.parametrize("kind", ["postgres_url", "postgres18_url"])
def test_a_transaction_the_server_refuses_is_answered_item_by_item(
    kind: str, request: pytest.FixtureRequest
) -> None:
    # PostgreSQL text cannot hold NUL: the server refuses that claim alone,
    # and the batch's transaction with it; the other claim is still answered.
    url = str(request.getfixturevalue(kind))
    name = f"t{uuid.uuid4().hex[:10]}"
    store = open_store(url, namespace=name)
    try:
        requests = [ClaimRequest("a", SLOT, 10), ClaimRequest("bad\x00", SLOT, 10)]
        with pytest.raises(BatchRefused) as refused:
            store.claim_many(requests, "x")
        won, bad = refused.value.answers
        assert won.won and isinstance(bad, Exception)
        assert store.claim("a", SLOT, "y", 10).status is ClaimStatus.TAKEN
        with pytest.raises(BatchRefused) as refused:
            store.change_many(
                [Change("a", won.holder.token, RunState.DONE), Change("bad\x00", 1, RunState.DONE)]
            )
        assert refused.value.answers[0] is True and isinstance(refused.value.answers[1], Exception)
    finally:
        store.close()
        drop_namespace(url, name)


def test_a_bug_in_a_nats_step_is_raised_not_refused(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anarchon_core.stores.nats import NatsStore

    name = f"t{uuid.uuid4().hex[:10]}"
    store = open_store(nats_url, namespace=name)
    try:
        store.claim("a", SLOT - 10_000, "x", 10)

        def broken(*args: object) -> None:
            raise TypeError("a bug")

        monkeypatch.setattr(NatsStore, "_state", broken)
        with pytest.raises(TypeError, match="a bug"):
            store.claim_many([ClaimRequest("a", SLOT, 10), ClaimRequest("b", SLOT, 10)], "x")
    finally:
        monkeypatch.undo()
        store.close()
        drop_namespace(nats_url, name)
