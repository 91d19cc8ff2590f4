"""A broker outage across a slot, for the Celery and Dramatiq end-to-end tests.

The broker is a private Redis server that the test stops and starts again on
the same port; the anarchon store is on another server and stays up. The
broker goes down shortly before a slot and comes back inside that slot's
catch-up window (one interval by default). What a user must see: that slot
runs once, late, sent by a later attempt; no slot is missed or runs twice,
and the slots after the outage run as before.
"""

from __future__ import annotations

import math
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tests import servers
from tests.fleet import Fleet, Line, per_slot, slot_seconds
from tests.waiting import wait_until

F = TypeVar("F", bound=Fleet)

#: The entry's interval, and so its default catch-up window (seconds).
EVERY = 10
#: The broker stops this long before the slot, and comes back this long after it:
#: after every claim of the slot (jitter: at most 1 s) failed to send it, and early
#: enough that the workers are back before the next slot (Celery's retry to
#: connect 0, 2 and 6 s after losing the broker). A slot whose message still
#: waits for a worker then would hold its lease, and the next slot would be
#: skipped as an overlap.
DOWN_BEFORE = 1.0
UP_AFTER = 3.5
#: Slots after the outage's that must run too.
SLOTS_AFTER = 2


def restartable_redis() -> Iterator[servers.ServerProcess]:
    """A fixture body: a private Redis server, which the test may stop and start again."""
    binary = servers.redis_binary()
    if binary is None:
        servers.unavailable("a redis-server or valkey-server binary")
    assert binary is not None
    datadir = Path(tempfile.mkdtemp(prefix="broker-outage-"))
    server = servers.start_redis_like(binary, "broker", datadir)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(datadir, ignore_errors=True)


@dataclass
class Outage:
    """What ran of ``job`` around a broker outage across the slot at ``slot`` (Unix seconds)."""

    runs: list[Line]
    first: float
    slot: float
    last: float

    def expected(self) -> list[float]:
        """Every slot from the first run to the last slot waited for."""
        count = round((self.last - self.first) / EVERY) + 1
        return [self.first + k * EVERY for k in range(count)]

    def check(self) -> None:
        """Each slot ran once; the outage's slot by a later attempt than the failed one."""
        counts = per_slot(self.runs)
        ran = {slot_seconds(s) for s in counts}
        missed = [s for s in self.expected() if s not in ran]
        assert missed == [], f"slots missed: {missed} (the broker was down at {self.slot})"
        assert {s: n for s, n in counts.items() if n > 1} == {}, "a slot ran twice"
        [run] = [x for x in self.runs if slot_seconds(x["slot_id"]) == self.slot]
        assert run["attempt"] > 1, "the slot was not sent while the broker was down"
        assert run["t"] > self.slot + UP_AFTER - 0.5, "the slot ran while the broker was down"


def across_a_slot(pods: Fleet, broker: servers.ServerProcess, job: str) -> Outage:
    """Stop ``broker`` just before a slot of ``job``, start it again inside its window.

    The fleet is up once ``job`` ran a first slot. Returns once the
    :data:`SLOTS_AFTER` slots after the outage's ran (and a second run of any
    slot would have shown), with every pod stopped.
    """
    runs = wait_until(pods.watch(lambda ls: pods.starts(job)), 60, "a first slot", seen=pods.tail)
    first = min(slot_seconds(x["slot_id"]) for x in runs)
    ahead = math.ceil((time.time() + DOWN_BEFORE + 0.5 - first) / EVERY)
    slot = first + max(1, ahead) * EVERY
    time.sleep(max(0.0, slot - DOWN_BEFORE - time.time()))
    broker.stop(signal.SIGKILL)  # a crash: no goodbye to the clients
    time.sleep(max(0.0, slot + UP_AFTER - time.time()))
    broker.start()  # on the same port, empty
    last = slot + SLOTS_AFTER * EVERY
    wait_until(
        pods.watch(lambda ls: [x for x in pods.starts(job) if slot_seconds(x["slot_id"]) >= last]),
        EVERY + 20,
        f"the slot at {last}",
        seen=pods.tail,
    )
    time.sleep(2)
    pods.stop_all()
    return Outage(pods.starts(job), first, slot, last)


def three_pods_across_a_slot(
    fleet: Callable[..., F],
    broker: servers.ServerProcess,
    store: str,
    worker: Callable[[F, str], None],
) -> None:
    """The test of both frameworks: three pods on ``broker``, the outage, each slot run once.

    ``fleet`` makes the framework's pods, ``store`` is the anarchon store's URL, and
    ``worker(pods, name)`` starts one pod with its scheduler.
    """
    pods = fleet(
        f"redis://127.0.0.1:{broker.port}/0",
        {"tick": {"every": EVERY, "work": 0.2}},
        store=store,
    )
    for name in ("w1", "w2", "w3"):
        worker(pods, name)
    outage = across_a_slot(pods, broker, "tick")
    outage.check()
