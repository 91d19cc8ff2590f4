from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cleanup import drop_namespace
from tests.conftest import SERVER_STORES
from tests.fleet import Fleet

#: Stores with a lease: every row of the failure table runs against each.
LEASE_STORES = ["sqlite", "redis", "valkey", "postgres", "mysql", "libsql", "nats"]
#: Claim-only stores run the rows they support.
CLAIM_ONLY_STORES = ["rabbitmq"]


def _url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'anarchon.db'}"
    return str(request.getfixturevalue(SERVER_STORES[kind]))


@pytest.fixture(params=LEASE_STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A lease store's URL, shared by the instance processes of one test."""
    return _url(request.param, request, tmp_path)


@pytest.fixture(params=LEASE_STORES + CLAIM_ONLY_STORES)
def any_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Any store's URL, for the rows that claim-only stores support too."""
    return _url(request.param, request, tmp_path)


def _fleets(tmp_path: Path, url: str) -> Iterator[Callable[..., Fleet]]:
    fleets: list[Fleet] = []
    namespace = f"s{uuid.uuid4().hex[:10]}"

    def make(**job: object) -> Fleet:
        fleet = Fleet(tmp_path, url, namespace=namespace, **job)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop_all()
    drop_namespace(url, namespace)


@pytest.fixture
def fleet_factory(tmp_path: Path, store_url: str) -> Iterator[Callable[..., Fleet]]:
    yield from _fleets(tmp_path, store_url)


@pytest.fixture
def any_fleet_factory(tmp_path: Path, any_store_url: str) -> Iterator[Callable[..., Fleet]]:
    yield from _fleets(tmp_path, any_store_url)
