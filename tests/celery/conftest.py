"""Fixtures of the Celery tests that run real worker and beat processes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.celery.harness import CeleryFleet
from tests.fleet import fleets


@pytest.fixture
def celery_redis(redis_url: str) -> str:
    """The Redis broker, on one of databases 1-9 of the test Redis, queues per test.

    Workers answer ``inspect`` broadcasts of every beat on their database:
    spreading the tests over databases keeps their fleets apart.
    """
    return f"{redis_url.rsplit('/', 1)[0]}/{1 + uuid.uuid4().int % 9}"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., CeleryFleet]]:
    """Makes the test's fleets of Celery pods; every process is stopped at its end."""
    yield from fleets(CeleryFleet, tmp_path)
