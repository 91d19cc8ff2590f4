"""Failover after SIGKILL: anarchon core beside celery-redbeat, as one Markdown table.

**anarchon core.** Three instance processes, each an :class:`anarchon_core.Scheduler`
on the Redis store under a fresh namespace, share one job every 3 x lease seconds
whose handler runs 2.5 x lease seconds (30 s and 25 s at the default lease of
10 s); ``watch`` is the default 0.5 s. Each instance appends a line to its own
file when a handler starts (instance, slot id, attempt, wall time). Once
attempt 1 of a new slot starts, its instance is killed with SIGKILL; the
failover time runs from the kill to the start of attempt 2 of that slot on
another instance. The killed instance is started again before the next
repetition, so three instances always run; each repetition uses a later slot.

**celery-redbeat.** Two ``celery beat --scheduler redbeat.RedBeatScheduler``
processes share a private redis-server (broker and ``redbeat_redis_url``) and
one entry every second. Only the beat holding redbeat's lock publishes, and
each message's ``origin`` header names the publishing process, so the holder
is the process behind the messages on the broker's ``celery`` list. It is
killed with SIGKILL; the failover time runs from the kill to the first message
published afterwards, by the other beat. Redbeat's lock timeout defaults to
5 x ``beat_max_loop_interval``, whose default is 300 s: 1500 s (25 minutes).
A standby beat retries the lock every ``beat_max_loop_interval`` (redis-py's
``Lock.acquire`` sleeps that long between attempts), so three settings are
measured:

- the default (lock 1500 s, retry every 300 s): measured up to ``cap``
  seconds, once, and reported as "> cap";
- ``redbeat_lock_timeout = 10`` alone: the lock lapses within 10 s, but the
  standby retries only every 300 s; measured up to ``cap``, once;
- ``redbeat_lock_timeout = 10`` with ``beat_max_loop_interval = 2`` (the ratio
  of redbeat's own default, lock = 5 x interval): repeated like anarchon's.

Fast mode, for a smoke test: with a lease below 5 s (``run(repeats=1,
lease=2.0, cap=15.0)``), anarchon's job runs every 6 s with a 5 s handler (the
same scaling), and redbeat's short lock timeout is 3 s (retry every 0.6 s)
instead of 10 s.

Every process runs in a process group of its own and is stopped at the end,
errors included (SIGTERM, then SIGKILL after a grace period), as are the
private redis-servers; the anarchon namespace is removed from Redis.

Run::

    .venv/bin/python -m benchmarks.failover --repeats 3 --lease 10 --cap 90
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Container
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from benchmarks.appended import Appended
from benchmarks.ports import free_port

log = logging.getLogger("benchmarks.failover")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STORE = "redis://127.0.0.1:6379/0"

HEADER = (
    "| Scheduler | Setting | Failover after SIGKILL (s): each run / max | Expected |\n"
    "|---|---|---|---|"
)

#: anarchon's instances, and the job's interval and handler duration per second of lease.
INSTANCES = 3
EVERY_PER_LEASE = 3.0
HANDLER_PER_LEASE = 2.5
#: anarchon's default ``watch``: how often a backup reads the lease it watches.
WATCH = 0.5

#: celery.beat.DEFAULT_MAX_INTERVAL: ``beat_max_loop_interval`` when unset (seconds).
BEAT_MAX_INTERVAL = 300.0
#: RedBeatScheduler's lock timeout when unset: this many beat max intervals.
REDBEAT_LOCK_FACTOR = 5
#: redbeat's short lock timeout, and the one of the fast mode (a lease below FAST_LEASE).
SHORT_LOCK, FAST_LOCK, FAST_LEASE = 10.0, 3.0, 5.0
#: The redbeat entry's interval (seconds).
BEAT_EVERY = 1.0

#: How often the output files and logs are read while waiting (seconds).
POLL = 0.02
#: How long processes get to start, and to stop after SIGTERM before SIGKILL (seconds).
START_TIMEOUT, STOP_GRACE = 60.0, 5.0

T = TypeVar("T")


@dataclass
class Result:
    """The failover times of one setting; ``None`` where none came within ``limit`` seconds."""

    scheduler: str
    setting: str
    times: list[float | None]
    limit: float
    expected: str

    @property
    def worst(self) -> float | None:
        """The longest failover, ``None`` if one did not come within ``limit``."""
        if not self.times or any(t is None for t in self.times):
            return None
        return max(t for t in self.times if t is not None)

    def row(self) -> str:
        def cell(value: float | None) -> str:
            return f"> {self.limit:g}" if value is None else f"{value:.2f}"

        each = ", ".join(cell(t) for t in self.times) or "-"
        return (
            f"| {self.scheduler} | {self.setting} | {each} / {cell(self.worst)} | {self.expected} |"
        )


# -- processes ---------------------------------------------------------------


class Processes:
    """The processes of one measurement, each the leader of a process group of its own.

    Leaving the ``with`` block stops every one still running: SIGTERM to its
    group, then SIGKILL to the groups still there after ``STOP_GRACE`` seconds.
    """

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(
        self, argv: list[str], output: Path, cwd: Path = ROOT, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with output.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with self._lock:
            self._procs.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL ``proc``'s group and reap it."""
        _signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)

    def stop_all(self) -> None:
        with self._lock:
            live = [proc for proc in self._procs if proc.poll() is None]
        for proc in live:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for proc in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        for proc in live:
            # The whole group: a leader that exited may leave members behind.
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


