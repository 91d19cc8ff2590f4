"""``anarchon_overlap="allow_all"``: real ``celery beat`` and ``celery worker`` processes on a
Redis broker; an entry whose task takes three intervals has every slot sent once, and the
worker runs several of them at the same time. With ``anarchon_limit`` beside it, beat
refuses to start, naming the entry."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.celery.harness import Line, per_slot, slot_seconds
from tests.celery.test_expiry_e2e import ExpiryFleet
from tests.fleet import assert_each_second_once, fleets
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: The entry's interval, and how long its task works: three intervals.
EVERY = 1
WORK = 3 * EVERY
#: The tracked slots the test sees run to their end.
SLOTS = 6


@pytest.fixture
def make(tmp_path: Path, redis_url: str) -> Iterator[Callable[[dict[str, object]], ExpiryFleet]]:
    """Fleets of the entry ``side`` (every EVERY s, works WORK s) with the given options,
    on one of databases 1-9 of the test Redis (see test_e2e.py)."""
    broker = f"{redis_url.rsplit('/', 1)[0]}/{1 + uuid.uuid4().int % 9}"
    for fleet in fleets(ExpiryFleet, tmp_path):

        def made(options: dict[str, object]) -> ExpiryFleet:
            pods = fleet(broker, {"side": {"every": EVERY, "work": WORK}})
            pods.env["E2E_OPTIONS"] = json.dumps({"side": options})
            return pods

        yield made


def most_at_once(runs: list[Line]) -> int:
    """The most runs going on at the same time, from their start and end lines."""
    edges = sorted((x["t"], 1 if x["kind"] == "start" else -1) for x in runs)
    most = going = 0
    for _, step in edges:
        going += step
        most = max(most, going)
    return most


def test_allow_all_sends_every_slot_once_and_the_worker_runs_them_side_by_side(
    make: Callable[[dict[str, object]], ExpiryFleet],
) -> None:
    pods = make({"anarchon_overlap": "allow_all"})
    pods.worker("w1", beat=False, concurrency=4)
    pods.beat("b1")
    pods.beat("b2")
    wait_until(
        lambda: pods.tracking("b1", "b2"), 30, "execution tracking in b1, b2", seen=pods.tail
    )
    tracked_since = time.time()

    def tracked(lines: list[Line], kind: str) -> list[Line]:
        return [
            x for x in lines if x["kind"] == kind and slot_seconds(x["slot_id"]) > tracked_since
        ]

    wait_until(
        pods.watch(lambda ls: len(per_slot(tracked(ls, "end"))) >= SLOTS),
        SLOTS * EVERY + WORK + 10,
        f"{SLOTS} tracked slots to end",
        seen=pods.tail,
    )
    lines = pods.lines()
    ended = tracked(lines, "end")
    last = max(slot_seconds(x["slot_id"]) for x in ended)
    starts = [x for x in tracked(lines, "start") if slot_seconds(x["slot_id"]) <= last]

    # Every slot from the first tracked one to the last: started once, attempt 1, handed
    # off to the worker (its lane's lease held there), none skipped.
    assert_each_second_once(starts, last, pods, EVERY)
    assert len(starts) >= SLOTS, starts
    assert {(x["job"], x["attempt"], x["info"]["tracked"]) for x in starts} == {
        ("side", 1, True)
    }, starts
    assert {x["slot_id"].rpartition("@")[0] for x in starts} == {"side"}, starts
    # Sent once: the worker received one task per slot, never a second attempt.
    received = re.findall(
        rf"Task e2e\.work\[anarchon:{re.escape(pods.namespace)}:side@([0-9]+):([0-9]+)\] received",
        pods.log("w1"),
    )
    sent = {x["slot_id"] for x in starts}
    per_sent = per_slot([{"slot_id": f"side@{ms}"} for ms, _ in received])
    assert {slot: per_sent[slot] for slot in sent} == dict.fromkeys(sent, 1), received
    assert {attempt for _, attempt in received} == {"1"}, received
    # Side by side: each run takes three intervals, and three went on at once.
    runs = [x for x in lines if x["kind"] in ("start", "end") and x["slot_id"] in sent]
    assert most_at_once(runs) >= 3, runs
    # No beat passed a slot by as an overlap (as under the default policy, skip).
    assert pods.mentions("anarchon: overlap ") == [], pods.mentions("anarchon: overlap ")


def test_allow_all_with_a_limit_stops_beat_at_start_naming_the_entry(
    make: Callable[[dict[str, object]], ExpiryFleet],
) -> None:
    pods = make({"anarchon_overlap": "allow_all", "anarchon_limit": 3})
    pods.beat("b1")
    beat = pods.procs["b1"]
    wait_until(lambda: beat.poll() is not None, 30, "beat to stop", seen=pods.tail)
    assert beat.returncode == 1, pods.tail()
    said = pods.mentions("anarchon: beat cannot start:")
    assert len(said) == 1, pods.tail()
    assert "beat_schedule['side']: anarchon_limit=3 with overlap='allow_all'" in said[0], said
    assert pods.lines() == []  # nothing sent
