"""Real instances in real processes, sharing one store, driven with real signals."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Line = dict[str, Any]


class Fleet:
    """Instance processes of ``anarchon_core.tools.instance`` and their shared report."""

    def __init__(self, tmp_path: Path, store: str, *, namespace: str = "demo", **job: Any) -> None:
        self.store = store
        self.namespace = namespace
        self.report = tmp_path / "report.jsonl"
        self.report.touch()
        self.job = job
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = tmp_path

    def start(self, *names: str, wait: bool = True, **overrides: Any) -> None:
        for name in names:
            options = {**self.job, **overrides}
            argv = [sys.executable, "-m", "anarchon_core.tools.instance"]
            argv += ["--store", self.store, "--namespace", self.namespace]
            argv += ["--name", name, "--report", str(self.report)]
            for key, value in options.items():
                if value is None:
                    continue
                argv += [f"--{key.replace('_', '-')}", str(value)]
            with open(self.logs / f"{name}.log", "ab") as log:
                self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            for name in names:
                self.wait_for(
                    lambda ls, n=name: any(
                        line["kind"] == "up" and line["instance"] == n for line in ls
                    ),
                    timeout=20,
                    what=f"{name} to start",
                )

    def signal(self, name: str, sig: signal.Signals) -> float:
        self.procs[name].send_signal(sig)
        return time.time()

    def kill(self, name: str) -> float:
        at = self.signal(name, signal.SIGKILL)
        self.procs.pop(name).wait(10)
        return at

    def lines(self) -> list[Line]:
        with open(self.report, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def wait_for(
        self, predicate: Callable[[list[Line]], Any], timeout: float, what: str = "condition"
    ) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = predicate(self.lines())
            if result:
                return result
            for name, proc in self.procs.items():
                if proc.poll() is not None and proc.returncode not in (0, -9, -15):
                    raise AssertionError(f"instance {name} exited with {proc.returncode}")
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}: {self.lines()[-10:]}")

    def starts(self, slot_id: str | None = None) -> list[Line]:
        return [
            line
            for line in self.lines()
            if line["kind"] == "start" and (slot_id is None or line["slot_id"] == slot_id)
        ]

    def first_start(self, timeout: float = 75) -> Line:
        """The first run; if slow starts missed the first slot, the next one (up to 60 s on)."""
        found: list[Line] = self.wait_for(
            lambda ls: [line for line in ls if line["kind"] == "start"], timeout, "a first run"
        )
        return found[0]

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait(10)
        self.procs.clear()


def anchor_soon(delay: float = 2.0) -> int:
    """A whole-second grid anchor ``delay`` seconds or a bit more from now."""
    return math.ceil(time.time() + delay)


def slot_seconds(slot_id: str) -> float:
    return int(slot_id.rsplit("@", 1)[1]) / 1000


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
