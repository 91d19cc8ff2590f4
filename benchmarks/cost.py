"""The engine's CPU per job per tick, in-process and in virtual time: the work of the
engine's own Python, apart from the round trips, the store's server and the handlers.

Real schedulers (:class:`~anarchon_core.Scheduler`) on one virtual clock share one
in-memory store; handlers run inline and return at once. (The clock is read without a
lock, as the system's is: :class:`~anarchon_core.FakeClock`'s lock, there for the
threads it runs, would weigh on every figure.) Three figures per job and tick:

- **not due**: a step while none of the jobs is due (every hour: the steps between
  its slots), divided by the jobs: what a job costs while it waits;
- **due and won**: one instance, every slot won, begun and ended;
- **due and lost**: two instances, each slot won by one and lost by the other (which
  reads the record, backs the run up and drops it once it ended): the fleet's CPU per
  job and tick, less a won slot's.

Each in µs of CPU (``time.process_time``, the process's own; the least of three runs),
and the store's share
(the memory store's methods, timed apart) taken out; and in instructions, counted by
``valgrind --tool=callgrind`` (stable on a busy machine, where µs move by tens of
percent): the same run with two more ticks, less the run without them, so that start-up
and warm-up cancel out (the store's share is in those counts).

    .venv/bin/python -m benchmarks.cost                  # µs, and instructions if valgrind is found
    .venv/bin/python -m benchmarks.cost --jobs 2000 --ticks 3 --case won   # one case, printed
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from anarchon_core import Run, Scheduler
from anarchon_core.stores.memory import MemoryStore

#: Virtual seconds between two slots of the "due" cases.
EVERY = 10.0
#: The store's methods timed apart, to take their share out.
STORE_METHODS = (
    "claim_many",
    "states",
    "change_many",
    "take_over_many",
    "announce",
    "peers",
    "controls",
    "get_control",
    "set_control",
    "once_due",
    "paused",
    "history",
)


@dataclass
class Figures:
    """One case's CPU, in seconds: in all, and in the store's methods."""

    cpu: float = 0.0
    store: float = 0.0

    @property
    def engine(self) -> float:
        return self.cpu - self.store


class SteppedClock:
    """Virtual time for one thread: moves only by :meth:`advance`; handlers run inline."""

    def __init__(self, start: float) -> None:
        self._wall = start
        self._mono = 0.0

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.is_set()

    def spawn(self, target: Callable[[], None], name: str) -> Any:
        raise RuntimeError(f"{name}: the cost benchmark runs everything inline")


def _noop(run: Run) -> None:
    return None


class _Timed:
    """Counts the CPU seconds spent inside a store's methods."""

    def __init__(self, store: MemoryStore) -> None:
        self.spent = 0.0
        for name in STORE_METHODS:
            method = getattr(store, name, None)
            if method is not None:
                setattr(store, name, self._wrap(method))

    def _wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.spent += time.process_time() - began

        return timed


class Fleet:
    """``instances`` schedulers with ``jobs`` jobs every ``every`` s, stepped in virtual time."""

    def __init__(self, jobs: int, instances: int, every: float) -> None:
        # Started just after a slot time, so that the first tick is a whole interval away.
        self.clock = SteppedClock(1_800_000_000.0 + 0.5)
        self.store = MemoryStore(clock=self.clock)
        self.timed = _Timed(self.store)
        self.schedulers = []
        for k in range(instances):
            scheduler = Scheduler(
                self.store, instance=f"i{k + 1}", clock=self.clock, inline=True, jitter=0, seed=k
            )
            for j in range(jobs):
                scheduler.add_job(_noop, name=f"job{j}", every=every)
            self.schedulers.append(scheduler)
        self.figures = Figures()

    def run(self, seconds: float, measured: bool) -> None:
        """Step every scheduler until ``seconds`` of virtual time passed."""
        until = self.clock.time() + seconds
        while self.clock.time() < until:
            cpu0, store0 = time.process_time(), self.timed.spent
            sleeps = [scheduler.run_pending() for scheduler in self.schedulers]
            if measured:
                self.figures.cpu += time.process_time() - cpu0
                self.figures.store += self.timed.spent - store0
            step = max(0.001, min(min(sleeps), until - self.clock.time()))
            self.clock.advance(step)


