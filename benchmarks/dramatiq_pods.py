"""Dramatiq pods sending and running the same periodic actors: what a slot costs the server.

Each pod is a real ``dramatiq`` command (one process, two threads, in a process
group of its own) with the ``Anarchon`` middleware at its defaults: the scheduler
hosted in the pod, sending each slot it wins, and execution tracking (the worker
processing a slot's message holds its lease). The pods share a private
``redis-server`` (broker and store) started for the run, on a free port; the
actors (benchmarks/dramatiq_app.py) write a line per message they start. The
window starts one interval after every pod is up, and lasts ``--seconds``.
Measured:

- **publish lateness**: when the message was enqueued (stamped by a middleware
  just before) minus the slot's time, p50 / p99 / max in ms; **start lateness**:
  when the actor started it, p99;
- **duplicated**: a slot started more than once; **missed**: a slot of the
  window (at least one interval before its end) never started: the pods run
  on past the window until each was started or reported missed (at most
  :data:`benchmarks.missed.DRAIN_TIMEOUT`; a pod held up past the next slot
  skips the one it waited for and reports it, see :mod:`benchmarks.missed`),
  the column saying how many were reported;
- **Redis commands per slot**: every command the server ran over the window
  (``total_commands_processed``; Lua scripts' commands included: Dramatiq's own
  fetch, ack and heartbeat scripts, anarchon's claim, hand-off, pick-up and end),
  less the benchmark's own, divided by the slots started in the window. Dramatiq's
  consumers poll the queue while idle, so this counts their idle polling too;
- **CPU per pod**: user + system time of each pod's processes over the window,
  as a share of one core (mean / busiest).

There is no peer: Dramatiq has no scheduler of its own.

::

    .venv/bin/python -m benchmarks.dramatiq_pods --actors 200 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks import missed
from benchmarks.appended import Appended
from benchmarks.celery_beat import (
    START_TIMEOUT,
    Window,
    command_counts,
    start_redis,
    stop_group,
    stop_groups,
)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = "ANARCHON_BENCH_DRAMATIQ"

HEADER = (
    "| Pods | Actors | Every | Slots run | Publish lateness p50 / p99 / max (ms)"
    " | Start lateness p99 (ms) | Sent tracked | Duplicated | Missed | Redis commands per slot"
    " | CPU per pod (mean / busiest) |"
    "\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def _group_cpu(pgid: int) -> float:
    """User + system seconds of every process in the group ``pgid``."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _window(procs: list[subprocess.Popen[bytes]], probe: redis.Redis) -> Window:
    """One end of the window: the time, each pod's CPU, the server's counts."""
    return Window(time.time(), [_group_cpu(p.pid) for p in procs], probe.info("all"), Counter())


@dataclass
class Result:
    pods: int
    actors: int
    every: float
    runs: list[dict[str, Any]]
    start: float
    end: float
    commands: int
    by_command: Counter[str]
    cpu: list[float]
    #: The slots the pods' logs report missed.
    told: set[missed.Slot] = field(default_factory=set)
    slots: int = 0
    tracked: int = 0
    duplicated: int = 0
    missed: int = 0
    #: Of the slots missed, those the pods reported missed.
    reported: int = 0
    publish: list[float] = field(default_factory=list)
    started: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        seen: Counter[tuple[str, int]] = Counter()
        for run in self.runs:
            slot_ms = int(str(run["slot_id"]).rsplit("@", 1)[1])
            seen[(run["actor"], slot_ms)] += 1
            if self.start <= slot_ms / 1000 <= self.end:
                self.slots += 1
                self.tracked += bool(run["tracked"])
                self.publish.append(float(run["published"]) - slot_ms / 1000)
                self.started.append(float(run["started"]) - slot_ms / 1000)
        self.duplicated = sum(1 for n in seen.values() if n > 1)
        due = due_slots(self.actors, self.every, self.start, self.end)
        missing = [slot for slot in due if slot not in seen]
        self.missed = len(missing)
        self.reported = missed.reported(missing, seen, self.told)

    @property
    def commands_per_slot(self) -> float:
        return self.commands / max(1, self.slots)

    def row(self) -> str:
        def ms(values: list[float], p: float) -> str:
            if not values:
                return "-"
            ordered = sorted(values)
            return str(round(ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000))

        p = self.publish
        cpu = f"{sum(self.cpu) / len(self.cpu):.1%} / {max(self.cpu):.1%}"
        missed_cell = str(self.missed) + (f" ({self.reported} reported)" if self.reported else "")
        return (
            f"| {self.pods} | {self.actors} | {self.every:g} s | {self.slots} |"
            f" {ms(p, 0.5)} / {ms(p, 0.99)} / {ms(p, 1.0)} | {ms(self.started, 0.99)} |"
            f" {self.tracked} | {self.duplicated} | {missed_cell} |"
            f" {self.commands_per_slot:.2f} | {cpu} |"
        )


