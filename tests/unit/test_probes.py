"""The probe endpoint (anarchon_core.probes.serve), asked over real HTTP as a kubelet and
Prometheus ask it.

The scheduler is a real one, stepped by hand on a fake clock (so that "no
step for longer than the stall" takes no real time); the store is a memory
store, or a Redis URL on a port nothing listens on for a store that really fails.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from anarchon_core import ConfigurationError, FakeClock, Scheduler
from anarchon_core.metrics import Metrics
from anarchon_core.probes import OutageLog, ProbeServer, check_port, serve, serve_beside
from anarchon_core.scheduler import LOOP_STALL
from anarchon_core.stores.memory import MemoryStore
from tests.servers import free_port

START = 1_699_999_200.0


@dataclass
class Answer:
    status: int
    body: str
    content_type: str


def ask(port: int, path: str, method: str = "GET") -> Answer:
    """``method path`` on the endpoint, over HTTP; any status is an answer."""
    data = b"x" if method == "POST" else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Answer(
                response.status, response.read().decode(), response.headers["Content-Type"]
            )
    except urllib.error.HTTPError as error:
        with error:
            return Answer(error.code, error.read().decode(), error.headers["Content-Type"])


@dataclass
class Served:
    scheduler: Scheduler
    clock: FakeClock
    server: ProbeServer

    def step(self) -> None:
        self.scheduler.run_pending()
        self.clock.settle()

    def ask(self, path: str, method: str = "GET") -> Answer:
        return ask(self.server.port, path, method)


def _scheduler(clock: FakeClock, store: MemoryStore | str) -> Scheduler:
    scheduler = Scheduler(store, instance="probed", clock=clock, jitter=0)
    scheduler.add_job(lambda: None, name="job", every=10)
    return scheduler


@pytest.fixture
def served() -> Iterator[Served]:
    clock = FakeClock(START)
    scheduler = _scheduler(clock, MemoryStore(clock=clock))
    server = serve(scheduler, 0, "127.0.0.1")
    try:
        yield Served(scheduler, clock, server)
    finally:
        server.close()


def test_probes_fail_before_the_first_step_and_pass_after_it(served: Served) -> None:
    assert served.server.port > 0  # port 0: a free one was picked
    for path in ("/healthz", "/readyz"):
        answer = served.ask(path)
        assert answer.status == 503, path
        assert answer.body == "failing: the scheduling loop has not started\n"
        assert answer.content_type.startswith("text/plain")
    served.step()
    for path in ("/healthz", "/readyz"):
        answer = served.ask(path)
        assert answer.status == 200, path
        assert answer.body.startswith("ok: last step 0.0s ago"), answer.body


def test_healthz_fails_once_no_step_began_for_longer_than_the_stall(served: Served) -> None:
    served.step()
    served.clock.advance(LOOP_STALL - 1)  # a quiet loop, but within the bound
    assert served.ask("/healthz").status == 200
    served.clock.advance(2)  # the loop is stuck: no step for LOOP_STALL + 1 s
    live = served.ask("/healthz")
    assert live.status == 503
    assert live.body == f"failing: no scheduling step for {LOOP_STALL + 1:.1f}s\n"
    assert served.ask("/readyz").status == 503  # not live, so not ready either
    served.step()  # the loop steps again
    assert served.ask("/healthz").status == 200
    assert served.ask("/readyz").status == 200


def test_readyz_fails_while_the_store_does_not_answer_and_healthz_passes() -> None:
    clock = FakeClock(START)
    closed = f"redis://127.0.0.1:{free_port()}/0?socket_connect_timeout=1&socket_timeout=1"
    scheduler = _scheduler(clock, closed)
    server = serve(scheduler, 0, "127.0.0.1")
    try:
        for attempt in range(3):  # each step fails against the closed port, and backs off
            scheduler.run_pending()
            ready = ask(server.port, "/readyz")
            assert ready.status == 503, attempt
            assert ready.body == "failing: the store does not answer\n"
            # The loop itself steps: alive, so the kubelet must not restart it;
            # its body says so without reading as if the store were fine.
            live = ask(server.port, "/healthz")
            assert live.status == 200
            assert live.body == "ok: live; store down: no slot is claimed until it answers\n"
            clock.advance(3)  # past the longest back-off
        metrics = ask(server.port, "/metrics")
        assert metrics.status == 200
        assert 'anarchon_up{namespace="default"} 0.0' in metrics.body.splitlines()
    finally:
        server.close()
        scheduler.stop(timeout=0)


def test_metrics_are_served_in_prometheus_text_format(served: Served) -> None:
    served.clock.advance(9.5)
    served.step()
    served.clock.advance(0.5)  # slot 10 comes
    served.step()
    served.step()  # its handler returned: finished
    answer = served.ask("/metrics")
    assert answer.status == 200
    assert answer.content_type.startswith("text/plain; version=")
    lines = answer.body.splitlines()
    assert 'anarchon_slots_won_total{job="job",namespace="default"} 1.0' in lines
    assert 'anarchon_runs_finished_total{job="job",namespace="default"} 1.0' in lines
    assert 'anarchon_claim_lateness_seconds_count{job="job",namespace="default"} 1.0' in lines
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.body)
        for sample in family.samples
    }
    job = (("job", "job"), ("namespace", "default"))
    assert samples[("anarchon_next_slot_timestamp_seconds", job)] == START + 20
    assert 'anarchon_up{namespace="default"} 1.0' in lines
    assert "# TYPE anarchon_slots_won_total counter" in lines
    assert "# TYPE anarchon_run_duration_seconds histogram" in lines


def test_other_paths_are_not_found_and_only_get_is_answered(served: Served) -> None:
    served.step()
    for path in ("/", "/metricsx", "/healthz/more", "/HEALTHZ", "/favicon.ico"):
        answer = served.ask(path)
        assert answer.status == 404, path
        assert answer.body == "not found\n"
    assert served.ask("/readyz?verbose=1").status == 200  # a query is not part of the path
    for path in ("/healthz", "/readyz", "/metrics"):
        answer = served.ask(path, method="POST")
        assert answer.status == 405, path
        assert answer.body == "GET only\n"
        assert served.ask(path, method="DELETE").status == 405


def test_without_metrics_only_the_probes_are_served() -> None:
    clock = FakeClock(START)
    scheduler = _scheduler(clock, MemoryStore(clock=clock))
    server = serve(scheduler, 0, "127.0.0.1", metrics=False)
    try:
        scheduler.run_pending()
        assert ask(server.port, "/metrics").status == 404
        assert ask(server.port, "/healthz").status == 200
        assert ask(server.port, "/readyz").status == 200
    finally:
        server.close()


def test_metrics_of_ones_own_are_the_ones_served() -> None:
    clock = FakeClock(START)
    scheduler = _scheduler(clock, MemoryStore(clock=clock, namespace="billing"))
    mine = Metrics(scheduler)
    server = serve(scheduler, 0, "127.0.0.1", metrics=mine)
    try:
        scheduler.run_pending()
        body = ask(server.port, "/metrics").body
        assert 'anarchon_up{namespace="billing"} 1.0' in body.splitlines()
        # The same registry the caller holds: served, not a copy of another.
        assert mine.registry.get_sample_value("anarchon_up", {"namespace": "billing"}) == 1
    finally:
        server.close()


@pytest.mark.parametrize("port", [-1, 65536, "9100", 9100.0, True, None])
def test_a_bad_port_is_refused(port: object) -> None:
    clock = FakeClock(START)
    scheduler = _scheduler(clock, MemoryStore(clock=clock))
    with pytest.raises(ConfigurationError, match=r"port=.*expected a TCP port, 0 to 65535"):
        serve(scheduler, port, "127.0.0.1")  # type: ignore[arg-type]


def test_a_port_in_use_is_refused_naming_host_and_port(served: Served) -> None:
    taken = served.server.port
    with pytest.raises(ConfigurationError, match=rf"cannot serve probes on 127\.0\.0\.1:{taken}: "):
        serve(served.scheduler, taken, "127.0.0.1")
    with socket.socket() as other:  # a port another program listens on
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(ConfigurationError, match=rf"127\.0\.0\.1:{port}: .*in use"):
            serve(served.scheduler, port, "127.0.0.1")
    assert served.ask("/healthz").status == 503  # the first server still answers


def test_close_stops_serving_and_frees_the_port() -> None:
    clock = FakeClock(START)
    scheduler = _scheduler(clock, MemoryStore(clock=clock))
    server = serve(scheduler, 0, "127.0.0.1")
    port = server.port
    assert ask(port, "/healthz").status == 503
    server.close()
    with pytest.raises(urllib.error.URLError):
        ask(port, "/healthz")
    again = serve(scheduler, port, "127.0.0.1")  # the same port, at once
    try:
        assert again.port == port
        assert ask(port, "/readyz").status == 503
    finally:
        again.close()


def test_without_prometheus_client_the_settings_serve_the_probes_alone() -> None:
    """Celery's anarchon_metrics_port and Dramatiq's metrics_port need only the core."""
    code = """
