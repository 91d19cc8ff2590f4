"""End to end: a schedule stored at run time, sent by three real Dramatiq pods.

Three ``dramatiq`` pods (the Anarchon middleware runs the scheduler in one
process of each) share the test's Redis (broker and store). A schedule naming
the ``e2e_echo`` actor (not periodic: it takes arguments and reports them,
see tests/dramatiq/e2e_app.py) is stored while they run, then paused,
resumed, run now, changed and removed with ``dramatiq-anarchon VERB BROKER``
(real subprocesses, as a user runs them). The pods declare no periodic actor:
every schedule they send is stored at run time.

One fleet goes through every step (to keep the time down): the steps run in
order, each building on the report of the ones before.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cleanup import drop_namespace
from tests.dramatiq.harness import APP, DramatiqFleet, Line, per_slot, slot_seconds
from tests.fleet import (
    BIN,
    FOLLOW,
    ROOT,
    assert_each_second_once,
    later,
    pause_resume_and_run_now,
    shown,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: The stored schedule, the actor it names, and what it passes to it.
JOB, ACTOR = "stored", "e2e_echo"
ARGS, KWARGS = ["a", 2], {"k": {"n": [1, None]}}
#: No periodic actor: the pods follow the schedules stored at run time alone.
IDLE: dict[str, dict[str, str]] = {}
#: The interval the schedule is changed to.
CHANGED = 3


@pytest.fixture
def dramatiq_redis(redis_url: str) -> str:
    """The Redis broker: db 10 of the test Redis, a queue and namespace per test."""
    return redis_url.rsplit("/", 1)[0] + "/10"


@pytest.fixture
def pods(tmp_path: Path, dramatiq_redis: str) -> Iterator[DramatiqFleet]:
    """The test's pods (none started); killed, and the namespace dropped, afterwards."""
    made = DramatiqFleet(tmp_path, dramatiq_redis, IDLE)
    try:
        yield made
    finally:
        made.stop_all()
        drop_namespace(dramatiq_redis, made.namespace)


def control(pods: DramatiqFleet, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``dramatiq-anarchon VERB tests.dramatiq.e2e_app ARGS``: the middleware's store."""
    done = subprocess.run(
        [str(BIN / "dramatiq-anarchon"), verb, APP, *args],
        env=pods.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, shown(done)
    return done


def runs(pods: DramatiqFleet) -> list[Line]:
    """The messages of the stored schedule's slots processed."""
    return pods.starts(JOB)


@pytest.mark.timeout(240)
def test_a_schedule_stored_at_run_time_is_sent_once_per_slot_paused_run_now_changed_removed(
    pods: DramatiqFleet,
) -> None:
    names = ("w1", "w2", "w3")
    for name in names:
        pods.worker(name, processes=1, threads=2)

    def started(pod: str) -> bool:
        return "anarchon: scheduler running in process" in pods.log(pod)

    # Each pod's scheduler up (its store reached) before the schedule is stored.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(map(started, names)):
        time.sleep(0.2)
    assert all(map(started, names)), pods.logs()

    # 1. Stored while the pods run: each slot sent once, with its args and kwargs.
    done = control(
        pods, "add", JOB, "--handler", ACTOR, "--every", "1",
        "--args", '["a", 2]', "--kwargs", '{"k": {"n": [1, null]}}',
    )  # fmt: skip
    added_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout.startswith(f"added job {JOB!r} v"), shown(done)
    wait_until(
        pods.watch(lambda ls: runs(pods)), 30, "a first slot of the stored schedule", seen=pods.tail
    )
    wait_until(
        pods.watch(lambda ls: len(per_slot(runs(pods))) >= 6), 30, "six slots", seen=pods.tail
    )
    time.sleep(2)  # a second send of these slots would have run by now
    first = runs(pods)
    assert_each_second_once(first, time.time() - 2, pods)
    assert len(per_slot(first)) >= 6
    assert min(slot_seconds(x["slot_id"]) for x in first) <= added_at + FOLLOW + 1
    assert [(x["args"], x["kwargs"]) for x in first] == [(ARGS, KWARGS)] * len(first)
    assert {x["attempt"] for x in first} == {1}
    assert len({x["message_id"] for x in first}) == len(first)

    # 2-3. Paused, resumed, run now (the same for Celery and Dramatiq).
    slot_id = pause_resume_and_run_now(
        pods, lambda *args: control(pods, *args), JOB, lambda: runs(pods)
    )

    # 4. Changed to every CHANGED seconds: followed within FOLLOW seconds, on the new grid.
    done = control(pods, "change", JOB, "--every", str(CHANGED))
    changed_at = time.time()
    assert done.returncode == 0, shown(done)
    assert re.match(rf"changed job {JOB!r} v(\d+) -> v(\d+): every 1s", done.stdout), shown(done)
    grid = wait_until(
        pods.watch(lambda ls: later(runs(pods), changed_at + FOLLOW)),
        30,
        "a slot on the changed grid",
        seen=pods.tail,
    )[0]
    g1 = slot_seconds(grid["slot_id"])
    assert g1 % CHANGED == 0, f"{grid['slot_id']} is not on the {CHANGED}s grid"
    assert g1 <= changed_at + FOLLOW + CHANGED + 0.001, "the first slot of the new grid was missed"
    g2 = f"{JOB}@{int(g1 + CHANGED) * 1000}"
    wait_until(
        pods.watch(lambda ls: [x for x in runs(pods) if x["slot_id"] == g2]), 15, g2, seen=pods.tail
    )

    # 5. Removed: no slot due FOLLOW seconds after the removal is sent.
    done = control(pods, "remove", JOB)
    removed_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout.startswith(f"removed job {JOB!r} v"), shown(done)
    # Past the next slot of the grid after the removal was followed, and its run.
    after_follow = (int(removed_at + FOLLOW) // CHANGED + 1) * CHANGED
    time.sleep(max(0.0, after_follow + 2.5 - time.time()))
    pods.stop_all()

    everything = runs(pods)
    assert later(everything, removed_at + FOLLOW) == [], f"sent after the removal {removed_at:.3f}"
    manual = [x for x in everything if x["slot_id"] == slot_id]
    assert len(manual) == 1, manual
    assert (manual[0]["args"], manual[0]["kwargs"]) == (ARGS, KWARGS)
    # Over the whole test: every slot sent once, attempt 1, by more than one pod.
    assert {s: n for s, n in per_slot(everything).items() if n > 1} == {}, "a slot was sent twice"
    assert {x["attempt"] for x in everything} == {1}
    assert len({x["sent_by"] for x in everything}) >= 2, "one pod sent every slot"
    # After the change: only the new grid, every one of its slots, with the same arguments.
    changed = later(everything, changed_at + FOLLOW)
    seconds = sorted(slot_seconds(x["slot_id"]) for x in changed)
    assert seconds == [g1 + CHANGED * k for k in range(len(seconds))], seconds
    assert len(seconds) >= 2
    assert {(str(x["args"]), str(x["kwargs"])) for x in changed} == {(str(ARGS), str(KWARGS))}
