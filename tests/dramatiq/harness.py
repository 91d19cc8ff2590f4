"""Real ``dramatiq`` and ``dramatiq-anarchon`` processes running tests/dramatiq/e2e_app.py."""

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
BIN = Path(sys.executable).parent
APP = "tests.dramatiq.e2e_app"


class DramatiqFleet:
    """Pods of one test (``dramatiq`` commands), each in its own process group."""

    def __init__(
        self, tmp_path: Path, broker: str, schedule: dict[str, Any], *, lease: float = 3
    ) -> None:
        self.tmp_path = tmp_path
        self.report = tmp_path / "report.jsonl"
        self.report.touch()
        self.namespace = f"d{uuid.uuid4().hex[:10]}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "E2E_BROKER": broker,
            "E2E_NAMESPACE": self.namespace,
            "E2E_LEASE": str(lease),
            "E2E_SCHEDULE": json.dumps(schedule),
            "E2E_REPORT": str(self.report),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.tmp_path / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv,
                env={**self.env, **env},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def worker(
        self, name: str, *, processes: int = 2, threads: int = 2, scheduler: bool = True
    ) -> None:
        argv = [str(BIN / "dramatiq"), APP, "--processes", str(processes)]
        argv += ["--threads", str(threads), "--queues", self.namespace, "-v"]
        self._spawn(name, argv, {"E2E_SCHEDULER": "1" if scheduler else "0"})

    def scheduler(self, name: str) -> None:
        self._spawn(name, [str(BIN / "dramatiq-anarchon"), APP, "-v"], {})

    def signal(self, name: str, sig: signal.Signals) -> float:
        os.killpg(self.procs[name].pid, sig)
        return time.time()

    def kill(self, name: str) -> float:
        at = self.signal(name, signal.SIGKILL)
        self.procs.pop(name).wait(10)
        return at

    def stop(self, name: str, timeout: float = 20) -> None:
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

    def pod_of(self, instance: str) -> str:
        """The pod whose process is ``instance`` (host:pid:...)."""
        group = os.getpgid(int(instance.split(":")[1]))
        return next(name for name, proc in self.procs.items() if proc.pid == group)


def per_slot(lines: list[Line]) -> Counter[str]:
    return Counter(x["slot_id"] for x in lines)


def slot_seconds(slot_id: str) -> float:
    return int(slot_id.rsplit("@", 1)[1]) / 1000
