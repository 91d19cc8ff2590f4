"""Celery beat side by side: anarchon, celery-redbeat and stock beat sending the same entries.

Each case runs real ``celery beat`` processes, each in a process group of its
own, on a private ``redis-server`` (broker, and store where there is one)
started for that case alone on a free port:

- anarchon: 3 beats with ``--scheduler anarchon_celery:Scheduler``, the broker
  as the store, once with the default ``anarchon_jitter`` (0) and once with a
  jitter of 1 s (at most a tenth of the interval); every other setting is
  anarchon's default (execution tracking on: with no worker to answer its
  ``inspect conf``, beat sends in dispatch-only mode);
- celery-redbeat: 3 beats with ``--scheduler redbeat.RedBeatScheduler``,
  ``redbeat_redis_url`` the same server, default lock settings (one beat
  holds the lock and sends, the others wait for it);
- stock beat: 1 beat, ``PersistentScheduler`` on a temporary schedule file.

Every case has the same ``beat_schedule``: N entries, each a
``timedelta(seconds=every)`` interval naming a task that no worker runs. The
benchmark consumes the Celery queue itself (BRPOP, then RPOP in batches), and
each beat stamps every message just before it is published (a
``before_task_publish`` handler writes ``time.time()`` into a header). The
measured window starts once every beat of the case has started (``beat_init``)
and lasts ``--seconds``. Measured per case:

- **lateness**: the message's publish stamp minus the time the scheduler meant
  to send it, for messages published in the window, p50 / p99 / max in ms.
  anarchon aims at the slot's time: intervals are slots on a grid of multiples
  of the interval since the Unix epoch, and the slot is in the message (its
  ``anarchon`` header's ``slot_id``, ``<entry>@<unix ms>``); jitter is part of
  its lateness. Stock beat and redbeat aim at ``last_run_at + interval``,
  where ``last_run_at`` is set as the previous send of the entry is reserved,
  a fraction of a millisecond before that send's stamp: their target is taken
  as the previous stamp of the entry plus the interval, so their lateness is
  the gap between two consecutive sends of an entry minus the interval (the
  first send of each entry, whose target depends on when the entry was first
  read, has none). Their grid therefore drifts by each send's lateness;
  anarchon's does not.
- **longest round**: from the first to the last publish of one round, the
  longest of the rounds inside the window. A round is, for anarchon, the
  messages of one slot time; for beat and redbeat, the k-th send of every
  entry (every entry is first due at the same time, then each follows its own
  previous send). Beat's and redbeat's lateness leaves this spread out: a
  round that took 2 s is followed by one spread over at least 2 s too, each
  entry on time against its own previous send.
- **mean period**: the mean time between two consecutive sends of one entry
  (the later one in the window), against the ``--every`` asked for. Beat's
  and redbeat's is the interval plus their mean lateness, which accumulates:
  the entries run less often than asked. anarchon's slots stay on the grid,
  so its period differs from the interval only by the difference between
  its lateness at the first and at the last slot of the window, divided by
  the number of intervals between them.
- **duplicated**: anarchon, a slot (entry and slot time) published more than
  once; beat and redbeat, two sends of one entry less than half an interval
  apart (one due time sent twice).
- **missed**: due times in the window, at least one interval before its end,
  for which no message had been published when the beats were stopped.
  anarchon: every slot of the grid after the window's start, and the beats
  run on past the window until each was sent or reported missed (at most
  :data:`benchmarks.missed.DRAIN_TIMEOUT`; a beat held up past the next slot
  skips the one it waited for and reports it, see :mod:`benchmarks.missed`),
  the column saying how many were reported; beat and redbeat, stopped at the
  end of the window (so a send more than an interval late counts as
  missed): the due time that follows each entry's last send (an entry never
  sent misses every due time of the window).
- **Redis commands per slot**: the server's ``total_commands_processed`` over
  the window, minus the benchmark's own commands (its BRPOP, RPOP and INFO),
  divided by the messages published in the window: claims, lock renewals,
  schedule reads and writes, and the broker traffic of the publishes. Redis
  counts each command a Lua script runs (anarchon's claims and changes are
  scripts that read ``TIME``, ``HMGET`` and write) and each command queued in
  a ``MULTI``/``EXEC`` (redbeat's pipelines), so this counts work on the
  server, not round trips. ``--commands`` prints the breakdown by command
  (``INFO commandstats``).
- **CPU per beat**: user + system time of each beat process over the window
  (``/proc/<pid>/stat``), as a share of one core: the mean over the beats and
  the busiest beat. **Peak RSS**: the largest ``VmHWM`` of the case's beats.

Cases run one after another, so that none competes with another for the CPU.
A smoke of at most 100 entries runs them all at the same time (``together``),
which makes ``run(entries=20, seconds=12, every=2)`` take about 25 s instead
of over a minute.

::

    .venv/bin/python -m benchmarks.celery_beat --entries 1000 --seconds 60
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from anarchon_core.jobs import DEFAULT_JITTER
from benchmarks import missed
from benchmarks.appended import Appended
from benchmarks.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
#: The environment variable that configures the app of a benchmark beat (JSON).
CONFIG = "ANARCHON_BENCH_BEAT"
#: The task every entry names; no worker runs it.
TASK = "bench.noop"
#: Celery's default queue: a Redis list the benchmark pops.
QUEUE = "celery"
#: Message headers: the entry's name, and when the beat published the message.
ENTRY = "bench_entry"
PUBLISHED = "bench_published"
#: At most this many entries: the cases run at the same time unless told otherwise.
TOGETHER_UP_TO = 100
#: How long the beats of a case may take to start.
START_TIMEOUT = 90.0
#: The worker's processes, with ``--worker``.
WORKER_CONCURRENCY = 2
#: With a worker: how long after every process is up the window starts (beat hands
#: slots off once the worker has answered its ``inspect conf``).
WORKER_WARMUP = 6.0
#: How long a beat has to exit after SIGTERM before it gets SIGKILL.
STOP_TIMEOUT = 15.0

HEADER = (
    "| Scheduler | Beats | Entries | Every | Published | Lateness p50 / p99 / max (ms)"
    " | Longest round (ms) | Mean period (s) | Duplicated | Missed | Redis commands per slot"
    " | CPU per beat (mean / busiest) | Peak RSS (MB) |"
    "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


@dataclass(frozen=True)
class Case:
    """One row: ``scheduler`` is ``anarchon``, ``redbeat`` or ``beat``."""

    label: str
    scheduler: str
    beats: int
    jitter: float | None = None


def cases(every: float) -> list[Case]:
    """The four rows, in the table's order."""
    other = min(DEFAULT_JITTER, every / 10)
    return [
        Case("anarchon, jitter 0 (default)", "anarchon", 3),
        Case(f"anarchon, jitter {other:g} s", "anarchon", 3, other),
        Case("celery-redbeat", "redbeat", 3),
        Case("stock beat", "beat", 1),
    ]


