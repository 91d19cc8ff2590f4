"""The RabbitMQ claim-only store against the real broker (amqp_url)."""

from __future__ import annotations

import multiprocessing
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from amqp.exceptions import PreconditionFailed
from kombu import Connection

from anarchon_core import ClaimStatus, StoreUnavailable, open_store
from anarchon_core.errors import ConfigurationError
from anarchon_core.store import LeaseStore
from anarchon_core.stores.rabbitmq import RabbitMQStore

SLOT = 1_700_000_000_000
ROUNDS = 50
MakeStore = Callable[..., RabbitMQStore]


@pytest.fixture
def amqp_url(amqp_url: str) -> str:
    """The broker without the suite's ``?expires=``: these tests set their own and clean up."""
    return amqp_url.split("?", 1)[0]


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}-rmq"


@pytest.fixture
def made(amqp_url: str, namespace: str) -> Iterator[list[RabbitMQStore]]:
    """Stores built by a test; their slot queues are deleted afterwards."""
    stores: list[RabbitMQStore] = []
    yield stores
    for store in stores:
        store.close()
    _delete_queues(amqp_url, namespace)


@pytest.fixture
def make(amqp_url: str, namespace: str, made: list[RabbitMQStore]) -> MakeStore:
    def build(**options: Any) -> RabbitMQStore:
        options.setdefault("expires", 120)
        store = RabbitMQStore.from_url(amqp_url, namespace=namespace, **options)
        made.append(store)
        return store

    return build


def _delete_queues(url: str, namespace: str) -> None:
    """Tests leave no queue behind (the broker is shared): delete the ones they may make."""
    names = RabbitMQStore.from_url(url, namespace=namespace)
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for job in ("job", "race"):
            for k in range(ROUNDS):
                channel.queue_delete(names.queue_name(job, SLOT + k))
    names.close()


def _raw_channel(url: str) -> Any:
    conn = Connection(url, connect_timeout=5)
    return conn, conn.channel()


def _racer(url: str, namespace: str, i: int, rounds: int, barrier: Any, out: Any) -> None:
    store = RabbitMQStore.from_url(url, namespace=namespace, expires=120)
    wins = []
    for r in range(rounds):
        barrier.wait(30)
        if store.claim("race", SLOT + r, f"p{i}", 10).won:
            wins.append(r)
    store.close()
    out.put(wins)


def test_racing_processes_get_exactly_one_winner(
    amqp_url: str, namespace: str, made: list[RabbitMQStore]
) -> None:
    """8 processes, each with its own connection, race for the same slot, 50 rounds."""
    ctx = multiprocessing.get_context("spawn")
    n, rounds = 8, ROUNDS
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(amqp_url, namespace, i, rounds, barrier, out))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    per_round = [sum(r in wins for wins in results) for r in range(rounds)]
    assert per_round == [1] * rounds


def test_claim_queue_has_the_specified_arguments(amqp_url: str, make: MakeStore) -> None:
    store = make()
    assert store.claim("job", SLOT, "a", 10).won
    name = store.queue_name("job", SLOT)
    assert name.startswith(f"anarchon.{store.namespace}.") and name.endswith(f".{SLOT}")
    assert store.queue_arguments == {
        "x-max-length": 1,
        "x-overflow": "reject-publish",
        "x-queue-type": "classic",
        "x-expires": 120_000,
    }
    conn, channel = _raw_channel(amqp_url)
    with conn:
        # The broker accepts a re-declaration only with equivalent arguments.
        same = dict(store.queue_arguments)
        _, messages, _ = channel.queue_declare(
            name, durable=True, auto_delete=False, arguments=same
        )
        assert messages == 1
        for change in ({"x-max-length": 2}, {"x-overflow": "drop-head"}, {"x-expires": 60_000}):
            with pytest.raises(PreconditionFailed):
                channel.queue_declare(
                    name, durable=True, auto_delete=False, arguments={**same, **change}
                )
            channel = conn.channel()
    assert store.claim("job", SLOT, "b", 10).status is ClaimStatus.TAKEN


