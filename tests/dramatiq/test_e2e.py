"""End to end: real ``dramatiq`` and ``dramatiq-anarchon`` processes, Redis broker, signals."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.dramatiq.harness import DramatiqFleet, per_slot, slot_seconds
from tests.fleet import assert_each_second_once, fleets
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

FAST = {"every": 1, "work": 0.2}
MINUTELY = {"cron": "* * * * *", "work": 0.2}


@pytest.fixture
def dramatiq_redis(redis_url: str) -> str:
    """The Redis broker: db 10 of the test Redis, a queue and namespace per test."""
    return redis_url.rsplit("/", 1)[0] + "/10"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., DramatiqFleet]]:
    yield from fleets(DramatiqFleet, tmp_path)

    # Slots held by the frozen pod were taken over as attempt 2: never two of one attempt.


def test_a_worker_killed_mid_message_runs_the_slot_again_as_attempt_2(
    fleet: Callable[..., DramatiqFleet], dramatiq_redis: str
) -> None:
    lease = 3
    pods = fleet(dramatiq_redis, {"long": {"every": 15, "work": 8}, "fast": FAST}, lease=lease)
    pods.worker("w1")
    pods.worker("w2")
    first = wait_until(
        pods.watch(lambda ls: pods.starts("long")), 40, "a long message", seen=pods.tail
    )[0]
    import os

    killed = time.time()
    os.kill(first["pid"], signal.SIGKILL)
    again = wait_until(
        pods.watch(
            lambda ls: [x for x in pods.starts("long") if x["slot_id"] == first["slot_id"]][1:]
        ),
        20,
        "attempt 2",
        seen=pods.tail,
    )[0]
    assert again["attempt"] == 2
    assert again["t"] - killed <= lease + 2
    time.sleep(1)
    pods.stop_all()
    assert len([x for x in pods.starts("long") if x["slot_id"] == first["slot_id"]]) == 2


def test_dramatiq_anarchon_next_to_plain_workers_sends_each_slot_once(
    fleet: Callable[..., DramatiqFleet], dramatiq_redis: str
) -> None:
    pods = fleet(dramatiq_redis, {"fast": FAST})
    pods.worker("w1", scheduler=False)
    pods.worker("w2", scheduler=False)
    # Workers first: a slot sent before any worker consumes would hold its job past the next slot.
    wait_until(
        pods.watch(lambda ls: all("ready for action" in t for t in pods.logs().values())),
        30,
        "up",
        seen=pods.tail,
    )
    pods.scheduler("s1")
    pods.scheduler("s2")
    wait_until(pods.watch(lambda ls: pods.starts("fast")), 30, "a first slot", seen=pods.tail)
    wait_until(
        pods.watch(lambda ls: len(per_slot(pods.starts("fast"))) >= 12),
        40,
        "12 slots",
        seen=pods.tail,
    )
    pods.stop_all()
    fast = pods.starts("fast")
    assert_each_second_once(fast, time.time() - 3, pods)
    assert {pods_of(x["sent_by"]) for x in fast} <= {"dqa"}


def pods_of(instance: str) -> str:
    return instance.rsplit(":", 1)[1]


def test_all_down_across_a_slot_and_back_in_the_catch_up_window_runs_it_once(
    fleet: Callable[..., DramatiqFleet], dramatiq_redis: str
) -> None:
    pods = fleet(dramatiq_redis, {"ten": {"every": 10, "work": 0.2}})
    pods.worker("w1")
    first = wait_until(
        pods.watch(lambda ls: pods.starts("ten")), 40, "a first slot", seen=pods.tail
    )[0]
    pods.stop_all()
    missed = slot_seconds(first["slot_id"]) + 10
    time.sleep(max(0.0, missed + 2 - time.time()))
    pods.worker("w1")
    pods.worker("w2")
    wait_until(
        pods.watch(
            lambda ls: [x for x in pods.starts("ten") if slot_seconds(x["slot_id"]) == missed]
        ),
        30,
        "the missed slot",
        seen=pods.tail,
    )
    time.sleep(2)
    pods.stop_all()
    counts = per_slot(pods.starts("ten"))
    assert counts[first["slot_id"]] == 1
    assert [n for s, n in counts.items() if slot_seconds(s) == missed] == [1]


class StoreCommands:
    """Counts the Redis commands touching ``namespace``'s keys (MONITOR), in a thread,
    from :meth:`start` until :meth:`stop`."""

    def __init__(self, url: str, namespace: str) -> None:
        self._client = redis.Redis.from_url(url)
        self._monitor = self._client.monitor()
        self._key = "anarchon:{" + namespace
        self._stopping = threading.Event()
        self.count = 0
        #: The commands counted, by name (EVALSHA for a script, whatever it does).
        self.by_name: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def start(self) -> None:
        self._monitor.__enter__()  # monitoring from here on
        self._thread.start()

    def _listen(self) -> None:
        try:
            for command in self._monitor.listen():
                if self._stopping.is_set():
                    break
                if self._key in command["command"]:
                    self.count += 1
                    self.by_name[command["command"].split(" ", 1)[0].upper()] += 1
        except Exception as exc:
            if not self._stopping.is_set():
                self.error = exc

    def stop(self) -> int:
        self._stopping.set()
        self._client.set("anarchon-test:monitor-wake", 1)  # a command for the loop to see
        self._thread.join(30)
        self._monitor.__exit__(None, None, None)
        self._client.close()
        assert self.error is None, f"MONITOR failed: {self.error!r}"
        return self.count


@pytest.mark.timeout(180)
def test_store_operations_per_slot_do_not_grow_with_processes(
    fleet: Callable[..., DramatiqFleet], dramatiq_redis: str
) -> None:
    per_slot_ops = {}
    by_name: dict[int, dict[str, float]] = {}
    for processes in (1, 4):
        pods = fleet(dramatiq_redis, {"fast": FAST})
        pods.worker("w1", processes=processes)
        pods.worker("w2", processes=processes)
        wait_until(
            pods.watch(lambda ls, p=pods: len(p.starts("fast")) > 2),
            30,
            "first slots",
            seen=pods.tail,
        )
        counter = StoreCommands(dramatiq_redis, pods.namespace)
        counter.start()
        began = time.time()
        # Counted over the slots of ten seconds from now, until the last of them started
        # (however long a loaded machine takes): their claims come at their times, inside
        # the count, whereas slots claimed before it and started late would be counted
        # without their claims if the count ran over slots started instead.
        wait_until(
            pods.watch(
                lambda ls, p=pods: [
                    s for s in p.starts("fast") if slot_seconds(s["slot_id"]) >= began + 10
                ]
            ),
            60,
            "the slots of ten seconds",
            seen=pods.tail,
        )
        commands = counter.stop()
        # Per slot time (a slot a second): the registry's and the controls' reads come per
        # second, as the slots do.
        slots = (time.time() - began) / FAST["every"]
        pods.stop_all()
        per_slot_ops[processes] = round(commands / slots, 1)
        by_name[processes] = {n: round(c / slots, 2) for n, c in counter.by_name.items()}
    print("store operations per slot:", per_slot_ops, by_name)
    assert per_slot_ops[4] <= per_slot_ops[1] * 1.25, by_name
