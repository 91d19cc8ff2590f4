"""APScheduler 4 as a peer: the benchmark case of benchmarks.run, run on APScheduler 4.0.0a6.

A case: ``--instances`` processes, each an APScheduler ``Scheduler`` (sync API)
with the SQLAlchemy data store on PostgreSQL (a schema of its own per run,
dropped afterwards) and an event broker (PostgreSQL ``NOTIFY`` through asyncpg
by default; psycopg or Redis with ``--broker``). Each adds the same ``--jobs``
schedules, ``IntervalTrigger(seconds=--every)`` aligned to the epoch, all
calling one function that returns at once, and runs for ``--seconds``. That is
APScheduler's own design: whichever scheduler acquires a due schedule adds a
job for it to the data store, and whichever scheduler acquires the job runs it.

Measured, over the window from the moment every instance is ready to the end:

- lateness: when a slot's handler started, minus the slot's time (p50, p99, max);
- slots doubled (run more than once, over the whole run) and missed (due after
  every instance was ready and at least one interval before the end, never run);
- the shares of the window's runs started by the busiest and the least busy instance;
- store calls per instance per interval: each SQL statement, BEGIN, COMMIT and
  ROLLBACK the data store sends, plus each event the event broker publishes;
- CPU per instance (share of one core) and its peak RSS;
- PostgreSQL transactions per slot: the growth of ``xact_commit`` of the
  database in ``pg_stat_database`` over the window, divided by the slots due in
  the window that ran. It is server-wide: whatever else runs on that database
  counts too, and backends report their counts up to a second or so late.
  With a PostgreSQL event broker, each event published is a ``NOTIFY`` (one
  transaction) that every listening instance's backend then reads in a
  transaction of its own: 1 + ``--instances`` transactions per event.

Each schedule has a task of its own (``job00000``...), as each job of
anarchon is independent of the others; with ``--shared-task`` every schedule
is on the one task of the function instead. Tasks are configured with
``max_running_jobs=None`` (APScheduler's default is one running job per task).
A task's row counts its running jobs: every job acquired or released updates
it, so with one shared task every job of every instance updates one row, and
jobs are acquired with ``FOR UPDATE ... SKIP LOCKED`` on it.

One case::

    .venv/bin/python -m benchmarks.apscheduler_peer --jobs 1000 --instances 3 \\
        --every 10 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.run import HEADER as RUN_HEADER
from benchmarks.run import Result

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"
#: The event brokers of APScheduler 4.0.0a6 that work across processes here.
BROKERS = ("asyncpg", "psycopg", "redis")

_head, _rule = RUN_HEADER.splitlines()
HEADER = f"{_head} PG transactions per slot |\n{_rule}---|"

ROOT = Path(__file__).resolve().parents[1]
#: How long an instance has to exit after SIGTERM before it gets SIGKILL.
STOP_GRACE = 5.0


@dataclass
class PeerResult(Result):
    """benchmarks.run's figures of one case, with PostgreSQL's transactions per slot last."""

    #: The data store's schema, dropped at the end of the case.
    schema: str = ""

    @property
    def pg_transactions_per_slot(self) -> float:
        return self.pg_per_slot or 0.0

    def row(self, peer: bool = True) -> str:
        return super().row(peer)


# -- one instance ------------------------------------------------------------

#: What the task recorded in this process: (schedule id, fire time, start time).
_RUNS: list[tuple[str, float, float]] = []
_RUNS_LOCK = threading.Lock()


def record() -> None:
    """The task of every schedule: notes which slot it is and when it started."""
    started = time.time()
    from apscheduler import current_job

    job = current_job.get()
    fire_time = job.scheduled_fire_time
    if job.schedule_id is None or fire_time is None:
        return
    with _RUNS_LOCK:
        _RUNS.append((job.schedule_id, fire_time.timestamp(), started))


def _provide_sniffio() -> None:
    """Make ``sniffio`` importable: APScheduler 4.0.0a6's SQLAlchemy store imports it.

    Recent AnyIO no longer depends on sniffio, so it may be absent; a stand-in
    that knows asyncio only (all that the SQLAlchemy store accepts) takes its place.
    """
    if "sniffio" in sys.modules or importlib.util.find_spec("sniffio") is not None:
        return

    class AsyncLibraryNotFoundError(RuntimeError):
        pass

    library: contextvars.ContextVar[str | None] = contextvars.ContextVar(
        "current_async_library_cvar", default=None
    )

    def current_async_library() -> str:
        name = library.get()
        if name is not None:
            return name
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise AsyncLibraryNotFoundError("no async library is running") from None
        return "asyncio"

    module = types.ModuleType("sniffio")
    module.__dict__.update(
        AsyncLibraryNotFoundError=AsyncLibraryNotFoundError,
        current_async_library=current_async_library,
        current_async_library_cvar=library,
    )
    sys.modules["sniffio"] = module


def _with_driver(url: str, driver: str) -> str:
    """A ``postgresql://`` URL as SQLAlchemy's URL for ``driver``."""
    return "postgresql+" + driver + "://" + url.split("://", 1)[1]


