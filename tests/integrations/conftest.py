"""Fixtures of the tests that Celery and Dramatiq pass alike, each test once per framework.

``framework`` is parametrized over both; ``fleet`` makes that framework's
fleet (tests/celery/harness.py, tests/dramatiq/harness.py), whose ``worker``
starts a pod with the scheduler in it (``celery worker -B``; ``dramatiq`` with
the Anarchon middleware); ``redis_broker`` is the framework's Redis broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.celery.harness import CeleryFleet
from tests.dramatiq.harness import DramatiqFleet
from tests.fleet import fleets

Pods = CeleryFleet | DramatiqFleet
FLEETS: dict[str, type[CeleryFleet] | type[DramatiqFleet]] = {
    "celery": CeleryFleet,
    "dramatiq": DramatiqFleet,
}


@pytest.fixture(params=sorted(FLEETS))
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def redis_broker(framework: str, redis_url: str) -> str:
    """The framework's Redis broker, on a database of the test Redis.

    Celery: one of databases 1-9, at random. Its workers answer ``inspect``
    broadcasts of every beat on their database: spreading the tests over
    databases keeps their fleets apart. Dramatiq: database 10, a queue and
    namespace per test.
    """
    base = redis_url.rsplit("/", 1)[0]
    return f"{base}/{1 + uuid.uuid4().int % 9}" if framework == "celery" else f"{base}/10"


@pytest.fixture
def fleet(framework: str, tmp_path: Path) -> Iterator[Callable[..., Pods]]:
    yield from fleets(FLEETS[framework], tmp_path)
