"""Celery beat serves Prometheus metrics and probes (``anarchon_metrics_port``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.celery.harness import CeleryFleet
from tests.fleet import metrics_and_probes_served
from tests.servers import free_port

pytestmark = pytest.mark.scenario


def test_beat_serves_metrics_and_probes(fleet: Callable[..., CeleryFleet], redis_url: str) -> None:
    pods = fleet(redis_url.rsplit("/", 1)[0] + "/11", {"fast": {"every": 1, "work": 0.1}})
    port = free_port()
    pods.env["E2E_METRICS_PORT"] = str(port)
    pods.worker("w1")
    metrics_and_probes_served(pods, port, "fast")
