"""The store's server restarts while instances run: they survive, nothing runs twice."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import servers
from tests.fleet import Fleet, Line, slot_seconds
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario


@pytest.fixture(params=["redis", "postgres", "mysql", "nats"])
def owned_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, servers.ServerProcess]]:
    """A private server that this test may stop and start again, and its store URL."""
    kind = request.param
    datadir = Path(tempfile.mkdtemp(prefix=f"{kind}-restart-"))
    if kind == "redis":
        binary = servers.redis_binary()
        if binary is None:
            servers.unavailable("a redis-server or valkey-server binary")
        assert binary is not None
        server = servers.start_redis_like(binary, "redis-restart", datadir)
        url = f"redis://127.0.0.1:{server.port}/0"
    elif kind == "postgres":
        bindir = servers.postgres_bindir(wheel=False) or servers.postgres_bindir(wheel=True)
        if bindir is None:
            servers.unavailable("PostgreSQL binaries")
        assert bindir is not None
        server = servers.start_postgres(bindir, "pg-restart")
        url = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    elif kind == "mysql":
        # Never the machine's MariaDB: other tests use it meanwhile.
        server = servers.start_mariadb("mariadb-restart")
        url = f"mysql://root@127.0.0.1:{server.port}/test"
    else:
        binary = servers.nats_binary(wheel=False) or servers.nats_binary(wheel=True)
        if binary is None:
            servers.unavailable("a nats-server binary")
        assert binary is not None
        server = servers.start_nats(binary, "nats-restart", datadir)
        url = f"nats://127.0.0.1:{server.port}"
    try:
        yield url, server
    finally:
        server.stop()
        shutil.rmtree(datadir, ignore_errors=True)
        if server.workdir is not None:  # a data directory of its own
            shutil.rmtree(server.workdir, ignore_errors=True)


def slots(lines: list[Line], since: float = 0.0) -> set[str]:
    """The slots whose runs started after ``since``."""
    return {x["slot_id"] for x in lines if x["kind"] == "start" and x["t"] > since}


def test_a_server_restart_mid_run_is_survived_without_duplicates(
    tmp_path: Path, owned_server: tuple[str, servers.ServerProcess]
) -> None:
    url, server = owned_server
    fleet = Fleet(tmp_path, url, namespace=f"r{uuid.uuid4().hex[:8]}", every=1, work=0.5, lease=3)
    try:
        fleet.start("a", "b", "c")
        wait_until(fleet.watch(lambda ls: len(slots(ls)) >= 3), 15, "3 slots", seen=fleet.tail)
        server.stop()
        down_at = time.time()
        # Down past the claim window of every slot claimed before: a Redis server
        # restarted keeps no data, so such a slot could be claimed again.
        time.sleep(3)
        restart_at = time.time()
        server.start()
        up_at = time.time()
        wait_until(
            fleet.watch(lambda ls: len(slots(ls, since=up_at)) >= 3),
            30,
            "3 slots started after the restart",
            seen=fleet.tail,
        )
        alive = {name: proc.poll() is None for name, proc in fleet.procs.items()}
    finally:
        fleet.stop_all()
    assert alive == {"a": True, "b": True, "c": True}
    lines = fleet.lines()
    starts = [x for x in lines if x["kind"] == "start"]
    assert max(Counter((x["slot_id"], x["attempt"]) for x in starts).values()) == 1
    assert max(Counter(x["slot_id"] for x in starts if x["attempt"] == 1).values()) == 1
    # No claim won while the server was down: no slot due after the stop was won before
    # the restart. (A report line may lag its claim on a busy machine, so a line's own
    # time does not tell: a slot won just before the stop may be reported after it.)
    won = [x for x in lines if x["kind"] == "won"]
    assert [x for x in won if slot_seconds(x["slot_id"]) > down_at and x["t"] < restart_at] == []
    resumed = [x for x in starts if x["t"] > up_at]
    assert resumed, "scheduling did not resume"
    assert resumed[0]["t"] - up_at < 5
    assert len({x["slot_id"] for x in resumed}) >= 3
    assert any(x["kind"] == "store_unavailable" for x in lines)
