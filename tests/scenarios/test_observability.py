"""Metrics and health probes of real instance processes on a real Redis.

Three instances serve their metrics (``--metrics-port``); the test scrapes
them over HTTP as Prometheus would, while slots are won, one is taken over
after a SIGKILL, and slots are missed while every instance is frozen. Then
``anarchon check``, run as a Kubernetes exec probe runs it, turns non-zero
when an instance's loop is frozen (SIGSTOP) or its store is stopped, and
zero again once it steps and the store answers.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon_core.check import LIVE_WITHIN
from anarchon_core.peers import ANNOUNCE_EVERY
from tests import servers
from tests.cleanup import drop_namespace
from tests.fleet import Fleet, scraped
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
scrape = scraped


def of(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def total(ports: dict[str, int], metric: str, job: str, namespace: str) -> float:
    """``metric`` for ``job``, summed over the instances that answer."""
    found = 0.0
    for port in ports.values():
        try:
            found += of(scrape(port), metric, namespace=namespace, job=job) or 0.0
        except OSError:  # a killed instance
            continue
    return found


def metrics_ports(fleet: Fleet) -> dict[str, int]:
    return {
        line["instance"]: int(line["metrics_port"])
        for line in fleet.lines()
        if line["kind"] == "up" and line.get("metrics_port")
    }


@pytest.fixture
def redis_fleet(tmp_path: Path, redis_url: str) -> Iterator[Fleet]:
    namespace = f"o{uuid.uuid4().hex[:10]}"
    fleet = Fleet(
        tmp_path, redis_url, namespace=namespace, every=3, work=2.5, lease=1, jitter=0,
        metrics_port=0,
    )  # fmt: skip
    try:
        yield fleet
    finally:
        fleet.stop_all()
        drop_namespace(redis_url, namespace)


def test_counters_move_as_slots_are_won_taken_over_and_missed(redis_fleet: Fleet) -> None:
    fleet, ns = redis_fleet, redis_fleet.namespace
    fleet.start("a", "b", "c")
    ports = metrics_ports(fleet)
    assert set(ports) == {"a", "b", "c"}
    wait_until(
        fleet.watch(lambda ls: len({x["slot_id"] for x in fleet.starts()}) >= 3),
        30,
        "3 slots",
        seen=fleet.tail,
    )

    # Won: the instances' counters add up to the slots they started.
    before = len([x for x in fleet.starts() if x["attempt"] == 1])
    won = total(ports, "anarchon_slots_won_total", "tick", ns)
    after = len([x for x in fleet.starts() if x["attempt"] == 1])
    assert before <= won <= after + 1, (before, won, after)
    samples = scrape(ports["a"])
    assert of(samples, "anarchon_up", namespace=ns) == 1.0
    next_slot = of(samples, "anarchon_next_slot_timestamp_seconds", namespace=ns, job="tick")
    assert next_slot is not None and time.time() - 3 < next_slot <= time.time() + 3
    assert total(ports, "anarchon_claim_lateness_seconds_count", "tick", ns) >= before

    # Taken over: SIGKILL the instance running a slot (started within the last half
    # second of its 2.5 s of work); a survivor takes it over. Its 1 s lease lapses
    # well before the next slot (3 s), whose claim would otherwise supersede it.
    running = wait_until(fleet.watch(lambda ls: [
            x for x in fleet.starts()
            if time.time() - x["t"] < 0.5
            and not any(e["kind"] in ("end", "abort") and e["slot_id"] == x["slot_id"]
                        and e["attempt"] == x["attempt"] for e in ls)
        ]), 10, "a run that just started", seen=fleet.tail)[-1]  # fmt: skip
    victim = running["instance"]
    killed_at = fleet.kill(victim)
    survivors = {n: p for n, p in ports.items() if n != victim}
    try:
        wait_until(
            lambda: total(survivors, "anarchon_slots_taken_over_total", "tick", ns) >= 1,
            15,
            "a takeover counted after the SIGKILL",
            interval=0.2,
        )
    except AssertionError as exc:
        since = [x for x in fleet.lines() if x["t"] >= killed_at - 3]
        logs = {n: fleet.log(n)[-3000:] for n in survivors}
        raise AssertionError(f"{exc}; killed {running}; then: {since}; logs: {logs}") from None
    takeover = [x for x in fleet.starts() if x["slot_id"] == running["slot_id"]]
    assert [x["attempt"] for x in takeover] == [running["attempt"], running["attempt"] + 1]

    # Missed: every instance frozen past two slots (3 s apart, each its window).
    assert total(survivors, "anarchon_slots_missed_total", "tick", ns) == 0
    for name in survivors:
        fleet.signal(name, signal.SIGSTOP)
    time.sleep(7)
    for name in survivors:
        fleet.signal(name, signal.SIGCONT)
    wait_until(
        lambda: total(survivors, "anarchon_slots_missed_total", "tick", ns) >= 1,
        5,
        "a missed slot counted after the freeze",
        interval=0.2,
    )
    # No slot id ever becomes a label: one series per job and metric.
    samples = scrape(next(iter(survivors.values())))
    labels = {key for (_, labelled) in samples for key, _ in labelled}
    assert labels <= {"namespace", "job", "le"}, labels


def run_check(url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "anarchon_core.cli", "check", "--store", url]
    argv += ["--namespace", namespace, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.fixture
def own_redis() -> Iterator[tuple[str, servers.ServerProcess]]:
    """A private Redis this test may stop and start again."""
    binary = servers.redis_binary()
    if binary is None:
        servers.unavailable("a redis-server or valkey-server binary")
    assert binary is not None
    server = servers.start_redis_like(binary, "redis-check", Path(tempfile.mkdtemp()))
    try:
        yield f"redis://127.0.0.1:{server.port}/0", server
    finally:
        server.stop()


def test_check_fails_on_a_frozen_loop_and_a_stopped_store_then_passes_again(
    tmp_path: Path, own_redis: tuple[str, servers.ServerProcess]
) -> None:
    url, server = own_redis
    ns = f"k{uuid.uuid4().hex[:8]}"
    fleet = Fleet(tmp_path, url, namespace=ns, every=1, work=0.1, lease=2, metrics_port=0)
    try:
        fleet.start("a", "b")
        wait_until(fleet.watch(lambda ls: fleet.starts()), 20, "a first run", seen=fleet.tail)
        port = metrics_ports(fleet)["a"]
        done = run_check(url, ns, "--instance", "a", "--job", "tick")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "ok  loop: a recorded itself" in done.stdout

        # Frozen loop: non-zero within the stated bound (LIVE_WITHIN of the freeze, plus
        # up to 5 s for one probe command to start and answer on a loaded machine).
        frozen_at = time.monotonic()
        fleet.signal("a", signal.SIGSTOP)
        with pytest.raises(OSError):  # a frozen process answers no HTTP probe either
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
        wait_until(
            lambda: run_check(url, ns, "--instance", "a").returncode == 1,
            LIVE_WITHIN + 5 - (time.monotonic() - frozen_at),
            "check failing on a frozen loop",
            interval=0.2,
        )
        # The other instance, not frozen, passes all along.
        assert run_check(url, ns, "--instance", "b").returncode == 0
        fleet.signal("a", signal.SIGCONT)
        wait_until(
            lambda: run_check(url, ns, "--instance", "a").returncode == 0,
            5,
            "check passing once the loop steps again",
            interval=0.2,
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200

        # Stopped store: non-zero at once, and /readyz 503 (the loop still lives).
        server.stop()
        done = run_check(url, ns, "--instance", "a")
        assert done.returncode == 1 and "FAIL  store" in done.stdout, done.stdout + done.stderr

        def not_ready() -> bool:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2)
            except urllib.error.HTTPError as exc:
                return exc.code == 503
            return False

        wait_until(not_ready, 5, "/readyz failing while the store is down", interval=0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200
        server.restart()
        # Zero again once the instance announces itself to the restarted store.
        wait_until(
            lambda: run_check(url, ns, "--instance", "a").returncode == 0,
            ANNOUNCE_EVERY + 5,
            "check passing once the store answers",
            interval=0.2,
        )
    finally:
        fleet.stop_all()
