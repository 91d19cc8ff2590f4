"""Overload: a fleet that cannot keep up runs slots late, or not at all, but never twice.

Three instances share one SQLite file, with thousands of jobs due every
second and handlers that return at once, each instance held to a tenth of a
core by a CPU quota (a CFS quota, as a Kubernetes pod's CPU limit is): more
claims than the fleet can send, and ends than it can record, in time. A
fleet behind its schedule may start a slot late or miss it; it must never
run a slot whose handler already ran again. That is what a lease that lapses
while its instance is busy claiming other slots would do: another instance
takes the slot over and runs it a second time.

The quota keeps the fleet overloaded whatever the machine, using little of
it (the tests beside it keep their cores). The report holds every start: a
slot that ran twice shows as two start lines of one slot id. The test also
proves that the fleet was overloaded: a slot started more than a lease late,
or a slot due while every instance ran never started.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import Fleet, Line, per_slot, slot_seconds
from tests.servers import unavailable
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

NAMES = ("a", "b", "c")
#: The jobs of each instance, all due every second: far more than an instance held to
#: :data:`CPU` keeps up with (only a fraction of them start).
JOBS = 2000
EVERY = 1
#: Short, so that an instance busy for longer than this loses the runs it holds; long
#: enough that a machine busy with other tests never stops a process for as long.
LEASE = 4.0
#: The share of a core each instance may use (its CFS quota per period).
CPU = 0.1
#: Where the kernel's CPU controller (cgroup v1) lets a process be given a quota.
CGROUPS = Path("/sys/fs/cgroup/cpu")
#: Seconds the fleet runs overloaded, from when every instance is up.
RUN = 25.0
#: How often the test reads the report while the fleet runs: rarely, to leave it the cores.
POLL = 0.5
#: The slots of the first seconds after the start-up, and of the last ones before the
#: end, are not counted as missed: the start-up and the stop are not overload.
EDGE = 3.0
#: Events that an instance keeping up never reports.
BEHIND = ("catch_up", "missed", "lost", "takeover", "finish_refused", "overlap")


class Report:
    """The report's lines, read as they are appended (each read parses only the new ones)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self.lines: list[Line] = []
        #: The instances up, and the latest slot time (Unix seconds) started so far.
        self.up: set[str] = set()
        self.latest = 0.0

    def read(self) -> list[Line]:
        with open(self._path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        whole = data.rfind(b"\n") + 1  # a line being written is read next time
        self._offset += whole
        new = [json.loads(line) for line in data[:whole].splitlines() if line.strip()]
        for line in new:
            if line["kind"] == "up":
                self.up.add(line["instance"])
            elif line["kind"] == "start":
                self.latest = max(self.latest, slot_seconds(line["slot_id"]))
        self.lines += new
        return self.lines


class CpuLimits:
    """A CPU quota of its own for each process given to it (a cgroup per process)."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.groups: list[Path] = []
        self._tag = uuid.uuid4().hex[:8]

    @staticmethod
    def usable() -> bool:
        return os.access(CGROUPS, os.W_OK) and (CGROUPS / "cpu.cfs_quota_us").exists()

    def limit(self, name: str, pid: int) -> None:
        group = CGROUPS / f"anarchon-{self._tag}-{name}"
        group.mkdir()
        self.groups.append(group)
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(int(period * self.share)))
        (group / "cgroup.procs").write_text(str(pid))  # the process and all its threads

    def throttled(self) -> float:
        """Seconds the processes were held back by their quota, in all."""
        total = 0
        for group in self.groups:
            stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
            total += int(stat.get("throttled_time", 0))
        return total / 1e9

    def close(self) -> None:
        for group in self.groups:  # empty once its process exited
            with contextlib.suppress(OSError):
                group.rmdir()


@pytest.fixture
def limits() -> Iterator[CpuLimits]:
    if not CpuLimits.usable():
        unavailable(f"a writable CPU controller at {CGROUPS} (root, cgroup v1)")
    made = CpuLimits(CPU)
    yield made
    made.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    options = {"jobs": JOBS, "every": EVERY, "lease": LEASE, "work": 0, "jitter": 0}
    pods = Fleet(tmp_path, f"sqlite:///{tmp_path / 'anarchon.db'}", **options)
    yield pods
    pods.stop_all()


def running(fleet: Fleet) -> None:
    """Fail at once if an instance exited."""
    for name, proc in fleet.procs.items():
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}; {fleet.logs()}")


def test_an_overloaded_fleet_runs_no_slot_twice(limits: CpuLimits, fleet: Fleet) -> None:
    began_at = time.monotonic()
    fleet.start(*NAMES, wait=False)
    for name in NAMES:
        limits.limit(name, fleet.procs[name].pid)
    report = Report(fleet.report)

    def up() -> bool:
        running(fleet)
        report.read()
        return report.up == set(NAMES)

    wait_until(up, 60, "every instance to be up", interval=POLL)
    began = time.time()
    end = began + RUN

    def past_the_end() -> bool:
        running(fleet)
        report.read()
        return report.latest >= end

    wait_until(past_the_end, RUN + 30, f"a slot due {RUN:g}s on to start", interval=POLL)
    fleet.stop_all()
    lines = report.read()

    starts = [x for x in lines if x["kind"] == "start"]
    # The slots due while every instance ran: how late each started, and which never did.
    due = range(int(began + EDGE) + 1, int(end - EDGE))
    expected = {f"tick{k:05d}@{s * 1000}" for k in range(JOBS) for s in due}
    late = sorted(x["t"] - slot_seconds(x["slot_id"]) for x in starts if x["slot_id"] in expected)
    assert late, f"no slot due from {due.start} to {due.stop} ran: {fleet.tail()}"
    missed = expected - {x["slot_id"] for x in starts}
    events = Counter(x["kind"] for x in lines)
    behind = {kind: events[kind] for kind in BEHIND if events[kind]}
    seen = (
        f"{len(late)} starts of the {len(expected)} slots due in {len(due)} s;"
        f" lateness p50 {late[len(late) // 2]:.2f}s, p99 {late[int(len(late) * 0.99)]:.2f}s,"
        f" max {late[-1]:.2f}s; {len(missed)} missed; events {behind};"
        f" held back by the quota {limits.throttled():.0f}s;"
        f" {time.monotonic() - began_at:.0f}s in all"
    )
    print(seen)
    assert late[-1] > LEASE or missed, f"the fleet kept up, it was not overloaded: {seen}"

    counts = per_slot(starts)
    twice = {slot: n for slot, n in counts.items() if n > 1}
    shown = sorted(twice)[:5]
    told = {
        slot: [
            (x["kind"], x["instance"], x.get("attempt"), round(x["t"] - slot_seconds(slot), 2))
            for x in lines
            if x.get("slot_id") == slot
        ]
        for slot in shown
    }
    assert len(twice) == 0, f"{len(twice)} slots ran twice or more ({seen}); for instance {told}"
