"""The fleet harness: the processes of one test on one store, their signals, their report.

Every end-to-end and scenario test drives its instances through :class:`Fleet`:
scheduler instances (``anarchon_core.tools.instance``), Celery workers and
beats, Dramatiq workers and schedulers. Each process runs in its own process
group, so a signal reaches it and whatever it forked, as a container
runtime's would (a pod). Every process appends JSON lines
(``anarchon_core.tools.instance.Reporter``) to one report file that the test
reads; tests wait on it with ``wait_until(fleet.watch(predicate), ...)``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tests.cli.command import anarchon
from tests.processes import OWN_GROUP
from tests.waiting import wait_until

Line = dict[str, Any]
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
T = TypeVar("T")


def report_lines(path: Path) -> list[Line]:
    """The records of a JSON-lines report that processes append to as they run.

    Only whole lines count: a reader can see a line another process is still writing
    (a write to a file is not atomic for a concurrent read), and a process killed in the
    middle of one leaves it cut; such a last line, without its newline, is left out.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    whole = data[: data.rfind(b"\n") + 1].decode("utf-8")
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


class Fleet:
    """The processes of one test, sharing one store (``store``) and one report.

    ``job`` holds the options of :meth:`start`'s scheduler instances
    (``anarchon_core.tools.instance`` flags); ``env`` is added to every
    process's environment (the integrations' apps read their ``E2E_*``
    settings there). Fleets of one test may share ``tmp_path``: they then
    share the report, as instances of one service share a store.
    """

    prefix = "f"
    #: Exit statuses that a wait takes in stride (a clean exit, SIGKILL,
    #: SIGTERM); any other exit of a process fails the wait at once. ``None``:
    #: exits are not checked (workers that the test stops in other ways).
    expected_exits: tuple[int, ...] | None = (0, -signal.SIGKILL, -signal.SIGTERM)

    def __init__(
        self,
        tmp_path: Path,
        store: str = "",
        *,
        namespace: str | None = None,
        env: Mapping[str, str] | None = None,
        **job: Any,
    ) -> None:
        self.tmp_path = tmp_path
        self.store = store
        self.namespace = namespace or f"{self.prefix}{uuid.uuid4().hex[:10]}"
        self.report = tmp_path / "report.jsonl"
        self.report.touch()
        self.job = job
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def app_settings(self, broker: str, schedule: dict[str, Any], lease: float) -> None:
        """The ``E2E_*`` settings the Celery and Dramatiq test apps read (tests/*/e2e_app.py)."""
        self.env.update(
            E2E_BROKER=broker,
            E2E_STORE=self.store,
            E2E_NAMESPACE=self.namespace,
            E2E_LEASE=str(lease),
            E2E_SCHEDULE=json.dumps(schedule),
            E2E_REPORT=str(self.report),
        )

    # -- starting and signalling --------------------------------------------------

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        *,
        release: Path | None = None,
    ) -> None:
        """Start ``argv`` as the pod ``name``, its output in ``<name>.log``; with the code
        of ``release`` (a source tree of an older release: tests/releases.py) if given."""
        # The release's packages first; this tree's after them, for the test apps.
        tree = {"PYTHONPATH": os.pathsep.join((str(release), str(ROOT)))} if release else {}
        with open(self.tmp_path / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv,
                env={**self.env, **(env or {}), **tree},
                cwd=release or ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                **OWN_GROUP,
            )

    def start(
        self, *names: str, wait: bool = True, release: Path | None = None, **overrides: Any
    ) -> None:
        """Start scheduler instances ``names`` on the store; ``wait``: until each is up;
        ``release``: an older release's source tree to run them from."""
        for name in names:
            argv = [sys.executable, "-m", "anarchon_core.tools.instance"]
            argv += ["--store", self.store, "--namespace", self.namespace]
            argv += ["--name", name, "--report", str(self.report)]
            for key, value in {**self.job, **overrides}.items():
                if value is None:
                    continue
                argv += [f"--{key.replace('_', '-')}", str(value)]
            self.spawn(name, argv, release=release)
        if wait:
            for name in names:
                wait_until(
                    self.watch(
                        lambda ls, n=name: any(
                            line["kind"] == "up" and line["instance"] == n for line in ls
                        )
                    ),
                    20,
                    f"{name} to start",
                    seen=self.tail,
                )

    def anarchon(self, *args: str) -> subprocess.CompletedProcess[str]:
        """This tree's ``anarchon ARGS --store URL --namespace NS`` on the fleet's store, run
        as a user runs it (tests/cli/command.py)."""
        return anarchon(*args, "--store", self.store, "--namespace", self.namespace)

    def signal(self, name: str, sig: signal.Signals) -> float:
        """Signal the whole pod (process group); returns when."""
        os.killpg(self.procs[name].pid, sig)
        return time.time()

    def kill(self, name: str) -> float:
        at = self.signal(name, signal.SIGKILL)
        self.procs.pop(name).wait(10)
        return at

    def stop(self, name: str, timeout: float = 30) -> None:
        """SIGTERM, and SIGKILL if the pod is still there after ``timeout`` seconds."""
        self.signal(name, signal.SIGTERM)
        proc = self.procs.pop(name)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.procs[name].pid, signal.SIGKILL)
            self.procs.pop(name).wait(10)

    # -- reading what they did ----------------------------------------------------

    def lines(self) -> list[Line]:
        return report_lines(self.report)

    def watch(self, predicate: Callable[[list[Line]], T]) -> Callable[[], T]:
        """A condition for ``wait_until``: ``predicate`` of the report so far.

        While it does not hold, a process that exited unexpectedly (see
        :attr:`expected_exits`) ends the wait at once.
        """

        def check() -> T:
            found = predicate(self.lines())
            if not found and self.expected_exits is not None:
                for name, proc in self.procs.items():
                    code = proc.poll()
                    if code is not None and code not in self.expected_exits:
                        raise AssertionError(f"{name} exited with {code}; {self.tail()}")
            return found

        return check

    def starts(self, job: str | None = None, *, slot_id: str | None = None) -> list[Line]:
        """The runs started, of ``job`` or of one slot if given."""
        return [
            x
            for x in self.lines()
            if x["kind"] == "start"
            and (job is None or x["job"] == job)
            and (slot_id is None or x["slot_id"] == slot_id)
        ]

    def first_start(self, timeout: float = 75, after: float = 0.0) -> Line:
        """The first run (of a slot due after ``after``); if slow starts missed the first
        slot, the next one (up to 60 s on)."""
        found: list[Line] = wait_until(
            self.watch(
                lambda ls: [
                    line
                    for line in ls
                    if line["kind"] == "start" and slot_seconds(line["slot_id"]) > after
                ]
            ),
            timeout,
            "a first run",
            seen=self.tail,
        )
        return found[0]

    def all_up(self) -> float:
        """When the last of the instances running now reported it was up."""
        return max(
            x["t"] for x in self.lines() if x["kind"] == "up" and x["instance"] in self.procs
        )

    def all_ready(self, timeout: float = 60) -> float:
        """When the last of the instances running now had done its first step (every job
        placed, the store answered: its ``ready`` line), waited for."""
        names = set(self.procs)

        def ready() -> list[float]:
            lines = self.lines()
            seen = {x["instance"]: x["t"] for x in lines if x["kind"] == "ready"}
            return list(seen.values()) if names <= set(seen) else []

        return max(wait_until(ready, timeout, "every instance's first step", seen=self.tail))

    def tail(self) -> str:
        """The report's last lines and the end of every log: what a failed wait shows."""
        lines = "\n".join(json.dumps(x) for x in self.lines()[-10:])
        return f"report: {lines}\nlogs: {self.logs()}"

    def logs(self) -> dict[str, str]:
        return {p.name: p.read_text(errors="replace")[-2000:] for p in self.tmp_path.glob("*.log")}

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def mentions(self, *needles: str) -> list[str]:
        """The lines of every pod's log that hold one of ``needles``, each after its pod's name."""
        return [
            f"{path.stem}: {line}"
            for path in sorted(self.tmp_path.glob("*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if any(needle in line for needle in needles)
        ]

    def pod_of(self, instance: str) -> str:
        """The pod whose process is ``instance`` (``host:pid:...``)."""
        group = os.getpgid(int(instance.split(":")[1]))
        return next(name for name, proc in self.procs.items() if proc.pid == group)


def anchor_soon(delay: float = 2.0) -> int:
    """A whole-second grid anchor ``delay`` seconds or a bit more from now."""
    return math.ceil(time.time() + delay)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def per_slot(lines: list[Line]) -> Counter[str]:
    return Counter(x["slot_id"] for x in lines)


def slot_seconds(slot_id: str) -> float:
    return int(slot_id.rsplit("@", 1)[1]) / 1000


F = TypeVar("F", bound=Fleet)


def fleets(cls: type[F], tmp_path: Path) -> Iterator[Callable[..., F]]:
    """A fixture body: makes fleets of ``cls`` for a test and kills them all afterwards."""
    made: list[F] = []

    def make(*args: Any, **options: Any) -> F:
        fleet = cls(tmp_path, *args, **options)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.stop_all()


def assert_each_second_once(
    starts: list[Line], last: float, pods: Fleet | None = None, every: int = 1
) -> None:
    """From the first slot run (the fleet is up) to ``last``: every second (every
    ``every`` seconds) once.

    A failure names the slots missed or run twice, with what ``pods`` logged
    about them.
    """
    first = min(slot_seconds(x["slot_id"]) for x in starts)
    counts = per_slot([x for x in starts if slot_seconds(x["slot_id"]) <= last])
    expected = {int(first) + k for k in range(0, int(last) - int(first) + 1, every)}
    missed = sorted(expected - {int(slot_seconds(s)) for s in counts})
    job = starts[0]["job"]
    told = pods.mentions(*(f"{job}@{s * 1000}" for s in missed)) if pods and missed else []
    assert missed == [], f"slots missed: {missed}; logged about them: {told}"
    twice = {s: n for s, n in counts.items() if n > 1}
    told = pods.mentions(*twice) if pods and twice else []
    assert twice == {}, f"slots run twice: {twice}; logged about them: {told}"


#: A claim of slot S is sent by S + 1 s, plus a margin for a loaded machine.
CLAIM_WINDOW = 1.5
#: Every pod reads the control entries once a second; plus a margin.
FOLLOW = 2.0

Command = Callable[..., subprocess.CompletedProcess[str]]


def shown(done: subprocess.CompletedProcess[str]) -> str:
    return f"{done.args}: exit {done.returncode}\nstdout:\n{done.stdout}stderr:\n{done.stderr}"


def later(lines: list[Line], since: float) -> list[Line]:
    """The runs of ``lines`` whose slot is due after ``since``."""
    return [x for x in lines if slot_seconds(x["slot_id"]) > since]


def pause_resume_and_run_now(
    pods: Fleet, verb: Command, job: str, runs: Callable[[], list[Line]]
) -> str:
    """The runtime-control steps a Celery or Dramatiq fleet goes through alike.

    ``verb(name, *args)`` runs the integration's control command (``celery
    anarchon``, ``dramatiq-anarchon``) for ``job``, whose slot comes every
    second; ``runs()`` are its runs so far. Paused: no slot due after the
    pause is sent, and a run-now request is refused. Resumed: sends go on
    with the next slot, none of the paused ones. Run now: one send of the
    slot the command names, then regular sends again. Returns that slot's id.
    """
    done = verb("pause", job)
    paused_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout == f"paused job {job!r}\n", shown(done)
    done = verb("trigger", job)
    assert done.returncode == 1, shown(done)
    assert "paused" in done.stderr and "asked to run" not in done.stdout, shown(done)
    time.sleep(max(0.0, paused_at + 4 - time.time()))
    assert later(runs(), paused_at) == [], f"slots due after the pause at {paused_at:.3f}"

    resuming = time.time()
    done = verb("resume", job)
    resumed_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout == f"resumed job {job!r}\n", shown(done)
    resumed = wait_until(
        pods.watch(lambda ls: later(runs(), resumed_at)),
        15,
        "a slot after the resume",
        seen=pods.tail,
    )
    back = slot_seconds(resumed[0]["slot_id"])
    assert back <= resumed_at + FOLLOW, resumed[0]
    in_pause = [
        x for x in runs() if paused_at < slot_seconds(x["slot_id"]) < resuming - CLAIM_WINDOW
    ]
    assert in_pause == [], f"paused {paused_at:.3f} to {resuming:.3f}: {in_pause}"

    asking = time.time()
    done = verb("trigger", job)
    asked = time.time()
    assert done.returncode == 0, shown(done)
    match = re.search(r"asked to run (\S+) now", done.stdout)
    assert match, shown(done)
    slot_id = match.group(1)
    manual_at = slot_seconds(slot_id)
    assert slot_id.startswith(f"{job}@") and asking < manual_at < asked + 3, slot_id
    wait_until(
        pods.watch(lambda ls: [x for x in runs() if x["slot_id"] == slot_id]),
        15,
        slot_id,
        seen=pods.tail,
    )
    wait_until(
        pods.watch(lambda ls: len(per_slot(later(runs(), manual_at + 1))) >= 3),
        15,
        "slots after it",
        seen=pods.tail,
    )
    time.sleep(1)
    resumed_runs = [x for x in later(runs(), resumed_at) if x["slot_id"] != slot_id]
    every_second = {int(slot_seconds(x["slot_id"])) for x in resumed_runs}
    # Every second from the resume on, but the slot the run-now slot may overlap
    # (its claim finds the run-now run's lease held: an overlap, not sent).
    missing = set(range(int(back), max(every_second))) - every_second
    assert missing <= {int(manual_at) + 1}, sorted(missing)
    assert len([x for x in runs() if x["slot_id"] == slot_id]) == 1
    return slot_id


def scraped(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of the ``/metrics`` served on ``port``, by name and label set."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metrics_and_probes_served(pods: Fleet, port: int, job: str) -> None:
    """The pods' scheduler serves, on ``port``: /healthz and /readyz 200, and /metrics
    whose won and dispatched counters of ``job`` match the runs its workers started."""
    import urllib.request

    labels = frozenset({"namespace": pods.namespace, "job": job}.items())

    def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        try:
            samples = scraped(port)
        except OSError:  # not served yet: the scheduler starts after the workers boot
            return {}
        # Both counters: one scrape reads them one after the other, so a slot won between
        # the two reads shows in the second only.
        counters = ("anarchon_slots_won_total", "anarchon_slots_dispatched_total")
        return samples if all(samples.get((c, labels), 0) >= 3 for c in counters) else {}

    samples = wait_until(
        pods.watch(lambda ls: counted()), 60, f"3 slots of {job} counted on :{port}", seen=pods.tail
    )
    runs = len(per_slot(pods.starts(job)))
    won = samples[("anarchon_slots_won_total", labels)]
    assert 3 <= won <= runs + 2, (won, runs)
    assert samples[("anarchon_up", frozenset({"namespace": pods.namespace}.items()))] == 1.0
    assert ("anarchon_next_slot_timestamp_seconds", labels) in samples
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            assert answer.status == 200, path
