"""django-celery-beat's rows sent by anarchon's beats and by django-celery-beat's own scheduler.

Real ``celery beat`` processes of one Django project
(benchmarks/django_project: django-celery-beat's tables on a new PostgreSQL
database per case, the Redis broker, a queue of the case's own), each in a
process group of its own:

- anarchon: ``celery beat -S anarchon_celery:DatabaseScheduler`` in 3
  processes, claims in the broker's Redis, every setting anarchon's default
  (execution tracking off: no worker runs);
- django-celery-beat: ``celery beat -S
  django_celery_beat.schedulers:DatabaseScheduler``, Django's and its own
  defaults (``CONN_MAX_AGE`` 0).

Two measurements:

- **scale**: 10,000 enabled rows, each a crontab row ``* * * * *`` (one
  shared ``CrontabSchedule``), made with one ``bulk_create`` before the beats
  start; anarchon in 3 beats, then django-celery-beat in one (as it must run),
  each for 3 minutes on a database of its own;
- **duplicates**: 5 rows every 2 s, made once every beat has started (as the
  admin adds rows), each row's ``last_run_at`` one interval before the first
  slot measured, so that every beat first sends them at that slot's time;
  django-celery-beat in 3 beats at once beside anarchon in 3 beats, 60 s.

No worker runs: the benchmark pops the queues itself, and each beat stamps
every message just before it is published (``before_task_publish``: the time
and the beat's process id). The measured window starts at the first slot
time (a minute boundary, or a multiple of the interval since the Unix epoch)
after every beat of the case has started, and lasts the case's length; the
slots due in it are those at least one interval before its end (3 minutes of
the minute crontab; 30 slots of a 2 s interval in 60 s). Per case:

- **slots due**: rows x slot times in the window;
- **messages**: tasks published in the window;
- **slots sent**, **sent twice / 3 times or more**, **missed** (slots due
  less slots sent). anarchon's slot is in the message (its ``anarchon``
  header's ``slot_id``, ``<row>@<unix ms>``). django-celery-beat aims each
  send of a row at the row's next due time after the previous send of the
  same beat (``last_run_at``, set as the send is reserved, a fraction of a
  millisecond before its stamp): the next minute boundary of a crontab row,
  the previous send plus the interval of an interval row; a row's first send
  aims at the next due time after its ``last_run_at``, or after its
  ``date_changed`` when it has none. Sends of one row aimed at due times less
  than half an interval apart are one slot sent several times (the grids of
  3 beats drift apart by their lateness). A crontab row sent more than a
  minute late skips a minute (beat sends it once, then aims at the next
  boundary after that send), and an interval row's sends drift by their
  lateness: both leave slots due unsent, counted missed, as are slots not
  sent when the beats are stopped. anarchon's beats report the slots they
  do not send (a ``missed`` line in their log: beats held up past the next
  slot skip the one they waited for, as documented; see
  :mod:`benchmarks.missed`); the missed column says how many of its missed
  slots were so reported. The beats of a group run on past the end of the
  window until every slot due in anarchon's cases was sent or reported
  missed, at most :data:`benchmarks.missed.DRAIN_TIMEOUT` (no wait when all
  were sent by the end), then are stopped together; a slot due in the
  window counts as sent whenever it was sent before they stopped, in every
  case alike;
- **lateness**: the publish stamp minus the slot's time (anarchon) or the due
  time the send aimed at (django-celery-beat), p50 / p99 / max in ms;
- **CPU per beat**: user + system time of each beat over the window
  (``/proc/<pid>/stat``), as a share of one core, the mean and the busiest;
  **peak RSS**: the largest ``VmHWM`` among the case's beats.

Each case drops its database, its queue and anarchon's namespace in Redis.
``--short`` (the test suite's smoke) runs every case at once, on 100 rows
every 2 s instead of 10,000 crontab rows, 6 s each, in about 35 s::

    .venv/bin/python -m benchmarks.django_beat
    .venv/bin/python -m benchmarks.django_beat --short
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

from benchmarks import missed
from benchmarks.celery_beat import cpu_seconds, peak_rss_mb, stop_groups

ROOT = Path(__file__).resolve().parents[1]
#: The PostgreSQL server of the project's databases (one new database per case).
SERVER = "postgresql://postgres@127.0.0.1:5432/test"
BROKER = "redis://127.0.0.1:6379/0"
APP = "benchmarks.django_project.celery_app"
ANARCHON = "anarchon_celery:DatabaseScheduler"
STOCK = "django_celery_beat.schedulers:DatabaseScheduler"
#: The crontab of the scale rows: every minute.
MINUTELY = "* * * * *"
#: How long the beats of a case may take to start (and 10,000 rows to be read).
START_TIMEOUT = 120.0
#: The first slot measured is at least this long after every beat has started.
SETTLE = 2.0
#: Rows made while the beats run are first due at least this long after they are
#: written (``rows.py ahead``): django-celery-beat's longest sleep between two
#: reads of its change marker (5 s), then some for a loaded machine.
ADDED_LEAD = 12.0

HEADER = (
    "| Case | Scheduler | Beats | Rows | Schedule | Measured | Slots due | Messages"
    " | Slots sent | Sent twice / 3 times or more | Missed | Lateness p50 / p99 / max (ms)"
    " | CPU per beat (mean / busiest) | Peak RSS (MB) |"
    "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


@dataclass(frozen=True)
class Case:
    """One row of the table: ``schedule`` is :data:`MINUTELY` or an interval in seconds."""

    kind: str
    scheduler: str
    beats: int
    rows: int
    schedule: str
    seconds: float
    #: The rows are made once every beat has started (else before the beats start).
    added: bool = False

    @property
    def anarchon(self) -> bool:
        return self.scheduler == ANARCHON

    @property
    def cron(self) -> bool:
        return self.schedule == MINUTELY

    @property
    def every(self) -> float:
        return 60.0 if self.cron else float(self.schedule)

    @property
    def label(self) -> str:
        if self.anarchon:
            return "anarchon"
        return f"django-celery-beat {version('django-celery-beat')}"


def cases(short: bool = False) -> list[list[Case]]:
    """The cases in groups: the cases of a group run at the same time, groups one by one."""
    if short:
        return [
            [
                Case("scale", ANARCHON, 3, 100, "2", 6.0),
                Case("scale", STOCK, 1, 100, "2", 6.0),
                Case("duplicates", STOCK, 3, 5, "2", 6.0, added=True),
                Case("duplicates", ANARCHON, 3, 5, "2", 6.0, added=True),
            ]
        ]
    return [
        [Case("scale", ANARCHON, 3, 10000, MINUTELY, 180.0)],
        [Case("scale", STOCK, 1, 10000, MINUTELY, 180.0)],
        [
            Case("duplicates", STOCK, 3, 5, "2", 60.0, added=True),
            Case("duplicates", ANARCHON, 3, 5, "2", 60.0, added=True),
        ],
    ]


@dataclass
class Result:
    """The figures of one case (see the module's docstring)."""

    case: Case
    due: int
    messages: int
    sent: int
    twice: int
    more: int
    missed: int
    lateness: list[float]
    cpu: list[float]
    rss_mb: float
    #: Of the slots missed, those a beat reported missed (anarchon's only).
    reported: int = 0
    #: What the case made, all dropped by the end of the case.
    database: str = ""
    queue: str = ""
    namespace: str = ""

    def row(self) -> str:
        late = sorted(self.lateness)

        def ms(p: float) -> str:
            if not late:
                return "-"
            return f"{late[min(len(late) - 1, int(len(late) * p))] * 1000:,.0f}"

        case = self.case
        schedule = f"`{case.schedule}`" if case.cron else f"every {case.schedule} s"
        seconds = case.seconds
        minutes = seconds % 60 == 0 and seconds > 60
        measured = f"{seconds / 60:g} min" if minutes else f"{seconds:g} s"
        cpu = f"{sum(self.cpu) / len(self.cpu):.1%} / {max(self.cpu):.1%}" if self.cpu else "-"
        missed_cell = f"{self.missed:,}"
        missed_cell += f" ({self.reported:,} reported)" if self.reported else ""
        return (
            f"| {case.kind} | {case.label} | {case.beats} | {case.rows:,} | {schedule} |"
            f" {measured} | {self.due:,} | {self.messages:,} | {self.sent:,} |"
            f" {self.twice:,} / {self.more:,} | {missed_cell} |"
            f" {ms(0.5)} / {ms(0.99)} / {ms(1.0)} | {cpu} | {self.rss_mb:.0f} |"
        )


# -- the project's database ---------------------------------------------------------


class Database:
    """A new database of the project on :data:`SERVER`'s server, migrated."""

    def __init__(self, server: str = SERVER) -> None:
        self.name = f"bench_dj_{uuid.uuid4().hex[:12]}"
        parts = urlsplit(server)
        self.admin = urlunsplit(parts._replace(path="/postgres"))
        self.url = urlunsplit(parts._replace(path=f"/{self.name}"))
        self.env = {
            "BENCH_DJ_DATABASE": self.url,
            "DJANGO_SETTINGS_MODULE": "benchmarks.django_project.settings",
        }

    def create(self) -> None:
        self._admin(f"CREATE DATABASE {self.name}")
        self.rows("migrate")

    def drop(self) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")

    def rows(self, *argv: str) -> str:
        """``benchmarks/django_project/rows.py`` on this database; what it printed."""
        env = dict(os.environ, **self.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.django_project.rows", *argv],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rows {' '.join(argv)}: {done.stderr[-3000:]}")
        return done.stdout

    def changed(self) -> dict[str, float]:
        """Each row's ``date_changed`` (Unix seconds)."""
        import psycopg

        with psycopg.connect(self.url) as conn:
            found = conn.execute(
                "SELECT name, extract(epoch FROM date_changed) FROM django_celery_beat_periodictask"
            ).fetchall()
        return {str(name): float(at) for name, at in found}

    def _admin(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(statement)


# -- the queues -----------------------------------------------------------------


class Consumer(threading.Thread):
    """Pops the cases' queues as fast as messages come."""

    def __init__(self, url: str, queues: list[str]) -> None:
        super().__init__(name="django-beat consumer", daemon=True)
        self.client = redis.Redis.from_url(url, socket_timeout=10)
        self.queues = queues
        self.raw: dict[str, list[bytes]] = {queue: [] for queue in queues}
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.drain()
        except BaseException as exc:  # reported by finish(), which fails the case
            self.error = exc

    def drain(self) -> None:
        popped: Any = self.client.brpop(self.queues, timeout=0.5)
        if not popped:
            return
        self.raw[popped[0].decode()].append(popped[1])
        for queue in self.queues:
            while batch := self.client.rpop(queue, 1000):
                self.raw[queue].extend(batch)  # type: ignore[arg-type]

    def finish(self) -> None:
        self.halt.set()
        self.join(10)
        if self.error is None:
            self.drain()  # whatever came after the last pop
        self.client.close()
        if self.error is not None:
            raise RuntimeError(f"the queues' consumer failed: {self.error!r}")


@dataclass(frozen=True)
class Send:
    """One published message: the row, the beat's process, its stamp, the anarchon slot."""

    row: str
    beat: int
    stamp: float
    slot: float | None


def sends_of(raw: list[bytes]) -> list[Send]:
    """The messages popped, read from the headers that benchmarks/django_project/celery_app.py
    stamps (``bench_published``, ``bench_beat``) and that both schedulers set."""
    found = []
    for message in raw:
        headers = json.loads(message)["headers"]
        info = headers.get("anarchon") or {}
        slot = None
        if info.get("slot_id"):
            slot = int(str(info["slot_id"]).rsplit("@", 1)[1]) / 1000
        stamp = float(headers["bench_published"])
        found.append(Send(headers["periodic_task_name"], int(headers["bench_beat"]), stamp, slot))
    return found


# -- the figures ------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """The measured window: slots due from ``first`` to ``end`` less one interval."""

    first: float
    end: float
    every: float

    @property
    def slots(self) -> list[float]:
        count = math.floor((self.end - self.every - self.first) / self.every + 1e-9) + 1
        return [self.first + k * self.every for k in range(max(0, count))]

    def holds(self, due: float) -> bool:
        """Whether a due time is one of the window's slots (django-celery-beat's grids
        drift by their lateness: within half an interval)."""
        half = self.every / 2
        return self.first - half <= due < self.end - half


@dataclass
class Tally:
    sent: int = 0
    twice: int = 0
    more: int = 0
    missed: int = 0
    #: Of the slots missed, those reported missed (:func:`benchmarks.missed.reported`).
    reported: int = 0
    lateness: list[float] = field(default_factory=list)

    def count(self, copies: int) -> None:
        """One slot sent ``copies`` times (0: missed)."""
        if copies == 0:
            self.missed += 1
            return
        self.sent += 1
        self.twice += copies == 2
        self.more += copies > 2


def anarchon_tally(
    sends: list[Send],
    rows: list[str],
    window: Window,
    told: frozenset[missed.Slot] = frozenset(),
) -> Tally:
    """Slots from the messages' ``anarchon`` header, against the window's grid;
    ``told``: the slots the beats reported missed."""
    copies: Counter[tuple[str, float]] = Counter()
    tally = Tally()
    slots = {round(s, 3) for s in window.slots}
    for send in sends:
        if send.slot is not None and round(send.slot, 3) in slots:
            copies[(send.row, round(send.slot, 3))] += 1
            tally.lateness.append(send.stamp - send.slot)
    for row in rows:
        for slot in slots:
            tally.count(copies[(row, slot)])
    ran = {(send.row, round(send.slot * 1000)) for send in sends if send.slot is not None}
    missing = [(row, round(slot * 1000)) for row in rows for slot in slots]
    tally.reported = missed.reported([s for s in missing if s not in ran], ran, told)
    return tally


def stock_tally(
    sends: list[Send], rows: list[str], window: Window, cron: bool, start: dict[str, float]
) -> Tally:
    """Due times as django-celery-beat works them out, from each beat's previous send.

    ``start``: each row's ``last_run_at`` when the beats read it (its
    ``date_changed`` when it had none). A row's missed slots are its slots due
    less the slots it sent: a send late for a minute boundary by more than a
    minute skips the next one, and an interval row drifts by its lateness.
    """

    def next_due(previous: float) -> float:
        if cron:
            return (math.floor(previous / window.every) + 1) * window.every
        return previous + window.every

    by_row: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for send in sends:
        by_row[send.row][send.beat].append(send.stamp)
    tally = Tally()
    due_per_row = len(window.slots)
    for row in rows:
        # The due time each send aimed at, and its lateness.
        aims: list[tuple[float, float]] = []
        for stamps in by_row[row].values():
            previous = start[row]
            for stamp in sorted(stamps):
                due = next_due(previous)
                aims.append((due, stamp - due))
                previous = stamp
        aims.sort()
        # Due times of several beats less than half an interval apart: one slot.
        slots: list[list[tuple[float, float]]] = []
        for aim in aims:
            if slots and aim[0] - slots[-1][0][0] < window.every / 2:
                slots[-1].append(aim)
            else:
                slots.append([aim])
        sent = [slot for slot in slots if window.holds(slot[0][0])]
        for slot in sent:
            tally.count(len(slot))
            tally.lateness += [lateness for _, lateness in slot]
        tally.missed += max(0, due_per_row - len(sent))
    return tally


# -- one case ----------------------------------------------------------------------


@dataclass
class CaseRun:
    """The database, beats and readings of one case; :meth:`stop` may be called at any point."""

    case: Case
    database: Database
    broker: str = BROKER
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="anarchon-dj-")))
    queue: str = field(default_factory=lambda: f"bench-dj-{uuid.uuid4().hex[:10]}")
    namespace: str = field(default_factory=lambda: f"bench-dj-{uuid.uuid4().hex[:10]}")
    beats: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: Each row's last_run_at as the beats first read it (its date_changed when it has none).
    start: dict[str, float] = field(default_factory=dict)
    window: Window | None = None
    cpu_begun: list[float] = field(default_factory=list)
    cpu_ended: list[float] = field(default_factory=list)
    rss_mb: float = 0.0
    created: bool = False
    stopped: bool = False

    @property
    def rows(self) -> list[str]:
        return [f"r{n:05d}" for n in range(self.case.rows)]

    def prepare(self) -> None:
        self.created = True  # dropped whatever happens next (DROP DATABASE IF EXISTS)
        self.database.create()
        if not self.case.added:
            self.database.rows("create", str(self.case.rows), self.case.schedule)
            self.start = self.database.changed()

    def launch(self) -> None:
        (self.tmp / "ready").mkdir()
        env = dict(os.environ, **self.database.env)
        env.update(
            BENCH_DJ_BROKER=self.broker,
            BENCH_DJ_QUEUE=self.queue,
            BENCH_DJ_NAMESPACE=self.namespace,
            BENCH_DJ_READY=str(self.tmp / "ready"),
        )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        for k in range(self.case.beats):
            argv = [sys.executable, "-m", "celery", "-A", APP, "beat", "-S", self.case.scheduler]
            argv += ["-s", str(self.tmp / f"celerybeat-schedule-{k}"), "--loglevel", "WARNING"]
            with open(self.tmp / f"beat-{k}.log", "wb") as log:
                self.beats.append(
                    subprocess.Popen(
                        argv,
                        cwd=self.tmp,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def ready(self) -> bool:
        """Whether every beat has started; a beat that exited is an error."""
        self.check_alive("exited before it started")
        return len(list((self.tmp / "ready").iterdir())) >= len(self.beats)

    def check_alive(self, what: str) -> None:
        for k, proc in enumerate(self.beats):
            if proc.poll() is not None:
                log = (self.tmp / f"beat-{k}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(
                    f"{self.case.kind}, {self.case.label}: beat {k} {what}"
                    f" (status {proc.returncode}):\n{log}"
                )

    def plan(self, now: float) -> None:
        """The window; rows made while the beats run are made now, first due at its start
        (:data:`ADDED_LEAD` after they were written, however long their process took)."""
        every = self.case.every
        if self.case.added:
            argv = [str(self.case.rows), self.case.schedule, repr(ADDED_LEAD), repr(every)]
            first = float(self.database.rows("ahead", *argv))
            self.start = dict.fromkeys(self.rows, first - every)
        else:
            first = math.ceil((now + SETTLE) / every) * every
        self.window = Window(first, first + self.case.seconds, every)

    def begin(self) -> None:
        self.check_alive("exited during the run")
        self.cpu_begun = [cpu_seconds(p.pid) for p in self.beats]

    def end(self) -> None:
        self.check_alive("exited during the run")
        self.cpu_ended = [cpu_seconds(p.pid) for p in self.beats]
        self.rss_mb = max(peak_rss_mb(p.pid) for p in self.beats)

    def told_missed(self) -> frozenset[missed.Slot]:
        """The slots the beats' logs report missed."""
        return frozenset(missed.from_logs(self.tmp.glob("beat-*.log")))

    def unaccounted(self, raw: list[bytes]) -> int:
        """How many of anarchon's slots due in the window were neither sent (a message
        holds it) nor reported missed yet; 0 for django-celery-beat's cases, whose slots
        are known only from each beat's sends."""
        if not self.case.anarchon or self.window is None:
            return 0
        tally = anarchon_tally(sends_of(list(raw)), self.rows, self.window, self.told_missed())
        return tally.missed - tally.reported

    def stop(self) -> None:
        """Stop the beats; drop the database, the queue and anarchon's namespace."""
        if self.stopped:
            return
        self.stopped = True
        try:
            stop_groups(self.beats)
        finally:
            try:
                if self.created:
                    self.database.drop()
            finally:
                drop_keys(self.broker, self.queue, self.namespace)
                shutil.rmtree(self.tmp, ignore_errors=True)

    def result(self, raw: list[bytes]) -> Result:
        window = self.window
        assert window is not None
        # Sends after the end count for the slots due in the window (the beats ran on
        # until anarchon's were all sent); the messages column counts the window's only.
        sends = sends_of(raw)
        if self.case.anarchon:
            tally = anarchon_tally(sends, self.rows, window, self.told_missed())
        else:
            tally = stock_tally(sends, self.rows, window, self.case.cron, self.start)
        span = max(1e-9, window.end - window.first)
        cpu = [(b - a) / span for a, b in zip(self.cpu_begun, self.cpu_ended, strict=True)]
        return Result(
            self.case,
            due=len(self.rows) * len(window.slots),
            messages=sum(1 for s in sends if window.first <= s.stamp <= window.end),
            sent=tally.sent,
            twice=tally.twice,
            more=tally.more,
            missed=tally.missed,
            lateness=tally.lateness,
            cpu=cpu,
            rss_mb=self.rss_mb,
            reported=tally.reported,
            database=self.database.name,
            queue=self.queue,
            namespace=self.namespace,
        )


def drop_keys(url: str, queue: str, namespace: str) -> None:
    """The queue's keys (the list, kombu's binding) and anarchon's keys of the namespace."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        patterns = (f"*{queue}*", f"anarchon:{{{namespace}}}*", f"anarchon:{{{namespace}/*")
        keys = [key for pattern in patterns for key in client.scan_iter(pattern, count=1000)]
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def run_group(group: list[Case], server: str = SERVER, broker: str = BROKER) -> list[Result]:
    """Run the cases of ``group`` at the same time; their results, in the group's order."""
    runs = [CaseRun(case, Database(server), broker) for case in group]
    consumer: Consumer | None = None
    try:
        _each(runs, CaseRun.prepare)
        consumer = Consumer(broker, [run.queue for run in runs])
        consumer.start()
        for run in runs:
            run.launch()
        deadline = time.monotonic() + START_TIMEOUT
        while not all(run.ready() for run in runs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the beats did not start within {START_TIMEOUT:g}s")
            time.sleep(0.05)
        now = time.time()
        _each(runs, lambda run: run.plan(now))
        steps: list[tuple[float, Callable[[], None]]] = []
        for run in runs:
            assert run.window is not None
            steps += [(run.window.first, run.begin), (run.window.end, run.end)]
        for at, step in sorted(steps, key=lambda s: s[0]):
            time.sleep(max(0.0, at - time.time()))
            step()
        # The last sends (or missed reports) of the slots due, late on a loaded machine,
        # before the beats stop.
        missed.drain(lambda: sum(run.unaccounted(consumer.raw[run.queue]) for run in runs))
        stop_groups([beat for run in runs for beat in run.beats])
        consumer.finish()  # pops whatever the beats sent until they exited
        return [run.result(consumer.raw[run.queue]) for run in runs]
    finally:
        if consumer is not None and consumer.is_alive():
            consumer.halt.set()
            consumer.join(10)
        for run in runs:
            run.stop()


def _each(runs: list[CaseRun], act: Callable[[CaseRun], None]) -> None:
    """``act`` on every run at once (each mostly waits on a subprocess or the server)."""
    with ThreadPoolExecutor(len(runs)) as pool:
        for done in [pool.submit(act, run) for run in runs]:
            done.result()


def results(short: bool = False, server: str = SERVER, broker: str = BROKER) -> list[Result]:
    """Every case's result, in the table's order, each row printed as it comes."""
    done = []
    for group in cases(short):
        for result in run_group(group, server, broker):
            done.append(result)
            print(result.row(), flush=True)
    return done


def run(short: bool = False) -> list[str]:
    """The table's rows, one per case (see :data:`HEADER`)."""
    print(HEADER, flush=True)
    return [result.row() for result in results(short)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.django_beat", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument(
        "--short", action="store_true", help="100 rows every 2 s, 6 s per case, all at once"
    )
    run(parser.parse_args(argv).short)
    return 0


if __name__ == "__main__":
    sys.exit(main())
