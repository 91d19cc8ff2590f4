"""SIGTERM to a real ``celery beat`` at random moments of its tick: a prompt exit, no slot kept.

Each case runs several ``celery -A tests.celery.test_sigterm beat --scheduler
anarchon_celery:Scheduler`` processes side by side ("lanes"), each with a
namespace of its own in one store and :data:`ENTRIES` entries due every
second, claimed without jitter: at each second, a beat's scheduling step
claims, sends and finishes twenty slots. In rounds, every lane starts a beat;
after a seeded random delay it sends that beat SIGTERM 0-80 ms after a slot
boundary (inside or just after that step; each lane at its own second, once
every beat of the round has started), or, in the second test, at any moment
of the beat's first 2.5 seconds (imports, the scheduler's setup, the first
ticks). The time from the signal to the end of beat's shutdown (its exit
handlers) must stay within :data:`EXIT_LIMIT`, and the process must be gone
within :data:`PROCESS_LIMIT`, both counted without the time the beat waited
for a CPU that other processes held (:func:`cpu_waited` until its exit
handlers, :func:`main_thread_waited` until its end: what a loaded machine
adds, not what the beat's shutdown does); on a store that keeps leases no slot may be left
``running`` under the stopped beat's instance: each was finished or handed
over. RabbitMQ is claim-only: there only the exit time is checked. The
``-tracking`` case keeps beat's default of execution tracking on.

CI runs :data:`STOPS` stops per case. ``ANARCHON_SIGTERM_STOPS=200`` runs the
soak, ``ANARCHON_SIGTERM_SEED`` replays the delays of a failed run (each
failure names its seed), ``ANARCHON_SIGTERM_BEATS`` sets the number of lanes.

This module is also the Celery app of those beats: ``-A`` reads its ``app``,
built on first access from the ``SIGTERM_*`` environment variables.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import math
import os
import random
import re
import signal
import subprocess
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from anarchon_core import RunState, open_store
from tests.cleanup import drop_namespace
from tests.fleet import BIN, ROOT
from tests.processes import OWN_GROUP
from tests.waiting import wait_until

#: Beat's startup line: its entries are scheduled.
STARTED = re.compile(r"anarchon: \d+ entr.*, store ")

pytestmark = pytest.mark.scenario

#: Stops per store (``ANARCHON_SIGTERM_STOPS=200`` for the soak).
STOPS = int(os.environ.get("ANARCHON_SIGTERM_STOPS", "12"))
#: Beats stopped and restarted side by side, each in its own namespace.
BEATS = int(os.environ.get("ANARCHON_SIGTERM_BEATS", "4"))
#: The base seed of the random delays; printed, and named by every failure.
SEED = int(os.environ.get("ANARCHON_SIGTERM_SEED") or random.SystemRandom().randrange(10**6))
#: From SIGTERM to the end of beat's own shutdown (its exit handlers run), at most,
#: less the time the beat waited for a CPU meanwhile.
EXIT_LIMIT = 1.0
#: From SIGTERM to the process's end, at most: beat's shutdown plus the
#: interpreter's teardown (Celery's modules and objects), which CPU contention
#: stretches: under the full suite, 8 tests on 2 cores, that teardown alone was
#: seen to take 2 s. Less the time the beat waited for a CPU meanwhile: its threads'
#: until its exit handlers, or its main thread's until its end (read off the exited
#: process before it is reaped), whichever is longer. A hang is what
#: :data:`HANG_LIMIT` catches.
PROCESS_LIMIT = 4.0
#: A beat still alive this long after SIGTERM, less the time its main thread waited
#: for a CPU meanwhile, is counted as hung and killed (and at :data:`HANG_CAP` anyway).
HANG_LIMIT = 5.0
HANG_CAP = 30.0
#: Entries of the beats' schedule, every one due each second: a longer tick.
ENTRIES = 20
#: A slot left running by a stopped beat stays visible this long.
LEASE = 60.0
#: The longest a beat may take from its start to its first tick.
READY_LIMIT = 30.0
#: What a beat of this module writes to its log when its exit handlers run: the time,
#: and its :func:`cpu_waited` then.
EXITING = "sigterm-app: exit handlers at"


def cpu_waited(pid: int | str = "self") -> float:
    """Seconds the threads of process ``pid`` spent runnable but waiting for a CPU.

    The kernel's scheduler statistics (``/proc/<pid>/task/<tid>/schedstat``,
    the second field, in nanoseconds), summed over the threads alive now: on a
    machine busy with other tests, the time a beat's shutdown took beyond its
    own work and its waits on the store. 0.0 where the kernel does not say.
    """
    total = 0.0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += _task_waited(task)
    return total


def main_thread_waited(pid: int) -> float:
    """Seconds the main thread of process ``pid`` waited for a CPU (its schedstat, which
    stays readable after the process exits, until it is reaped). 0.0 where not said."""
    return _task_waited(Path(f"/proc/{pid}/task/{pid}"))


def _task_waited(task: Path) -> float:
    """The wait for a CPU in one thread's ``schedstat`` (its second field, ns), in seconds."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((task / "schedstat").read_text().split()[1]) / 1e9
    return 0.0


def exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


# -- the beats' Celery app -------------------------------------------------


def _beat_app() -> Any:
    from celery import Celery

    namespace = os.environ["SIGTERM_NAMESPACE"]
    beat_app = Celery("anarchon_sigterm", broker="memory://", set_as_current=True)
    beat_app.conf.update(
        beat_scheduler="anarchon_celery:Scheduler",
        anarchon_store=os.environ["SIGTERM_STORE"],
        anarchon_namespace=namespace,
        anarchon_lease=LEASE,
        # Every entry is claimed right at the second, all in one tick.
        anarchon_jitter=0,
        # No worker ever answers here: with tracking on or off, beat sends in
        # dispatch-only mode and holds each slot from its claim until the send
        # is recorded. With tracking on, it also asks the workers now and then.
        anarchon_tracking=os.environ.get("SIGTERM_TRACKING") == "1",
        beat_schedule={
            f"e{k:02d}": {"task": "sigterm.noop", "schedule": 1.0, "args": (k,)}
            for k in range(ENTRIES)
        },
        task_ignore_result=True,
        timezone="UTC",
    )
    # When the exit handlers ran, in the log: a late exit then shows whether beat's
    # shutdown or the interpreter's teardown took the time.
    atexit.register(
        lambda: os.write(2, f"{EXITING} {time.time():.6f} {cpu_waited():.6f}\n".encode())
    )
    # A beat that hangs after SIGTERM is sent SIGUSR1: its threads' stacks go to its log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    return beat_app


def __getattr__(name: str) -> Any:
    """``app`` for ``celery -A tests.celery.test_sigterm``; built only when asked for."""
    if name != "app":
        raise AttributeError(name)
    built = _beat_app()
    globals()["app"] = built
    return built


# -- the test ----------------------------------------------------------------------