def due_slots(actors: int, every: float, start: float, end: float) -> list[missed.Slot]:
    """The slots of the window: after its start, at least one interval before its end."""
    return missed.due_on_grid([f"a{n:05d}" for n in range(actors)], every, start, end)


def measure(actors: int, seconds: float, every: float = 10.0, pods: int = 3) -> Result:
    """Start the server and the pods, measure one window, stop everything."""
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-dramatiq-"))
    server, url = start_redis(tmp)
    procs: list[subprocess.Popen[bytes]] = []
    record, ready = tmp / "runs.jsonl", tmp / "ready"
    ready.mkdir()
    probe = redis.Redis.from_url(url, socket_timeout=10)
    try:
        probe.ping()
        config = {"broker": url, "actors": actors, "every": every}
        config |= {"record": str(record), "ready": str(ready)}
        env = dict(os.environ, **{CONFIG: json.dumps(config)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        argv = [str(BIN / "dramatiq"), "benchmarks.dramatiq_app", "--processes", "1"]
        argv += ["--threads", "2", "--queues", "bench"]
        for k in range(pods):
            with open(tmp / f"pod-{k}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=tmp,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + START_TIMEOUT
        while len(list(ready.iterdir())) < pods:
            for k, proc in enumerate(procs):
                if proc.poll() is not None:
                    log_text = (tmp / f"pod-{k}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"pod {k} exited ({proc.returncode}):\n{log_text}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pods did not start within {START_TIMEOUT:g}s")
            time.sleep(0.1)
        time.sleep(every)  # the schedulers' first slots, and their first inspect of tracking
        begun = Window(
            time.time(), [_group_cpu(p.pid) for p in procs], probe.info("all"), Counter()
        )
        time.sleep(seconds)
        ended = Window(
            time.time(), [_group_cpu(p.pid) for p in procs], probe.info("all"), Counter()
        )

        started = Appended([record])

        def unaccounted() -> int:
            """The window's slots neither started yet nor reported missed."""
            ran = {(run["actor"], missed.slot_of(str(run["slot_id"]))[1]) for run in started.poll()}
            due = due_slots(actors, every, begun.at, ended.at)
            return missed.unaccounted(due, ran, missed.from_logs(tmp.glob("pod-*.log")))

        missed.drain(unaccounted)  # the last slots of the window, late on a loaded machine
    finally:
        stop_groups(procs)
        probe.close()
        stop_group(server)
        lines = record.read_text().splitlines() if record.exists() else []
        told = missed.from_logs(tmp.glob("pod-*.log"))
        shutil.rmtree(tmp, ignore_errors=True)
    commands, by_command = command_counts(begun, ended)
    wall = max(1e-9, ended.at - begun.at)
    cpu = [(b - a) / wall for a, b in zip(begun.cpu, ended.cpu, strict=True)]
    runs = [json.loads(line) for line in lines if line]
    return Result(pods, actors, every, runs, begun.at, ended.at, commands, by_command, cpu, told)


def run(actors: int, seconds: float, every: float = 10.0) -> list[str]:
    """The table's row (see :data:`HEADER`)."""
    return [measure(actors, seconds, every).row()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.dramatiq_pods", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--actors", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--commands", action="store_true", help="then print the commands per slot")
    args = parser.parse_args(argv)
    result = measure(args.actors, args.seconds, args.every, args.pods)
    print(HEADER)
    print(result.row())
    if args.commands:
        slots = max(1, result.slots)
        print(", ".join(f"{n} {c / slots:.2f}" for n, c in result.by_command.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
