"""What the Redis/Valkey store promises beyond the contract, on real servers."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from anarchon_core import Change, ClaimRequest, ClaimStatus, RunState
from anarchon_core.errors import ConfigurationError, StoreUnavailable
from anarchon_core.stores.redis import RedisStore
from tests import servers
from tests.cleanup import drop_namespace
from tests.stores.monitor import script_commands
from tests.waiting import wait_until

SLOT = 1_700_000_000_000


@pytest.fixture(params=["redis_url", "valkey_url"], ids=["redis", "valkey"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


@pytest.fixture
def namespace(url: str) -> Iterator[str]:
    namespace = f"t{uuid.uuid4().hex[:10]}"
    yield namespace
    for name in (namespace, f"{namespace}:a"):
        drop_namespace(url, name)


@pytest.fixture
def store(url: str, namespace: str) -> Iterator[RedisStore]:
    store = RedisStore.from_url(url, namespace=namespace)
    yield store
    store.close()


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_scripts_survive_script_flush(store: RedisStore) -> None:
    holder = store.claim("job", SLOT, "a", 10).holder
    assert holder is not None
    store.client.script_flush()
    assert store.renew("job", holder.token, 20)
    store.client.script_flush()
    assert store.release("job", holder.token)
    store.client.script_flush()
    assert store.takeover("job", SLOT, "b", 10, holder.token).won
    store.client.script_flush()
    # The batched claim sends raw EVALSHAs in one pipeline: each NOSCRIPT is sent again.
    claims = store.claim_many([ClaimRequest("x", SLOT, 10), ClaimRequest("y", SLOT, 10)], "b")
    assert [c.status for c in claims] == [ClaimStatus.WON, ClaimStatus.WON]
    assert store.jobs() == ["job", "x", "y"]


def test_all_keys_of_a_job_share_one_hash_slot(store: RedisStore, namespace: str) -> None:
    jobs = ["job", "we{ird}", "}x{", "a/b", "ünï:code"]
    for k in range(2):
        for claim in store.claim_many([ClaimRequest(j, SLOT + k, 10) for j in jobs], "a"):
            assert claim.holder is not None
            store.finish(claim.holder.job, claim.holder.token, RunState.DONE)
    found = [
        key.decode()
        for key in store.client.scan_iter(match=f"anarchon:{{{namespace}/*", count=1000)
    ]
    by_job: dict[str, list[str]] = defaultdict(list)
    for key in found:
        by_job[key.rsplit(":", 1)[0]].append(key)
    assert len(by_job) == len(jobs) and len(found) == 2 * len(jobs)
    for keys in by_job.values():
        assert sorted(k.rsplit(":", 1)[1] for k in keys) == ["rec", "runs"]
        assert len({key_slot(k.encode()) for k in keys}) == 1


def test_namespaces_with_colons_do_not_collide(url: str, namespace: str) -> None:
    left = RedisStore.from_url(url, namespace=f"{namespace}:a")
    right = RedisStore.from_url(url, namespace=namespace)
    try:
        assert left.claim("b", SLOT, "l", 10).won
        assert right.claim("a:b", SLOT, "r", 10).won
        assert left.jobs() == ["b"] and right.jobs() == ["a:b"]
    finally:
        left.close()
        right.close()


def test_the_lease_is_measured_by_the_server_clock(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process's clock is an hour off; the lease must not notice.
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
    before = server_ms(store.client)
    holder = store.claim("job", SLOT, "a", 10).holder
    after = server_ms(store.client)
    assert holder is not None and holder.lease_remaining == 10
    raw = store.client.hget(f"anarchon:{{{store.namespace}/job}}:rec", "expires")
    assert raw is not None
    expires = int(raw)
    assert before + 10_000 <= expires <= after + 10_000
    state = store.state("job")
    assert state is not None
    assert abs(state.lease_remaining - (expires - server_ms(store.client)) / 1000) < 0.05
    # A short lease lapses by the server's clock, not before.
    short = store.claim("quick", SLOT, "a", 0.3).holder
    assert short is not None
    assert not store.takeover("quick", SLOT, "b", 10, short.token).won
    time.sleep(0.35)
    assert store.takeover("quick", SLOT, "b", 10, short.token).won


def test_claim_many_and_change_many_are_one_round_trip_each(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    execute = redis.client.Pipeline.execute
    command = redis.Redis.execute_command

    def counted_execute(self: redis.client.Pipeline, raise_on_error: bool = True) -> object:
        calls.append("pipeline")
        return execute(self, raise_on_error)

    def counted_command(self: redis.Redis, *args: object, **options: object) -> object:
        calls.append(str(args[0]))
        return command(self, *args, **options)  # type: ignore[no-untyped-call]

    warm = store.claim("warm", SLOT, "a", 10).holder  # the scripts are loaded by now
    assert warm is not None and store.renew("warm", warm.token, 10)
    monkeypatch.setattr(redis.client.Pipeline, "execute", counted_execute)
    monkeypatch.setattr(redis.Redis, "execute_command", counted_command)
    claims = store.claim_many([ClaimRequest(f"j{i}", SLOT, 10) for i in range(20)], "a")
    assert all(c.won for c in claims)
    assert len(store.states(f"j{i}" for i in range(20))) == 20
    assert calls == ["pipeline", "pipeline"]
    calls.clear()
    ends = [
        Change(f"j{i}", c.holder.token, RunState.DONE) for i, c in enumerate(claims) if c.holder
    ]
    assert store.change_many(ends) == [True] * 20
    assert calls == ["pipeline"]


def _job_commands(store: RedisStore, job: str, step: Callable[[], object]) -> list[str]:
    """The commands the scripts ran on ``job``'s keys while ``step`` ran (MONITOR)."""
    seen: list[str] = []
    with script_commands(store.client, store._keys(job), seen):
        step()
    return [command.split()[0].upper() for command in seen]