@dataclass
class Stop:
    """One SIGTERM to one beat, and what came of it."""

    lane: int
    index: int
    moment: str
    pid: int
    log: Path
    #: Seconds from the signal to the process's exit; None: counted as hung (HANG_LIMIT).
    exit_after: float | None = None
    #: Wall-clock time of the signal.
    signalled_at: float = 0.0
    #: The beat's :func:`cpu_waited` as it was signalled.
    waited_at_signal: float = 0.0
    #: Seconds its main thread waited for a CPU from the signal to its end.
    main_waited: float = 0.0
    returncode: int | None = None
    #: Records left running under the stopped beat's instance.
    held: list[str] = field(default_factory=list)
    #: Slots the stopped beat handed over (released) as it stopped.
    released: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and self.exit_after is not None
            and self.exit_after - self.process_wait() <= PROCESS_LIMIT
            and (self.handlers_after() or 0.0) - self.cpu_wait() <= EXIT_LIMIT
            and not self.held
        )

    def describe(self) -> str:
        where = f"seed {SEED} lane {self.lane} stop {self.index} (pid {self.pid}, {self.moment})"
        if self.error:
            return f"{where}: {self.error}"
        if self.exit_after is None:
            return (
                f"{where}: still running {HANG_LIMIT:g}s after SIGTERM, less its CPU waits (killed)"
            )
        problems = []
        handlers, waited = self.handlers_after(), self.cpu_wait()
        if (
            self.exit_after - self.process_wait() > PROCESS_LIMIT
            or handlers is None
            or handlers - waited > EXIT_LIMIT
        ):
            problems.append(
                f"exited {self.exit_after:.2f}s after SIGTERM (limits, less the time it"
                f" waited for a CPU: {EXIT_LIMIT:g}s to its exit handlers, {PROCESS_LIMIT:g}s"
                f" to its end; {self.exit_handlers()}; its main thread waited for a CPU"
                f" {self.main_waited:.2f}s before its end)"
            )
        if self.held:
            problems.append("left running under its instance: " + "; ".join(self.held))
        return f"{where}: " + ", ".join(problems)

    def _exit_line(self) -> tuple[float, float] | None:
        """The time the beat's exit handlers ran, and its :func:`cpu_waited` then."""
        with contextlib.suppress(OSError):
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith(EXITING):
                    at, waited = line[len(EXITING) :].split()
                    return float(at), float(waited)
        return None

    def handlers_after(self) -> float | None:
        """Seconds from the signal to the beat's exit handlers; None if they never ran."""
        found = self._exit_line()
        return None if found is None else found[0] - self.signalled_at

    def cpu_wait(self) -> float:
        """Seconds the beat waited for a CPU from the signal to its exit handlers."""
        found = self._exit_line()
        return 0.0 if found is None else max(0.0, found[1] - self.waited_at_signal)

    def process_wait(self) -> float:
        """Seconds the beat waited for a CPU between the signal and its end, as far as
        known: its threads' until its exit handlers, or its main thread's until its end."""
        return max(self.cpu_wait(), self.main_waited)

    def exit_handlers(self) -> str:
        """When the beat's exit handlers ran: what of the exit time its shutdown took."""
        after = self.handlers_after()
        if after is None:
            return "its exit handlers never ran"
        return (
            f"its exit handlers ran {after:.2f}s after SIGTERM, {self.cpu_wait():.2f}s of"
            " which it waited for a CPU"
        )

    def log_tail(self, lines: int = 90) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


def _pid_of(owner: str) -> int | None:
    """The process id in an instance name (``host:pid:...``)."""
    parts = owner.split(":")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


