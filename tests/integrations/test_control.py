"""End to end, alike for Celery and Dramatiq: a schedule stored at run time, sent by three pods.

Celery: three standalone beats (``--scheduler anarchon_celery:Scheduler``)
with no ``beat_schedule`` entry and one real worker; the entry names the
``e2e.work`` task, whose first positional argument is the report's ``job``
and whose ``seconds`` keyword is how long it works (tests/celery/e2e_app.py).
Dramatiq: three ``dramatiq`` pods (the Anarchon middleware runs the scheduler
in one process of each) that declare no periodic actor; the schedule names
the ``e2e_echo`` actor, which reports the arguments it gets
(tests/dramatiq/e2e_app.py). Both share the test's Redis (broker and store).

The schedule is stored while they run, then paused, resumed, run now, changed
and removed with the integration's control command (``celery -A APP anarchon
VERB``, ``dramatiq-anarchon VERB APP``: real subprocesses, as a user runs
them), Celery's change through :class:`~anarchon_core.Control`. One fleet goes
through every step (to keep the time down): the steps run in order, each
building on the report of the ones before.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon_core import Control
from tests.celery.harness import CELERY
from tests.cleanup import drop_namespace
from tests.dramatiq.harness import APP
from tests.fleet import (
    BIN,
    FOLLOW,
    ROOT,
    Line,
    assert_each_second_once,
    later,
    pause_resume_and_run_now,
    per_slot,
    shown,
    slot_seconds,
)
from tests.integrations.conftest import FLEETS, Pods
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: The stored job, and the interval it is changed to.
JOB = "stored"
CHANGED = 3


class Celery:
    """Celery's side: beats next to a worker, the ``celery anarchon`` command, ``e2e.work``."""

    BEATS = ("b1", "b2", "b3")
    TASK = "e2e.work"
    ARG, WORK = "from-args", 0.3
    ADD = ["--handler", TASK, "--every", "1"]
    ADD += ["--args", f'["{ARG}"]', "--kwargs", f'{{"seconds": {WORK}}}']

    def start(self, pods: Pods) -> None:
        def started(beat: str) -> bool:
            return re.search(r"anarchon: \d+ entr.*, store ", pods.log(beat)) is not None

        pods.worker("w1", beat=False, concurrency=2)
        for name in self.BEATS:
            pods.beat(name)
        # Each beat set up (its store reached) before the entry is stored.
        wait_until(lambda: all(map(started, self.BEATS)), 60, "every beat set up", seen=pods.logs)

    def verb(self, pods: Pods, *args: str) -> subprocess.CompletedProcess[str]:
        """``celery -A tests.celery.e2e_app anarchon VERB ARGS``: the app's store and namespace."""
        return run(pods, [CELERY, "-A", "tests.celery.e2e_app", "anarchon", *args])

    def added(self, done: subprocess.CompletedProcess[str]) -> bool:
        # The version is the store's (on Redis a namespace-wide counter: the beats'
        # declared jobs were written before it).
        return (
            re.match(rf"added job {JOB!r} v\d+: every 1s -> {re.escape(self.TASK)}", done.stdout)
            is not None
        )

    def runs(self, pods: Pods) -> list[Line]:
        """The runs of the stored entry's slots (its header names the entry)."""
        return [x for x in pods.starts() if x["info"].get("job") == JOB]

    def first_runs_as_stored(self, pods: Pods, first: list[Line]) -> None:
        assert {x["job"] for x in first} == {self.ARG}, "the stored args were not passed"
        ends = {x["task_id"]: x for x in pods.lines() if x["kind"] == "end"}
        worked = [ends[x["task_id"]]["t"] - x["t"] for x in first if x["task_id"] in ends]
        assert len(worked) >= 5 and min(worked) >= self.WORK - 0.01, (
            "the stored kwargs were not passed"
        )
        assert {x["attempt"] for x in first} == {1}
        assert len({x["task_id"] for x in first}) == len(first)

    def change(self, pods: Pods) -> None:
        with Control(pods.env["E2E_BROKER"], namespace=pods.namespace) as control:
            before, after = control.change(JOB, every=CHANGED)
        assert (before.every, after.every, after.args) == (1, CHANGED, (self.ARG,))
        assert after.kwargs == {"seconds": self.WORK}
        assert after.version > before.version

    def all_runs_as_stored(
        self, everything: list[Line], manual: Line, slot_id: str, g1: float, changed_at: float
    ) -> None:
        assert manual["job"] == self.ARG and manual["task_id"].endswith(f":{slot_id}:1")
        assert {x["job"] for x in everything} == {self.ARG}


