"""An entry's ``expires`` counts from its slot: real ``celery beat`` and ``celery worker``
processes on a Redis broker, a slot sent late dropped by the worker, on-time slots run."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.celery.harness import CeleryFleet, Line, slot_seconds
from tests.fleet import fleets
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: The entry's interval and expiry (seconds): a slot sent more than EXPIRES late is dropped.
EVERY = 20
EXPIRES = 4


class ExpiryFleet(CeleryFleet):
    """Beats and workers of tests/celery/expiry_app.py: the entry ``late`` expires."""

    app = "tests.celery.expiry_app"


@pytest.fixture
def pods(tmp_path: Path, celery_redis: str) -> Iterator[ExpiryFleet]:
    for make in fleets(ExpiryFleet, tmp_path):
        fleet = make(celery_redis, {"late": {"every": EVERY, "work": 0.2}})
        fleet.env["E2E_OPTIONS"] = json.dumps({"late": {"expires": EXPIRES}})
        fleet.worker("w1", beat=False, concurrency=1)
        yield fleet


def slot_id(at: float) -> str:
    return f"late@{round(at * 1000)}"


def ended(pods: ExpiryFleet, slot: str) -> Callable[[], list[Line]]:
    return pods.watch(lambda ls: [x for x in ls if x["kind"] == "end" and x["slot_id"] == slot])


def dropped(pods: ExpiryFleet, slot: str) -> Callable[[], bool]:
    """Whether the worker discarded the task of ``slot`` (attempt 1) as expired."""
    task = f"e2e.work[anarchon:{pods.namespace}:{slot}:1]"
    return lambda: f"Discarding revoked task: {task}" in pods.log("w1")


def test_a_slot_caught_up_after_its_expiry_is_dropped_by_the_worker(pods: ExpiryFleet) -> None:
    pods.beat("b1")
    first = pods.first_start()  # on time, with the same expires: run
    wait_until(ended(pods, first["slot_id"]), 10, "the first slot's run to end", seen=pods.tail)
    pods.stop("b1")  # every beat down across the next slot
    missed = slot_seconds(first["slot_id"]) + EVERY
    assert time.time() < missed, "the only beat stopped too late"
    wait_until(
        lambda: time.time() > missed + EXPIRES + 1, EVERY + EXPIRES + 5, "the slot to expire"
    )
    pods.beat("b2")  # back within the slot's catch-up window (one interval): it sends it

    wait_until(
        dropped(pods, slot_id(missed)), 30, "the worker to drop the late slot", seen=pods.tail
    )
    said = pods.mentions(f"anarchon: catch_up {slot_id(missed)} ", f"anarchon: {slot_id(missed)} ")
    assert [line.split(": ", 1)[0] for line in said] == ["b2", "b2"], said
    assert "attempt 1 sent" in said[1] and "past its expiry" in said[1], said
    # The next slot, on time, runs; the late one never did.
    after = slot_id(missed + EVERY)
    wait_until(ended(pods, after), EVERY + 15, "the next slot to run", seen=pods.tail)
    assert pods.starts(slot_id=slot_id(missed)) == []


def test_a_stalled_beat_sends_late_the_worker_drops_it_and_the_next_slot_runs(
    pods: ExpiryFleet,
) -> None:
    pods.beat("b1")
    wait_until(lambda: pods.tracking("b1"), 60, "execution tracking in b1", seen=pods.tail)
    tracked_since = time.time()
    first = wait_until(
        pods.watch(
            lambda ls: [
                x for x in ls if x["kind"] == "end" and slot_seconds(x["slot_id"]) > tracked_since
            ]
        ),
        EVERY + 15,
        "a tracked run",
        seen=pods.tail,
    )[0]
    assert first["info"]["tracked"] is True
    late = slot_seconds(first["slot_id"]) + EVERY
    # The beat freezes (SIGSTOP: a paused VM, a long GC) across the next slot, and
    # sends it once it runs again: past its expiry.
    wait_until(lambda: time.time() > late - 2, EVERY, "the next slot to come near")
    pods.signal("b1", signal.SIGSTOP)
    wait_until(lambda: time.time() > late + EXPIRES + 1, 15, "the slot to be past its expiry")
    pods.signal("b1", signal.SIGCONT)

    wait_until(dropped(pods, slot_id(late)), 20, "the worker to drop the late slot", seen=pods.tail)
    said = pods.mentions(f"anarchon: {slot_id(late)} attempt 1 sent")
    assert len(said) == 1 and "past its expiry" in said[0], said
    # The slot was handed off (tracked) but never picked up: it holds the entry
    # only until shortly after its expiry, not for the 300 s pickup lease, so
    # the next slot is sent on time and runs.
    after = slot_id(late + EVERY)
    (run,) = wait_until(ended(pods, after), EVERY + 15, "the next slot to run", seen=pods.tail)
    assert run["info"]["tracked"] is True
    assert pods.starts(slot_id=slot_id(late)) == []
