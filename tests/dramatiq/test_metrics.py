"""The Dramatiq middleware serves Prometheus metrics and probes (``metrics_port``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.dramatiq.harness import DramatiqFleet
from tests.fleet import fleets, metrics_and_probes_served, scraped
from tests.servers import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., DramatiqFleet]]:
    yield from fleets(DramatiqFleet, tmp_path)


def test_the_pod_running_the_scheduler_serves_metrics_and_probes(
    fleet: Callable[..., DramatiqFleet], redis_url: str
) -> None:
    pods = fleet(redis_url.rsplit("/", 1)[0] + "/10", {"fast": {"every": 1, "work": 0.1}})
    port = free_port()
    pods.env["E2E_METRICS_PORT"] = str(port)
    pods.worker("w1", processes=2, threads=2)
    metrics_and_probes_served(pods, port, "fast")


def test_with_dramatiq_prometheus_the_counters_join_its_exposition(
    fleet: Callable[..., DramatiqFleet], redis_url: str, tmp_path: Path
) -> None:
    pods = fleet(redis_url.rsplit("/", 1)[0] + "/10", {"fast": {"every": 1, "work": 0.1}})
    port = free_port()
    pods.env["dramatiq_prom_port"] = str(port)
    pods.env["dramatiq_prom_host"] = "127.0.0.1"
    pods.env["dramatiq_prom_db"] = str(tmp_path / "prometheus")
    pods.worker("w1", processes=2, threads=2)
    labels = frozenset({"namespace": pods.namespace, "job": "fast"}.items())

    def counted() -> float:
        try:
            return scraped(port).get(("anarchon_slots_won_total", labels), 0.0)
        except OSError:  # not served yet
            return 0.0

    wait_until(
        pods.watch(lambda ls: counted() >= 3),
        60,
        "anarchon's counters on Dramatiq's exposition",
        seen=pods.tail,
    )
    # Dramatiq's own metrics are there too: one exposition for both.
    assert any(name.startswith("dramatiq_") for name, _ in scraped(port))