Messages = dict[str, list[tuple[float, dict[str, Any]]]]


@dataclass
class Sends:
    """What the messages of one case say, against the scheduler's own targets."""

    lateness: list[float]
    duplicated: int
    missed: int
    #: The longest round, from its first to its last publish, among rounds inside the window.
    spread: float
    #: The mean time between two sends of one entry.
    period: float
    #: Of the slots missed, those the beats reported missed (anarchon's only).
    reported: int = 0


@dataclass
class Result:
    case: Case
    entries: int
    every: float
    published: int
    sends: Sends
    commands: int
    by_command: Counter[str]
    cpu: list[float]
    rss_mb: float
    #: Of the messages published in the window, those sent with execution tracking.
    tracked: int = 0

    @property
    def commands_per_slot(self) -> float:
        return self.commands / max(1, self.published)

    def row(self) -> str:
        late = sorted(self.sends.lateness)

        def ms(p: float) -> str:
            if not late:
                return "-"
            return str(round(late[min(len(late) - 1, int(len(late) * p))] * 1000))

        cpu = f"{sum(self.cpu) / len(self.cpu):.1%} / {max(self.cpu):.1%}" if self.cpu else "-"
        missed_cell = str(self.sends.missed)
        missed_cell += f" ({self.sends.reported} reported)" if self.sends.reported else ""
        return (
            f"| {self.case.label} | {self.case.beats} | {self.entries} | {self.every:g} s |"
            f" {self.published} | {ms(0.5)} / {ms(0.99)} / {ms(1.0)} |"
            f" {round(self.sends.spread * 1000)} | {self.sends.period:.2f} |"
            f" {self.sends.duplicated} |"
            f" {missed_cell} | {self.commands_per_slot:.2f} | {cpu} | {self.rss_mb:.0f} |"
        )