class Lane:
    """Starts, signals and restarts one beat after another, in one namespace.

    The lanes go in rounds: each round, every lane starts a beat at the same
    time; the lanes that stop theirs just after a slot wait until every beat
    has started (start-up is what loads the machine, not a stop), then each
    signals its beat at its own moment.
    """

    def __init__(
        self,
        lane: int,
        stops: int,
        store: str,
        tmp: Path,
        rounds: threading.Barrier,
        key: str,
        tracking: bool,
        startup: float,
    ) -> None:
        self.lane = lane
        self.tracking = tracking
        #: The share of stops sent during the beat's first seconds instead of just after a slot.
        self.startup = startup
        self.stops = stops
        self.store = store
        self.tmp = tmp
        self.rounds = rounds
        self.namespace = f"sigterm-{uuid.uuid4().hex[:10]}-{lane}"
        self.random = random.Random(f"{SEED}:{key}:{lane}")
        self.results: list[Stop] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.leases = not store.startswith("amqp")
        self.crash = ""

    def spawn(self, log: Path) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SIGTERM_STORE": self.store,
            "SIGTERM_NAMESPACE": self.namespace,
            "SIGTERM_TRACKING": "1" if self.tracking else "",
        }
        argv = [str(BIN / "celery"), "-A", "tests.celery.test_sigterm", "beat"]
        argv += ["--scheduler", "anarchon_celery:Scheduler", "--loglevel", "INFO"]
        argv += ["-s", str(self.tmp / f"beat-{self.lane}-schedule")]
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv,
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                **OWN_GROUP,
            )

    def run(self) -> None:
        store = None
        try:
            if self.leases:
                store = open_store(self.store, namespace=self.namespace)
            for index in range(self.stops):
                self.rounds.wait()
                self.results.append(self.one(index, store))
        except threading.BrokenBarrierError:
            pass  # another lane crashed: it says why
        except Exception:
            self.crash = traceback.format_exc()
            self.rounds.abort()
        finally:
            self.kill()
            if store is not None:
                store.close()

    def one(self, index: int, store: Any) -> Stop:
        log = self.tmp / f"beat-{self.lane}-{index}.log"
        proc = self.proc = self.spawn(log)
        started = time.monotonic()
        if self.random.random() < self.startup:
            # During start-up: imports, beat's signal handlers, the scheduler's setup.
            delay = self.random.uniform(0.0, 2.5)
            moment = f"{delay:.3f}s after start"
            time.sleep(max(0.0, started + delay - time.monotonic()))
            stop = self.signal(Stop(self.lane, index, moment, proc.pid, log), store)
            self.rounds.wait()
            return stop
        # Just after a slot boundary: the step that claims, sends and finishes every
        # entry's slot (the entries are claimed without jitter).
        try:
            wait_until(
                lambda: STARTED.search(log.read_text(errors="replace")) is not None,
                READY_LIMIT,
                "the scheduler's first tick",
            )
            ready = True
        except AssertionError:
            ready = False
        self.rounds.wait()
        if not ready:
            self.kill()
            return Stop(
                self.lane,
                index,
                "waiting for the first tick",
                proc.pid,
                log,
                error=f"beat did not start within {READY_LIMIT:g}s",
            )
        # Each lane at its own second: one beat's exit does not wait for another's.
        offset = self.random.uniform(0.0, 0.08)
        slot = math.floor(time.time()) + 1 + self.lane
        time.sleep(max(0.0, slot + offset - time.time()))
        return self.signal(
            Stop(self.lane, index, f"{offset * 1000:.0f} ms after a slot", proc.pid, log), store
        )

    def signal(self, stop: Stop, store: Any) -> Stop:
        """SIGTERM the beat; time its exit; look for slots it left running."""
        proc = self.proc
        assert proc is not None
        if proc.poll() is not None:
            stop.error = f"beat exited by itself (status {proc.returncode}) before SIGTERM"
            return stop
        signalled = time.monotonic()
        stop.signalled_at = time.time()
        stop.waited_at_signal = cpu_waited(proc.pid)
        main_at_signal = main_thread_waited(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)

        def hung() -> bool:
            spent = time.monotonic() - signalled
            starved = main_thread_waited(proc.pid) - main_at_signal
            return spent - starved >= HANG_LIMIT or spent >= HANG_CAP

        while not exited(proc.pid) and not hung():
            time.sleep(0.005)
        if exited(proc.pid):
            stop.main_waited = max(0.0, main_thread_waited(proc.pid) - main_at_signal)
        if proc.poll() is None:
            # Where it hangs: every thread's stack, into its log (see the app's setup).
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(0.5)
            self.kill()
            return stop
        stop.exit_after = time.monotonic() - signalled
        stop.returncode = proc.returncode
        self.proc = None
        if store is not None:
            for job, record in store.states(JOBS).items():
                if _pid_of(record.owner) != proc.pid:
                    continue
                if record.state is RunState.RUNNING:
                    stop.held.append(
                        f"{job}@{record.slot_ms} attempt {record.attempt}"
                        f" (lease {record.lease_remaining:.1f}s left)"
                    )
                elif record.state is RunState.RELEASED:
                    stop.released += 1
        return stop

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


