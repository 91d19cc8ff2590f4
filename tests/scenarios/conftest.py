from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scenarios.harness import Fleet


@pytest.fixture(params=["sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL shared by the instance processes of one test (one per lease store)."""
    return f"sqlite:///{tmp_path / 'anarchon.db'}"


@pytest.fixture
def fleet_factory(tmp_path: Path, store_url: str) -> Iterator[type[Fleet]]:
    fleets: list[Fleet] = []

    def make(**job: object) -> Fleet:
        fleet = Fleet(tmp_path, store_url, **job)
        fleets.append(fleet)
        return fleet

    yield make  # type: ignore[misc]
    for fleet in fleets:
        fleet.stop_all()
