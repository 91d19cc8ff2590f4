"""End to end: a schedule stored at run time, sent by three real ``celery beat`` processes.

Three standalone beats (``--scheduler anarchon_celery:Scheduler``) with no
``beat_schedule`` entry share the test's Redis (broker and store) with one
real worker. An entry is stored while they run, then paused, resumed, run
now and removed with ``celery -A tests.celery.e2e_app anarchon VERB`` (real
subprocesses, as a user runs them; the app's settings name the store and
namespace), and changed with :class:`~anarchon_core.Control`. The worker's
``e2e.work`` task reports each run it executes (see tests/celery/e2e_app.py):
its first positional argument is the report's ``job``, its ``seconds``
keyword how long it works, and the ``anarchon`` header it received names the
slot.

One fleet goes through every step (to keep the time down): the steps run in
order, each building on the report of the ones before.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon_core import Control
from tests.celery.harness import CELERY, CeleryFleet, Line, per_slot, slot_seconds
from tests.cleanup import drop_namespace
from tests.pods import (
    FOLLOW,
    ROOT,
    assert_each_second_once,
    later,
    pause_resume_and_run_now,
    shown,
)

pytestmark = pytest.mark.scenario

#: The stored entry, the task it names, and what it passes to it.
ENTRY, TASK = "stored", "e2e.work"
ARG, WORK = "from-args", 0.3
#: The interval the entry is changed to.
CHANGED = 3
BEATS = ("b1", "b2", "b3")


@pytest.fixture
def celery_redis(redis_url: str) -> str:
    """The Redis broker and store, on one of databases 1-9 of the test Redis."""
    return f"{redis_url.rsplit('/', 1)[0]}/{1 + uuid.uuid4().int % 9}"


@pytest.fixture
def pods(tmp_path: Path, celery_redis: str) -> Iterator[CeleryFleet]:
    """The test's pods (none started); killed, and the namespace dropped, afterwards."""
    made = CeleryFleet(tmp_path, celery_redis, {})  # no beat_schedule entry: only the store's
    try:
        yield made
    finally:
        made.stop_all()
        drop_namespace(celery_redis, made.namespace)


def celery_anarchon(pods: CeleryFleet, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.celery.e2e_app anarchon VERB ARGS``: the app's store and namespace."""
    done = subprocess.run(
        [CELERY, "-A", "tests.celery.e2e_app", "anarchon", *args],
        env=pods.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, shown(done)
    return done


def runs(pods: CeleryFleet) -> list[Line]:
    """The runs of the stored entry's slots (its header names the entry)."""
    return [x for x in pods.starts() if x["info"].get("job") == ENTRY]


@pytest.mark.timeout(240)
def test_a_schedule_stored_at_run_time_is_sent_once_per_slot_paused_run_now_changed_removed(
    pods: CeleryFleet,
) -> None:
    def started(beat: str) -> bool:
        return re.search(r"anarchon: \d+ entr.*, store ", pods.log(beat)) is not None

    pods.worker("w1", beat=False, concurrency=2)
    for name in BEATS:
        pods.beat(name)
    # Each beat set up (its store reached) before the entry is stored.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(map(started, BEATS)):
        time.sleep(0.2)
    assert all(map(started, BEATS)), pods.logs()

    # 1. Stored while the beats run: each slot sent once, with its args and kwargs.
    done = celery_anarchon(
        pods, "add", ENTRY, "--handler", TASK, "--every", "1",
        "--args", f'["{ARG}"]', "--kwargs", f'{{"seconds": {WORK}}}',
    )  # fmt: skip
    added_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout.startswith(f"added job {ENTRY!r} v1: every 1s -> {TASK}"), shown(done)
    pods.wait_for(lambda ls: runs(pods), 30, "a first slot of the stored entry")
    pods.wait_for(lambda ls: len(per_slot(runs(pods))) >= 6, 30, "six slots")
    time.sleep(2)  # a second send of these slots would have run by now
    first = runs(pods)
    assert_each_second_once(first, time.time() - 2, pods)
    assert len(per_slot(first)) >= 6
    assert min(slot_seconds(x["slot_id"]) for x in first) <= added_at + FOLLOW + 1
    assert {x["job"] for x in first} == {ARG}, "the stored args were not passed"
    ends = {x["task_id"]: x for x in pods.lines() if x["kind"] == "end"}
    worked = [ends[x["task_id"]]["t"] - x["t"] for x in first if x["task_id"] in ends]
    assert len(worked) >= 5 and min(worked) >= WORK - 0.01, "the stored kwargs were not passed"
    assert {x["attempt"] for x in first} == {1}
    assert len({x["task_id"] for x in first}) == len(first)

    # 2-3. Paused, resumed, run now (the same for Celery and Dramatiq).
    slot_id = pause_resume_and_run_now(
        pods, lambda *args: celery_anarchon(pods, *args), ENTRY, lambda: runs(pods)
    )

    # 4. Changed to every CHANGED seconds: followed within FOLLOW seconds, on the new grid.
    with Control(pods.env["E2E_BROKER"], namespace=pods.namespace) as control:
        before, after = control.change(ENTRY, every=CHANGED)
    changed_at = time.time()
    assert (before.every, after.every, after.args) == (1, CHANGED, (ARG,))
    assert after.kwargs == {"seconds": WORK}
    assert after.version > before.version
    grid = pods.wait_for(
        lambda ls: later(runs(pods), changed_at + FOLLOW), 30, "a slot on the changed grid"
    )[0]
    g1 = slot_seconds(grid["slot_id"])
    assert g1 % CHANGED == 0, f"{grid['slot_id']} is not on the {CHANGED}s grid"
    assert g1 <= changed_at + FOLLOW + CHANGED + 0.001, "the first slot of the new grid was missed"
    g2 = f"{ENTRY}@{int(g1 + CHANGED) * 1000}"
    pods.wait_for(lambda ls: [x for x in runs(pods) if x["slot_id"] == g2], 15, g2)

    # 5. Removed: no slot due FOLLOW seconds after the removal is sent.
    done = celery_anarchon(pods, "remove", ENTRY)
    removed_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout.startswith(f"removed job {ENTRY!r} v"), shown(done)
    # Past the next slot of the grid after the removal was followed, and its send.
    after_follow = (int(removed_at + FOLLOW) // CHANGED + 1) * CHANGED
    time.sleep(max(0.0, after_follow + 2.5 - time.time()))
    pods.stop_all()

    everything = runs(pods)
    assert later(everything, removed_at + FOLLOW) == [], f"sent after the removal {removed_at:.3f}"
    manual = [x for x in everything if x["slot_id"] == slot_id]
    assert len(manual) == 1, manual
    assert manual[0]["job"] == ARG and manual[0]["task_id"].endswith(f":{slot_id}:1")
    # Over the whole test: every slot sent once, attempt 1, by more than one beat.
    assert {s: n for s, n in per_slot(everything).items() if n > 1} == {}, "a slot was sent twice"
    assert {x["attempt"] for x in everything} == {1}
    assert {x["job"] for x in everything} == {ARG}
    assert len({x["sent_by"] for x in everything}) >= 2, "one beat sent every slot"
    # After the change: only the new grid, every one of its slots.
    seconds = sorted(slot_seconds(x["slot_id"]) for x in later(everything, changed_at + FOLLOW))
    assert seconds == [g1 + CHANGED * k for k in range(len(seconds))], seconds
    assert len(seconds) >= 2
