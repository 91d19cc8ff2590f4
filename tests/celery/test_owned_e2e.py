"""An entry whose schedule decides its own due times, in real ``celery beat`` processes on
Redis: one beat at a time decides them; SIGKILLed while it does, another takes over
after about the lease, and no due time is sent twice."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.celery.harness import CeleryFleet, slot_seconds
from tests.fleet import fleets
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: The entry's lease (``anarchon_lease``): the owner's too.
LEASE = 3.0
#: What a beat logs when it takes the entry's lease.
TAKES = "anarchon: entry two: this beat decides its due times now"


class OwnedFleet(CeleryFleet):
    """Beats and workers of tests/celery/owned_app.py: the entry ``two``."""

    app = "tests.celery.owned_app"


@pytest.fixture
def pods(tmp_path: Path, celery_redis: str) -> Iterator[OwnedFleet]:
    for make in fleets(OwnedFleet, tmp_path):
        fleet = make(celery_redis, {}, lease=LEASE)
        fleet.worker("w1", beat=False, concurrency=2)
        yield fleet


def owners(pods: OwnedFleet, *names: str) -> list[str]:
    """The beats of ``names`` that took the entry's lease, each as often as it did."""
    return [name for name in names for _ in range(pods.log(name).count(TAKES))]


def test_a_beat_killed_while_it_decides_is_taken_over_and_no_due_time_runs_twice(
    pods: OwnedFleet,
) -> None:
    beats = ("b1", "b2", "b3")
    for name in beats:
        pods.beat(name)
    (owner,) = wait_until(lambda: owners(pods, *beats), 60, "a beat to take the lease")
    said = (
        "anarchon: entry two: its schedule (EveryTwo) decides its own due times: sent by one"
        " beat at a time under a lease (takeover after 3s), not on a shared grid"
    )
    wait_until(
        lambda: all(pods.log(name).count(said) == 1 for name in beats),
        60,
        "every beat to say how the entry is run",
        seen=pods.tail,
    )
    wait_until(lambda: len(pods.starts("two")) >= 3, 30, "three runs", seen=pods.tail)

    killed_at = pods.kill(owner)  # SIGKILL: nothing released
    others = [name for name in beats if name != owner]
    (second,) = wait_until(
        lambda: owners(pods, *others), 3 * LEASE + 10, "another beat to take over"
    )
    took = time.time() - killed_at
    # Taken once the dead owner's lease lapsed: a read saw it unchanged for a whole
    # lease, and its last renewal came at most a third of the lease before the kill.
    assert LEASE * 2 / 3 <= took <= LEASE + 4, took
    assert f"{TAKES} (the lease of " in pods.log(second), pods.log(second)[-2000:]
    wait_until(
        pods.watch(
            lambda ls: [
                x
                for x in ls
                if x["kind"] == "end"
                and x["job"] == "two"
                and slot_seconds(x["slot_id"]) > killed_at + took
            ]
        ),
        15,
        "a run decided by the new owner",
        seen=pods.tail,
    )
    later = time.time() + 4
    wait_until(lambda: time.time() > later, 10, "a few more due times")

    starts = pods.starts("two")
    twice = {s: n for s, n in Counter(x["slot_id"] for x in starts).items() if n > 1}
    assert twice == {}, f"due times run twice: {twice}; {pods.tail()}"
    at = sorted(slot_seconds(x["slot_id"]) for x in starts)
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert all(gap >= 2.0 for gap in gaps), gaps
    # The one gap the kill made: not more than the lease after the due time, plus the
    # beats' reads and ticks.
    late = [gap for gap in gaps if gap > 3.5]
    assert len(late) <= 1 and all(gap <= 2.0 + LEASE + 3.0 for gap in late), gaps