JOBS = [f"e{k:02d}" for k in range(ENTRIES)]
STORE_FIXTURES = {"redis": "redis_url", "postgres": "postgres_url", "rabbitmq": "amqp_url"}
#: The cases: a store, and "-tracking" for beat's default of execution tracking on
#: (no worker ever answers here, so the slots are still sent in dispatch-only mode,
#: but beat asks the workers now and then, and close() waits for that question).
CASES = ["sqlite", "redis", "postgres", "rabbitmq", "redis-tracking"]


def _seconds(values: list[float], at: float) -> str:
    return f"{values[min(len(values) - 1, int(len(values) * at))]:.3f}s" if values else "-"


@pytest.mark.timeout(max(180, 60 + 12 * math.ceil(STOPS / BEATS)))
@pytest.mark.parametrize("kind", CASES)
def test_sigterm_during_a_tick_exits_within_a_second_and_keeps_no_slot(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    stop_beats(kind, tmp_path, request, startup=0.0)


@pytest.mark.timeout(max(180, 60 + 12 * math.ceil(STOPS / BEATS)))
@pytest.mark.parametrize("kind", ["postgres", "redis-tracking"])
def test_sigterm_in_the_first_seconds_of_a_beat(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    stop_beats(kind, tmp_path, request, startup=1.0)


def stop_beats(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, *, startup: float
) -> None:
    """Stop :data:`STOPS` beats of ``kind``, a share ``startup`` of them in their first seconds."""
    name, _, variant = kind.partition("-")
    if name == "sqlite":
        store = f"sqlite:///{tmp_path}/store.db"
    else:
        store = request.getfixturevalue(STORE_FIXTURES[name])
    beats = max(1, min(BEATS, STOPS))
    rounds = threading.Barrier(beats, timeout=READY_LIMIT + 2 * HANG_CAP + 10)
    lanes = [
        Lane(
            k,
            math.ceil(STOPS / beats),
            store,
            tmp_path,
            rounds,
            kind,
            variant == "tracking",
            startup,
        )
        for k in range(beats)
    ]
    threads = [
        threading.Thread(target=lane.run, name=f"sigterm-lane-{lane.lane}", daemon=True)
        for lane in lanes
    ]
    began = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        rounds.abort()
        for thread in threads:
            thread.join(HANG_CAP + 10)
        for lane in lanes:
            lane.kill()
            drop_namespace(store, lane.namespace)
    took = time.monotonic() - began
    crashes = [f"lane {lane.lane}: {lane.crash}" for lane in lanes if lane.crash]
    assert not crashes, "\n".join(crashes)
    stops = [stop for lane in lanes for stop in lane.results]
    exits = sorted(s.exit_after for s in stops if s.exit_after is not None)
    shutdowns = sorted(h for s in stops if (h := s.handlers_after()) is not None)
    waits = sorted(s.cpu_wait() for s in stops)
    print(
        f"{kind}: {len(stops)} stops by {len(lanes)} beats in {took:.0f}s (seed {SEED});"
        f" shutdown after SIGTERM: median {_seconds(shutdowns, 0.5)},"
        f" max {_seconds(shutdowns, 1.0)} (waiting for a CPU: max {_seconds(waits, 1.0)});"
        f" process end: median {_seconds(exits, 0.5)}, max {_seconds(exits, 1.0)};"
        f" slots handed over: {sum(s.released for s in stops)}"
    )
    assert len(stops) >= STOPS
    bad = [s for s in stops if not s.ok]
    if bad:
        details = "\n\n".join(f"{s.describe()}\n--- log tail ---\n{s.log_tail()}" for s in bad[:3])
        summary = "\n".join(s.describe() for s in bad)
        pytest.fail(
            f"{len(bad)} of {len(stops)} SIGTERMs went wrong on {kind}"
            f" (replay: ANARCHON_SIGTERM_SEED={SEED}):\n{summary}\n\n{details}",
            pytrace=False,
        )
