"""One-off runs in the store (``OnceStore``): a set of (job, due time) entries read by due time.

``add_once`` writes entries (idempotent: the same job and time again only
changes the value), ``once_due(until, limit, after)`` answers those due, oldest
first, from the store's index on the due time, ``remove_once`` removes one,
``pending_once`` lists them for status. On every store that keeps records;
RabbitMQ, claim-only, refuses them naming why.

The due read of 100,000 pending entries is checked to be an index read, each
store in the honest way it allows: the plan of the SQL statement (SQLite,
libSQL, PostgreSQL, MySQL), the commands the server ran (Redis, Valkey: its
MONITOR), the bytes the client received (NATS).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from anarchon_core import ConfigurationError, Store, open_store
from anarchon_core.store import OnceEntry, OnceStore, onces
from tests.stores.conftest import StoreFactory
from tests.stores.monitor import script_commands

BASE = 1_800_000_000_000
#: The most bytes a due read of 10 entries may receive from NATS: a listing of every
#: pending entry's subject would be over 5 MB.
NATS_READ_BYTES = 64_000


@pytest.fixture
def once_store(kind: str, store: Store) -> OnceStore:
    if kind == "rabbitmq":
        pytest.skip("RabbitMQ is claim-only: it keeps no one-offs")
    return onces(store)


def test_entries_are_read_by_due_time_from_any_connection_and_removed_once(
    once_store: OnceStore, make_store: StoreFactory
) -> None:
    store = once_store
    assert store.once_due(BASE + 10**9, 10) == []
    entries = [
        OnceEntry(BASE + 3000, "b", '{"by":"x"}'),
        OnceEntry(BASE + 1000, "a"),
        OnceEntry(BASE + 3000, "a", '{"by":"y"}'),
        OnceEntry(BASE + 2000, "nightly report"),
        OnceEntry(BASE + 9000, "a"),
    ]
    store.add_once(entries)
    due = store.once_due(BASE + 3000, 10)
    assert [(e.due_ms, e.job) for e in due] == [
        (BASE + 1000, "a"),
        (BASE + 2000, "nightly report"),
        (BASE + 3000, "a"),
        (BASE + 3000, "b"),
    ]
    assert [json.loads(e.value) for e in due] == [{}, {}, {"by": "y"}, {"by": "x"}]
    # The limit, and a cursor: the entries after one (the tie on a due time broken by job).
    assert store.once_due(BASE + 3000, 2) == due[:2]
    assert store.once_due(BASE + 3000, 10, after=due[2].key) == due[3:]
    assert store.once_due(BASE + 10_000, 10, after=due[3].key) == [entries[4]]
    # Another store object of the namespace (another connection) reads the same.
    other = onces(make_store())
    assert other.once_due(BASE + 3000, 10) == due
    # Added again: one entry, its value replaced.
    store.add_once([OnceEntry(BASE + 1000, "a", '{"by":"again"}')])
    again = store.once_due(BASE + 1000, 10)
    assert [(e.key, e.value) for e in again] == [((BASE + 1000, "a"), '{"by":"again"}')]
    assert [e.key for e in store.pending_once()] == [e.key for e in sorted(entries)]
    assert [e.key for e in store.pending_once("a")] == [
        (BASE + 1000, "a"),
        (BASE + 3000, "a"),
        (BASE + 9000, "a"),
    ]
    assert len(store.pending_once(limit=2)) == 2
    assert store.pending_once("nobody") == []
    # Removed once: whoever removes it first.
    assert other.remove_once("a", BASE + 1000) is True
    assert store.remove_once("a", BASE + 1000) is False
    assert [e.key for e in store.once_due(BASE + 3000, 10)] == [e.key for e in due[1:]]


def test_namespaces_keep_their_one_offs_apart(
    once_store: OnceStore, make_store: StoreFactory
) -> None:
    once_store.add_once([OnceEntry(BASE, "job")])
    elsewhere = onces(make_store("elsewhere"))
    assert elsewhere.once_due(BASE + 1, 10) == []
    assert elsewhere.remove_once("job", BASE) is False
    assert [e.key for e in once_store.once_due(BASE + 1, 10)] == [(BASE, "job")]


def test_bad_entries_are_refused_before_anything_is_written(once_store: OnceStore) -> None:
    store = once_store
    good = OnceEntry(BASE, "ok")
    for bad in (
        OnceEntry(BASE, ""),
        OnceEntry(-1, "job"),
        OnceEntry(BASE, "job", "x" * 2000),
        OnceEntry(BASE, "job", "[1]"),
    ):
        with pytest.raises((ValueError, ConfigurationError)):
            store.add_once([good, bad])
    assert store.pending_once() == []
    for limit in (0, 10_001, True):
        with pytest.raises(ValueError):
            store.once_due(BASE, limit)


def test_a_claim_only_store_keeps_no_one_offs_and_says_why(kind: str, store: Store) -> None:
    if kind != "rabbitmq":
        pytest.skip("a store that keeps records keeps one-offs")
    assert not isinstance(store, OnceStore)
    with pytest.raises(ConfigurationError, match="keeps no one-off runs"):
        onces(store)


@pytest.mark.timeout(300)
def test_100000_pending_the_due_read_answers_the_due_ones_from_the_index(
    kind: str, once_store: OnceStore, store_url: str
) -> None:
    store = once_store
    # 100,000 entries a second apart (27 hours of them), 20 jobs. On NATS, each
    # publish awaits its acknowledgement within the request timeout: the add goes
    # through a connection with a longer one (CI runs ten test processes on two
    # cores; the reads below keep the default).
    entries = [OnceEntry(BASE + i * 1000, f"job-{i % 20}") for i in range(100_000)]
    if kind.startswith("nats"):
        adder = open_store(store_url, namespace=store.namespace, timeout=20)
        try:
            onces(adder).add_once(entries)
        finally:
            adder.close()
        store.ping()  # connected before its reads are watched
    else:
        store.add_once(entries)
    until = BASE + 9_999
    expected = [(BASE + i * 1000, f"job-{i % 20}") for i in range(10)]
    with _watching(kind, store) as seen:
        due = store.once_due(until, 500)
    assert [e.key for e in due] == expected
    assert [e.key for e in store.once_due(until, 4)] == expected[:4]
    assert [e.key for e in store.once_due(until, 500, after=expected[7])] == expected[8:]
    _assert_index_read(kind, store, store_url, until, seen)
    if kind.startswith("nats"):
        # The status listing names every entry's subject (the server sends all 100,000
        # in its answer): the longer timeout again, as for the add.
        lister = open_store(store_url, namespace=store.namespace, timeout=20)
        try:
            assert len(onces(lister).pending_once(limit=1000)) == 1000
        finally:
            lister.close()
    else:
        assert len(store.pending_once(limit=1000)) == 1000


class _Seen:
    """What the server ran inside scripts during a read (Redis, Valkey), or sent back (NATS)."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.received = 0


