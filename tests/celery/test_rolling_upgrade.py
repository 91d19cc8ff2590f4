"""A rolling upgrade of Celery pods: a worker with the previous release's beat (``-B``)
beside one with this release's, on one Redis broker serving as the store.

Each slot is sent once by one of the two beats and run once, whichever worker
takes it (a beat of one release hands off to a worker of the other, whose
execution tracking takes the slot's lease); both beats send some; a task killed
mid-run in one pod is taken over as attempt 2 by the pod of the other release.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests import releases
from tests.celery.harness import CeleryFleet, Line, per_slot, slot_seconds
from tests.fleet import assert_each_second_once
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: The release the pods are upgraded from (RELEASES).
PREVIOUS = "0.1.0"


def test_old_and_new_beats_send_each_slot_once_and_take_over_each_others_work(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    previous = releases.source_tree(PREVIOUS)
    pods = fleet(
        celery_redis, {"fast": {"every": 1, "work": 0.2}, "long": {"every": 30, "work": 12}}
    )
    pods.worker("old", concurrency=2, release=previous)
    pods.worker("new", concurrency=2)
    wait_until(lambda: pods.tracking("old", "new"), 60, "both pods tracking", seen=pods.tail)
    began = time.time()

    def both_sent(lines: list[Line]) -> bool:
        fast = [x for x in pods.starts("fast") if slot_seconds(x["slot_id"]) > began + 1]
        return len(per_slot(fast)) >= 10 and len({x["sent_by"] for x in fast}) == 2

    wait_until(pods.watch(both_sent), 90, "10 slots, sent by both beats", seen=pods.tail)

    # The long task, killed mid-run in the pod that runs it (the broker's choice), is
    # taken over in the pod of the other release.
    def running(lines: list[Line]) -> list[Line]:
        """Runs of the long task (12 s) begun under 8 s ago and not ended."""
        ended = {(x["slot_id"], x["attempt"]) for x in lines if x["kind"] == "end"}
        return [
            x for x in lines
            if x["kind"] == "start" and x["job"] == "long" and time.time() - x["t"] < 8
            and (x["slot_id"], x["attempt"]) not in ended
        ]  # fmt: skip

    first = wait_until(pods.watch(running), 75, "a run of the long task", seen=pods.tail)[0]
    runner = pods.pod_of_worker(first["worker"])
    other = {"old": "new", "new": "old"}[runner]
    killed_at = pods.kill(runner)
    again = wait_until(
        pods.watch(
            lambda ls: [
                x for x in pods.starts("long")
                if x["slot_id"] == first["slot_id"] and x["attempt"] == 2
            ]
        ),
        20,
        f"attempt 2 in the {other} pod",
        seen=pods.tail,
    )[0]  # fmt: skip
    assert pods.pod_of_worker(again["worker"]) == other, again
    assert again["t"] - killed_at <= 3 + 5  # the 3 s lease, and a loaded machine's margin
    pods.stop_all()
    fast = [x for x in pods.starts("fast") if slot_seconds(x["slot_id"]) > began + 1]
    assert_each_second_once(
        [x for x in fast if slot_seconds(x["slot_id"]) < killed_at], killed_at - 2, pods
    )
    # A slot run again after the kill is a later attempt of a run the kill cut short
    # (begun in the killed pod, never ended), taken over as the long one is.
    ended = {(x["slot_id"], x["attempt"]) for x in pods.lines() if x["kind"] == "end"}
    for slot, n in per_slot(fast).items():
        runs = sorted((x for x in fast if x["slot_id"] == slot), key=lambda x: x["attempt"])
        cut = [
            x for x in runs[:-1]
            if pods.pod_of_worker(x["worker"]) == runner and (slot, x["attempt"]) not in ended
        ]  # fmt: skip
        attempts = [x["attempt"] for x in runs]
        assert n == 1 or (cut == runs[:-1] and attempts == sorted(set(attempts))), runs
