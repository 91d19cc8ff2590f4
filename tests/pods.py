"""Pods for end-to-end tests: worker or scheduler commands, each in its own process group.

A pod's processes (a worker and the processes it forks) share a process
group, so a signal reaches all of them, as a container runtime's would. The
test apps append JSON lines (``anarchon_core.tools.instance.Reporter``) to one
report file that the tests read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

Line = dict[str, Any]
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class Pods:
    """The pods of one test, configured through ``E2E_*`` environment variables."""

    prefix = "p"

    def __init__(
        self,
        tmp_path: Path,
        broker: str,
        schedule: dict[str, Any],
        *,
        store: str = "",
        lease: float = 3,
    ) -> None:
        self.tmp_path = tmp_path
        self.report = tmp_path / "report.jsonl"
        self.report.touch()
        self.namespace = f"{self.prefix}{uuid.uuid4().hex[:10]}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "E2E_BROKER": broker,
            "E2E_STORE": store,
            "E2E_NAMESPACE": self.namespace,
            "E2E_LEASE": str(lease),
            "E2E_SCHEDULE": json.dumps(schedule),
            "E2E_REPORT": str(self.report),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.tmp_path / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv,
                env={**self.env, **(env or {})},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def signal(self, name: str, sig: signal.Signals) -> float:
        """Signal the whole pod (process group)."""
        os.killpg(self.procs[name].pid, sig)
        return time.time()

    def kill(self, name: str) -> float:
        at = self.signal(name, signal.SIGKILL)
        self.procs.pop(name).wait(10)
        return at

    def stop(self, name: str, timeout: float = 30) -> None:
        self.signal(name, signal.SIGTERM)
        proc = self.procs.pop(name)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.procs[name].pid, signal.SIGKILL)
            self.procs.pop(name).wait(10)

    def lines(self) -> list[Line]:
        with open(self.report, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def starts(self, job: str | None = None) -> list[Line]:
        return [
            x for x in self.lines() if x["kind"] == "start" and (job is None or x["job"] == job)
        ]

    def wait_for(self, predicate: Callable[[list[Line]], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = predicate(self.lines())
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; logs: {self.logs()}")

    def logs(self) -> dict[str, str]:
        return {p.name: p.read_text()[-2000:] for p in self.tmp_path.glob("*.log")}

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()

    def mentions(self, *needles: str) -> list[str]:
        """The lines of every pod's log that hold one of ``needles``, each after its pod's name."""
        return [
            f"{path.stem}: {line}"
            for path in sorted(self.tmp_path.glob("*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if any(needle in line for needle in needles)
        ]

    def pod_of(self, instance: str) -> str:
        """The pod whose process is ``instance`` (``host:pid:...``)."""
        group = os.getpgid(int(instance.split(":")[1]))
        return next(name for name, proc in self.procs.items() if proc.pid == group)


def per_slot(lines: list[Line]) -> Counter[str]:
    return Counter(x["slot_id"] for x in lines)


def slot_seconds(slot_id: str) -> float:
    return int(slot_id.rsplit("@", 1)[1]) / 1000


P = TypeVar("P", bound=Pods)


def fleets(cls: type[P], tmp_path: Path) -> Iterator[Callable[..., P]]:
    """A fixture body: makes pods of ``cls`` for a test and kills them all afterwards."""
    made: list[P] = []

    def make(broker: str, schedule: dict[str, Any], **options: Any) -> P:
        pods = cls(tmp_path, broker, schedule, **options)
        made.append(pods)
        return pods

    yield make
    for pods in made:
        pods.stop_all()


def assert_each_second_once(starts: list[Line], last: float, pods: Pods | None = None) -> None:
    """From the first slot run (the fleet is up) to ``last``: every second once.

    A failure names the slots missed or run twice, with what ``pods`` logged
    about them.
    """
    first = min(slot_seconds(x["slot_id"]) for x in starts)
    counts = per_slot([x for x in starts if slot_seconds(x["slot_id"]) <= last])
    expected = {int(first) + k for k in range(int(last) - int(first) + 1)}
    missed = sorted(expected - {int(slot_seconds(s)) for s in counts})
    job = starts[0]["job"]
    told = pods.mentions(*(f"{job}@{s * 1000}" for s in missed)) if pods and missed else []
    assert missed == [], f"slots missed: {missed}; logged about them: {told}"
    twice = {s: n for s, n in counts.items() if n > 1}
    told = pods.mentions(*twice) if pods and twice else []
    assert twice == {}, f"slots run twice: {twice}; logged about them: {told}"


#: A claim of slot S is sent by S + 1 s, plus a margin for a loaded machine.
CLAIM_WINDOW = 1.5
#: Every pod reads the control entries once a second; plus a margin.
FOLLOW = 2.0

Command = Callable[..., subprocess.CompletedProcess[str]]


def shown(done: subprocess.CompletedProcess[str]) -> str:
    return f"{done.args}: exit {done.returncode}\nstdout:\n{done.stdout}stderr:\n{done.stderr}"


def later(lines: list[Line], since: float) -> list[Line]:
    """The runs of ``lines`` whose slot is due after ``since``."""
    return [x for x in lines if slot_seconds(x["slot_id"]) > since]


def pause_resume_and_run_now(
    pods: Pods, verb: Command, job: str, runs: Callable[[], list[Line]]
) -> str:
    """The runtime-control steps a Celery or Dramatiq fleet goes through alike.

    ``verb(name, *args)`` runs the integration's control command (``celery
    anarchon``, ``dramatiq-anarchon``) for ``job``, whose slot comes every
    second; ``runs()`` are its runs so far. Paused: no slot due after the
    pause is sent, and a run-now request is refused. Resumed: sends go on
    with the next slot, none of the paused ones. Run now: one send of the
    slot the command names, then regular sends again. Returns that slot's id.
    """
    done = verb("pause", job)
    paused_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout == f"paused job {job!r}\n", shown(done)
    done = verb("trigger", job)
    assert done.returncode == 1, shown(done)
    assert "paused" in done.stderr and "asked to run" not in done.stdout, shown(done)
    time.sleep(max(0.0, paused_at + 4 - time.time()))
    assert later(runs(), paused_at) == [], f"slots due after the pause at {paused_at:.3f}"

    resuming = time.time()
    done = verb("resume", job)
    resumed_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout == f"resumed job {job!r}\n", shown(done)
    resumed = pods.wait_for(lambda ls: later(runs(), resumed_at), 15, "a slot after the resume")
    back = slot_seconds(resumed[0]["slot_id"])
    assert back <= resumed_at + FOLLOW, resumed[0]
    in_pause = [
        x for x in runs() if paused_at < slot_seconds(x["slot_id"]) < resuming - CLAIM_WINDOW
    ]
    assert in_pause == [], f"paused {paused_at:.3f} to {resuming:.3f}: {in_pause}"

    asking = time.time()
    done = verb("trigger", job)
    asked = time.time()
    assert done.returncode == 0, shown(done)
    match = re.search(r"asked to run (\S+) now", done.stdout)
    assert match, shown(done)
    slot_id = match.group(1)
    manual_at = slot_seconds(slot_id)
    assert slot_id.startswith(f"{job}@") and asking < manual_at < asked + 3, slot_id
    pods.wait_for(lambda ls: [x for x in runs() if x["slot_id"] == slot_id], 15, slot_id)
    pods.wait_for(lambda ls: len(per_slot(later(runs(), manual_at + 1))) >= 3, 15, "slots after it")
    time.sleep(1)
    resumed_runs = [x for x in later(runs(), resumed_at) if x["slot_id"] != slot_id]
    every_second = {int(slot_seconds(x["slot_id"])) for x in resumed_runs}
    # Every second from the resume on, but the slot the run-now slot may overlap
    # (its claim finds the run-now run's lease held: an overlap, not sent).
    missing = set(range(int(back), max(every_second))) - every_second
    assert missing <= {int(manual_at) + 1}, sorted(missing)
    assert len([x for x in runs() if x["slot_id"] == slot_id]) == 1
    return slot_id


def scraped(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of the ``/metrics`` served on ``port``, by name and label set."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metrics_and_probes_served(pods: Pods, port: int, job: str) -> None:
    """The pods' scheduler serves, on ``port``: /healthz and /readyz 200, and /metrics
    whose won and dispatched counters of ``job`` match the runs its workers started."""
    import urllib.request

    labels = frozenset({"namespace": pods.namespace, "job": job}.items())

    def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        try:
            samples = scraped(port)
        except OSError:  # not served yet: the scheduler starts after the workers boot
            return None
        return samples if samples.get(("anarchon_slots_dispatched_total", labels), 0) >= 3 else None

    samples = pods.wait_for(lambda ls: counted(), 60, f"3 slots of {job} counted on :{port}")
    runs = len(per_slot(pods.starts(job)))
    won = samples[("anarchon_slots_won_total", labels)]
    assert 3 <= won <= runs + 2, (won, runs)
    assert samples[("anarchon_up", frozenset({"namespace": pods.namespace}.items()))] == 1.0
    assert ("anarchon_next_slot_timestamp_seconds", labels) in samples
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            assert answer.status == 200, path
