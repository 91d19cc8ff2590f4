"""The broker is down when a slot is due: beat sends it once the broker is back.

Real ``celery worker -B`` pods; the broker is a private Redis server that the
test crashes shortly before a slot and starts again inside the slot's catch-up
window; the anarchon store (PostgreSQL) stays up. Before, a send that could
not reach the broker failed the slot, which never ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import servers
from tests.broker_outage import restartable_redis, three_pods_across_a_slot
from tests.celery.harness import CeleryFleet
from tests.fleet import fleets

pytestmark = pytest.mark.scenario


@pytest.fixture
def broker() -> Iterator[servers.ServerProcess]:
    """A private Redis broker that the test crashes and starts again."""
    yield from restartable_redis()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., CeleryFleet]]:
    yield from fleets(CeleryFleet, tmp_path)


@pytest.mark.timeout(180)
def test_a_slot_due_while_the_broker_is_down_runs_once_when_it_is_back(
    fleet: Callable[..., CeleryFleet], broker: servers.ServerProcess, postgres_url: str
) -> None:
    """Three beats: the slot is sent again by whichever beat reaches the broker, once."""
    three_pods_across_a_slot(fleet, broker, postgres_url, lambda pods, name: pods.worker(name))
