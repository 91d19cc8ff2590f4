"""The broker is down when a slot is due: the scheduler sends it once the broker is back.

Real pods (``celery worker -B``; ``dramatiq`` with the Anarchon middleware);
the broker is a private Redis server that the test crashes shortly before a
slot and starts again inside the slot's catch-up window; the anarchon store
(Celery: PostgreSQL; Dramatiq: the machine's Redis, a namespace of its own)
stays up. Before, a send that could not reach the broker failed the slot,
which never ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests import servers
from tests.integrations.broker_outage import restartable_redis, three_pods_across_a_slot
from tests.integrations.conftest import Pods

pytestmark = pytest.mark.scenario

#: Each framework's store for this test, and the options of its pods.
STORES = {"celery": "postgres_url", "dramatiq": "redis_url"}
OPTIONS: dict[str, dict[str, int]] = {"celery": {}, "dramatiq": {"processes": 1, "threads": 2}}


@pytest.fixture
def broker() -> Iterator[servers.ServerProcess]:
    """A private Redis broker that the test crashes and starts again."""
    yield from restartable_redis()


@pytest.mark.timeout(180)
def test_a_slot_due_while_the_broker_is_down_runs_once_when_it_is_back(
    framework: str,
    fleet: Callable[..., Pods],
    broker: servers.ServerProcess,
    request: pytest.FixtureRequest,
) -> None:
    """Three pods: the slot is sent again by whichever pod reaches the broker, once."""
    store = str(request.getfixturevalue(STORES[framework]))
    options = OPTIONS[framework]
    three_pods_across_a_slot(fleet, broker, store, lambda pods, name: pods.worker(name, **options))
