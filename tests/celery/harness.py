"""Real ``celery worker`` / ``celery beat`` processes running tests/celery/e2e_app.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

Line = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")


class CeleryFleet:
    """Worker and beat processes of one test, each in its own process group (a pod)."""

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
        self.namespace = f"c{uuid.uuid4().hex[:10]}"
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

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.tmp_path / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def worker(self, name: str, *, beat: bool = True, concurrency: int = 2, **extra: str) -> None:
        # Node names unique across tests that share the broker: "<pod>.<namespace>@host".
        argv = [CELERY, "-A", "tests.celery.e2e_app", "worker", "-n", f"{name}.{self.namespace}@%h"]
        argv += [
            "-c",
            str(concurrency),
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
        ]
        if beat:
            argv += ["-B", "--scheduler", "anarchon_celery:Scheduler"]
            argv += ["-s", str(self.tmp_path / f"{name}-beat-schedule")]
        self._spawn(name, argv)

    def worker_without_anarchon(self, name: str) -> None:
        """A worker started in code, not by the ``celery`` command: no anarchon hooks."""
        code = (
            "from tests.celery.e2e_app import app; "
            f"app.Worker(hostname='{name}.{self.namespace}@%h', concurrency=1, pool='solo',"
            " without_gossip=True, without_mingle=True, loglevel='INFO').start()"
        )
        self._spawn(name, [sys.executable, "-c", code])

    def beat(self, name: str) -> None:
        argv = [CELERY, "-A", "tests.celery.e2e_app", "beat", "--scheduler"]
        argv += ["anarchon_celery:Scheduler", "--loglevel", "INFO"]
        argv += ["-s", str(self.tmp_path / f"{name}-beat-schedule")]
        self._spawn(name, argv)

    def signal(self, name: str, sig: signal.Signals) -> float:
        """Signal the whole pod (process group), as a container runtime would."""
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
        logs = {p.name: p.read_text()[-1500:] for p in self.tmp_path.glob("*.log")}
        raise AssertionError(f"timed out waiting for {what}; logs: {logs}")

    def wait_tracking(self, *names: str, timeout: float = 60) -> None:
        """Wait until the beats of ``names`` hand slots off to tracking workers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all("every worker tracks execution" in self.log(n) for n in names):
                return
            time.sleep(0.2)
        raise AssertionError(f"execution tracking did not come on in {names}")

    @staticmethod
    def pod_of_worker(worker: str) -> str:
        """The pod name of a worker node name ("w1.<namespace>@host")."""
        return worker.split("@", 1)[0].split(".", 1)[0]

    def pod_of(self, instance: str) -> str:
        """The pod (worker or beat process group) whose beat is ``instance`` (host:pid:beat)."""
        group = os.getpgid(int(instance.split(":")[1]))
        return next(name for name, proc in self.procs.items() if proc.pid == group)

    def resend(self, start: Line) -> None:
        """Publish again the message of a run that started (as a broker redelivery would)."""
        from celery import Celery

        app = Celery("resend", broker=self.env["E2E_BROKER"])
        try:
            app.send_task(
                "e2e.work",
                args=(start["job"], 0.2),
                task_id=start["task_id"],
                headers={"anarchon": start["info"]},
                queue=self.namespace,
            )
        finally:
            app.close()

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()


def per_slot(lines: list[Line]) -> Counter[str]:
    return Counter(x["slot_id"] for x in lines)


def slot_seconds(slot_id: str) -> float:
    return int(slot_id.rsplit("@", 1)[1]) / 1000
