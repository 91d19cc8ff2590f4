"""One store fixture, parametrized over every store; the contract suite runs on each."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anarchon_core import Store
from anarchon_core.stores.memory import MemoryStore
from anarchon_core.stores.sqlite import SQLiteStore

StoreFactory = Callable[..., Store]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Builds stores of one kind that share their data (one per simulated instance)."""
    made: list[Store] = []
    shared_memory: dict[str, MemoryStore] = {}

    def make(namespace: str = "test") -> Store:
        store: Store
        if request.param == "memory":
            # One process-local store per namespace stands for the shared server.
            store = shared_memory.setdefault(namespace, MemoryStore(namespace=namespace))
        else:
            store = SQLiteStore(str(tmp_path / "contract.db"), namespace=namespace)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    return make_store()