def test_each_step_reads_and_writes_a_record_once(store: RedisStore) -> None:
    """What a slot costs the server: a claim reads the record's hash once, writes it
    once and pushes one history entry; a hand-off, a renewal or an end read and
    write the hash once each. The history stays whole."""
    first = store.claim("job", SLOT, "a", 10).holder
    assert first is not None and store.finish("job", first.token, RunState.DONE)
    claimed: list[object] = []
    assert _job_commands(
        store, "job", lambda: claimed.append(store.claim("job", SLOT + 1000, "b", 10, limit=5))
    ) == ["HMGET", "LPUSH", "HSET"]
    (won,) = claimed
    assert won.holder is not None and won.holder.token > first.token  # type: ignore[attr-defined]
    token = won.holder.token  # type: ignore[attr-defined]
    for change in (
        lambda: store.dispatch("job", token, 30),
        lambda: store.renew("job", token, 10),
        lambda: store.finish("job", token, RunState.FAILED),
    ):
        assert _job_commands(store, "job", change) == ["HMGET", "HSET"]
    history = store.history("job")
    assert [(r.slot_ms, r.state, r.owner) for r in history] == [
        (SLOT + 1000, RunState.FAILED, "b"),
        (SLOT, RunState.DONE, "a"),
    ]
    assert all(r.ended_at is not None and r.ended_at >= r.started_at for r in history)
    stats = store.stats(["job"])["job"]
    assert (stats.runs, stats.done, stats.failed) == (2, 1, 1)
    assert stats.last_failure is not None and stats.last_success is not None


def test_the_history_is_cut_back_now_and_then_and_always_reads_its_newest_50(
    store: RedisStore,
) -> None:
    ends = [RunState.DONE, RunState.FAILED, RunState.RELEASED]
    for k in range(70):
        holder = store.claim("job", SLOT + k * 1000, "a", 10).holder
        assert holder is not None
        assert store.change_many([Change("job", holder.token, ends[k % 3])]) == [True]
    held = store.client.llen(store._keys("job")[1])
    assert 50 <= held <= 50 + 16
    history = store.history("job", 100)
    assert [r.slot_ms for r in history] == [SLOT + k * 1000 for k in range(69, 19, -1)]
    assert [r.state for r in history] == [ends[k % 3] for k in range(69, 19, -1)]


