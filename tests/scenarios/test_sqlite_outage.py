"""The store becomes unreachable: another process holds SQLite's write lock."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.fleet import Fleet, Line, slot_seconds
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario


def starts_of(lines: list[Line]) -> list[Line]:
    return [x for x in lines if x["kind"] == "start"]


def reported(lines: list[Line], kind: str) -> set[str]:
    """The instances that reported ``kind``."""
    return {x["instance"] for x in lines if x["kind"] == kind}


def test_instances_survive_a_locked_store_and_resume_without_duplicates(tmp_path: Path) -> None:
    db = tmp_path / "outage.db"
    fleet = Fleet(tmp_path, f"sqlite:///{db}?busy_timeout=0.5", every=1, work=0.2, lease=3)
    try:
        fleet.start("a", "b", "c")
        wait_until(fleet.watch(lambda ls: len(starts_of(ls)) >= 2), 10, "2 runs", seen=fleet.tail)
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        locked_at = time.time()
        wait_until(
            fleet.watch(lambda ls: reported(ls, "store_unavailable") == set("abc")),
            10,
            "every instance to find the store unavailable",
            seen=fleet.tail,
        )
        time.sleep(3)  # the 3 s leases of runs going at the lock lapse meanwhile
        blocker.execute("COMMIT")
        blocker.close()
        unlocked_at = time.time()

        def resumed(lines: list[Line]) -> bool:
            late = [x for x in starts_of(lines) if slot_seconds(x["slot_id"]) > unlocked_at + 3]
            return reported(lines, "store_recovered") == set("abc") and bool(late)

        wait_until(fleet.watch(resumed), 15, "every instance to resume", seen=fleet.tail)
        alive = {name: proc.poll() is None for name, proc in fleet.procs.items()}
    finally:
        fleet.stop_all()
    assert alive == {"a": True, "b": True, "c": True}  # nobody crashed
    lines = fleet.lines()
    starts = [x for x in lines if x["kind"] == "start"]
    per_slot = Counter(x["slot_id"] for x in starts if x["attempt"] == 1)
    assert max(per_slot.values()) == 1
    # A second attempt only of a slot whose run was going when the store locked:
    # its end could not be recorded before its lease ended, so a backup took it
    # over once the store answered (docs/failure-scenarios.md, "Store unreachable").
    for again in [x for x in starts if x["attempt"] > 1]:
        first = [x for x in starts if x["slot_id"] == again["slot_id"] and x["attempt"] == 1]
        assert first and first[0]["t"] < locked_at + 0.5, again
        assert again["t"] > unlocked_at, again
        assert again["attempt"] == 2 and again["token"] > first[0]["token"], again
    # Nothing ran that could not be claimed while the store was locked.
    during = [x for x in starts if locked_at + 0.5 < x["t"] < unlocked_at - 0.1]
    assert during == []
    for name in "abc":
        kinds = {x["kind"] for x in lines if x["instance"] == name}
        assert {"store_unavailable", "store_recovered"} <= kinds
    resumed = [x for x in starts if x["t"] > unlocked_at]
    assert resumed
    assert resumed[0]["t"] - unlocked_at < 3
    assert slot_seconds(resumed[-1]["slot_id"]) > unlocked_at + 3
