"""One-off runs on Redis and PostgreSQL: two schedulers of the test process, real time.

A one-off declared on both runs once at its time; one asked for a periodic job
(``Control.once``) runs once between its scheduled slots, which all run once too;
schedulers started again afterwards, declaring the same one-off, run nothing more.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timezone

import pytest

from anarchon_core import Control, Run, Scheduler
from tests.cleanup import drop_namespace
from tests.conftest import SERVER_STORES
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario


@pytest.fixture(params=["redis", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(SERVER_STORES[request.param]))


def test_one_offs_run_once_across_two_schedulers_and_restarts(url: str) -> None:
    namespace = f"once-{uuid.uuid4().hex[:10]}"
    ran: Counter[str] = Counter()
    lock = threading.Lock()

    def record(run: Run) -> None:
        with lock:
            ran[run.slot_id] += 1

    base = int(time.time())
    at = datetime.fromtimestamp(base + 4, timezone.utc)
    report = f"report@{(base + 4) * 1000}"
    # Between two slots of "tick" (every 2 s): a second and a millisecond past one.
    extra_ms = (base - base % 2 + 7) * 1000 + 1
    extra = f"tick@{extra_ms}"

    def scheduler(name: str) -> Scheduler:
        made = Scheduler(url, namespace=namespace, instance=name, jitter=0.2)
        made.once("report", at, record)
        made.add_job(record, name="tick", every=2)
        return made

    schedulers = [scheduler("a"), scheduler("b")]
    control = Control(url, namespace=namespace)
    try:
        for s in schedulers:
            s.start()
        wait_until(lambda: control.pending_once("report"), 10, "the one-off stored")
        control.once("tick", datetime.fromtimestamp(extra_ms / 1000, timezone.utc), by="test")
        wait_until(
            lambda: ran[report] and ran[extra] and not control.pending_once(),
            20,
            "both one-offs run and settled",
            seen=lambda: (ran, control.pending_once()),
        )
        wait_until(lambda: time.time() > extra_ms / 1000 + 5, 10, "a few more slots of tick")
        for s in schedulers:
            s.stop()
        with lock:
            seen = Counter(ran)
        assert seen[report] == 1 and seen[extra] == 1, seen
        assert [slot for slot, n in seen.items() if n > 1] == [], seen
        ticks = sorted(int(s.split("@")[1]) for s in seen if s.startswith("tick@") and s != extra)
        # Every scheduled slot of tick from the first to the last ran, the one after the
        # one-off included: it waited for the one-off, and did not supersede it.
        assert ticks == list(range(ticks[0], ticks[-1] + 1, 2000)), ticks
        assert any(t > extra_ms for t in ticks), ticks

        # Started again, declaring the same one-off: nothing runs twice.
        again = [scheduler("c"), scheduler("d")]
        schedulers = again
        for s in again:
            s.start()
        started = time.time()
        wait_until(lambda: time.time() > started + 4, 10, "the schedulers to run a while")
        for s in again:
            s.stop()
        assert ran[report] == 1 and ran[extra] == 1, ran
        assert [slot for slot, n in ran.items() if n > 1] == [], ran
        assert control.pending_once() == []
    finally:
        for s in schedulers:
            s.stop()
        control.close()
        drop_namespace(url, namespace)