def case(kind: str, jobs: int, ticks: int) -> Figures:
    """The CPU of ``ticks`` ticks of case ``kind`` (``idle``, ``won``, ``lost``), after
    two ticks of warm-up."""
    every = 3600.0 if kind == "idle" else EVERY
    fleet = Fleet(jobs, 2 if kind == "lost" else 1, every)
    fleet.run(2 * EVERY, measured=False)
    fleet.run(ticks * EVERY, measured=True)
    return fleet.figures


#: Each µs figure is the least of this many runs: what the machine's other load adds
#: only ever makes a run slower.
REPEATS = 3


def best(kind: str, jobs: int, ticks: int) -> Figures:
    """The run of case ``kind`` that took the least CPU, of :data:`REPEATS`."""
    return min((case(kind, jobs, ticks) for _ in range(REPEATS)), key=lambda f: f.cpu)


def per_job(kind: str, jobs: int, ticks: int) -> tuple[float, float]:
    """µs per job and tick of ``kind``: in all, and the engine's (the store's share out).
    A lost slot's: the two instances' CPU per job and tick, less a won slot's."""
    figures = best(kind, jobs, ticks)
    scale = 1e6 / (jobs * ticks)
    if kind != "lost":
        return figures.cpu * scale, figures.engine * scale
    won = best("won", jobs, ticks)
    return (figures.cpu - won.cpu) * scale, (figures.engine - won.engine) * scale


def instructions(kind: str, jobs: int, ticks: int) -> float | None:
    """Instructions per job and tick of ``kind``, by callgrind: the run with ``ticks`` more
    ticks less the run without; a lost slot's less a won slot's. None without valgrind."""
    if shutil.which("valgrind") is None:
        return None

    def counted(kind: str, ticks: int) -> int:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                "-m",
                "benchmarks.cost",
                "--case",
                kind,
                "--jobs",
                str(jobs),
                "--ticks",
                str(ticks),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
        assert found, done.stderr[-2000:]
        return int(found.group(1))

    def extra(kind: str) -> int:
        return counted(kind, ticks) - counted(kind, 0)

    spent = extra(kind)
    if kind == "lost":
        spent -= extra("won")
    return spent / (jobs * ticks)


HEADER = (
    "| Case | Jobs | µs per job per tick, in all | The engine's (the store's share out)"
    " | Instructions per job per tick (callgrind, 1,000 jobs) |\n|---|---|---|---|---|"
)
#: The cases, as the table names them.
CASES = {"idle": "not due", "won": "due and won", "lost": "due and lost"}


def run(
    jobs: tuple[int, ...] = (1000, 10000),
    ticks: int = 5,
    callgrind_jobs: int | None = 1000,
) -> list[str]:
    """The table's rows: each case at each number of jobs; its instructions (callgrind)
    in the row of ``callgrind_jobs`` jobs (None: not counted)."""
    rows = []
    for kind, name in CASES.items():
        for n in jobs:
            total, engine = per_job(kind, n, ticks)
            counted = instructions(kind, n, 2) if n == callgrind_jobs else None
            shown = f"{counted:,.0f}" if counted is not None else "-"
            rows.append(f"| {name} | {n:,} | {total:.1f} | {engine:.1f} | {shown} |")
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("idle", "won", "lost"))
    parser.add_argument("--jobs", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args(argv)
    if args.case:
        figures = case(args.case, args.jobs[0], args.ticks)
        print(json.dumps({"cpu": figures.cpu, "store": figures.store}))
        return 0
    print(HEADER, flush=True)
    run(tuple(args.jobs), args.ticks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