class Aborted(RuntimeError):
    """Another part of the measurement failed or was interrupted: this one stops too."""


def _until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    abort: threading.Event | None = None,
) -> T:
    """Poll ``check`` until it returns something other than ``None``; TimeoutError after
    ``timeout`` seconds, naming ``what`` was awaited; Aborted once ``abort`` is set."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s")
        if abort is None:
            time.sleep(POLL)
        elif abort.wait(POLL):
            raise Aborted(f"stopped while waiting for {what}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _drop_namespace(store: str, namespace: str) -> None:
    try:
        from tests.cleanup import drop_namespace
    except ImportError:  # run without the tests alongside
        return
    drop_namespace(store, namespace)


# -- anarchon core -----------------------------------------------------------


def serve(argv: list[str] | None = None) -> None:
    """One anarchon instance: a scheduler with the benchmark's job until SIGTERM.

    Each handler start is appended to ``--out`` as a JSON line (instance, slot,
    attempt, wall time); the handler then runs ``--handler`` seconds.
    ``--out`` + ``.ready`` is created once the scheduler runs.
    """
    parser = argparse.ArgumentParser(prog="benchmarks.failover serve")
    parser.add_argument("--store", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--every", type=float, required=True)
    parser.add_argument("--handler", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from anarchon_core import Run, Scheduler

    out = open(args.out, "a")  # noqa: SIM115 (open for the life of the process)
    written = threading.Lock()

    def handler(run: Run) -> None:
        started = time.time()
        line = {"instance": args.name, "slot": run.slot_id, "attempt": run.attempt, "at": started}
        with written:
            out.write(json.dumps(line) + "\n")
            out.flush()
        time.sleep(args.handler)

    cron = Scheduler(args.store, namespace=args.namespace, instance=args.name, lease=args.lease)
    cron.add_job(handler, name="failover", every=args.every)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cron.start()
    Path(args.out + ".ready").touch()
    stop.wait()
    cron.stop()
    out.close()


SERVE = "import sys; from benchmarks.failover import serve; serve(sys.argv[1:])"


class _Starts(Appended):
    """The handler starts the instances recorded, read from their output files as they grow."""

    def new_slot(self, since: float, measured: set[str]) -> dict[str, Any] | None:
        """The first attempt 1 started at ``since`` or later, of a slot not ``measured``."""
        return next(
            (
                start
                for start in self.poll()
                if start["attempt"] == 1 and start["at"] >= since and start["slot"] not in measured
            ),
            None,
        )

    def takeover(self, slot: str) -> dict[str, Any] | None:
        """The first start of ``slot`` after its first attempt."""
        return next(
            (start for start in self.poll() if start["slot"] == slot and start["attempt"] >= 2),
            None,
        )


def measure_anarchon(
    store: str, repeats: int, lease: float, namespace: str | None = None
) -> Result:
    """Kill the instance running a slot, ``repeats`` times; time the takeover of each."""
    every, busy = EVERY_PER_LEASE * lease, HANDLER_PER_LEASE * lease
    namespace = namespace or f"failover-{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="anarchon-failover-"))
    starts = _Starts()
    live: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    wait_takeover = lease + max(15.0, lease)
    times: list[float | None] = []
    try:
        with Processes() as procs:

            def launch(name: str) -> None:
                out = workdir / f"{name}.jsonl"
                argv = [sys.executable, "-c", SERVE, "--store", store, "--namespace", namespace]
                argv += ["--name", name, "--lease", f"{lease:g}", "--every", f"{every:g}"]
                argv += ["--handler", f"{busy:g}", "--out", str(out)]
                live[name] = (procs.start(argv, workdir / f"{name}.log"), out)
                starts.files.append(out)

            def ready() -> bool | None:
                for name, (proc, _) in live.items():
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"instance {name} exited:\n{_tail(workdir / f'{name}.log')}"
                        )
                return all(Path(f"{out}.ready").exists() for _, out in live.values()) or None

            for k in range(INSTANCES):
                launch(f"i{k}")
            _until(ready, START_TIMEOUT, "start of every instance")
            ready_at, measured = time.time(), set[str]()
            for rep in range(repeats):
                # Attempt 1 of a slot that started once every instance ran.
                first = _until(
                    functools.partial(starts.new_slot, ready_at, measured),
                    3 * every + 30,
                    "new slot started",
                )
                slot, victim = first["slot"], first["instance"]
                measured.add(slot)
                proc, _ = live.pop(victim)
                Processes.kill(proc)
                killed_at = time.time()
                try:
                    takeover = _until(
                        functools.partial(starts.takeover, slot),
                        wait_takeover,
                        f"takeover of {slot}",
                    )
                    times.append(takeover["at"] - killed_at)
                    log.info(
                        "anarchon: %s killed on %s, taken over by %s after %.2f s",
                        slot,
                        victim,
                        takeover["instance"],
                        times[-1],
                    )
                except TimeoutError:
                    times.append(None)
                    log.info("anarchon: %s killed on %s, not taken over", slot, victim)
                if rep < repeats - 1:
                    launch(f"{victim.split('-')[0]}-{rep + 1}")
                    _until(ready, START_TIMEOUT, "restart of the killed instance")
                    ready_at = time.time()
    finally:
        _drop_namespace(store, namespace)
        shutil.rmtree(workdir, ignore_errors=True)
    return Result(
        "anarchon core",
        f"lease = {lease:g} s, watch = {WATCH:g} s; {INSTANCES} instances on Redis;"
        f" job every {every:g} s, handler {busy:g} s",
        times,
        wait_takeover,
        f"≤ {lease + 1:g} (lease + 1 s)",
    )


# -- celery-redbeat ----------------------------------------------------------

BEAT_APP = """\
from celery import Celery