def test_a_history_an_earlier_release_closed_in_place_reads_the_same(
    store: RedisStore,
) -> None:
    """Entries an earlier release wrote (each closed in place when its run ended, no
    ``prev``) are read as they are, beside and below the entries written now; a
    lapsed run of that release is told lost by the takeover's entry."""
    rk, hk = store._keys("job")
    now = server_ms(store.client)
    old = {"slot": SLOT, "attempt": 1, "token": 1, "owner": "old", "state": "done"}
    store.client.rpush(hk, json.dumps({**old, "started": now - 5000, "ended": now - 4000}))
    running = {"slot": SLOT + 1000, "attempt": 1, "token": 2, "owner": "old"}
    store.client.lpush(hk, json.dumps({**running, "state": "running", "started": now - 3000}))
    store.client.hset(
        rk,
        mapping={
            "slot": SLOT + 1000, "owner": "old", "attempt": 1, "token": 2,
            "state": "running", "expires": now - 1000, "n_runs": 2,
        },
    )  # fmt: skip
    before = store.history("job")
    assert [(r.token, r.state) for r in before] == [(2, RunState.RUNNING), (1, RunState.DONE)]
    taken = store.takeover("job", SLOT + 1000, "new", 10, 2).holder
    assert taken is not None and taken.token >= now  # the server's clock in ms
    after = store.history("job")
    assert [(r.token, r.attempt, r.owner, r.state) for r in after] == [
        (taken.token, 2, "new", RunState.RUNNING),
        (2, 1, "old", RunState.LOST),
        (1, 1, "old", RunState.DONE),
    ]
    assert after[1].ended_at is not None and after[2].ended_at == (now - 4000) / 1000
    assert store.stats(["job"])["job"].runs == 3


def test_a_client_passed_in_is_used_and_left_open(url: str, namespace: str) -> None:
    plain = url.replace("valkey://", "redis://", 1)
    client = redis.Redis.from_url(plain, decode_responses=True, socket_timeout=3)
    store = RedisStore(client=client, namespace=namespace)
    assert store.claim("job", SLOT, "a", 10).won
    state = store.state("job")
    assert state is not None and state.owner == "a"
    assert store.history("job")[0].owner == "a"
    store.close()
    assert client.ping()
    client.close()


# -- URLs and passwords ---------------------------------------------------


def test_valkey_and_tls_schemes_map_to_redis_py_connections() -> None:
    plain = RedisStore.from_url("valkey://127.0.0.1:6390/3", namespace="n")
    tls = RedisStore.from_url("valkeys://user:s3cr%21t@example.com:6391/2", namespace="n")
    rediss = RedisStore.from_url("rediss://:s3cr%21t@example.com", namespace="n")
    try:
        pool = plain.client.connection_pool
        assert pool.connection_class is redis.Connection
        assert (pool.connection_kwargs["port"], pool.connection_kwargs["db"]) == (6390, 3)
        kwargs = tls.client.connection_pool.connection_kwargs
        assert tls.client.connection_pool.connection_class is redis.SSLConnection
        assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("user", "s3cr!t", 2)
        assert rediss.client.connection_pool.connection_class is redis.SSLConnection
        for store in (tls, rediss):
            assert "s3cr" not in repr(store) and "***" in repr(store)
    finally:
        for store in (plain, tls, rediss):
            store.close()


def test_a_bad_url_names_the_problem_without_the_password() -> None:
    for bad in ("valkey://:s3cret@127.0.0.1:6379/notadb", "redis://:s3cret@host:port/0"):
        with pytest.raises(ConfigurationError) as info:
            RedisStore.from_url(bad, namespace="n")
        assert "s3cret" not in str(info.value) and info.value.__cause__ is None


def test_passwords_stay_out_of_errors(url: str, namespace: str) -> None:
    """A user and password the server refuses, and a port where no server listens."""
    host_url = url.replace("://", f"://{namespace}:s3cr%21t@", 1)
    closed = f"valkey://:s3cr%21t@127.0.0.1:{servers.free_port()}/0"
    for target in (host_url, closed):
        store = RedisStore.from_url(target, namespace=namespace)
        with pytest.raises(StoreUnavailable) as info:
            store.claim("job", SLOT, "a", 10)
        assert "s3cr" not in str(info.value) and "s3cr" not in repr(store)
        store.close()


# -- a server of our own: restart and freeze -------------------------------


@pytest.fixture(params=["redis", "valkey"])
def own_server(request: pytest.FixtureRequest) -> Iterator[servers.ServerProcess]:
    binary = servers.redis_binary() if request.param == "redis" else servers.valkey_binary()
    if binary is None:
        servers.unavailable(f"a {request.param} server binary")
    assert binary is not None
    datadir = Path(tempfile.mkdtemp(prefix=f"{request.param}-restart-"))
    server = servers.start_redis_like(binary, f"{request.param}-restart", datadir)
    yield server
    server.stop()


