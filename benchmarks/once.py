"""One-off runs pending in the store: the cost of the engine's due read, and of its ticks.

Each case fills a namespace with ``pending`` one-offs of the engine's own jobs,
due an hour from now and later (one a second: the 100,000 of the suite span 28
hours), and 10 of a job no instance declares, due now. Measured:

- **due read**: one ``once_due(now + 2 s, 500)``, as the engine's poll sends it
  (it answers the 10 due now), ``reads`` times in a row: p50 / p99 in ms;
- **engine CPU per tick**: one scheduler in this process with ``jobs`` jobs every
  10 s (handlers that return at once) over ``seconds`` after a tick of warm-up:
  the process's CPU time per tick, in ms, with the due reads it sent (one per
  poll, every second, whatever the number pending).

The case with none pending is the baseline: the same jobs, the 10 due now alone.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

from anarchon_core import Run, Scheduler, open_store
from anarchon_core.store import OnceEntry, onces

#: The engine's jobs' interval, in seconds.
EVERY = 10.0
#: One-offs of a job no instance declares, due now: what every due read answers.
DUE_NOW = 10

HEADER = (
    "| Store | Pending one-offs | Due now | Due read p50 / p99 (ms) | Engine CPU per tick"
    " (ms, 1,000 jobs every 10 s) | Due reads per second |\n|---|---|---|---|---|---|"
)


@dataclass
class Result:
    store: str
    pending: int
    read_ms: list[float]
    cpu_per_tick_ms: float
    reads_per_second: float

    def row(self) -> str:
        late = sorted(self.read_ms)
        p99 = late[min(len(late) - 1, int(len(late) * 0.99))]
        return (
            f"| {self.store.split(':', 1)[0]} | {self.pending:,} | {DUE_NOW} |"
            f" {statistics.median(late):.2f} / {p99:.2f} | {self.cpu_per_tick_ms:.1f} |"
            f" {self.reads_per_second:.2f} |"
        )


def run_case(
    store_url: str, pending: int, jobs: int, seconds: float, reads: int, warmup: float = EVERY
) -> Result:
    """One case, in a namespace of its own (dropped afterwards); the engine measured after
    ``warmup`` seconds."""
    namespace = f"bench-once-{uuid.uuid4().hex[:8]}"
    store = onces(open_store(store_url, namespace=namespace))
    try:
        now_ms = int(time.time() * 1000)
        later = now_ms + 3_600_000
        store.add_once([OnceEntry(later + i * 1000, f"job{i % jobs:05d}") for i in range(pending)])
        store.add_once([OnceEntry(now_ms - i, "elsewhere") for i in range(DUE_NOW)])
        read_ms = []
        for _ in range(reads):
            began = time.perf_counter()
            due = store.once_due(int(time.time() * 1000) + 2000, 500)
            read_ms.append((time.perf_counter() - began) * 1000)
            assert len(due) == DUE_NOW, due
        cpu, sent = _engine(store, jobs, seconds, warmup)
        return Result(store_url, pending, read_ms, cpu, sent)
    finally:
        store.close()
        _drop(store_url, namespace)


def _engine(store: Any, jobs: int, seconds: float, warmup: float) -> tuple[float, float]:
    """CPU ms per tick of one scheduler of ``jobs`` jobs on ``store``, and its due reads
    per second, over ``seconds`` after ``warmup`` seconds."""
    calls = [0]
    read = store.once_due

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return read(*args, **kwargs)

    setattr(store, "once_due", counted)  # noqa: B010 - counted on this object alone

    def handler(run: Run) -> None:
        pass

    scheduler = Scheduler(store, instance="bench", jitter=0)
    for n in range(jobs):
        scheduler.add_job(handler, name=f"job{n:05d}", every=EVERY)
    scheduler.start()
    try:
        time.sleep(warmup)
        cpu, wall, before = time.process_time(), time.monotonic(), calls[0]
        time.sleep(seconds)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        sent = calls[0] - before
    finally:
        scheduler.stop()
        del store.once_due
    return cpu * 1000 / (wall / EVERY), sent / wall


def _drop(store: str, namespace: str) -> None:
    try:
        from tests.cleanup import drop_namespace
    except ImportError:
        return
    drop_namespace(store, namespace)


def run(
    stores: tuple[str, ...], pending: int = 100_000, jobs: int = 1000, seconds: float = 60.0
) -> list[str]:
    """The part's rows: each store with none pending, then with ``pending``."""
    rows = []
    for store in stores:
        for count in (0, pending):
            rows.append(run_case(store, count, jobs, seconds, reads=200).row())
            print(rows[-1], flush=True)
    return rows