def _event_broker(kind: str, postgres: str, redis: str, channel: str, counts: Counter[str]) -> Any:
    """APScheduler's event broker of ``kind``, counting the events it publishes."""
    from apscheduler.eventbrokers.base import BaseExternalEventBroker

    base: type[BaseExternalEventBroker]
    target = postgres
    if kind == "redis":
        from apscheduler.eventbrokers.redis import RedisEventBroker

        base, target = RedisEventBroker, redis
    elif kind == "psycopg":
        from apscheduler.eventbrokers.psycopg import PsycopgEventBroker

        base = PsycopgEventBroker
    elif kind == "asyncpg":
        from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker

        base = AsyncpgEventBroker
    else:
        raise ValueError(f"unknown event broker {kind!r}: one of {', '.join(BROKERS)}")

    async def publish(self: Any, event: Any) -> None:
        counts["published"] += 1
        await base.publish(self, event)

    counting = type(f"Counting{base.__name__}", (base,), {"publish": publish})
    return counting(target, channel=channel)


def _count_sql(store: Any, counts: Counter[str]) -> None:
    """Count the round trips of the data store's engine: statements, BEGIN, COMMIT, ROLLBACK."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import AsyncEngine

    engine = store._engine
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine

    def counter(name: str) -> Any:
        def count(*_: Any, **__: Any) -> None:
            counts[name] += 1

        return count

    for name in ("before_cursor_execute", "begin", "commit", "rollback"):
        event.listen(sync_engine, name, counter(name))


def instance(argv: list[str] | None = None) -> None:
    """One benchmark instance: an APScheduler scheduler in a process of its own.

    Stops on SIGTERM (or at ``--deadline``): it then writes what ran and its
    figures to ``--out`` at once, before the scheduler shuts down.
    """
    parser = argparse.ArgumentParser(prog="benchmarks.apscheduler_peer instance")
    parser.add_argument("--postgres", required=True)
    parser.add_argument("--redis", default=REDIS)
    parser.add_argument("--broker", choices=BROKERS, required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--every", type=float, required=True)
    parser.add_argument("--shared-task", action="store_true")
    parser.add_argument("--deadline", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s",
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    _provide_sniffio()
    from apscheduler import ConflictPolicy, Scheduler
    from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
    from apscheduler.executors.thread import ThreadPoolJobExecutor
    from apscheduler.triggers.interval import IntervalTrigger

    counts: Counter[str] = Counter()
    store = SQLAlchemyDataStore(_with_driver(args.postgres, "asyncpg"), schema=args.schema)
    _count_sql(store, counts)
    broker = _event_broker(args.broker, args.postgres, args.redis, args.schema, counts)
    scheduler = Scheduler(
        store,
        broker,
        identity=f"{args.name}-{os.getpid()}",
        job_executors={"threadpool": ThreadPoolJobExecutor()},
    )
    with scheduler:
        if args.shared_task:
            scheduler.configure_task(record, max_running_jobs=None)
        first = math.ceil(time.time() / args.every) * args.every
        start = datetime.fromtimestamp(first, timezone.utc)
        for n in range(args.jobs):
            if stop.is_set() or time.time() > args.deadline:
                return
            name = f"job{n:05d}"
            if not args.shared_task:
                scheduler.configure_task(name, func=record, max_running_jobs=None)
            scheduler.add_schedule(
                record if args.shared_task else name,
                IntervalTrigger(seconds=args.every, start_time=start),
                id=name,
                conflict_policy=ConflictPolicy.do_nothing,
            )
        scheduler.start_in_background()
        before = Counter(counts)
        began_cpu, began = time.process_time(), time.monotonic()
        Path(args.out + ".ready").touch()  # the runner starts counting once every instance runs
        stop.wait(max(0.0, args.deadline - time.time()))
        cpu, wall = time.process_time() - began_cpu, time.monotonic() - began
        calls = Counter(counts)
        calls.subtract(before)
        with _RUNS_LOCK:
            runs = list(_RUNS)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        stats = {
            "calls": dict(calls),
            "cpu": cpu,
            "wall": wall,
            "rss_mb": rss,
            "state": scheduler.state.name,
        }
        partial = Path(args.out + ".partial")
        with partial.open("w") as out:
            for schedule_id, at, started in runs:
                slot = f"{schedule_id}@{round(at * 1000)}"
                out.write(json.dumps({"slot": slot, "at": at, "started": started}) + "\n")
            out.write(json.dumps({"stats": stats}) + "\n")
        partial.rename(args.out)
        scheduler.stop()


# -- the runner --------------------------------------------------------------


def _create_schema(postgres: str, schema: str) -> None:
    """The data store's schema and tables, made once before the instances start."""
    _provide_sniffio()
    from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
    from sqlalchemy import create_engine
    from sqlalchemy.schema import CreateSchema

    store = SQLAlchemyDataStore(_with_driver(postgres, "asyncpg"), schema=schema)
    metadata = store.get_table_definitions()
    engine = create_engine(_with_driver(postgres, "psycopg"))
    try:
        with engine.begin() as conn:
            conn.execute(CreateSchema(schema))
            metadata.create_all(conn)
            conn.execute(metadata.tables[f"{schema}.metadata"].insert(), {"schema_version": 1})
    finally:
        engine.dispose()