import logging, sys, urllib.error, urllib.request
sys.modules["prometheus_client"] = None  # as if not installed
logging.basicConfig(level=logging.WARNING)
from anarchon_core import Scheduler
from anarchon_core.probes import serve_beside
s = Scheduler("memory://", namespace="x")
s.add_job(lambda run: None, name="tick", every=1)
s.run_pending()
server = serve_beside(s, 0, "127.0.0.1")
base = f"http://127.0.0.1:{server.port}"
print(urllib.request.urlopen(base + "/healthz").status)
try:
    urllib.request.urlopen(base + "/metrics")
except urllib.error.HTTPError as exc:
    print(exc.code)
server.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.split() == ["200", "404"], done.stdout + done.stderr
    assert "prometheus_client is not installed" in done.stderr
    assert "pip install 'anarchon[metrics]'" in done.stderr


# -- the one rule of a metrics port, at each entry point ----------------------

NOT_PORTS = ["9100", 70000, True, -1, 9100.0, None]


@pytest.mark.parametrize("port", [0, 1, 9100, 65535])
def test_check_port_keeps_a_tcp_port_and_zero(port: int) -> None:
    assert check_port(port, "metrics_port") == port


@pytest.mark.parametrize("port", NOT_PORTS)
def test_check_port_refuses_anything_else_naming_the_setting(port: object) -> None:
    with pytest.raises(
        ConfigurationError, match=r"^metrics_port=.*0 to 65535 \(0: any free port\)"
    ):
        check_port(port, "metrics_port")


