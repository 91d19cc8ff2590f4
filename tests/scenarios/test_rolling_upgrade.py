"""A rolling upgrade: instances of the previous release and of this one share a store.

Pods are upgraded one at a time, so for minutes two releases share one store.
The previous release (``RELEASES``: 0.1.0) is built from the repository's history
(tests/releases.py) and its instances run beside this release's, on every lease
store that release had (MySQL came after it):

- a mixed fleet runs each slot once, the store's records, tables and keys written
  by the older release first and taken on by this one (which migrates what changed
  while the old instances go on);
- runs are taken over across the releases both ways (the runner killed) and handed
  over both ways (the runner stopped with SIGTERM);
- the older side honours this release's control requests: paused (no slot runs
  while paused), resumed, and a run-now request answered by a run.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from anarchon_core import open_store
from tests import releases
from tests.fleet import Fleet, Line, anchor_soon, shown, slot_seconds
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: The release a fleet is upgraded from.
PREVIOUS = "0.1.0"
#: A claim of slot S is sent before S + 1 s; plus a margin for its round trip.
CLAIM_WINDOW = 1.5


@pytest.fixture
def previous(store_url: str) -> Path:
    if urlsplit(store_url).scheme in ("mysql", "mariadb"):
        pytest.skip(f"release {PREVIOUS} has no MySQL store: no fleet of it to upgrade")
    return releases.source_tree(PREVIOUS)


def starts(lines: list[Line], job: str = "tick") -> list[Line]:
    return [x for x in lines if x["kind"] == "start" and x["job"] == job]


def due_between(lines: list[Line], since: float, until: float) -> list[Line]:
    return [x for x in starts(lines) if since < slot_seconds(x["slot_id"]) < until]


def slots_run(fleet: Fleet, since: float, count: int, what: str) -> None:
    """Wait until ``count`` slots due after ``since`` started."""
    wait_until(
        fleet.watch(lambda ls: len(due_between(ls, since, 1e12)) >= count),
        30,
        what,
        seen=fleet.tail,
    )


def assert_once(lines: list[Line], first: float, last: float, fleet: Fleet) -> None:
    """Every second from ``first`` to ``last`` claimed once (attempt 1) and run to its end
    once: a run handed over or taken over ends as its next attempt, not beside it."""
    due = [x for x in lines if int(first) <= slot_seconds(x.get("slot_id", "x@0")) < int(last) + 1]
    claims = Counter(int(slot_seconds(x["slot_id"])) for x in starts(due) if x["attempt"] == 1)
    ends = Counter(int(slot_seconds(x["slot_id"])) for x in due if x["kind"] == "end")
    expected = set(range(int(first), int(last) + 1))
    missed = sorted(expected - set(claims))
    told = fleet.mentions(*(f"tick@{s * 1000}" for s in missed)) if missed else []
    assert missed == [], f"missed {missed} of {int(first)}..{int(last)}: {told}"
    twice = {s for s, n in claims.items() if n > 1} | {s for s, n in ends.items() if n > 1}
    shown_twice = [x for x in due if int(slot_seconds(x["slot_id"])) in twice]
    assert twice == set(), f"run twice: {shown_twice}; {fleet.tail()}"


def test_a_mixed_fleet_runs_each_slot_once_and_the_older_side_obeys_control(
    fleet_factory: Callable[..., Fleet], previous: Path
) -> None:
    fleet = fleet_factory(every=1, work=0.1, lease=3)
    fleet.start("old-a", "old-b", release=previous)
    began = fleet.all_up()
    slots_run(fleet, began + 1, 3, "the older release to run three slots")
    # This release opens the store the older one laid out, while it runs.
    fleet.start("new-a", "new-b")
    mixed = fleet.all_up()
    slots_run(fleet, mixed + 1, 8, "eight slots of the mixed fleet")
    done = fleet.anarchon("status")  # this release reads what both wrote
    assert done.returncode == 0, shown(done)
    assert "tick" in done.stdout and "old-a" in done.stdout, shown(done)
    # The history kept by count once this release migrated the store (by token
    # distance, as the older layout kept it, clock tokens would leave one attempt).
    store = open_store(fleet.store, namespace=fleet.namespace)
    try:
        history = store.history("tick", 50)  # type: ignore[attr-defined]
    finally:
        store.close()
    owners = {run.owner for run in history}
    assert len(history) >= 10 and {"old-a", "old-b"} & owners, history

    # The newer instances go (the upgrade rolled back, or not yet rolled on): the
    # older ones alone follow this release's control requests.
    for name in ("new-a", "new-b"):
        fleet.stop(name)
    alone = time.time()
    done = fleet.anarchon("pause", "tick")
    paused_at = time.time()
    assert done.returncode == 0, shown(done)
    # The older instances claim the next slots and are told the job is paused; the
    # last slots claimed before the pause may start, none due later.
    wait_until(
        fleet.watch(
            lambda ls: {
                x["slot_id"] for x in ls
                if x["kind"] == "paused" and slot_seconds(x["slot_id"]) > paused_at + CLAIM_WINDOW
            } and len({x["slot_id"] for x in ls if x["kind"] == "paused"}) >= 3
        ),
        15,
        "three slots refused as paused by the older release",
        seen=fleet.tail,
    )  # fmt: skip
    assert due_between(fleet.lines(), paused_at + CLAIM_WINDOW, 1e12) == [], fleet.tail()
    done = fleet.anarchon("resume", "tick")
    resumed_at = time.time()
    assert done.returncode == 0, shown(done)
    slots_run(fleet, resumed_at + 1, 2, "the older release to run slots again after the resume")
    done = fleet.anarchon("trigger", "tick")
    assert done.returncode == 0, shown(done)
    asked = done.stdout.split("asked to run ", 1)[1].split()[0]
    wait_until(
        fleet.watch(lambda ls: [x for x in starts(ls) if x["slot_id"] == asked]),
        15,
        f"the older release to run {asked}",
        seen=fleet.tail,
    )
    last = time.time() - CLAIM_WINDOW
    fleet.stop_all()

    lines = [x for x in fleet.lines() if x.get("slot_id") != asked]
    assert_once(lines, began + 2, paused_at - 1, fleet)
    assert_once(lines, resumed_at + CLAIM_WINDOW + 1, last - 1, fleet)
    runs = fleet.lines()
    winners = {x["instance"] for x in due_between(runs, alone + CLAIM_WINDOW, 1e12)}
    assert winners and winners <= {"old-a", "old-b"}
    assert len([x for x in starts(runs) if x["slot_id"] == asked]) == 1


#: Each case: its job, the release of the runner, of the instance that takes the run
#: on, and how the runner goes (killed: a takeover once its lease lapsed; SIGTERM: a
#: hand-over at once).
CASES = [
    ("old-kill", "old", "new", signal.SIGKILL),
    ("new-kill", "new", "old", signal.SIGKILL),
    ("old-term", "old", "new", signal.SIGTERM),
    ("new-term", "new", "old", signal.SIGTERM),
]
LEASES = {signal.SIGKILL: 2, signal.SIGTERM: 10}


def test_runs_are_taken_over_and_handed_over_across_releases_both_ways(
    tmp_path: Path, store_url: str, fleet_factory: Callable[..., Fleet], previous: Path
) -> None:
    anchor = anchor_soon(10)
    fleets: dict[str, Fleet] = {}
    tree: dict[str, Path | None] = {"old": previous, "new": None}
    for job, runner, _, sig in CASES:
        # Runs of 30 s: they go on while the instances that take them on start (eight
        # processes, two releases: seconds on a loaded machine) and are signalled.
        fleets[job] = fleet_factory(job=job, every=60, anchor=anchor, work=30, lease=LEASES[sig])
        fleets[job].start(f"{job}-runner-{runner}", wait=False, release=tree[runner])
    any_fleet = next(iter(fleets.values()))  # they share the report
    first: dict[str, Line] = {}
    for job in fleets:
        found = wait_until(
            any_fleet.watch(lambda ls, job=job: starts(ls, job)),
            60,
            f"the first run of {job}",
            seen=any_fleet.tail,
        )
        first[job] = found[0]
        # Which release claimed it shows in its token: 0.1.0 numbered a job's claims
        # from 1, this release from the store's clock in ms.
        assert (first[job]["token"] == 1) == job.startswith("old"), first[job]
    # The instances that take the runs on start while the runs go on: each backs up
    # the run it finds in the store.
    for job, _, successor, _ in CASES:
        fleets[job].start(f"{job}-next-{successor}", wait=False, release=tree[successor])
    wait_until(
        any_fleet.watch(lambda ls: sum(x["kind"] == "up" for x in ls) >= 2 * len(CASES)),
        30,
        "every instance up",
        seen=any_fleet.tail,
    )
    ended = [x for x in any_fleet.lines() if x["kind"] == "end"]
    assert not ended, f"a run ended before its runner was signalled: {ended}"
    gone: dict[str, float] = {}
    for job, runner, _, sig in CASES:
        gone[job] = fleets[job].signal(f"{job}-runner-{runner}", sig)
    for job, _, successor, sig in CASES:
        slot_id = first[job]["slot_id"]
        again = wait_until(
            any_fleet.watch(
                lambda ls, slot_id=slot_id: [
                    x for x in ls if x["kind"] == "start" and x["slot_id"] == slot_id
                    and x["attempt"] == 2
                ]
            ),
            # The lease, then the backups' checks: seconds, but a fresh process on a loaded
            # machine may take longer to get there (how soon a hand-over came is below).
            LEASES[sig] + 30,
            f"{job}: attempt 2 of {slot_id}",
            seen=any_fleet.tail,
        )[0]  # fmt: skip
        assert again["instance"] == f"{job}-next-{successor}", again
        assert again["token"] > first[job]["token"], (again, first[job])
        if sig is signal.SIGTERM:  # handed over, not waited out: far less than the lease
            assert again["t"] - gone[job] <= 3, (job, again["t"] - gone[job])
    lines = any_fleet.lines()
    for job in fleets:
        runs = Counter((x["slot_id"], x["attempt"]) for x in starts(lines, job))
        assert all(n == 1 for n in runs.values()), (job, runs)