# -- the app every benchmark beat runs -------------------------------------------


def entry_names(entries: int) -> list[str]:
    return [f"e{n:05d}" for n in range(entries)]


def beat_app(config: dict[str, Any]) -> Any:
    """The Celery app of a benchmark beat: the entries, the publish stamp, the ready mark."""
    from celery import Celery, signals

    every = timedelta(seconds=float(config["every"]))
    app = Celery("anarchon_bench", broker=config["broker"])
    app.conf.update(
        timezone="UTC",
        broker_connection_retry_on_startup=True,
        beat_schedule={
            name: {"task": TASK, "schedule": every, "options": {"headers": {ENTRY: name}}}
            for name in entry_names(int(config["entries"]))
        },
    )
    if config["scheduler"] == "redbeat":
        app.conf.redbeat_redis_url = config["broker"]
    if config.get("jitter") is not None:
        app.conf.anarchon_jitter = float(config["jitter"])
    ready = Path(config["ready"])
    if config.get("record"):
        _record_tasks(app, Path(config["record"]))

    def stamp(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers is not None:
            headers[PUBLISHED] = time.time()

    def started(**_: Any) -> None:
        # Before redbeat's own beat_init handler, which waits for its lock.
        (ready / str(os.getpid())).touch()

    signals.before_task_publish.connect(stamp, weak=False)
    signals.beat_init.connect(started, weak=False)
    signals.worker_ready.connect(started, weak=False)
    return app


def _record_tasks(app: Any, path: Path) -> None:
    """In a worker: the task every entry names, and a line per task started (no Redis
    command of its own), which the benchmark reads in place of the queue."""
    from celery import signals

    @app.task(name=TASK)
    def noop() -> None:
        return None

    def started(task: Any = None, **_: Any) -> None:
        request = task.request
        line = {
            "headers": {
                ENTRY: getattr(request, ENTRY, None),
                PUBLISHED: getattr(request, PUBLISHED, None),
                "anarchon": getattr(request, "anarchon", None),
            },
            "started": time.time(),
        }
        with open(path, "a") as out:  # one write per line: processes may share the file
            out.write(json.dumps(line) + "\n")

    signals.task_prerun.connect(started, weak=False)


#: ``celery -A benchmarks.celery_beat beat``: the app, in a benchmark beat only.
app: Any = beat_app(json.loads(os.environ[CONFIG])) if CONFIG in os.environ else None


# -- processes -------------------------------------------------------------------


def stop_group(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL it if it outlives ``timeout``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stop_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every group at once, then wait for each (SIGKILL past the timeout)."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for proc in procs:
        stop_group(proc, max(0.1, deadline - time.monotonic()))


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server on a free port, without persistence: the process and its URL."""
    for _ in range(5):
        port = free_port()
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--daemonize", "no", "--dir", str(tmp)]
        with open(tmp / f"redis-{port}.log", "wb") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url, socket_timeout=1)
        deadline = time.monotonic() + 10
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    client.ping()
                    return proc, url
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        stop_group(proc)  # the port was taken meanwhile, or the server did not start
    raise RuntimeError(f"redis-server did not start; see {tmp}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (``/proc/<pid>/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """The peak resident set size of ``pid`` (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Consumer(threading.Thread):
    """Pops Celery's queue as fast as messages come; counts its own Redis commands."""

    def __init__(self, url: str) -> None:
        super().__init__(name=f"consumer {url}", daemon=True)
        self.client = redis.Redis.from_url(url, socket_timeout=10)
        self.client.ping()  # connects now, before any count is read
        self.raw: list[bytes] = []
        self.commands: Counter[str] = Counter()
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.drain()
        except BaseException as exc:  # reported by the case, which fails
            self.error = exc

    def drain(self) -> None:
        popped: Any = self.client.brpop([QUEUE], timeout=0.5)
        self.commands["brpop"] += 1
        if not popped:
            return
        self.raw.append(popped[1])
        while True:
            batch: Any = self.client.rpop(QUEUE, 1000)
            self.commands["rpop"] += 1
            if not batch:
                return
            self.raw.extend(batch)

    def finish(self) -> None:
        self.halt.set()
        self.join(5)
        self.client.close()
        if self.error is not None:
            raise RuntimeError(f"the queue's consumer failed: {self.error!r}")


# -- one case --------------------------------------------------------------------


@dataclass
class Window:
    """What is read at one end of the measured window."""

    at: float
    cpu: list[float]
    info: dict[str, Any]
    own: Counter[str]


@dataclass
class CaseRun:
    """The processes of one case, and its readings; :meth:`stop` may be called at any point."""

    case: Case
    entries: int
    every: float
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="anarchon-beat-")))
    redis_proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    consumer: Consumer | None = None
    probe: redis.Redis | None = None
    beats: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: With a worker: it runs the tasks and writes a line per task (the queue is its).
    worker: subprocess.Popen[bytes] | None = None
    with_worker: bool = False
    #: The worker's lines, read before the case's directory goes.
    ran: list[str] = field(default_factory=list)
    #: The slots the beats' logs report missed, read before the case's directory goes.
    told: set[missed.Slot] = field(default_factory=set)
    begun: Window | None = None
    ended: Window | None = None
    rss_mb: float = 0.0
    stopped: bool = False

    @property
    def ready_dir(self) -> Path:
        return self.tmp / "ready"

    @property
    def record(self) -> Path:
        return self.tmp / "tasks.jsonl"

    def start(self) -> None:
        self.redis_proc, self.url = start_redis(self.tmp)
        if not self.with_worker:
            self.consumer = Consumer(self.url)
            self.consumer.start()
        # Connected now: connecting sends commands of its own (CLIENT SETINFO).
        self.probe = redis.Redis.from_url(self.url, socket_timeout=10)
        self.probe.ping()
        self.ready_dir.mkdir()
        config = {
            "broker": self.url,
            "entries": self.entries,
            "every": self.every,
            "scheduler": self.case.scheduler,
            "jitter": self.case.jitter,
            "ready": str(self.ready_dir),
            "record": str(self.record) if self.with_worker else None,
        }
        env = dict(os.environ, **{CONFIG: json.dumps(config)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if self.with_worker:
            worker = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_beat", "worker"]
            with open(self.tmp / "worker.log", "wb") as log:
                self.worker = subprocess.Popen(
                    [*worker, "--concurrency", str(WORKER_CONCURRENCY), "--loglevel", "INFO"],
                    cwd=self.tmp,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        argv = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_beat", "beat"]
        if self.case.scheduler == "anarchon":
            argv += ["--scheduler", "anarchon_celery:Scheduler"]
        elif self.case.scheduler == "redbeat":
            argv += ["--scheduler", "redbeat.RedBeatScheduler"]
        for k in range(self.case.beats):
            own = [*argv, "-s", str(self.tmp / f"celerybeat-schedule-{k}")]
            with open(self.tmp / f"beat-{k}.log", "wb") as log:
                self.beats.append(
                    subprocess.Popen(
                        own,
                        cwd=self.tmp,  # anything a beat writes goes to the case's directory
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def ready(self) -> bool:
        """Whether every beat has started; a beat that exited is an error."""
        self.check_alive("exited before it started")
        expected = len(self.beats) + (self.worker is not None)
        return len(list(self.ready_dir.iterdir())) >= expected

    def check_alive(self, what: str) -> None:
        procs = [(f"beat {k}", f"beat-{k}.log", proc) for k, proc in enumerate(self.beats)]
        if self.worker is not None:
            procs.append(("the worker", "worker.log", self.worker))
        for name, file, proc in procs:
            if proc.poll() is not None:
                log = (self.tmp / file).read_text(errors="replace")[-3000:]
                raise RuntimeError(
                    f"{self.case.label}: {name} {what} (status {proc.returncode}):\n{log}"
                )

    def read(self) -> Window:
        assert self.probe is not None
        own = Counter(self.consumer.commands if self.consumer is not None else {})
        info: dict[str, Any] = self.probe.info("all")
        return Window(time.time(), [cpu_seconds(p.pid) for p in self.beats], info, own)

    def begin(self) -> None:
        self.begun = self.read()

    def end(self) -> None:
        self.check_alive("exited during the run")
        self.rss_mb = max(peak_rss_mb(p.pid) for p in self.beats)
        self.ended = self.read()

    def unaccounted(self, ran_by_worker: Appended) -> int:
        """anarchon's slots due in the window neither sent yet nor reported missed
        (0 for the other schedulers, or before the window has ended); with a worker,
        ``ran_by_worker`` reads its record."""
        if self.case.scheduler != "anarchon" or self.begun is None or self.ended is None:
            return 0
        if self.consumer is not None:
            found = [json.loads(raw) for raw in list(self.consumer.raw)]
        else:
            found = ran_by_worker.poll()
        ran = {
            (m["headers"][ENTRY], missed.slot_of(str(m["headers"]["anarchon"]["slot_id"]))[1])
            for m in found
        }
        due = missed.due_on_grid(
            entry_names(self.entries), self.every, self.begun.at, self.ended.at
        )
        return missed.unaccounted(due, ran, missed.from_logs(self.tmp.glob("beat-*.log")))

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        try:
            # anarchon's last slots due, sent late on a loaded machine (or reported missed).
            ran_by_worker = Appended([self.record])
            missed.drain(lambda: self.unaccounted(ran_by_worker))
            self.told = missed.from_logs(self.tmp.glob("beat-*.log"))
            stop_groups(self.beats)
            if self.worker is not None:
                time.sleep(0.5)  # what the beats sent last is run
                stop_group(self.worker)
            if self.consumer is not None:
                time.sleep(0.2)  # what the beats sent last is popped
                self.consumer.finish()
            if self.probe is not None:
                self.probe.close()
        finally:
            if self.redis_proc is not None:
                stop_group(self.redis_proc)
            if self.record.exists():
                self.ran = self.record.read_text().splitlines()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def messages(self) -> list[dict[str, Any]]:
        """What each message published says: its headers (and, run by a worker, when)."""
        if self.consumer is not None:
            return [json.loads(raw) for raw in self.consumer.raw]
        return [json.loads(line) for line in self.ran if line]

    def result(self) -> Result:
        assert self.begun is not None and self.ended is not None
        start, end = self.begun.at, self.ended.at
        messages: Messages = defaultdict(list)
        for message in self.messages():
            headers = message["headers"]
            messages[headers[ENTRY]].append((float(headers[PUBLISHED]), headers))
        inside = [h for sent in messages.values() for stamp, h in sent if start <= stamp <= end]
        published = len(inside)
        tracked = sum(1 for headers in inside if (headers.get("anarchon") or {}).get("tracked"))
        if self.case.scheduler == "anarchon":
            sends = anarchon_slots(messages, self.entries, self.every, start, end, self.told)
        else:
            sends = interval_sends(messages, self.entries, self.every, start, end)
        commands, by_command = command_counts(self.begun, self.ended)
        wall = max(1e-9, end - start)
        cpu = [(b - a) / wall for a, b in zip(self.begun.cpu, self.ended.cpu, strict=True)]
        return Result(
            self.case,
            self.entries,
            self.every,
            published,
            sends,
            commands,
            by_command,
            cpu,
            self.rss_mb,
            tracked,
        )


def command_counts(begun: Window, ended: Window) -> tuple[int, Counter[str]]:
    """The commands the server ran in the window, the benchmark's own taken out."""
    own = ended.own - begun.own
    own["info"] += 1  # the first reading's INFO (a command counts once it has run)
    by_command: Counter[str] = Counter()
    for key, value in ended.info.items():
        if key.startswith("cmdstat_") and isinstance(value, dict):
            name = key.removeprefix("cmdstat_")
            old = begun.info.get(key, {}).get("calls", 0)
            by_command[name] = int(value["calls"]) - int(old)
    by_command.subtract(own)
    by_command = +by_command  # drop what is left at zero
    total = int(ended.info["total_commands_processed"])
    total -= int(begun.info["total_commands_processed"])
    return total - sum(own.values()), by_command


def due_count(first: float, every: float, after: float, until: float) -> int:
    """How many times ``first + k * every`` (k >= 0) lie in ``(after, until]``."""
    if first > until:
        return 0
    upto = math.floor((until - first) / every) + 1
    before = math.floor((after - first) / every) + 1 if first <= after else 0
    return max(0, upto - before)


def longest_round(rounds: list[list[float]], start: float, end: float) -> float:
    """The longest time from the first to the last publish of a round inside the window."""
    inside = [r for r in rounds if r and start <= min(r) and max(r) <= end]
    return max((max(r) - min(r) for r in inside), default=0.0)


def mean_period(stamps: list[list[float]], every: float, start: float, end: float) -> float:
    """The mean time between two sends of one entry, the later one in the window."""
    gaps = [
        later - earlier
        for sent in stamps
        for earlier, later in itertools.pairwise(sent)
        if later - earlier >= every / 2 and start <= later <= end
    ]
    return sum(gaps) / len(gaps) if gaps else 0.0


def anarchon_slots(
    messages: Messages,
    entries: int,
    every: float,
    start: float,
    end: float,
    told: set[missed.Slot] | None = None,
) -> Sends:
    """Lateness against the slot's time; duplicated and missed slots of the epoch grid,
    and of the missed those reported (``told``: the slots the beats reported missed)."""
    told = told or set()
    lateness: list[float] = []
    sent: Counter[tuple[str, int]] = Counter()
    rounds: dict[int, list[float]] = defaultdict(list)
    for name, stamps in messages.items():
        for stamp, headers in stamps:
            slot_ms = int(str(headers["anarchon"]["slot_id"]).rsplit("@", 1)[1])
            sent[(name, slot_ms)] += 1
            rounds[slot_ms].append(stamp)
            if start <= stamp <= end:
                lateness.append(stamp - slot_ms / 1000)
    missing = [
        slot
        for slot in missed.due_on_grid(entry_names(entries), every, start, end)
        if slot not in sent
    ]
    duplicated = sum(1 for n in sent.values() if n > 1)
    by_entry = [sorted(stamp for stamp, _ in sent_) for sent_ in messages.values()]
    return Sends(
        lateness,
        duplicated,
        len(missing),
        longest_round(list(rounds.values()), start, end),
        mean_period(by_entry, every, start, end),
        missed.reported(missing, sent, told),
    )


def interval_sends(
    messages: Messages, entries: int, every: float, start: float, end: float
) -> Sends:
    """Lateness against the previous send plus the interval; doubled sends, missed due times."""
    lateness: list[float] = []
    duplicated = missed = 0
    latest_due = end - every
    by_entry: list[list[float]] = []
    for name in entry_names(entries):
        stamps = sorted(stamp for stamp, _ in messages.get(name, []))
        by_entry.append(stamps)
        if not stamps:
            missed += max(0, math.floor((latest_due - start) / every))
            continue
        for previous, stamp in itertools.pairwise(stamps):
            if stamp - previous < every / 2:
                duplicated += 1
            elif start <= stamp <= end:
                lateness.append(stamp - previous - every)
        # The entry's next due time, never sent, and the grid that would follow it.
        missed += due_count(stamps[-1] + every, every, start, latest_due)
    # Round k: the k-th send of every entry (all entries start together, each then
    # follows its own previous send).
    depth = min((len(sent) for sent in by_entry), default=0)
    rounds = [[sent[k] for sent in by_entry] for k in range(depth)]
    return Sends(
        lateness,
        duplicated,
        missed,
        longest_round(rounds, start, end),
        mean_period(by_entry, every, start, end),
    )


# -- the benchmark ---------------------------------------------------------------


def results(
    entries: int,
    seconds: float,
    every: float = 10.0,
    together: bool | None = None,
    worker: bool = False,
    only: str | None = None,
) -> Iterator[Result]:
    """Run every case and yield its result: one after another, or all at once.

    ``worker``: a Celery worker runs the tasks (execution tracking on for
    anarchon's), and its commands count; else the benchmark pops the queue.
    ``only``: the cases of that scheduler alone.
    """
    if together is None:
        together = entries <= TOGETHER_UP_TO
    runs = [
        CaseRun(case, entries, every, with_worker=worker)
        for case in cases(every)
        if only is None or case.scheduler == only
    ]
    groups = [runs] if together else [[run] for run in runs]
    try:
        for group in groups:
            yield from _run_group(group, seconds)
    finally:
        for run in runs:
            run.stop()


def _run_group(group: list[CaseRun], seconds: float) -> list[Result]:
    try:
        for run in group:
            run.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not all(run.ready() for run in group):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the beats did not start within {START_TIMEOUT:g}s")
            time.sleep(0.05)
        if any(run.with_worker for run in group):
            time.sleep(WORKER_WARMUP)
        for run in group:
            run.begin()
        time.sleep(seconds)
        for run in group:
            run.end()
    finally:
        for run in group:
            run.stop()
    return [run.result() for run in group]


def run(
    entries: int,
    seconds: float,
    every: float = 10.0,
    worker: bool = False,
    together: bool | None = None,
) -> list[str]:
    """The table's rows, one per case (see :data:`HEADER`)."""
    found = results(entries, seconds, every, together, worker=worker)
    return [result.row() for result in found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.celery_beat", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument(
        "--together",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"run the cases at the same time (default: with at most {TOGETHER_UP_TO} entries)",
    )
    parser.add_argument(
        "--commands", action="store_true", help="then print each case's Redis commands per slot"
    )
    parser.add_argument(
        "--worker",
        action="store_true",
        help="a Celery worker runs the tasks (anarchon: tracking on), its commands counted",
    )
    parser.add_argument("--only", choices=["anarchon", "redbeat", "beat"], help="one scheduler")
    args = parser.parse_args(argv)
    done = []
    print(HEADER, flush=True)
    for result in results(
        args.entries, args.seconds, args.every, args.together, args.worker, args.only
    ):
        done.append(result)
        print(result.row(), flush=True)
    if args.commands:
        for result in done:
            slots = max(1, result.published)
            top = ", ".join(
                f"{name} {calls / slots:.2f}" for name, calls in result.by_command.most_common()
            )
            print(f"\n{result.case.label}: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
