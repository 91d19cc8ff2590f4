"""``anarchon demo``: several local instances sharing one SQLite file.

The demo starts ``--instances`` processes of :mod:`anarchon_core.instance`,
each running the same job every ``--interval`` seconds against one SQLite
file in a temporary folder, and prints one line per run as it starts: the
slot, the instance that won it, the attempt. A third of the way in it
SIGKILLs the instance running a slot (a backup takes it over as attempt 2);
two thirds of the way in it SIGTERMs the instance running another slot (it
hands the run over at once). Each stopped instance is started again, as an
orchestrator would. It ends with a summary: slots, duplicates, takeovers and
hand-overs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO


@dataclass
class Tally:
    """What the report file said so far."""

    starts: Counter[tuple[str, int]] = field(default_factory=Counter)
    slots: set[str] = field(default_factory=set)
    takeovers: int = 0
    handovers: int = 0
    overlaps: int = 0

    @property
    def duplicates(self) -> int:
        """Runs of a slot and attempt beyond the first: must stay 0."""
        return sum(n - 1 for n in self.starts.values() if n > 1)


class Demo:
    def __init__(
        self, *, instances: int, interval: float, duration: float, out: TextIO, folder: Path
    ) -> None:
        self.instances = [f"i{n}" for n in range(1, instances + 1)]
        self.interval = interval
        self.duration = duration
        self.out = out
        self.report = folder / "report.jsonl"
        self.report.touch()
        self.store = f"sqlite:///{folder / 'demo.db'}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tally = Tally()
        self._offset = 0
        self._running: dict[str, str] = {}  # instance -> slot id it runs now
        self._takeovers: dict[tuple[str, int], str] = {}  # (slot id, attempt) -> how

    def spawn(self, name: str) -> None:
        argv = [sys.executable, "-m", "anarchon_core.instance", "--store", self.store]
        argv += ["--name", name, "--report", str(self.report), "--job", "tick"]
        argv += ["--every", str(self.interval), "--work", str(self.interval * 0.4)]
        argv += ["--lease", str(max(1.0, self.interval / 2)), "--watch", "0.25"]
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def row(self, slot: str, instance: str, attempt: Any, note: str = "") -> None:
        self.say(f"  {slot:<12} {instance:<9} {attempt!s:<8} {note}".rstrip())

    def poll(self) -> None:
        with open(self.report, encoding="utf-8") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete.encode())
        for raw in complete.splitlines():
            self.show(json.loads(raw))

    def show(self, line: dict[str, Any]) -> None:
        kind, who = line["kind"], line["instance"]
        slot = line.get("slot_id") or ""
        clock = ""
        if slot:
            ms = int(slot.rsplit("@", 1)[1])
            clock = datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S")
        if kind == "start":
            self.tally.starts[(slot, line["attempt"])] += 1
            self.tally.slots.add(slot)
            self._running[who] = slot
            how = self._takeovers.pop((slot, line["attempt"]), "")
            self.row(clock, who, line["attempt"], f"takeover ({how})" if how else "")
        elif kind in ("end", "abort"):
            self._running.pop(who, None)
        elif kind == "takeover":
            self.tally.takeovers += 1
            self._takeovers[(slot, line["attempt"])] = line["detail"]
        elif kind == "handed_over":
            self.tally.handovers += 1
            self.row(clock, who, line["attempt"], "hands its run over")
        elif kind == "overlap":
            self.tally.overlaps += 1
        elif kind == "catch_up":
            self.row(clock, who, line["attempt"], "catch-up")

    def runner(self, timeout: float) -> str | None:
        """Wait until some instance is in the middle of a run; return its name."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            for name in self.instances:
                if name in self._running and name in self.procs:
                    return name
            time.sleep(0.05)
        return None

    def interrupt(self, sig: signal.Signals, label: str) -> None:
        name = self.runner(self.interval * 3)
        if name is None:
            return
        slot = self._running.get(name, "")
        self.say(f"  >> {label} to {name}, in the middle of its run of {slot}")
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(15)
        self._running.pop(name, None)
        self.spawn(name)
        self.say(f"  >> {name} started again")

    def run(self) -> int:
        self.say(
            f"anarchon demo: {len(self.instances)} instances share one SQLite file and run a job"
            f" every {self.interval:g} s for {self.duration:g} s."
        )
        self.say("Each line is one run, printed as it starts: the slot, who won it, the attempt.")
        self.say("")
        self.row("slot (UTC)", "instance", "attempt", "note")
        for name in self.instances:
            self.spawn(name)
        end = time.monotonic() + self.duration
        plan = [
            (self.duration / 3, signal.SIGKILL, "SIGKILL"),
            (2 * self.duration / 3, signal.SIGTERM, "SIGTERM"),
        ]
        started = time.monotonic()
        try:
            try:
                while time.monotonic() < end:
                    if plan and time.monotonic() - started >= plan[0][0]:
                        _, sig, label = plan.pop(0)
                        self.interrupt(sig, label)
                    self.poll()
                    time.sleep(0.05)
            except KeyboardInterrupt:
                self.say("  >> interrupted")
            self.poll()
        finally:
            # What instances print while the demo stops them is not part of the story.
            self.shutdown()
        tally = self.tally
        self.say("")
        self.say(
            f"slots: {len(tally.slots)}, duplicates: {tally.duplicates},"
            f" takeovers: {tally.takeovers}, hand-overs: {tally.handovers},"
            f" overlap skips: {tally.overlaps}"
        )
        return 0 if tally.duplicates == 0 else 1

    def shutdown(self) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for proc in self.procs.values():
                proc.send_signal(signal.SIGTERM)
            for proc in self.procs.values():
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            self.procs.clear()
        finally:
            signal.signal(signal.SIGINT, previous)


def run_demo(*, instances: int, interval: float, duration: float, out: TextIO) -> int:
    """Run the demo in a temporary folder that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="anarchon-demo-") as folder:
        demo = Demo(
            instances=instances,
            interval=interval,
            duration=duration,
            out=out,
            folder=Path(folder),
        )
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        return demo.run()