app = Celery("failover", broker={url!r})
app.conf.redbeat_redis_url = {url!r}
app.conf.beat_schedule = {{"tick": {{"task": "failover.tick", "schedule": {every!r}}}}}
"""

#: redbeat's banner line about its lock: ". lock -> `redbeat::lock` 25.00 minutes (1500s)".
LOCK_BANNER = re.compile(r"\. lock -> `[^`]*` .*\((\d+(?:\.\d+)?)s\)")
ORIGIN = re.compile(r"gen(\d+)@")


@dataclass
class BeatCase:
    """One redbeat configuration: ``None`` leaves a setting at its default."""

    lock_timeout: float | None
    max_interval: float | None
    repeats: int

    @property
    def interval(self) -> float:
        """How often the standby beat retries the lock."""
        return self.max_interval or BEAT_MAX_INTERVAL

    @property
    def lock(self) -> float:
        return self.lock_timeout or REDBEAT_LOCK_FACTOR * self.interval

    def app(self, url: str) -> str:
        text = BEAT_APP.format(url=url, every=BEAT_EVERY)
        if self.lock_timeout is not None:
            text += f"app.conf.redbeat_lock_timeout = {self.lock_timeout:g}\n"
        if self.max_interval is not None:
            text += f"app.conf.beat_max_loop_interval = {self.max_interval:g}\n"
        return text

    def setting(self, lock: float) -> str:
        interval = f"beat_max_loop_interval = {self.interval:g} s"
        if self.max_interval is None:
            interval += " (default)"
        if self.lock_timeout is None:
            lock_text = f"default lock timeout = {lock:g} s ({REDBEAT_LOCK_FACTOR} x interval)"
        else:
            lock_text = f"redbeat_lock_timeout = {lock:g}"
        return f"{lock_text}, {interval}; 2 beats, entry every {BEAT_EVERY:g} s"

    def expected(self, lock: float) -> str:
        # The lock lapses at most ``lock`` s after the kill (the holder renews it each tick,
        # at least every second); the standby takes it at its next retry after that.
        low, high = lock - BEAT_EVERY, lock + self.interval
        return (
            f"{low:g} to {high:g} (the lock lapses within {lock:g} s; the standby retries"
            f" every {self.interval:g} s)"
        )


class _Broker:
    """The messages published on the private redis-server's ``celery`` list."""

    def __init__(self, url: str, abort: threading.Event) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.abort = abort

    def close(self) -> None:
        self.client.close()

    def next_publisher(self, timeout: float) -> tuple[int, float] | None:
        """The pid of the next message's beat and when it was received (monotonic)."""
        popped = self.client.blpop(["celery"], timeout=min(timeout, 0.1))
        if not popped:
            return None
        at = time.monotonic()
        message = json.loads(cast("tuple[bytes, bytes]", popped)[1])
        found = ORIGIN.match(str(message.get("headers", {}).get("origin", "")))
        if found is None:
            raise RuntimeError(f"a message without its origin: {message!r}")
        return int(found.group(1)), at

    def first_from(
        self, timeout: float, among: Container[int] | None = None, other_than: int | None = None
    ) -> tuple[int, float] | None:
        """The first message published by a beat ``among`` those given and ``other_than``
        the one given, or ``None`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self.abort.is_set():
                raise Aborted("stopped while waiting for a message")
            found = self.next_publisher(left)
            if found is None or found[0] == other_than:
                continue
            if among is None or found[0] in among:
                return found
        return None


def _start_redis(procs: Processes, workdir: Path, abort: threading.Event) -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    argv += ["no", "--dir", str(workdir)]
    proc = procs.start(argv, workdir / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    def answers() -> bool | None:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited:\n{_tail(workdir / 'redis.log')}")
        client = redis.Redis.from_url(url, socket_timeout=1)
        try:
            return bool(client.ping()) or None
        except redis.RedisError:
            return None
        finally:
            client.close()

    _until(answers, START_TIMEOUT, "answer from the private redis-server", abort)
    return url


def measure_redbeat(case: BeatCase, cap: float, abort: threading.Event | None = None) -> Result:
    """Kill the beat holding redbeat's lock, ``case.repeats`` times; time the next publish.

    Setting ``abort`` (from another thread) stops the measurement: Aborted is raised
    once its processes are stopped.
    """
    abort = abort or threading.Event()
    workdir = Path(tempfile.mkdtemp(prefix="redbeat-failover-"))
    times: list[float | None] = []
    lock = case.lock
    try:
        with Processes() as procs:
            url = _start_redis(procs, workdir, abort)
            (workdir / "beatapp.py").write_text(case.app(url))
            broker = _Broker(url, abort)
            beats: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}
            argv = [sys.executable, "-m", "celery", "-A", "beatapp", "beat"]
            argv += ["--scheduler", "redbeat.RedBeatScheduler", "--loglevel", "DEBUG"]
            env = {**os.environ, "PYTHONPATH": str(workdir)}

            def launch(n: int) -> None:
                output = workdir / f"beat{n}.log"
                proc = procs.start(argv, output, cwd=workdir, env=env)
                beats[proc.pid] = (proc, output)

            def waiting() -> bool | None:
                """Every beat runs and has tried to take the lock."""
                for proc, output in beats.values():
                    if proc.poll() is not None:
                        raise RuntimeError(f"a beat exited:\n{_tail(output)}")
                logs = [output.read_text(errors="replace") for _, output in beats.values()]
                return all("Acquiring lock" in text for text in logs) or None

            try:
                launch(0)
                launch(1)
                for rep in range(case.repeats):
                    _until(waiting, START_TIMEOUT, "beat trying to take the lock", abort)
                    broker.client.delete("celery")
                    found = broker.first_from(START_TIMEOUT, among=beats)
                    if found is None:
                        raise RuntimeError("no beat publishes")
                    holder = found[0]
                    proc, output = beats.pop(holder)
                    banner = LOCK_BANNER.search(output.read_text(errors="replace"))
                    lock = float(banner.group(1)) if banner else lock
                    Processes.kill(proc)
                    killed_at = time.monotonic()
                    found = broker.first_from(cap, other_than=holder)
                    times.append(None if found is None else found[1] - killed_at)
                    log.info(
                        "redbeat (lock %g s, retry every %g s): failover %s",
                        lock,
                        case.interval,
                        f"after {times[-1]:.2f} s" if times[-1] is not None else f"> {cap:g} s",
                    )
                    if found is None:
                        break
                    if rep < case.repeats - 1:
                        launch(rep + 2)
            finally:
                broker.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return Result("celery-redbeat", case.setting(lock), times, cap, case.expected(lock))


# -- the table ---------------------------------------------------------------


def beat_cases(repeats: int, lease: float) -> list[BeatCase]:
    """The redbeat settings measured: the default, the short lock alone, and the short lock
    with the standby retrying as often as redbeat's default ratio has it (lock / 5).

    The capped settings run once: their outcome is fixed by the lock's TTL or the
    standby's retry interval, both longer than any cap the table uses.
    """
    short = SHORT_LOCK if lease >= FAST_LEASE else FAST_LOCK
    return [
        BeatCase(None, None, 1),
        BeatCase(short, None, 1),
        BeatCase(short, short / REDBEAT_LOCK_FACTOR, repeats),
    ]


def measure(
    repeats: int = 3,
    lease: float = 10.0,
    cap: float = 90.0,
    *,
    store: str = DEFAULT_STORE,
    namespace: str | None = None,
) -> list[Result]:
    """anarchon first, while no redbeat process runs; then the redbeat settings side by
    side, each on a private redis-server of its own. If one of them fails (or the wait
    is interrupted), the others stop too, and the error is raised once all have stopped.
    """
    results = [measure_anarchon(store, repeats, lease, namespace)]
    cases = beat_cases(repeats, lease)
    abort = threading.Event()
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = [pool.submit(measure_redbeat, case, cap, abort) for case in cases]
        try:
            for future in as_completed(futures):
                future.result()
        except BaseException:
            abort.set()
            raise
    return results + [future.result() for future in futures]


def run(repeats: int = 3, lease: float = 10.0, cap: float = 90.0) -> list[str]:
    """The table's rows (see :data:`HEADER`)."""
    return [result.row() for result in measure(repeats, lease, cap)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.failover", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--repeats", type=int, default=3, help="kills per setting (default 3)")
    parser.add_argument("--lease", type=float, default=10.0, help="anarchon's lease (default 10)")
    parser.add_argument(
        "--cap", type=float, default=90.0, help="longest wait for redbeat's failover (default 90)"
    )
    parser.add_argument("--store", default=DEFAULT_STORE, help="anarchon's Redis store URL")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    # SIGTERM ends the benchmark like Ctrl-C: its processes are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    results = measure(args.repeats, args.lease, args.cap, store=args.store)
    print(HEADER)
    for result in results:
        print(result.row())
    return 0


if __name__ == "__main__":
    sys.exit(main())
