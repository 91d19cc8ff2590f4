"""Run one benchmark case, or the suite, and print the figures as Markdown tables.

A case: ``--instances`` processes, each a scheduler with the same ``--jobs``
jobs every ``--every`` seconds (or on ``--cron``) on one store, for
``--seconds`` after two ticks of warm-up; handlers return at once. Measured,
from what every instance recorded:

- lateness: when a slot's handler started, minus the slot's time (p50, p99, max);
- slots doubled (run more than once) and missed (due in the window, never run;
  the instances run on past the window until each slot due ran or was
  reported missed, at most a minute, and the figure says how many of the
  missed were reported: see benchmarks/missed.py);
- the shares of wins of the busiest and the least busy instance;
- store calls per instance per tick (each is one round trip);
- CPU per instance (share of one core) and its peak RSS.

One case::

    .venv/bin/python -m benchmarks.run --store redis://127.0.0.1:6379/0 \\
        --jobs 1000 --instances 3 --every 10 --seconds 60

The suite, each part a table of docs/benchmarks.md (``engine``: the cases of
:data:`SUITE`; ``overload``: the cases of :data:`OVERLOAD`, more jobs than the
fleet keeps up with; ``failover``: benchmarks/failover.py; ``celery``:
benchmarks/celery_beat.py; ``scale``: the cases of :data:`SCALE`, 100,000 jobs x
10 instances on a Redis Cluster and on PostgreSQL; ``celery-worker``: the same
with 200 entries and a real Celery worker running the tasks; ``dramatiq``:
benchmarks/dramatiq_pods.py, 3 Dramatiq pods sending and running 200 actors; ``apscheduler``:
benchmarks/apscheduler_peer.py beside anarchon on PostgreSQL; ``django``: benchmarks/django_beat.py,
django-celery-beat's rows; ``once``: benchmarks/once.py, 100,000 pending one-offs;
``cost``: benchmarks/cost.py, the engine's CPU per job per tick, in-process;
``lookahead``: lateness with a store 5 and 20 ms further away, with and without
claims sent ahead, benchmarks/delay.py);
it needs the ``bench`` dependency group::

    .venv/bin/python -m benchmarks.run --suite --write docs/benchmarks.md
    .venv/bin/python -m benchmarks.run --suite --parts celery --write docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks import missed, plots
from benchmarks.appended import Appended

REDIS = "redis://127.0.0.1:6379/0"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
MYSQL = "mysql://root@127.0.0.1:3306/test"

#: The cases of the suite: (store URL, jobs, instances, every, seconds, jitter[, cron]).
#: Growth with jobs (100 / 1,000 / 10,000 x 3 instances) and with instances
#: (1 / 3 / 10 x 1,000 jobs) on Redis, 10,000 jobs x 10 instances for 5
#: minutes, PostgreSQL, and an idle fleet on a minute cron.
SUITE: list[tuple[Any, ...]] = [
    (REDIS, 100, 3, 10.0, 60, 0.0),
    (REDIS, 1000, 3, 10.0, 60, 0.0),
    (REDIS, 10000, 3, 10.0, 60, 0.0),
    (REDIS, 1000, 1, 10.0, 60, 0.0),
    (REDIS, 1000, 10, 10.0, 60, 0.0),
    (REDIS, 10000, 10, 10.0, 300, 0.0),
    (POSTGRES, 100, 3, 10.0, 60, 0.0),
    (POSTGRES, 1000, 3, 10.0, 60, 0.0),
    (POSTGRES, 10000, 3, 10.0, 60, 0.0),
    (REDIS, 1000, 3, 60.0, 120, 0.0, "* * * * *"),
]
#: The SQL part: the engine's cases of PostgreSQL beside the same on MySQL/MariaDB,
#: with the transactions each server committed per slot run.
SQL: list[tuple[Any, ...]] = [
    (store, jobs, 3, 10.0, 60, 0.0) for store in (POSTGRES, MYSQL) for jobs in (100, 1000, 10000)
]
#: The overload part: 100,000 jobs every minute x 3 instances, on Redis and on
#: PostgreSQL (same tuple as :data:`SUITE`). Every minute the fleet has far more
#: claims to send, and ends to record, than it can within a lease: slots may
#: start late, or be missed, but none may run twice.
#: The look-ahead part: 1,000 jobs every 10 s x 3 instances on Redis, the store reached
#: directly and through a relay adding 5 ms and 20 ms of round trip, and on PostgreSQL,
#: each without and with ``lookahead=0.5`` (a tenth of the default lease, the most it
#: may be): (store, round trip added, lookahead).
LOOKAHEAD: list[tuple[str, float, float]] = [
    (REDIS, rtt, ahead) for rtt in (0.0, 0.005, 0.020) for ahead in (0.0, 0.5)
] + [(POSTGRES, 0.0, ahead) for ahead in (0.0, 0.5)]
#: The scale part: 100,000 jobs every minute x 10 instances for 10 minutes, on a Redis
#: Cluster of three primaries (started by the part: ``CLUSTER``) and on PostgreSQL.
CLUSTER = "cluster"
SCALE: list[tuple[Any, ...]] = [
    (CLUSTER, 100000, 10, 60.0, 600, 0.0),
    (POSTGRES, 100000, 10, 60.0, 600, 0.0),
]
OVERLOAD: list[tuple[Any, ...]] = [
    (REDIS, 100000, 3, 60.0, 180, 0.0),
    (POSTGRES, 100000, 3, 60.0, 180, 0.0),
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
    least_share: float = 0.0
    cron: str | None = None
    #: PostgreSQL and MySQL only: committed transactions (server-wide) per slot run.
    pg_per_slot: float | None = None
    #: The events of every instance over the whole run, by kind.
    events: Counter[str] = field(default_factory=Counter)
    #: Each instance's start-up: from its launch to its first step done (seconds).
    startup: list[float] = field(default_factory=list)
    #: Of the slots missed, those the instances reported missed.
    reported: int = 0

    def row(self, peer: bool = False) -> str:
        """The table's row; ``peer``: with the SQL server's transactions per slot last."""
        if peer:
            pg = "-" if self.pg_per_slot is None else f"{self.pg_per_slot:.1f}"
            return Result.row(self) + f" {pg} |"
        late = sorted(self.lateness)

        def q(p: float) -> str:
            if not late:
                return "-"
            return f"{late[min(len(late) - 1, int(len(late) * p))] * 1000:.0f}"

        scheme = self.store.split(":", 1)[0]
        every = f"`{self.cron}`" if self.cron else f"{self.every:g} s"
        missed_cell = str(self.missed) + (f" ({self.reported} reported)" if self.reported else "")
        return (
            f"| {scheme} | {self.jobs} | {self.instances} | {every} | {self.seconds:g} s |"
            f" {q(0.5)} / {q(0.99)} / {late[-1] * 1000 if late else 0:.0f} |"
            f" {self.doubled} | {missed_cell} |"
            f" {self.busiest_share:.0%} / {self.least_share:.0%} |"
            f" {self.calls_per_tick:.1f} | {self.cpu_share:.2%} | {self.rss_mb:.0f} |"
        )


HEADER = (
    "| Store | Jobs | Instances | Every | Run | Lateness p50 / p99 / max (ms) | Doubled"
    " | Missed | Wins of the busiest / least busy instance | Store calls per instance per tick"
    " | CPU per instance | RSS (MB) |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def run_case(
    store: str,
    jobs: int,
    instances: int,
    every: float,
    seconds: float,
    jitter: float,
    cron: str | None = None,
    profile: Path | None = None,
    lookahead: float = 0.0,
    via: str | None = None,
) -> Result:
    """Run one case; with ``profile``, py-spy samples the first instance over the
    measured window into that file (raw, one stack per line; see :func:`top_frames`).
    ``lookahead``: the instances' (``Scheduler(lookahead=)``); ``via``: the store URL the
    instances use, when not ``store`` itself (a relay in front of it)."""
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-bench-"))
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for k in range(instances):
            out = tmp / f"i{k}.jsonl"
            argv = [sys.executable, "-m", "benchmarks.instance", "--store", via or store]
            argv += ["--namespace", namespace, "--name", f"i{k}", "--jobs", str(jobs)]
            argv += ["--every", str(every), "--jitter", str(jitter), "--out", str(out)]
            argv += ["--cron", cron] if cron else []
            argv += ["--lookahead", str(lookahead)] if lookahead else []
            argv += ["--launched", str(time.time())]
            procs.append((subprocess.Popen(argv, cwd=Path(__file__).parents[1]), out))
        return _measure(procs, store, namespace, jobs, instances, every, seconds, cron, profile)
    finally:
        for proc, _ in procs:  # whatever failed, no instance outlives its case
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _measure(
    procs: list[tuple[subprocess.Popen[bytes], Path]],
    store: str,
    namespace: str,
    jobs: int,
    instances: int,
    every: float,
    seconds: float,
    cron: str | None,
    profile: Path | None,
) -> Result:
    """The figures of the case whose instances ``procs`` are starting."""
    deadline = time.monotonic() + 60 + jobs / 100
    while not all(Path(f"{out}.ready").exists() for _, out in procs):
        if time.monotonic() > deadline or any(p.poll() is not None for p, _ in procs):
            raise RuntimeError("the benchmark's instances did not start")
        time.sleep(0.05)
    # Two ticks of warm-up: instances learn of each other from the store's registry.
    time.sleep(2 * every)
    commits = _xact_commit(store)
    began = time.time()
    for proc, _ in procs:
        proc.send_signal(signal.SIGUSR1)  # CPU and store calls count from now
    spy = None
    if profile is not None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        spy_argv = [py_spy, "record", "-p", str(procs[0][0].pid), "-d", str(int(seconds))]
        spy_argv += ["-r", "100", "-f", "raw", "-o", str(profile), "--nonblocking"]
        spy = subprocess.Popen(
            spy_argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    time.sleep(seconds)
    if spy is not None:
        _stop_profiler(spy)
    ended = time.time()
    commits = _xact_commit(store) - commits
    # The slots measured: due while every instance ran (after the window's start
    # and one interval, before its last second).
    first = math.ceil((began + every) / every) * every
    due = [first + n * every for n in range(int((ended - 1 - first) // every) + 1)]
    due_slots = [(f"job{n:05d}", round(t * 1000)) for n in range(jobs) for t in due]
    # Their last runs (or missed reports), late on a loaded machine, before the stop.
    live = Appended([Path(f"{out}.live") for _, out in procs])
    missed.drain(lambda: _unaccounted(due_slots, live.poll()))
    for proc, _ in procs:
        proc.send_signal(signal.SIGTERM)
    for proc, _ in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR2)  # its threads' stacks, to its standard error
            time.sleep(1)
            raise
    runs: Counter[str] = Counter()
    told: set[missed.Slot] = set()
    wins: Counter[int] = Counter()
    events: Counter[str] = Counter()
    lateness: list[float] = []
    calls = cpu = rss = 0.0
    wall = 0.0
    startup: list[float] = []
    for k, (_, out) in enumerate(procs):
        for line in out.read_text().splitlines():
            record = json.loads(line)
            if "stats" in record:
                stats = record["stats"]
                calls += sum(stats["calls"].values())
                cpu += stats["cpu"]
                wall = max(wall, stats["wall"])
                rss = max(rss, stats["rss_mb"])
                events.update(stats.get("events", {}))
                if stats.get("startup") is not None:
                    startup.append(stats["startup"])
                continue
            if "missed" in record:
                told.add(missed.slot_of(record["missed"]))
                continue
            if due and first <= record["at"] <= due[-1]:
                runs[record["slot"]] += 1
                wins[k] += 1
                lateness.append(record["started"] - record["at"])
    ran = {missed.slot_of(slot_id) for slot_id in runs}
    missing = [slot for slot in due_slots if slot not in ran]
    ticks = max(1.0, wall / every) * instances
    _drop(store, namespace)
    total = max(1, sum(wins.values()))
    return Result(
        store,
        jobs,
        instances,
        every,
        seconds,
        lateness,
        sum(1 for n in runs.values() if n > 1),
        len(missing),
        max(wins.values(), default=0) / total,
        calls / ticks,
        cpu / max(wall, 1e-9) / instances,
        rss,
        min((wins.get(k, 0) for k in range(instances)), default=0) / total,
        cron,
        commits / total if store.startswith(("postgres", "mysql")) else None,
        events,
        sorted(startup),
        missed.reported(missing, ran, told),
    )


def _unaccounted(due: list[missed.Slot], records: list[dict[str, Any]]) -> int:
    """The slots ``due`` that no instance has run or reported missed in ``records`` (the
    instances' ``.live`` lines: ``{"slot": id}`` or ``{"missed": id}``)."""
    ran = {missed.slot_of(record["slot"]) for record in records if "slot" in record}
    told = {missed.slot_of(record["missed"]) for record in records if "missed" in record}
    return missed.unaccounted(due, ran, told)


def _stop_profiler(spy: subprocess.Popen[bytes]) -> None:
    """Let py-spy end its recording; one that lags behind a busy machine is told
    to stop (it writes what it sampled on SIGINT), and at last killed."""
    try:
        spy.wait(30)
        return
    except subprocess.TimeoutExpired:
        spy.send_signal(signal.SIGINT)
    try:
        spy.wait(60)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


def top_frames(profile: Path, count: int = 15) -> list[str]:
    """The functions of most samples in a py-spy raw profile: Markdown rows of
    (function, share of samples in it and below, share in it alone)."""
    inside: Counter[str] = Counter()
    alone: Counter[str] = Counter()
    total = 0
    for line in profile.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        n = int(samples)
        total += n
        frames = [f.split(" (")[0] for f in stack.split(";") if f]
        if not frames:
            continue
        alone[frames[-1]] += n
        for frame in set(frames):
            inside[frame] += n
    # Thread plumbing, the loop's frames, and the benchmark's own counting of store calls.
    skip = (
        "Thread.",
        "_bootstrap",
        "Loop._run",
        "Loop.run_pending",
        "<module>",
        "count_calls",
    )
    rows: list[str] = []
    for frame, n in inside.most_common():
        if frame.startswith(skip) or len(rows) >= count:
            continue
        rows.append(f"| `{frame}` | {n / max(total, 1):.0%} | {alone[frame] / max(total, 1):.0%} |")
    return rows


def _xact_commit(store: str) -> int:
    """The transactions committed so far: PostgreSQL's in the store's database, MySQL's
    server-wide (``Handler_commit``: statements in autocommit too, as PostgreSQL counts
    them); 0 elsewhere."""
    if store.startswith("mysql"):
        from anarchon_core.stores.mysql import MySQLStore

        conn = MySQLStore.from_url(store, namespace="bench")._open()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW GLOBAL STATUS LIKE 'Handler_commit'")
                found = cur.fetchone()
        finally:
            conn.close()
        return int(found[1]) if found else 0
    if not store.startswith("postgres"):
        return 0
    import psycopg

    with psycopg.connect(store, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def _drop(store: str, namespace: str) -> None:
    try:
        from tests.cleanup import drop_namespace
    except ImportError:
        return
    drop_namespace(store, namespace)


#: The parts of the suite: each a table of its own in docs/benchmarks.md.
PARTS = (
    "engine",
    "cost",
    "lookahead",
    "sql",
    "overload",
    "scale",
    "failover",
    "celery",
    "celery-worker",
    "dramatiq",
    "apscheduler",
    "django",
    "once",
)
#: The engine's cases profiled with py-spy (their first instance, over the window).
PROFILED = {(REDIS, 1000, 3), (REDIS, 10000, 10), (POSTGRES, 10000, 3)}


#: Events that a fleet keeping up never reports.
UNUSUAL = ("overlap", "finish_refused", "catch_up", "missed", "lost", "takeover")
#: The overload part's table: the engine's, and the unusual events of every instance.
_HEAD, _RULE = HEADER.splitlines()
OVERLOAD_HEADER = f"{_HEAD} Unusual events |\n{_RULE}---|"
#: The scale part's table: the engine's, an instance's start-up, and the unusual events.
SCALE_HEADER = (
    f"{_HEAD} Start-up of an instance, median / max (s) | Unusual events |\n{_RULE}---|---|"
)
#: The SQL part's table: the engine's, and the transactions committed per slot run.
SQL_HEADER = f"{_HEAD} Transactions per slot |\n{_RULE}---|"
#: The profiles of the last engine part: (case, rows of :func:`top_frames`).
PROFILES: list[tuple[str, list[str]]] = []


def suite_part(part: str) -> tuple[str, list[str]]:
    """Run one part of the suite: its table's header and rows, printed as they come."""
    if part == "engine":
        header, rows, profiles = HEADER, [], []
        print(header, flush=True)
        for case in SUITE:
            profile = None
            if tuple(case[:3]) in PROFILED and len(case) == 6:
                profile = Path(tempfile.mkdtemp(prefix="anarchon-profile-")) / "profile.raw"
            store, jobs, instances, every, seconds, jitter = case[:6]
            cron = case[6] if len(case) > 6 else None
            result = run_case(store, jobs, instances, every, seconds, jitter, cron, profile)
            rows.append(result.row())
            print(rows[-1], flush=True)
            unusual = {k: result.events[k] for k in UNUSUAL if result.events[k]}
            print(f"events: {unusual or 'none of ' + ', '.join(UNUSUAL)}", flush=True)
            if profile is not None and profile.exists():
                scheme = case[0].split(":", 1)[0]
                title = f"{scheme}, {case[1]} jobs x {case[2]} instances"
                profiles.append((title, top_frames(profile)))
        PROFILES[:] = profiles
        return header, rows
    if part == "sql":
        print(SQL_HEADER, flush=True)
        rows = []
        for case in SQL:
            rows.append(run_case(*case).row(peer=True))
            print(rows[-1], flush=True)
        return SQL_HEADER, rows
    if part == "overload":
        print(OVERLOAD_HEADER, flush=True)
        rows = []
        for case in OVERLOAD:
            result = run_case(*case)
            unusual = ", ".join(f"{k} {result.events[k]}" for k in UNUSUAL if result.events[k])
            rows.append(f"{result.row()} {unusual or 'none'} |")
            print(rows[-1], flush=True)
        return OVERLOAD_HEADER, rows
    if part == "scale":
        from benchmarks.cluster import redis_cluster

        print(SCALE_HEADER, flush=True)
        rows = []
        for case in SCALE:
            with contextlib.ExitStack() as stack:
                store = case[0]
                if store == CLUSTER:
                    store = stack.enter_context(redis_cluster())
                result = run_case(store, *case[1:])
            up = result.startup
            shown = f"{up[len(up) // 2]:.1f} / {up[-1]:.1f}" if up else "-"
            unusual = ", ".join(f"{k} {result.events[k]}" for k in UNUSUAL if result.events[k])
            rows.append(f"{result.row()} {shown} | {unusual or 'none'} |")
            print(rows[-1], flush=True)
        return SCALE_HEADER, rows
    if part == "failover":
        from benchmarks import failover

        return failover.HEADER, failover.run()
    if part == "celery":
        from benchmarks import celery_beat

        return celery_beat.HEADER, celery_beat.run(entries=1000, seconds=60)
    if part == "celery-worker":
        from benchmarks import celery_beat

        rows = celery_beat.run(entries=200, seconds=60, worker=True, together=False)
        return celery_beat.HEADER, rows
    if part == "dramatiq":
        from benchmarks import dramatiq_pods

        return dramatiq_pods.HEADER, dramatiq_pods.run(actors=200, seconds=60)
    if part == "lookahead":
        from benchmarks.delay import relay

        header = f"| Round trip added | Look-ahead {_HEAD}\n|---|---{_RULE}"
        print(header, flush=True)
        rows = []
        for store, rtt, ahead in LOOKAHEAD:
            with contextlib.ExitStack() as stack:
                via = None
                if rtt:
                    port = stack.enter_context(relay("127.0.0.1:6379", rtt))
                    via = f"redis://127.0.0.1:{port}/0"
                result = run_case(store, 1000, 3, 10.0, 60, 0.0, lookahead=ahead, via=via)
            rows.append(f"| {rtt * 1000:g} ms | {ahead:g} s {result.row()}")
            print(rows[-1], flush=True)
        return header, rows
    if part == "cost":
        from benchmarks import cost

        print(cost.HEADER, flush=True)
        return cost.HEADER, cost.run()
    if part == "once":
        from benchmarks import once

        return once.HEADER, once.run((REDIS, POSTGRES))
    if part == "django":
        from benchmarks import django_beat

        return django_beat.HEADER, django_beat.run()
    from benchmarks import apscheduler_peer

    head, rule = apscheduler_peer.HEADER.splitlines()
    rows = []
    for jobs in (100, 1000, 10000):
        rows.append("| anarchon " + run_case(POSTGRES, jobs, 3, 10.0, 60, 0.0).row(peer=True))
        rows.append("| APScheduler 4.0.0a6 " + apscheduler_peer.run_case(jobs, 3, 10.0, 60).row())
        print(rows[-2], rows[-1], sep="\n", flush=True)
    return f"| Scheduler {head}\n|---{rule}", rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--cron", help="a cron expression instead of --every")
    parser.add_argument("--profile", help="py-spy the first instance into this file (raw)")
    parser.add_argument("--suite", action="store_true", help="run every part of the suite")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"with --suite: which of {', '.join(PARTS)}"
    )
    parser.add_argument("--write", help="with --suite: write the tables into this Markdown page")
    args = parser.parse_args(argv)
    if not args.suite:
        print(HEADER, flush=True)
        case = (args.store, args.jobs, args.instances, args.every, args.seconds, args.jitter)
        profile = Path(args.profile) if args.profile else None
        result = run_case(*case, args.cron, profile)
        print(result.row(), flush=True)
        print("\nEvents of every instance:", {k: result.events[k] for k in UNUSUAL})
        if profile is not None:
            print("\n| Function | Samples in it and below | In it alone |\n|---|---|---|")
            print("\n".join(top_frames(profile)), flush=True)
        return 0
    command = "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv)
    parts = args.parts.split(",")
    for part in parts:  # every part named is checked before the first one runs
        if part not in PARTS:
            parser.error(f"--parts: {part!r} is not one of {', '.join(PARTS)}")
    for part in parts:
        header, rows = suite_part(part)
        if args.write:
            _write(Path(args.write), part, header, rows, command)
            for title, frames in PROFILES if part == "engine" else []:
                block = f"{title}:\n\n| Function | Samples in it and below | In it alone |"
                block += "\n|---|---|---|"
                _write(Path(args.write), f"profile {title}", block, frames, command)
    if args.write and any(part in plots.PARTS for part in parts):
        plots.draw(Path(args.write))  # the growth curves, from the tables as they are now
    return 0


def _write(page: Path, part: str, header: str, rows: list[str], command: str) -> None:
    """Put the table of ``part`` between its markers in ``page`` (added at the end if absent)."""
    text = page.read_text() if page.exists() else ""
    start, end = f"<!-- {part} -->", f"<!-- /{part} -->"
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    block = (
        f"{start}\n\nMeasured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {machine}"
        f" with `{command}`:\n\n{header}\n" + "\n".join(rows) + f"\n\n{end}"
    )
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    page.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
