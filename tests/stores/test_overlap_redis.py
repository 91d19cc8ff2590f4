"""Overlap policies on real stores: two schedulers in one process share the store.

``buffer_one`` (Redis): the handler takes longer than the interval, so the
slot that comes while a run goes on waits for it and starts when it ends, on
either instance; the later ones are skipped, by both instances alike.
``allow_all`` (Redis and PostgreSQL): every slot starts at its time beside the
runs still going, each renewing a lease of its own in its lane's record.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter

import pytest

from anarchon_core import Control, Event, EventKind, Run, Scheduler
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


@pytest.mark.parametrize("url_fixture", ["redis_url", "postgres_url"])
def test_allow_all_on_a_real_store_runs_every_slot_once_several_at_a_time(
    url_fixture: str, request: pytest.FixtureRequest
) -> None:
    """``overlap="allow_all"``: every slot starts at its time beside the runs still going,
    each run renewing a lease of its own (a run of 2.6 s, a slot every second, a lease
    of 1 s: three at once, none lost, none skipped)."""
    url = request.getfixturevalue(url_fixture)
    namespace = f"t{uuid.uuid4().hex[:10]}-allow-all"
    events: list[Event] = []  # until the stop (which hands the runs going on over)
    stopped = threading.Event()
    runs: dict[str, list[float]] = {}  # slot id -> [start, end] of its first attempt
    starts: list[str] = []
    lock = threading.Lock()

    def work(run: Run) -> None:
        with lock:
            if run.attempt == 1:  # a stop hands the runs going on over: attempt 2
                starts.append(run.slot_id)
            runs.setdefault(run.slot_id, [time.time(), 0.0])
        end = time.monotonic() + 2.6
        while time.monotonic() < end and not run.lost:
            time.sleep(0.05)
        with lock:
            if not run.lost:
                runs[run.slot_id][1] = time.time()

    def ended() -> int:
        with lock:
            return sum(1 for _, end in runs.values() if end)

    schedulers = [
        Scheduler(
            url,
            namespace=namespace,
            instance=name,
            listener=lambda e: None if stopped.is_set() else events.append(e),
        )
        for name in ("a", "b")
    ]
    try:
        for s in schedulers:
            s.add_job(work, name="job", every=1, overlap="allow_all", lease=1, jitter=0.1)
            s.start()
        wait_until(lambda: ended() >= 6, 60, "six runs of the job to end", seen=lambda: runs)
        status = Control(schedulers[0].store).listing()[0]
    finally:
        stopped.set()
        for s in schedulers:
            s.stop()
        drop_namespace(url, namespace)

    with lock:
        done = {slot: times for slot, times in runs.items() if times[1]}
        assert [slot for slot, n in Counter(starts).items() if n > 1] == []
    assert not [e for e in events if e.kind in (EventKind.OVERLAP, EventKind.LOST)]
    assert not [e for e in events if e.kind is EventKind.TAKEOVER]
    # Consecutive slots ran side by side, each started at its time.
    ordered = sorted(done.items(), key=lambda item: _ms(item[0]))
    for (_, (_, end)), (slot, (start, _)) in itertools.pairwise(ordered):
        assert start < end, f"{slot} waited for the run before it"
        assert start - _ms(slot) / 1000 < 0.9, f"{slot} began {start - _ms(slot) / 1000:.2f}s late"
    # One job in the listing, named as declared.
    assert [job.job for job in status] == ["job"]
