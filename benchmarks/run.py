"""Run one benchmark case, or the suite, and print the figures as a Markdown table.

A case: ``--instances`` processes, each a scheduler with the same ``--jobs``
jobs every ``--every`` seconds on one store, for ``--seconds``; handlers return
at once. Measured, from what every instance recorded:

- lateness: when a slot's handler started, minus the slot's time (p50, p99, max);
- slots doubled (run more than once) and missed (due in the window, never run);
- the share of wins of the busiest instance;
- store calls per instance per tick (each is one round trip);
- CPU per instance (share of one core) and its peak RSS.

One case::

    .venv/bin/python -m benchmarks.run --store redis://127.0.0.1:6379/0 \\
        --jobs 1000 --instances 3 --every 10 --seconds 60

The suite (writes docs/benchmarks.md)::

    .venv/bin/python -m benchmarks.run --suite --write docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

#: The cases of the suite: (store URL, jobs, instances, every, seconds, jitter).
SUITE = [
    ("redis://127.0.0.1:6379/0", 100, 3, 10.0, 60, 0.0),
    ("redis://127.0.0.1:6379/0", 1000, 3, 10.0, 60, 0.0),
    ("postgresql://postgres@127.0.0.1:5432/test", 100, 3, 10.0, 60, 0.0),
    ("postgresql://postgres@127.0.0.1:5432/test", 1000, 3, 10.0, 60, 0.0),
]


@dataclass
class Result:
    store: str
    jobs: int
    instances: int
    every: float
    seconds: float
    lateness: list[float]
    doubled: int
    missed: int
    busiest_share: float
    calls_per_tick: float
    cpu_share: float
    rss_mb: float

    def row(self) -> str:
        late = sorted(self.lateness)

        def q(p: float) -> str:
            if not late:
                return "-"
            return f"{late[min(len(late) - 1, int(len(late) * p))] * 1000:.0f}"

        scheme = self.store.split(":", 1)[0]
        return (
            f"| {scheme} | {self.jobs} | {self.instances} | {self.every:g} s |"
            f" {q(0.5)} / {q(0.99)} / {late[-1] * 1000 if late else 0:.0f} |"
            f" {self.doubled} | {self.missed} | {self.busiest_share:.0%} |"
            f" {self.calls_per_tick:.1f} | {self.cpu_share:.1%} | {self.rss_mb:.0f} |"
        )


HEADER = (
    "| Store | Jobs | Instances | Every | Lateness p50 / p99 / max (ms) | Doubled | Missed"
    " | Busiest instance's wins | Store calls per instance per tick | CPU per instance"
    " | RSS (MB) |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def run_case(
    store: str, jobs: int, instances: int, every: float, seconds: float, jitter: float
) -> Result:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-bench-"))
    procs = []
    for k in range(instances):
        out = tmp / f"i{k}.jsonl"
        argv = [sys.executable, "-m", "benchmarks.instance", "--store", store]
        argv += ["--namespace", namespace, "--name", f"i{k}", "--jobs", str(jobs)]
        argv += ["--every", str(every), "--jitter", str(jitter), "--out", str(out)]
        procs.append((subprocess.Popen(argv, cwd=Path(__file__).parents[1]), out))
    deadline = time.monotonic() + 60
    while not all(Path(f"{out}.ready").exists() for _, out in procs):
        if time.monotonic() > deadline or any(p.poll() is not None for p, _ in procs):
            for proc, _ in procs:
                proc.kill()
            raise RuntimeError("the benchmark's instances did not start")
        time.sleep(0.05)
    began = time.time()
    time.sleep(seconds)
    ended = time.time()
    for proc, _ in procs:
        proc.send_signal(signal.SIGTERM)
    for proc, _ in procs:
        proc.wait(60)
    runs: Counter[str] = Counter()
    wins: Counter[int] = Counter()
    lateness: list[float] = []
    calls = cpu = rss = 0.0
    wall = 0.0
    for k, (_, out) in enumerate(procs):
        for line in out.read_text().splitlines():
            record = json.loads(line)
            if "stats" in record:
                stats = record["stats"]
                calls += sum(stats["calls"].values())
                cpu += stats["cpu"]
                wall = max(wall, stats["wall"])
                rss = max(rss, stats["rss_mb"])
                continue
            runs[record["slot"]] += 1
            wins[k] += 1
            lateness.append(record["started"] - record["at"])
    # Slots due while every instance ran (after the first, before the last second).
    first = math.ceil((began + every) / every) * every
    due = [first + n * every for n in range(int((ended - 1 - first) // every) + 1)]
    expected = {f"job{n:05d}@{round(t * 1000)}" for n in range(jobs) for t in due}
    ticks = max(1.0, wall / every) * instances
    _drop(store, namespace)
    return Result(
        store,
        jobs,
        instances,
        every,
        seconds,
        lateness,
        sum(1 for n in runs.values() if n > 1),
        len(expected - set(runs)),
        max(wins.values()) / max(1, sum(wins.values())),
        calls / ticks,
        cpu / max(wall, 1e-9) / instances,
        rss,
    )


def _drop(store: str, namespace: str) -> None:
    try:
        from tests.cleanup import drop_namespace
    except ImportError:
        return
    drop_namespace(store, namespace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--suite", action="store_true", help="run every case of SUITE")
    parser.add_argument("--write", help="with --suite: write the table into this Markdown page")
    args = parser.parse_args(argv)
    cases = (
        SUITE
        if args.suite
        else [(args.store, args.jobs, args.instances, args.every, args.seconds, args.jitter)]
    )
    rows = []
    print(HEADER, flush=True)
    for case in cases:
        result = run_case(*case)
        rows.append(result.row())
        print(rows[-1], flush=True)
    if args.write:
        _write(Path(args.write), rows, "python -m benchmarks.run " + " ".join(sys.argv[1:]))
    return 0


def _write(page: Path, rows: list[str], command: str) -> None:
    text = page.read_text() if page.exists() else ""
    start, end = "<!-- figures -->", "<!-- /figures -->"
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    block = (
        f"{start}\n\nMeasured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {machine}"
        f" with `{command}`:\n\n{HEADER}\n" + "\n".join(rows) + f"\n\n{end}"
    )
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    page.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