@contextlib.contextmanager
def _watching(kind: str, store: OnceStore) -> Iterator[_Seen]:
    """Watches the server while a read runs: MONITOR on Redis and Valkey (the commands
    its scripts ran on the one-offs' keys), the bytes the client received on NATS."""
    seen = _Seen()
    if kind in ("redis", "valkey"):
        client: Any = store.client  # type: ignore[attr-defined]
        keys = store._once_keys  # type: ignore[attr-defined]
        with script_commands(client, keys[:1], seen.commands):
            yield seen
    elif kind.startswith("nats"):
        start = store._nc.stats["in_bytes"]  # type: ignore[attr-defined]
        yield seen
        seen.received = store._nc.stats["in_bytes"] - start  # type: ignore[attr-defined]
    else:
        yield seen


def _assert_index_read(kind: str, store: OnceStore, url: str, until: int, seen: _Seen) -> None:
    """The due read is a range read of the index, not a scan of the 100,000 entries."""
    if kind == "sqlite":
        from anarchon_core.stores import _sql

        text, names = _sql.positional(_sql.ONCE_DUE)
        values = {"ns": store.namespace, "until": until, "from": -1, "after": "", "limit": 500}
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            plan = conn.execute("EXPLAIN QUERY PLAN " + text, [values[n] for n in names]).fetchall()
        said = " ".join(str(row[-1]) for row in plan)
        assert "SEARCH anarchon_once USING PRIMARY KEY" in said and "due_ms<" in said, said
        assert "SCAN" not in said, said
    elif kind == "libsql":
        from anarchon_core.stores import _sql

        values = {"until": until, "from": -1, "after": "", "limit": 500}
        with store._transaction(write=False) as conn:  # type: ignore[attr-defined]
            plan = store._run(conn, "EXPLAIN QUERY PLAN " + _sql.ONCE_DUE, **values).fetchall()  # type: ignore[attr-defined]
        said = " ".join(str(row[-1]) for row in plan)
        assert "SEARCH anarchon_once USING PRIMARY KEY" in said and "SCAN" not in said, said
    elif kind.startswith("postgres"):
        statements = store._once_statements()  # type: ignore[attr-defined]
        table = statements["create"].split(b"EXISTS ", 1)[1].split(b" ", 1)[0]
        params = {"until": until, "from": -1, "after": "", "limit": 500}
        with store._connection() as conn:  # type: ignore[attr-defined]
            conn.execute(b"ANALYZE " + table)
            plan = " ".join(r[0] for r in conn.execute(b"EXPLAIN " + statements["due"], params))
        assert "Index Scan using" in plan or "Index Only Scan using" in plan, plan
        assert "Seq Scan" not in plan, plan
    elif kind == "mysql":
        from anarchon_core.stores.mysql import _ONCE

        sql = "EXPLAIN " + _ONCE["due"].format(once=store._once_name)  # type: ignore[attr-defined]
        with store._cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(sql, (until, -1, -1, "", 500))
            columns = [d[0] for d in cur.description]
            (row,) = cur.fetchall()
        plan = dict(zip(columns, row, strict=True))
        assert (plan["key"], plan["type"]) == ("PRIMARY", "range"), plan
    elif kind in ("redis", "valkey"):
        # The server ran one range read of the index, with its limit, and read the values
        # of the entries it answered: nothing that walks the whole set.
        verbs = [command.split()[0].upper() for command in seen.commands]
        assert verbs == ["ZRANGEBYLEX", "HMGET"], seen.commands
        assert seen.commands[0].endswith(" LIMIT 0 500"), seen.commands
        assert len(seen.commands[1].split()) == 2 + 10, seen.commands  # the 10 answered
    elif kind.startswith("nats"):
        assert 0 < seen.received < NATS_READ_BYTES, seen.received
    else:
        assert kind in ("memory", "redis-cluster", "redis-sentinel"), kind
