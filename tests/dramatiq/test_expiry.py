"""``schedule_expires`` end to end: real ``dramatiq`` workers on a Redis broker.

A slot sent later than its expiry (caught up after every pod was down) is dropped
by the worker; the actor's on-time slots, with the same option, run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.dramatiq.harness import DramatiqFleet, Line, per_slot, slot_seconds
from tests.fleet import BIN, fleets
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

APP = "tests.dramatiq.options_app"
#: The actor's expiry, shorter than the catch-up's lateness below.
EXPIRES = 3
#: How long after the missed slot the pod comes back: past its expiry, within its
#: catch-up window (one interval, 10 s).
BACK_AFTER = EXPIRES + 1


class OptionsFleet(DramatiqFleet):
    """Workers running tests/dramatiq/options_app.py, whose actors take actor options."""

    def __init__(self, tmp_path: Path, broker: str, actors: dict[str, object]) -> None:
        super().__init__(tmp_path, broker, {})
        self.env["E2E_OPTIONED"] = json.dumps(actors)

    def worker(
        self, name: str, *, processes: int = 1, threads: int = 2, scheduler: bool = True
    ) -> None:
        argv = [str(BIN / "dramatiq"), APP, "--processes", str(processes)]
        argv += ["--threads", str(threads), "--queues", self.namespace, "-v"]
        self.spawn(name, argv, {"E2E_SCHEDULER": "1" if scheduler else "0"})


@pytest.fixture
def dramatiq_redis(redis_url: str) -> str:
    """The Redis broker: db 10 of the test Redis, a queue and namespace per test."""
    return redis_url.rsplit("/", 1)[0] + "/10"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., OptionsFleet]]:
    yield from fleets(OptionsFleet, tmp_path)


def starts_of(pods: OptionsFleet, slot: float) -> list[Line]:
    """The runs of ``ten``'s slot at ``slot`` (Unix seconds) that started."""
    return [x for x in pods.starts("ten") if slot_seconds(x["slot_id"]) == slot]


def test_a_slot_caught_up_past_its_expiry_is_dropped_and_the_next_one_runs(
    fleet: Callable[..., OptionsFleet], dramatiq_redis: str
) -> None:
    actor = {"every": 10, "work": 0.2, "options": {"schedule_expires": EXPIRES}}
    pods = fleet(dramatiq_redis, {"ten": actor})
    pods.worker("w1")
    first = wait_until(
        pods.watch(lambda ls: pods.starts("ten")), 40, "a first slot", seen=pods.tail
    )[0]
    pods.stop_all()  # every pod down across the next slot
    missed = slot_seconds(first["slot_id"]) + 10
    missed_id = f"ten@{int(missed * 1000)}"
    time.sleep(max(0.0, missed + BACK_AFTER - time.time()))
    pods.worker("w1")
    # The pod catches the missed slot up (within its catch-up window), past its expiry...
    sent_late = wait_until(
        pods.watch(lambda ls: pods.mentions(f"{missed_id} attempt 1 sent")),
        30,
        "the missed slot sent",
        seen=pods.tail,
    )
    assert "past its expiry (schedule_expires=3s)" in sent_late[0], sent_late
    # ...and the slot after it, on time, runs: the dropped one does not hold it up.
    following = wait_until(
        pods.watch(lambda ls: starts_of(pods, missed + 10)),
        30,
        "the slot after the missed one",
        seen=pods.tail,
    )[0]
    pods.stop_all()
    counts = per_slot(pods.starts("ten"))
    assert counts[first["slot_id"]] == 1
    assert counts[missed_id] == 0, pods.tail()
    assert counts[following["slot_id"]] == 1
    # The actor ran within its expiry, with the time it had left as its age limit.
    assert following["t"] - (missed + 10) < EXPIRES
    assert 0 < following["max_age"] <= EXPIRES * 1000
    assert pods.mentions("has exceeded its age limit"), pods.logs()
