"""``overlap="buffer_one"`` on a real store: two schedulers in one process share Redis.

The handler takes longer than the interval: the slot that comes while a run
goes on waits for it and starts when it ends, on either instance; the later
ones are skipped, by both instances alike.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter

from anarchon_core import Event, EventKind, Run, Scheduler
from tests.cleanup import drop_namespace
from tests.waiting import wait_until

EVERY, WORK = 2, 3.2


def test_buffer_one_on_redis_runs_each_waiting_slot_once_right_after_the_run(
    redis_url: str,
) -> None:
    namespace = f"t{uuid.uuid4().hex[:10]}-overlap"
    events: list[Event] = []
    runs: dict[str, list[float]] = {}  # slot id -> [start, end] of its first attempt
    starts: list[str] = []
    lock = threading.Lock()

    def work(run: Run) -> None:
        with lock:
            starts.append(run.slot_id)
            if run.attempt == 1:
                runs[run.slot_id] = [time.time(), 0.0]
        end = time.monotonic() + WORK
        while time.monotonic() < end and not run.lost:  # the job's own work
            time.sleep(0.05)
        with lock:
            if run.attempt == 1 and not run.lost:
                runs[run.slot_id][1] = time.time()

    def ended() -> int:
        with lock:
            return sum(1 for _, end in runs.values() if end)

    schedulers = [
        Scheduler(redis_url, namespace=namespace, instance=name, listener=events.append)
        for name in ("a", "b")
    ]
    try:
        for s in schedulers:
            s.add_job(work, name="job", every=EVERY, overlap="buffer_one", lease=3, jitter=0.1)
            s.start()
        wait_until(lambda: ended() >= 4, 60, "four runs of the job to end", seen=lambda: runs)
    finally:
        stopping = time.time()
        for s in schedulers:
            s.stop()
        drop_namespace(redis_url, namespace)

    with lock:
        # The runs that ended before the stop (a stop hands the one going on over).
        runs = {slot: times for slot, times in runs.items() if 0 < times[1] < stopping}
        starts = [slot for slot in starts if slot in runs]
        done = sorted((start, end, slot) for slot, (start, end) in runs.items())
    assert [slot for slot, n in Counter(starts).items() if n > 1] == []
    # One run at a time, in the order of their slots.
    for (_, end, slot), (start, _, after) in itertools.pairwise(done):
        assert end and end <= start, f"{slot} ran until {end}, {after} began at {start}"
    ms = [int(slot.rpartition("@")[2]) for _, _, slot in done]
    assert ms == sorted(ms)
    # The slots that waited began right after the run before them, late for their time.
    waited = [e for e in events if e.detail.startswith("waited for")]
    assert len(waited) >= 2
    assert {e.kind for e in waited} <= {EventKind.WON, EventKind.CATCH_UP}
    for _, _, slot in done[1:4]:
        assert any(e.slot_id == slot for e in waited), f"{slot} did not wait for the run before"
    # The others were skipped, by both instances alike, and never ran.
    skipped = Counter(e.slot_id for e in events if e.kind is EventKind.OVERLAP)
    last = ms[min(3, len(ms) - 1)]
    assert skipped and all(n == 2 for slot, n in skipped.items() if _ms(slot) < last)
    assert not set(skipped) & set(runs)
    # Every slot from the first run's to the fourth's ran or was skipped.
    for at in range(ms[0], last + 1, EVERY * 1000):
        assert f"job@{at}" in runs or f"job@{at}" in skipped, f"job@{at} neither ran nor skipped"


def _ms(slot: str) -> int:
    return int(slot.rpartition("@")[2])
