"""One store fixture, parametrized over every store; the contract suite runs on each."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anarchon_core import Store, open_store
from anarchon_core.store import LeaseStore
from anarchon_core.stores.memory import MemoryStore
from tests.cleanup import drop_namespace
from tests.conftest import SERVER_STORES

StoreFactory = Callable[..., Store]

ALL_STORES = ["memory", "sqlite", *SERVER_STORES]


@pytest.fixture(params=ALL_STORES)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'contract.db'}"
    return str(request.getfixturevalue(SERVER_STORES[kind]))


@pytest.fixture
def make_store(kind: str, store_url: str) -> Iterator[StoreFactory]:
    """Builds stores of one kind that share their data, as separate instances would.

    Every test gets namespaces of its own, so tests can share one server.
    """
    made: list[Store] = []
    shared_memory: dict[str, MemoryStore] = {}
    prefix = f"t{uuid.uuid4().hex[:10]}"

    def make(namespace: str = "test") -> Store:
        store: Store
        ns = f"{prefix}-{namespace}"
        if kind == "memory":
            # One process-local store per namespace stands for the shared server.
            store = shared_memory.setdefault(ns, MemoryStore(namespace=ns))
        else:
            store = open_store(store_url, namespace=ns)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
    for namespace in {store.namespace for store in made}:
        drop_namespace(store_url, namespace)


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    return make_store()


@pytest.fixture
def lease_store(store: Store) -> LeaseStore:
    """A store that keeps leases; claim-only stores skip the lease tests."""
    if not isinstance(store, LeaseStore):
        pytest.skip(f"{type(store).__name__} is claim-only: no lease")
    return store