def test_expires_is_configurable(amqp_url: str, namespace: str, make: MakeStore) -> None:
    default = RabbitMQStore(url=amqp_url)
    assert default.queue_arguments["x-expires"] == 24 * 3600 * 1000
    default.close()
    two_hours = make(expires="2h")
    assert two_hours.queue_arguments["x-expires"] == 7_200_000
    from_url = open_store(f"{amqp_url}?expires=90s&timeout=2", namespace=namespace)
    assert isinstance(from_url, RabbitMQStore)
    assert (from_url.expires, from_url.timeout) == (90, 2)
    from_url.close()
    with pytest.raises(ConfigurationError, match="at least"):
        RabbitMQStore(url=amqp_url, expires=10)
    with pytest.raises(ConfigurationError, match="unknown option"):
        open_store(f"{amqp_url}?lease=5", namespace=namespace)
    # Instances configured differently still share the slot's queue: no second winner.
    assert two_hours.claim("job", SLOT, "a", 10).won
    other = make(expires="3h")
    assert other.claim("job", SLOT, "b", 10).status is ClaimStatus.TAKEN
    assert other.claim("job", SLOT + 1, "b", 10).won


def test_a_dropped_socket_is_replaced_on_the_next_claim(make: MakeStore) -> None:
    store = make()
    assert store.claim("job", SLOT, "a", 10).won
    store._conn.connection.sock.shutdown(socket.SHUT_RDWR)
    claim = store.claim("job", SLOT + 1, "a", 10)
    assert claim.won


def test_a_connection_closed_by_the_broker_is_replaced(make: MakeStore) -> None:
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not available")
    store = make()
    assert store.claim("job", SLOT, "a", 10).won
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.splitlines()
    ours = [line.split()[0] for line in listing if f'"anarchon {store.namespace}"' in line]
    if not ours:
        pytest.skip("rabbitmqctl cannot list this broker's connections")
    subprocess.run(["rabbitmqctl", "close_connection", ours[0], "test"], check=True, timeout=60)
    assert store.claim("job", SLOT, "b", 10).status is ClaimStatus.TAKEN
    assert store.claim("job", SLOT + 1, "a", 10).won


def test_an_unreachable_or_silent_broker_raises_store_unavailable_quickly() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # accepts TCP connections but never speaks AMQP
        port = silent.getsockname()[1]
        store = RabbitMQStore(url=f"amqp://guest:guest@127.0.0.1:{port}//", timeout=0.5)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.claim("job", SLOT, "a", 10)
        assert time.monotonic() - started < 3
        store.close()
    refused = RabbitMQStore(url=f"amqp://guest:guest@127.0.0.1:{port}//", timeout=0.5)
    with pytest.raises(StoreUnavailable):
        refused.claim("job", SLOT, "a", 10)
    refused.close()


def test_the_password_never_shows(amqp_url: str) -> None:
    secret = "s3cret-pw-XYZ"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there
    for url in (
        f"amqp://guest:{secret}@127.0.0.1:{port}//",
        f"amqp://guest:{secret}@127.0.0.1:5672//",  # refused login on the real broker
    ):
        store = RabbitMQStore.from_url(url, namespace="t-secret", timeout=2)
        assert secret not in repr(store)
        with pytest.raises(StoreUnavailable) as caught:
            store.claim("job", SLOT, "a", 10)
        assert secret not in str(caught.value)
        assert "***" in str(caught.value)
        store.close()


def test_a_borrowed_connection_stays_open(amqp_url: str, namespace: str) -> None:
    conn = Connection(amqp_url, connect_timeout=5)
    try:
        store = RabbitMQStore(connection=conn, namespace=namespace)
        assert "guest:***@" in repr(store)
        assert store.claim("job", SLOT, "a", 10).won
        store.close()
        assert conn.connected
        assert (
            not RabbitMQStore(connection=conn, namespace=namespace).claim("job", SLOT, "b", 10).won
        )
    finally:
        conn.release()
        _delete_queues(amqp_url, namespace)


def test_a_claim_only_store_keeps_no_lease_and_records_nothing(make: MakeStore) -> None:
    store = make()
    holder = store.claim("job", SLOT, "a", 10).holder
    assert holder is not None and (holder.attempt, holder.token) == (1, SLOT)
    # No lease: nothing to renew or take over, and it does not pretend to.
    assert not isinstance(store, LeaseStore) and not isinstance(store, LeaseStore)
    assert not hasattr(store, "renew") and not hasattr(store, "takeover")
    # Nor to hand off, end or hand over: the engine sends none of those to it.
    for step in ("change_many", "dispatch", "finish", "release"):
        assert not hasattr(store, step)
    assert (store.states(["job"]), store.history("job"), store.jobs()) == ({}, [], [])


def test_one_store_is_safe_across_threads(make: MakeStore) -> None:
    store = make()
    wins: list[int] = []
    threads = [
        threading.Thread(target=lambda: wins.append(store.claim("job", SLOT, "a", 10).won))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]