@pytest.mark.parametrize("port", NOT_PORTS[:-1])
def test_every_entry_point_refuses_what_check_port_refuses(port: object) -> None:
    from celery import Celery

    from anarchon_celery.settings import read_settings
    from anarchon_dramatiq import Anarchon

    scheduler = _scheduler(FakeClock(START), MemoryStore())
    with pytest.raises(ConfigurationError, match=r"^port=.*expected a TCP port, 0 to"):
        serve(scheduler, port, "127.0.0.1")  # type: ignore[arg-type]
    app = Celery("ports", broker="memory://")
    app.conf.anarchon_metrics_port = port
    with pytest.raises(
        ConfigurationError, match=r"^anarchon_metrics_port=.*expected a TCP port, 0 to"
    ):
        read_settings(app)
    with pytest.raises(ConfigurationError, match=r"^metrics_port=.*expected a TCP port, 0 to"):
        Anarchon(store="memory://", metrics_port=port)  # type: ignore[arg-type]


def test_every_entry_point_takes_port_zero_as_any_free_port(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from celery import Celery

    from anarchon_celery.settings import read_settings
    from anarchon_dramatiq import Anarchon

    app = Celery("ports", broker="memory://")
    app.conf.anarchon_metrics_port = 0
    assert read_settings(app).metrics_port == 0
    assert Anarchon(store="memory://", metrics_port=0).metrics_port == 0
    scheduler = _scheduler(FakeClock(START), MemoryStore())
    with caplog.at_level("WARNING", logger="anarchon_core.probes"):
        server = serve_beside(scheduler, 0, "127.0.0.1")
    try:
        assert server.port > 0
        assert f"metrics port 0: serving on 127.0.0.1:{server.port}" in caplog.text
        assert ask(server.port, "/healthz").status in (200, 503)
    finally:
        server.close()


def test_a_store_that_never_answered_is_said_at_error_at_once_then_every_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(START)
    port = free_port()
    closed = f"redis://:hunter2@127.0.0.1:{port}/0?socket_connect_timeout=1&socket_timeout=1"
    scheduler = _scheduler(clock, closed)
    outage = OutageLog(scheduler, closed)
    caplog.set_level("INFO", logger="anarchon_core.probes")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "anarchon_core.probes"]

    try:
        outage.check()
        assert said() == []  # the loop has not stepped: nothing known yet
        scheduler.run_pending()
        outage.check()
        assert said() == [
            f"anarchon: the store redis://:***@127.0.0.1:{port}/0?socket_connect_timeout=1"
            "&socket_timeout=1 has not answered for 0s, since this scheduler started: no slot"
            " is claimed or sent until it does (waiting for it; check the URL and that the"
            " store is up)"
        ]
        assert all(r.levelname == "ERROR" for r in caplog.records if r.name.endswith("probes"))
        for _ in range(20):  # 58 s more of the outage: said once so far
            clock.advance(2.9)
            scheduler.run_pending()
            outage.check()
        assert len(said()) == 1
        clock.advance(3)
        scheduler.run_pending()
        outage.check()
        assert len(said()) == 2
        assert "has not answered for 1m00s, since this scheduler started" in said()[1]
        assert "hunter2" not in caplog.text
    finally:
        scheduler.stop(timeout=0)
