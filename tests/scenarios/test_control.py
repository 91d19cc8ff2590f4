"""Runtime control through the store, with real instances and the real ``anarchon`` command.

Three instance processes share one store and one job every second. The
``anarchon`` command, run as a user runs it (a subprocess), pauses the job,
is refused a run-now request while it is paused, resumes it, and asks for a
run now; the instances' report shows what each of them did meanwhile.

Each store runs one fleet through every step (to keep the time down), so the
steps run in order and each builds on the report of the ones before.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.cleanup import drop_namespace
from tests.conftest import SERVER_STORES
from tests.fleet import Fleet, Line, slot_seconds
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

NAMES = ("a", "b", "c")
#: The job ``anarchon_core.tools.instance`` declares unless told otherwise.
JOB = "tick"
#: The fleet's job: a slot every second, working 0.1 s, holding a 3 s lease.
EVERY, WORK, LEASE = 1, 0.1, 3
#: A claim of slot S is sent before S + 1 s: past it the engine claims only
#: the most recent slot. Plus a margin for the claim's own round trip.
CLAIM_WINDOW = 1.0 + 0.5
#: The longest a start may follow the pause: claims sent before it, answered late.
LATE_START = 2.0


@pytest.fixture(params=["redis", "postgres", "nats"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    """Three instances' fleet (not started) on a server store, in a namespace of its own."""
    url = str(request.getfixturevalue(SERVER_STORES[request.param]))
    namespace = f"s{uuid.uuid4().hex[:10]}"
    made = Fleet(tmp_path, url, namespace=namespace, every=EVERY, work=WORK, lease=LEASE)
    try:
        yield made
    finally:
        made.stop_all()
        drop_namespace(url, namespace)


def shown(done: subprocess.CompletedProcess[str]) -> str:
    return f"{done.args[3:5]}: exit {done.returncode}\nstdout:\n{done.stdout}stderr:\n{done.stderr}"


def starts(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line["kind"] == "start"]


def refused_after(lines: list[Line], since: float) -> set[str]:
    """The slots due after ``since`` whose claims were answered "paused"."""
    return {
        x["slot_id"] for x in lines if x["kind"] == "paused" and slot_seconds(x["slot_id"]) > since
    }