def _drop_schema(postgres: str, schema: str) -> None:
    import psycopg

    try:
        with psycopg.connect(postgres, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SET lock_timeout = '20s'")
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except psycopg.Error as exc:
        print(f"could not drop schema {schema}: {exc}", file=sys.stderr)


def _xact_commit(postgres: str) -> int:
    """The transactions committed so far in the URL's database (all clients)."""
    import psycopg

    with psycopg.connect(postgres, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every instance; SIGKILL to any still running a few seconds later."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + STOP_GRACE
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)


@dataclass(frozen=True)
class _Case:
    jobs: int
    instances: int
    every: float
    seconds: float
    postgres: str
    broker: str
    redis: str
    shared_task: bool
    #: The data store's schema, of this case only; also its event channel.
    schema: str


def run_case(
    jobs: int,
    instances: int,
    every: float,
    seconds: float,
    *,
    postgres: str = POSTGRES,
    broker: str = "asyncpg",
    redis: str = REDIS,
    shared_task: bool = False,
) -> PeerResult:
    """Run one case and return its figures (``.row()`` is its line of the table)."""
    if broker not in BROKERS:
        raise ValueError(f"unknown event broker {broker!r}: one of {', '.join(BROKERS)}")
    schema = f"apsbench_{uuid.uuid4().hex[:8]}"
    case = _Case(jobs, instances, every, seconds, postgres, broker, redis, shared_task, schema)
    tmp = Path(tempfile.mkdtemp(prefix="apscheduler-bench-"))
    outs = [tmp / f"i{k}.jsonl" for k in range(instances)]
    try:
        began, ended, committed = _run(case, outs)
        return _figures(case, outs, began, ended, committed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(case: _Case, outs: list[Path]) -> tuple[float, float, int]:
    """Run the instances; return when the window began and ended, and PG's commits in it.

    Whatever happens, every instance is stopped and the schema dropped on the way out.
    """
    procs: list[subprocess.Popen[bytes]] = []
    # Adding the schedules takes a few store round trips each.
    ready_timeout = 60 + case.jobs * 0.05
    code = "import sys; from benchmarks.apscheduler_peer import instance; instance(sys.argv[1:])"
    try:
        _create_schema(case.postgres, case.schema)
        deadline = time.time() + ready_timeout + case.seconds + 60
        for k, out in enumerate(outs):
            argv = [sys.executable, "-c", code, "--postgres", case.postgres]
            argv += ["--redis", case.redis, "--broker", case.broker, "--schema", case.schema]
            argv += ["--name", f"i{k}", "--jobs", str(case.jobs), "--every", str(case.every)]
            argv += ["--deadline", str(deadline), "--out", str(out)]
            argv += ["--shared-task"] if case.shared_task else []
            procs.append(subprocess.Popen(argv, cwd=ROOT, start_new_session=True))
        wait_until = time.monotonic() + ready_timeout
        while not all(Path(f"{out}.ready").exists() for out in outs):
            if time.monotonic() > wait_until or any(p.poll() is not None for p in procs):
                raise RuntimeError("the benchmark's APScheduler instances did not start")
            time.sleep(0.05)
        began = time.time()
        committed = _xact_commit(case.postgres)
        time.sleep(case.seconds)
        committed = _xact_commit(case.postgres) - committed
        return began, time.time(), committed
    finally:
        try:
            _stop(procs)
        finally:
            _drop_schema(case.postgres, case.schema)


def _figures(
    case: _Case, outs: list[Path], began: float, ended: float, committed: int
) -> PeerResult:
    runs: Counter[str] = Counter()
    wins: Counter[int] = Counter()
    in_window: set[str] = set()
    lateness: list[float] = []
    calls = cpu = rss = wall = 0.0
    for k, out in enumerate(outs):
        if not out.exists():
            raise RuntimeError(f"instance i{k} of {case.schema} wrote no figures")
        for line in out.read_text().splitlines():
            record = json.loads(line)
            if "stats" in record:
                stats = record["stats"]
                calls += sum(stats["calls"].values())
                cpu += stats["cpu"]
                wall = max(wall, stats["wall"])
                rss = max(rss, stats["rss_mb"])
                if stats["state"] != "started":
                    print(f"instance i{k} was {stats['state']} at the end", file=sys.stderr)
                continue
            runs[record["slot"]] += 1
            if began <= record["at"] <= ended:
                in_window.add(record["slot"])
                wins[k] += 1
                lateness.append(record["started"] - record["at"])
    # Slots due after every instance was ready, at least one interval before the end.
    every = case.every
    first = math.ceil(began / every) * every
    due = [first + n * every for n in range(int((ended - every - first) // every) + 1)]
    expected = {f"job{n:05d}@{round(t * 1000)}" for n in range(case.jobs) for t in due}
    ticks = max(1.0, wall / every) * case.instances
    total = max(1, sum(wins.values()))
    version = importlib.metadata.version("apscheduler")
    tasks = ", one shared task" if case.shared_task else ""
    return PeerResult(
        store=f"APScheduler {version} (PostgreSQL, {case.broker} events{tasks})",
        jobs=case.jobs,
        instances=case.instances,
        every=every,
        seconds=case.seconds,
        lateness=lateness,
        doubled=sum(1 for n in runs.values() if n > 1),
        missed=len(expected - set(runs)),
        busiest_share=max(wins.values(), default=0) / total,
        least_share=min((wins.get(k, 0) for k in range(case.instances)), default=0) / total,
        calls_per_tick=calls / ticks,
        cpu_share=cpu / max(wall, 1e-9) / case.instances,
        rss_mb=rss,
        pg_per_slot=committed / max(1, len(in_window)),
        schema=case.schema,
    )


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="benchmarks.apscheduler_peer", description=doc)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--postgres", default=POSTGRES, help="a postgresql:// URL")
    parser.add_argument("--broker", choices=BROKERS, default="asyncpg")
    parser.add_argument("--redis", default=REDIS, help="with --broker redis")
    parser.add_argument("--shared-task", action="store_true", help="every schedule on the one task")
    args = parser.parse_args(argv)
    # SIGTERM ends the run as an error does: the instances are stopped, the schema dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    print(HEADER, flush=True)
    result = run_case(
        args.jobs,
        args.instances,
        args.every,
        args.seconds,
        postgres=args.postgres,
        broker=args.broker,
        redis=args.redis,
        shared_task=args.shared_task,
    )
    print(result.row(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
