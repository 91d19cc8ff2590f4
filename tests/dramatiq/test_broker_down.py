"""The broker is down when a slot is due: the scheduler sends it once the broker is back.

Real ``dramatiq`` pods; the broker is a private Redis server that the test
crashes shortly before a slot and starts again inside the slot's catch-up
window; the anarchon store (the machine's Redis, a namespace of its own) stays
up. Before, an enqueue that could not reach the broker failed the slot, which
never ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import servers
from tests.broker_outage import restartable_redis, three_pods_across_a_slot
from tests.dramatiq.harness import DramatiqFleet
from tests.fleet import fleets

pytestmark = pytest.mark.scenario


@pytest.fixture
def broker() -> Iterator[servers.ServerProcess]:
    """A private Redis broker that the test crashes and starts again."""
    yield from restartable_redis()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., DramatiqFleet]]:
    yield from fleets(DramatiqFleet, tmp_path)


@pytest.mark.timeout(180)
def test_a_slot_due_while_the_broker_is_down_runs_once_when_it_is_back(
    fleet: Callable[..., DramatiqFleet], broker: servers.ServerProcess, redis_url: str
) -> None:
    """Three pods: the slot is sent again by whichever pod reaches the broker, once."""
    three_pods_across_a_slot(
        fleet, broker, redis_url, lambda pods, name: pods.worker(name, processes=1, threads=2)
    )