def test_pause_resume_and_run_now_across_instances(fleet: Fleet) -> None:
    fleet.start(*NAMES)
    wait_until(
        fleet.watch(lambda ls: len({x["slot_id"] for x in starts(ls)}) >= 3),
        30,
        "three slots to run",
        seen=fleet.tail,
    )

    # 1. Paused: no slot due after the pause starts, on any instance.
    done = fleet.anarchon("pause", JOB)
    paused_at = time.time()  # the pause is in the store by now
    assert done.returncode == 0, shown(done)
    assert done.stdout == f"paused job {JOB!r}\n", shown(done)
    # Paused for three slots: the instances claim each and are told the job is paused.
    wait_until(
        fleet.watch(lambda ls: len(refused_after(ls, paused_at)) >= 3),
        15,
        "3 slots due after the pause refused as paused",
        seen=fleet.tail,
    )
    lines = fleet.lines()
    after_pause = [x for x in starts(lines) if slot_seconds(x["slot_id"]) > paused_at]
    assert after_pause == [], f"slots due after the pause at {paused_at:.3f} started"
    # Only a slot whose claim was sent before the pause may start after it, and soon.
    late = [x for x in starts(lines) if x["t"] > paused_at]
    assert all(x["t"] <= paused_at + LATE_START for x in late), late
    # The instances did claim the slots meanwhile, and were told the job is paused:
    # a pause that stopped the instances claiming would not be a pause in the claim.
    assert len(refused_after(lines, paused_at)) >= 2, lines[-10:]

    # 2. A run-now request for a paused job is refused, and nothing runs.
    done = fleet.anarchon("trigger", JOB)
    assert done.returncode == 1, shown(done)
    assert "paused" in done.stderr, shown(done)
    assert "asked to run" not in done.stdout, shown(done)

    # 3. Resumed: the next slot due runs once; the slots passed while paused never.
    resuming = time.time()
    done = fleet.anarchon("resume", JOB)
    resumed_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout == f"resumed job {JOB!r}\n", shown(done)
    first = wait_until(
        fleet.watch(lambda ls: [x for x in starts(ls) if slot_seconds(x["slot_id"]) > resumed_at]),
        10,
        "the first slot after the resume",
        seen=fleet.tail,
    )[0]
    # The very next slot of the grid, not a later one.
    assert slot_seconds(first["slot_id"]) <= resumed_at + EVERY, first
    time.sleep(max(0.0, resumed_at + 3 - time.time()))
    lines = fleet.lines()
    assert len(fleet.starts(slot_id=first["slot_id"])) == 1, fleet.starts(slot_id=first["slot_id"])
    window = [x for x in starts(lines) if resumed_at <= x["t"] <= resumed_at + 3]
    assert len({x["slot_id"] for x in window}) <= 4, window  # no burst of missed slots
    # Slots due while paused whose claim was sent before the resume never run.
    in_pause = [
        x for x in starts(lines) if paused_at < slot_seconds(x["slot_id"]) < resuming - CLAIM_WINDOW
    ]
    assert in_pause == [], f"paused {paused_at:.3f} to {resuming:.3f}: {in_pause}"

    # 4. Run now: a slot of its own, run once on one instance, marked manual.
    done = fleet.anarchon("trigger", JOB)
    assert done.returncode == 0, shown(done)
    match = re.search(r"asked to run (\S+) now", done.stdout)
    assert match, shown(done)
    slot_id = match.group(1)
    assert slot_id.startswith(f"{JOB}@"), slot_id
    outcome = wait_until(
        fleet.watch(
            lambda ls: [
                x for x in ls if x.get("slot_id") == slot_id and x["kind"] in ("start", "missed")
            ]
        ),
        15,
        f"{slot_id} to run",
        seen=fleet.tail,
    )[0]
    # Nothing overlaps the request here (each run works 0.1 s of the 1 s between
    # slots): no scheduled slot may answer it in its place (a "missed" line).
    assert outcome["kind"] == "start", f"the run-now request was dropped: {outcome}"
    manual = outcome
    wait_until(
        fleet.watch(lambda ls: any(x["kind"] == "end" and x["slot_id"] == slot_id for x in ls)),
        10,
        f"{slot_id} to end",
        seen=fleet.tail,
    )
    ended = time.time()
    # Two slots later: a second claim of the request would have run by now.
    wait_until(
        fleet.watch(lambda ls: [x for x in starts(ls) if slot_seconds(x["slot_id"]) > ended + 1]),
        10,
        "two more slots",
        seen=fleet.tail,
    )
    runs = fleet.starts(slot_id=slot_id)
    assert [x["attempt"] for x in runs] == [1], runs
    won = [x for x in fleet.lines() if x["kind"] == "manual" and x["slot_id"] == slot_id]
    assert [x["instance"] for x in won] == [manual["instance"]], won
    when = datetime.fromtimestamp(slot_seconds(slot_id), timezone.utc)
    slot_text = when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    history = ""
    for _ in range(10):  # the manual mark is written just after the run began
        done = fleet.anarchon("history", JOB)
        assert done.returncode == 0, shown(done)
        history = done.stdout
        rows = [line.split() for line in history.splitlines()]
        row = [r for r in rows if r[:2] == slot_text.split()]
        if row and row[0][2] == "manual" and row[0][6] == "done":
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"no manual row, done, for {slot_text}:\n{history}")
    assert row[0][3] == "1" and row[0][5] == manual["instance"], history

    # 5. Over the whole run: each slot started once, none taken over or lost.
    fleet.stop_all()
    lines = fleet.lines()
    per_slot = Counter(x["slot_id"] for x in starts(lines))
    assert {s: n for s, n in per_slot.items() if n > 1} == {}
    assert {x["attempt"] for x in starts(lines)} == {1}
    trouble = {"takeover", "lost", "abort", "finish_refused", "store_unavailable"}
    assert [x for x in lines if x["kind"] in trouble] == []
    assert len({x["instance"] for x in starts(lines)}) >= 2


#: The job stored at run time: a slot every 2 s, then every 3 s once changed.
STORED = "stored"


