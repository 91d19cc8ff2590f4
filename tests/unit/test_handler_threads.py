"""``Scheduler(handler_threads=N)``: at most N handlers run at once; the others wait for a
thread, their leases renewed meanwhile, and every slot won still runs once."""

from __future__ import annotations

import threading
import time

import pytest

from anarchon_core import ConfigurationError, EventKind, Run, Scheduler
from anarchon_core.clock import HANDLER_THREADS, FakeClock
from anarchon_core.stores.memory import MemoryStore
from tests.waiting import wait_until


def test_handlers_past_the_bound_wait_for_a_thread_and_every_slot_runs_once() -> None:
    running = most = 0
    ran: list[str] = []
    lock = threading.Lock()
    kinds: list[EventKind] = []

    def work(run: Run) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.3)  # the job's own work
        with lock:
            running -= 1
            ran.append(run.slot_id)

    s = Scheduler(
        MemoryStore(),
        handler_threads=2,
        lease=1,
        jitter=0,
        listener=lambda e: kinds.append(e.kind),
    )
    for k in range(6):
        s.add_job(work, name=f"job{k}", every=2)
    s.start()
    try:
        wait_until(lambda: len(ran) >= 12, 20, "two slots of each job to run", seen=lambda: ran)
    finally:
        s.stop()
    assert most == 2  # six due at once, two at a time
    assert len(ran) == len(set(ran))  # each slot once
    assert EventKind.LOST not in kinds  # the waiting ones kept their leases


def test_the_bound_is_checked_and_kept_to_the_schedulers_own_clock() -> None:
    assert HANDLER_THREADS == 100
    with pytest.raises(ConfigurationError, match="handler_threads=0"):
        Scheduler(MemoryStore(), handler_threads=0)
    with pytest.raises(ConfigurationError, match="clock= given"):
        Scheduler(MemoryStore(), clock=FakeClock(), handler_threads=5)
    Scheduler(MemoryStore(), handler_threads=None)  # no bound: accepted
