"""``anarchon demo``: several local instances sharing one SQLite file.

The demo starts ``--instances`` processes of :mod:`anarchon_core.tools.instance`,
each running the same job every ``--interval`` seconds against one SQLite
file in a temporary folder, and prints one line per run as it starts: the
slot, the instance that won it, the attempt. A third of the way in it
SIGKILLs the instance running a slot (a backup takes it over as attempt 2);
two thirds of the way in it SIGTERMs the instance running another slot (it
hands the run over at once). Each stopped instance is started again, as an
orchestrator would. It ends with a summary: slots, duplicates, takeovers and
hand-overs.

Ctrl-C stops the demo at any moment, and the demo alone stops the instances:
they start with SIGINT blocked, so the terminal's Ctrl-C, sent to the whole
process group, reaches only the demo. It starts nothing more once Ctrl-C is
pressed, sends every instance it ever started one SIGTERM once that instance
is up (SIGKILL after ``STOP_GRACE`` seconds), and waits for each to exit
before it returns.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

from ..slots import Slot

STOP_GRACE = 10.0  # seconds an instance has to exit after SIGTERM before SIGKILL


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


class CtrlC:
    """While entered, Ctrl-C (SIGINT) sets :attr:`pressed` instead of raising.

    The demo then stops at points of its own choosing, never half-way through
    starting or stopping an instance. The handler only sets a flag: it takes
    no lock that the interrupted code could hold.
    """

    def __init__(self) -> None:
        self.pressed = False
        self._installed = False
        self._previous: Any = None

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._note)
            self._installed = True
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._installed:
            previous = self._previous
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
            self._installed = False

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Hold SIGINT back (it is delivered on leaving); children started inside inherit the block."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Demo:
    def __init__(
        self,
        *,
        instances: int,
        interval: float,
        duration: float,
        out: TextIO,
        folder: Path,
        ctrl_c: CtrlC | None = None,
    ) -> None:
        self.instances = [f"i{n}" for n in range(1, instances + 1)]
        self.interval = interval
        self.duration = duration
        self.out = out
        self.report = folder / "report.jsonl"
        self.report.touch()
        self.store = f"sqlite:///{folder / 'demo.db'}"
        self.ctrl_c = ctrl_c or CtrlC()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # instance -> its current process
        self._started: list[subprocess.Popen[bytes]] = []  # every process started, until reaped
        self._signalled: set[subprocess.Popen[bytes]] = set()
        self._closed = False  # set when stopping begins: nothing is started after it
        self.tally = Tally()
        self._offset = 0
        self._running: dict[str, str] = {}  # instance -> slot id it runs now
        self._takeovers: dict[tuple[str, int], str] = {}  # (slot id, attempt) -> how

    @property
    def stopping(self) -> bool:
        return self._closed or self.ctrl_c.pressed

    def spawn(self, name: str) -> bool:
        """Start instance ``name``, unless the demo is stopping; return whether it started."""
        argv = [sys.executable, "-m", "anarchon_core.tools.instance", "--store", self.store]
        argv += ["--name", name, "--report", str(self.report), "--job", "tick"]
        argv += ["--every", str(self.interval), "--work", str(self.interval * 0.4)]
        argv += ["--lease", str(max(1.0, self.interval / 2)), "--watch", "0.25"]
        # With SIGINT blocked, no Ctrl-C is noted between the check and the record, and
        # the child inherits the block: the terminal's Ctrl-C never reaches an instance.
        with _sigint_blocked():
            if self.stopping:
                return False
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
            self._started.append(proc)
            self.procs[name] = proc
        return True

    def send(self, proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        """Send ``sig`` to ``proc`` unless it was sent a stop signal already, or exited."""
        if proc in self._signalled or proc.poll() is not None:
            return
        self._signalled.add(proc)
        proc.send_signal(sig)

    def reap(self, proc: subprocess.Popen[bytes], timeout: float) -> bool:
        """Wait for ``proc`` to exit (SIGKILL it after ``timeout`` s); False on Ctrl-C first."""
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if self.ctrl_c.pressed:
                return False  # shutdown() reaps it
            if time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
            else:
                time.sleep(0.02)
        return True

    def _up(self) -> set[int]:
        """The pids of the instances that reported they are up, from the whole report."""
        with open(self.report, encoding="utf-8") as handle:
            lines = [json.loads(raw) for raw in handle if raw.endswith("\n")]
        return {line["pid"] for line in lines if line["kind"] == "up"}

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
        clock = Slot.from_id(slot).time.strftime("%H:%M:%S") if slot else ""
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
            # Each skip the summary counts has its line: a count with no line to
            # match it would leave the reader guessing which slot did not run.
            self.tally.overlaps += 1
            self.row(clock, who, "-", f"overlap skip ({line.get('detail') or 'still running'})")
        elif kind == "catch_up":
            self.row(clock, who, line["attempt"], "catch-up")

    def runner(self, timeout: float) -> str | None:
        """Wait until some instance is in the middle of a run; return its name."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stopping:
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
        proc = self.procs[name]
        self.send(proc, sig)
        if not self.reap(proc, STOP_GRACE):
            return
        del self.procs[name]
        self._running.pop(name, None)
        if self.spawn(name):
            self.say(f"  >> {name} started again")

    def run(self) -> int:
        """Run the demo and stop every instance; 0 unless a slot and attempt ran twice."""
        try:
            self.say(
                f"anarchon demo: {len(self.instances)} instances share one SQLite file and run"
                f" a job every {self.interval:g} s for {self.duration:g} s."
            )
            self.say(
                "Each line is one run, printed as it starts: the slot, who won it, the attempt."
            )
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
            while not self.ctrl_c.pressed and time.monotonic() < end:
                if plan and time.monotonic() - started >= plan[0][0]:
                    _, sig, label = plan.pop(0)
                    self.interrupt(sig, label)
                self.poll()
                time.sleep(0.05)
            if self.ctrl_c.pressed:
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
        """Stop every instance ever started and wait for each; start none afterwards."""
        self._closed = True
        deadline = time.monotonic() + STOP_GRACE
        # An instance is stopped once it is up, not half-way through its start-up: a
        # signal there would end it without waiting for what it runs (importing croniter
        # runs `file`), which would then outlive the demo.
        starting = [proc for proc in self._started if proc.poll() is None]
        while starting and time.monotonic() < deadline:
            up = self._up()
            for proc in starting:
                if proc.pid in up or proc.poll() is not None:
                    self.send(proc, signal.SIGTERM)
            starting = [proc for proc in starting if proc.pid not in up and proc.poll() is None]
            if starting:
                time.sleep(0.02)
        for proc in self._started:
            self.send(proc, signal.SIGTERM)
        for proc in self._started:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._started.clear()
        self._signalled.clear()
        self.procs.clear()


def run_demo(*, instances: int, interval: float, duration: float, out: TextIO) -> int:
    """Run the demo in a temporary folder that is removed afterwards.

    From start to end, including the summary and the removal of the folder,
    Ctrl-C stops the demo instead of raising :class:`KeyboardInterrupt`.
    """
    with CtrlC() as ctrl_c, tempfile.TemporaryDirectory(prefix="anarchon-demo-") as folder:
        demo = Demo(
            instances=instances,
            interval=interval,
            duration=duration,
            out=out,
            folder=Path(folder),
            ctrl_c=ctrl_c,
        )
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        return demo.run()