def test_a_stored_schedule_and_a_backfill_across_instances(fleet: Fleet) -> None:
    """A job added from the CLI runs on its first slot on exactly one instance; a change
    of every= is followed by all instances within a second; a removed job stops; a
    backfill of 10 past slots runs each once, in order, with its normal slot id."""
    fleet.start(*NAMES, every=60)  # the fleet's own job: a slot a minute, backfilled below

    # Added: every instance reads it within a second; its first slot runs once.
    done = fleet.anarchon("add", STORED, "--handler", "work", "--every", "2")
    added_at = time.time()
    assert done.returncode == 0, shown(done)
    assert done.stdout.startswith(f"added job {STORED!r} v"), shown(done)
    # The first slot every instance knows of: the first one 1 s (one read) after the add.
    first_due = (int(added_at + 1.0) // 2 + 1) * 2
    wait_until(
        fleet.watch(lambda ls: [x for x in starts(ls) if x["job"] == STORED]),
        10,
        "the stored job to run",
        seen=fleet.tail,
    )
    # Four slots: the first three are past their claim window.
    wait_until(
        fleet.watch(lambda ls: len({x["slot_id"] for x in starts(ls) if x["job"] == STORED}) >= 4),
        15,
        "4 slots of the stored job",
        seen=fleet.tail,
    )
    runs = Counter(x["slot_id"] for x in starts(fleet.lines()) if x["job"] == STORED)
    assert runs and set(runs.values()) == {1}, runs  # each slot on exactly one instance
    seconds = sorted(slot_seconds(s) for s in runs)
    assert seconds[0] <= first_due, (seconds, added_at)  # no slot after the add was skipped
    assert all(s % 2 == 0 for s in seconds)
    assert len(seconds) >= 3

    # Changed to every 3 s: all instances follow within a second.
    done = fleet.anarchon("change", STORED, "--every", "3")
    changed_at = time.time()
    assert done.returncode == 0, shown(done)
    wait_until(
        fleet.watch(
            lambda ls: (
                len(
                    {
                        x["slot_id"]
                        for x in starts(ls)
                        if x["job"] == STORED and slot_seconds(x["slot_id"]) > changed_at + 1.0
                    }
                )
                >= 3
            )
        ),
        15,
        "3 slots after the change",
        seen=fleet.tail,
    )
    later = [
        slot_seconds(x["slot_id"])
        for x in starts(fleet.lines())
        if x["job"] == STORED and slot_seconds(x["slot_id"]) > changed_at + 1.0
    ]
    assert len(later) >= 2 and all(s % 3 == 0 for s in later), later
    assert Counter(later).most_common(1)[0][1] == 1

    # Removed: no slot of it starts once every instance read the removal.
    done = fleet.anarchon("remove", STORED)
    removed_at = time.time()
    assert done.returncode == 0, shown(done)
    time.sleep(4)
    after = [
        x
        for x in starts(fleet.lines())
        if x["job"] == STORED and slot_seconds(x["slot_id"]) > removed_at + 1.0
    ]
    assert after == []

    # A backfill of the fleet's own job over 10 past minutes: 10 slots, each once,
    # in order (each starting after the previous ended), with normal slot ids.
    now = int(time.time()) // 60 * 60
    start = datetime.fromtimestamp(now - 600, timezone.utc).isoformat()
    end = datetime.fromtimestamp(now, timezone.utc).isoformat()
    done = fleet.anarchon("backfill", JOB, "--from", start, "--to", end, "--unrecorded")
    assert done.returncode == 0, shown(done)
    expected = [f"{JOB}@{(now - 600 + 60 * k) * 1000}" for k in range(10)]
    wait_until(
        fleet.watch(
            lambda ls: len({x["slot_id"] for x in starts(ls) if x["slot_id"] in expected}) == 10
        ),
        40,
        "the 10 backfilled slots",
        seen=fleet.tail,
    )
    time.sleep(1.5)
    lines = fleet.lines()
    filled = [x for x in starts(lines) if x["slot_id"] in expected]
    assert [x["slot_id"] for x in filled] == expected  # each once, in order
    ends = {x["slot_id"]: x["t"] for x in lines if x["kind"] == "end"}
    for previous, following in itertools.pairwise(filled):
        assert following["t"] >= ends[previous["slot_id"]], (previous, following)
    history = fleet.anarchon("history", JOB, "--limit", "50")
    assert history.returncode == 0, shown(history)
    assert history.stdout.count("backfill") == 10, shown(history)
    done = fleet.anarchon("jobs")
    assert "backfill waiting" not in done.stdout, shown(done)