def test_server_restart_and_freeze(own_server: servers.ServerProcess) -> None:
    """Unavailable while down, no hang beyond the timeouts, answers again after a restart.

    The server keeps nothing on disk, so the restart forgets the claim: the
    slot can be claimed again (the caveat in the module docstring).
    """
    url = f"redis://127.0.0.1:{own_server.port}/0"
    store = RedisStore.from_url(url, namespace="n", socket_timeout=0.5, socket_connect_timeout=1)
    try:
        first = store.claim("job", SLOT, "a", 10)
        assert first.won and first.holder is not None
        own_server.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{own_server.port}"):
            store.renew("job", first.holder.token, 10)
        with pytest.raises(StoreUnavailable):
            store.states(["job"])
        assert time.monotonic() - started < 2
        own_server.start()
        assert store.state("job") is None  # not persisted: the lease vanished
        again = store.claim("job", SLOT, "b", 10)  # scripts reload by themselves
        assert again.won and again.holder is not None
        # Tokens rise across the loss: the first token is the server's clock.
        assert again.holder.token > first.holder.token
        token = again.holder.token
        # A frozen server: the operation times out instead of hanging.
        assert own_server.proc is not None
        servers.freeze(own_server.proc.pid)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.renew("job", token, 10)
            assert time.monotonic() - started < 1.5
        finally:
            os.kill(own_server.proc.pid, signal.SIGCONT)
        assert store.renew("job", token, 10)
    finally:
        store.close()


def test_the_replicas_option_is_checked_when_the_store_opens() -> None:
    for bad in ("replicas=x", "replicas=-1", "replica_timeout=0", "replica_timeout=soon"):
        with pytest.raises(ConfigurationError, match=bad.split("=")[0]) as caught:
            RedisStore.from_url(f"redis://:hush@127.0.0.1:1/0?{bad}", namespace="n")
        assert "hush" not in str(caught.value)
    with pytest.raises(ConfigurationError, match="replica_timeout within"):
        RedisStore.from_url("redis://127.0.0.1:1/0?replicas=1&replica_timeout=5", namespace="n")
    store = RedisStore.from_url(
        "redis://127.0.0.1:1/0?replicas=2&replica_timeout=0.5", namespace="n"
    )
    assert (store.replicas, store.replica_timeout) == (2, 0.5)
    store.close()


def _acknowledged_all(primary: redis.Redis) -> bool:
    """Whether the primary's one replica acknowledged its whole replication stream."""
    info = primary.info("replication")
    replica = info.get("slave0")
    return isinstance(replica, dict) and replica.get("offset") == info["master_repl_offset"]


def test_with_replicas_a_step_counts_once_a_replica_has_it(tmp_path: Path) -> None:
    """``?replicas=1``: each step's writes wait for a replica's acknowledgement (WAIT). A
    replica frozen: the claim was applied on the primary but does not count (an outage,
    nothing run); the end sent again once it is back is accepted."""
    binary = servers.redis_binary()
    if binary is None:
        servers.unavailable("a redis-server or valkey-server binary")
    assert binary is not None
    primary = servers.start_redis_like(binary, "durable-primary", tmp_path)
    (tmp_path / "replica").mkdir()
    port = servers.free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    argv += [
        "no",
        "--dir",
        str(tmp_path / "replica"),
        "--replicaof",
        "127.0.0.1",
        str(primary.port),
    ]
    replica = servers.ServerProcess(argv, port, name="durable-replica").start()
    url = f"redis://127.0.0.1:{primary.port}/0?replicas=1&replica_timeout=0.5"
    store = RedisStore.from_url(url, namespace="durable")
    try:
        follows = redis.Redis(port=port)
        wait_until(
            lambda: follows.info("replication").get("master_link_status") == "up",
            20,
            "the replica to follow",
        )
        follows.close()
        won = store.claim("job", SLOT, "a", 30)
        assert won.won and won.holder is not None
        assert replica.proc is not None
        # The replica acknowledged every write before it freezes: the end's first send
        # (EVALSHA of a script this server has not seen: NOSCRIPT, nothing written) finds
        # nothing unacknowledged, and only the wait after the script sent again whole
        # can refuse it. A step counted without that wait is what this catches.
        source = redis.Redis(port=primary.port)
        wait_until(lambda: _acknowledged_all(source), 20, "the replica to acknowledge")
        source.close()
        servers.freeze(replica.proc.pid)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="0 of the 1 replica"):
                store.finish("job", won.holder.token, RunState.DONE)
            assert time.monotonic() - started < 2
            with pytest.raises(StoreUnavailable, match="replica"):
                store.claim("other", SLOT, "a", 30)
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        # Back: the end, sent again, is accepted; the claim refused before was not run
        # and its record (applied on the primary) is a held slot a backup takes over.
        assert store.finish("job", won.holder.token, RunState.DONE)
        state = store.state("other")
        assert state is not None and state.state is RunState.RUNNING
    finally:
        store.close()
        replica.stop()
        primary.stop()