class Dramatiq:
    """Dramatiq's side: pods with the middleware, ``dramatiq-anarchon``, ``e2e_echo``."""

    PODS = ("w1", "w2", "w3")
    ARGS: list[Any] = ["a", 2]
    KWARGS: dict[str, Any] = {"k": {"n": [1, None]}}
    ADD = ["--handler", "e2e_echo", "--every", "1"]
    ADD += ["--args", '["a", 2]', "--kwargs", '{"k": {"n": [1, null]}}']

    def start(self, pods: Pods) -> None:
        for name in self.PODS:
            pods.worker(name, processes=1, threads=2)

        def started(pod: str) -> bool:
            return "anarchon: scheduler running in process" in pods.log(pod)

        # Each pod's scheduler up (its store reached) before the schedule is stored.
        wait_until(lambda: all(map(started, self.PODS)), 60, "every scheduler up", seen=pods.logs)

    def verb(self, pods: Pods, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``dramatiq-anarchon VERB tests.dramatiq.e2e_app ARGS``: the middleware's store."""
        return run(pods, [str(BIN / "dramatiq-anarchon"), verb, APP, *args])

    def added(self, done: subprocess.CompletedProcess[str]) -> bool:
        return done.stdout.startswith(f"added job {JOB!r} v")

    def runs(self, pods: Pods) -> list[Line]:
        """The messages of the stored schedule's slots processed."""
        return pods.starts(JOB)

    def first_runs_as_stored(self, pods: Pods, first: list[Line]) -> None:
        expected = [(self.ARGS, self.KWARGS)] * len(first)
        assert [(x["args"], x["kwargs"]) for x in first] == expected
        assert {x["attempt"] for x in first} == {1}
        assert len({x["message_id"] for x in first}) == len(first)

    def change(self, pods: Pods) -> None:
        done = self.verb(pods, "change", JOB, "--every", str(CHANGED))
        assert done.returncode == 0, shown(done)
        assert re.match(rf"changed job {JOB!r} v(\d+) -> v(\d+): every 1s", done.stdout), shown(
            done
        )

    def all_runs_as_stored(
        self, everything: list[Line], manual: Line, slot_id: str, g1: float, changed_at: float
    ) -> None:
        assert (manual["args"], manual["kwargs"]) == (self.ARGS, self.KWARGS)
        assert len({x["sent_by"] for x in everything}) >= 2, "one pod sent every slot"
        # After the change: only the new grid, every one of its slots, with the same arguments.
        changed = later(everything, changed_at + FOLLOW)
        seconds = sorted(slot_seconds(x["slot_id"]) for x in changed)
        assert seconds == [g1 + CHANGED * k for k in range(len(seconds))], seconds
        assert len(seconds) >= 2
        assert {(str(x["args"]), str(x["kwargs"])) for x in changed} == {
            (str(self.ARGS), str(self.KWARGS))
        }


SIDES: dict[str, Celery | Dramatiq] = {"celery": Celery(), "dramatiq": Dramatiq()}


def run(pods: Pods, argv: list[str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, env=pods.env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert "Traceback" not in done.stderr, shown(done)
    return done


@pytest.fixture
def pods(framework: str, tmp_path: Path, redis_broker: str) -> Iterator[Pods]:
    """The test's pods (none started); killed, and the namespace dropped, afterwards."""
    made = FLEETS[framework](tmp_path, redis_broker, {})  # no periodic job: only the store's
    try:
        yield made
    finally:
        made.stop_all()
        drop_namespace(redis_broker, made.namespace)


@pytest.mark.timeout(240)
def test_a_schedule_stored_at_run_time_is_sent_once_per_slot_paused_run_now_changed_removed(
    pods: Pods, framework: str
) -> None:
    side = SIDES[framework]
    side.start(pods)

    def runs() -> list[Line]:
        return side.runs(pods)

    # 1. Stored while the pods run: each slot sent once, with its args and kwargs.
    done = side.verb(pods, "add", JOB, *side.ADD)
    added_at = time.time()
    assert done.returncode == 0, shown(done)
    assert side.added(done), shown(done)
    wait_until(pods.watch(lambda ls: runs()), 30, "a first slot of the stored job", seen=pods.tail)
    wait_until(pods.watch(lambda ls: len(per_slot(runs())) >= 6), 30, "six slots", seen=pods.tail)
    checked = time.time()
    # Two slots later: a second send of the slots checked would have run by now.
    wait_until(
        pods.watch(lambda ls: later(runs(), checked + 1)), 30, "two more slots", seen=pods.tail
    )
    first = [x for x in runs() if slot_seconds(x["slot_id"]) <= checked]
    assert_each_second_once(first, checked, pods)
    assert len(per_slot(first)) >= 6
    assert min(slot_seconds(x["slot_id"]) for x in first) <= added_at + FOLLOW + 1
    side.first_runs_as_stored(pods, first)

    # 2-3. Paused, resumed, run now.
    slot_id = pause_resume_and_run_now(pods, lambda *args: side.verb(pods, *args), JOB, runs)

    # 4. Changed to every CHANGED seconds: followed within FOLLOW seconds, on the new grid.
    side.change(pods)
    changed_at = time.time()
    grid = wait_until(
        pods.watch(lambda ls: later(runs(), changed_at + FOLLOW)),
        30,
        "a slot on the changed grid",
        seen=pods.tail,
    )[0]
    g1 = slot_seconds(grid["slot_id"])
    assert g1 % CHANGED == 0, f"{grid['slot_id']} is not on the {CHANGED}s grid"
    assert g1 <= changed_at + FOLLOW + CHANGED + 0.001, "the first slot of the new grid was missed"
    g2 = f"{JOB}@{int(g1 + CHANGED) * 1000}"
    wait_until(
        pods.watch(lambda ls: [x for x in runs() if x["slot_id"] == g2]), 15, g2, seen=pods.tail
    )

    # 5. Removed: no slot due FOLLOW seconds after the removal is sent.
    done = side.verb(pods, "remove", JOB)
    removed_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout.startswith(f"removed job {JOB!r} v"), shown(done)
    # Past the next slot of the grid after the removal was followed, and its send.
    after_follow = (int(removed_at + FOLLOW) // CHANGED + 1) * CHANGED
    time.sleep(max(0.0, after_follow + 2.5 - time.time()))
    pods.stop_all()

    everything = runs()
    assert later(everything, removed_at + FOLLOW) == [], f"sent after the removal {removed_at:.3f}"
    manual = [x for x in everything if x["slot_id"] == slot_id]
    assert len(manual) == 1, manual
    # Over the whole test: every slot sent once, attempt 1, by more than one scheduler.
    assert {s: n for s, n in per_slot(everything).items() if n > 1} == {}, "a slot was sent twice"
    assert {x["attempt"] for x in everything} == {1}
    side.all_runs_as_stored(everything, manual[0], slot_id, g1, changed_at)
