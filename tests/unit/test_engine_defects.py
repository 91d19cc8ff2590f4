"""Defects the engine's structure once hid: a job removed mid-step, a bug in a store call."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from anarchon_core import Event, Scheduler
from anarchon_core.clock import FakeClock
from anarchon_core.due import DueIndex
from anarchon_core.store import Change, ClaimRequest, RunState
from anarchon_core.stores.memory import MemoryStore
from tests.waiting import wait_until


def test_a_job_removed_while_a_step_takes_its_claim_due_is_no_store_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``remove_job`` from another thread, just as the step took the job's claim off
    the agenda: the step goes on, no outage is reported, and the job is gone."""
    clock = FakeClock()
    events: list[Event] = []
    s = Scheduler(MemoryStore(clock=clock), clock=clock, instance="a", listener=events.append)
    s.add_job(lambda: None, name="job", every=10, jitter=0)
    s.run_pending()
    pop_due = DueIndex.pop_due
    removers: list[threading.Thread] = []

    def pop_then_remove(index: DueIndex, *args: Any) -> list[str]:
        names = pop_due(index, *args)
        if "job" in names and not removers:
            remover = threading.Thread(target=lambda: s.remove_job("job"))
            removers.append(remover)
            remover.start()
            remover.join(0.2)  # done at once unless the step holds the jobs' lock
        return names

    monkeypatch.setattr(DueIndex, "pop_due", pop_then_remove)
    clock.advance(10)
    s.run_pending()
    removers[0].join(5)
    monkeypatch.undo()
    clock.advance(10)
    s.run_pending()
    assert removers and not removers[0].is_alive()
    assert "job" not in s.jobs
    assert [e.kind for e in events if e.kind == "store_unavailable"] == []


class BuggyStore(MemoryStore):
    """A store whose calls about one job hit a bug of the store's code (a TypeError)."""

    def __init__(self, bad: str, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.bad = bad
        self.calls_about_bad = 0

    def _check(self, names: Iterator[str] | list[str]) -> None:
        if self.bad in names:
            self.calls_about_bad += 1
            raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")

    def claim_many(self, requests: Any, owner: str) -> Any:
        requests = list(requests)
        self._check([r.job for r in requests if isinstance(r, ClaimRequest)])
        return super().claim_many(requests, owner)

    def change_many(self, changes: Any) -> Any:
        changes = list(changes)
        self._check([c.job for c in changes if isinstance(c, Change)])
        return super().change_many(changes)


def test_a_bug_in_a_store_call_is_logged_and_its_job_left_alone_not_retried_as_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = BuggyStore("bad", clock)
    events: list[Event] = []
    ran: list[str] = []
    s = Scheduler(store, clock=clock, instance="a", listener=events.append, inline=True)
    s.add_job(lambda: ran.append("good"), name="good", every=1, jitter=0)
    s.add_job(lambda: ran.append("bad"), name="bad", every=1, jitter=0)
    with caplog.at_level(logging.ERROR, logger="anarchon_core"):
        for _ in range(20):
            clock.advance(1)
            s.run_pending()
    kinds = {e.kind for e in events}
    assert "store_unavailable" not in kinds and "store_refused" not in kinds
    assert "bad" not in ran and ran.count("good") >= 18  # the other job went on
    bugs = [r for r in caplog.records if r.exc_info and r.exc_info[0] is TypeError]
    assert len(bugs) == 1 and bugs[0].levelno == logging.ERROR and "bad" in bugs[0].getMessage()
    assert store.calls_about_bad <= 2  # the batch, then the job alone: never again


class BuggyTakeover(MemoryStore):
    """A store whose takeovers (the batch the engine sends) hit a bug of the store's code."""

    takeovers = 0

    def takeover_many(self, *args: Any, **kwargs: Any) -> Any:
        self.takeovers += 1
        raise AttributeError("'NoneType' object has no attribute 'token'")


def test_a_bug_in_a_takeover_leaves_its_job_alone_and_the_loop_does_not_spin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = BuggyTakeover(clock=clock)
    events: list[Event] = []
    s = Scheduler(store, clock=clock, instance="a", listener=events.append, lease=3, watch=1)
    s.add_job(lambda: None, name="job", every=60, jitter=0)
    s.run_pending()
    slot_at = s.upcoming()["job"][0]
    assert slot_at is not None
    clock.advance(slot_at - clock.time())
    store.claim("job", int(slot_at * 1000), "gone", 3)  # another instance, which dies
    delays = []
    with caplog.at_level(logging.ERROR, logger="anarchon_core"):
        for _ in range(20):
            delays.append(s.run_pending())
            clock.advance(0.5)
    assert store.takeovers == 1
    assert min(delays[-10:]) > 0  # nothing left due at once: the loop sleeps
    assert not {e.kind for e in events} & {"store_unavailable", "store_refused", "takeover"}
    bugs = [r for r in caplog.records if r.exc_info and r.exc_info[0] is AttributeError]
    assert len(bugs) == 1 and bugs[0].levelno == logging.ERROR


def test_a_bug_in_a_renewal_tells_the_run_it_lost_and_the_loop_does_not_spin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = BuggyStore("job", clock)
    store.bad = "nothing yet"
    runs: list[Any] = []
    s = Scheduler(store, clock=clock, instance="a", lease=30)
    s.add_job(lambda run: (runs.append(run), clock.sleep(40)), name="job", every=60, jitter=0)
    s.run_pending()
    slot_at = s.upcoming()["job"][0]
    assert slot_at is not None
    clock.advance(slot_at - clock.time())
    s.run_pending()
    wait_until(lambda: runs, 10, "the handler to start (in a thread of its own)")
    assert len(runs) == 1 and not runs[0].lost
    store.bad = "job"  # from now on, the store's calls about the job hit a bug
    delays = []
    with caplog.at_level(logging.ERROR, logger="anarchon_core"):
        for _ in range(30):
            clock.advance(1)
            delays.append(s.run_pending())
    assert runs[0].lost and "bug" in runs[0].lost_reason
    assert min(delays[-10:]) > 0
    assert len([r for r in caplog.records if r.exc_info]) == 1


class Refusing(MemoryStore):
    """A store whose server refuses the calls of some kinds about one job (a read-only
    replica answering them with an error); every other call goes through."""

    def __init__(self, clock: FakeClock, refused: set[str]) -> None:
        super().__init__(clock=clock)
        self.refused = refused
        self.calls: Counter[str] = Counter()

    def _check(self, kind: str, names: list[str]) -> None:
        if kind in self.refused and "job" in names:
            self.calls[kind] += 1
            raise RuntimeError("READONLY You can't write against a read only replica.")

    def states(self, jobs: Any) -> Any:
        jobs = list(jobs)
        self._check("states", jobs)
        return super().states(jobs)

    def takeover_many(self, requests: Any, owner: str) -> Any:
        requests = list(requests)
        self._check("takeover", [r.job for r in requests])
        return super().takeover_many(requests, owner)

    def change_many(self, changes: Any) -> Any:
        changes = list(changes)
        self._check("renew", [c.job for c in changes if c.state is RunState.RUNNING])
        return super().change_many(changes)


def steps_for(s: Scheduler, clock: FakeClock, seconds: float) -> int:
    """How many steps the loop takes in ``seconds``, sleeping as long as each step asks."""
    end, steps = clock.time() + seconds, 0
    while clock.time() < end:
        steps += 1
        clock.advance(max(s.run_pending(), 0.001))
    return steps


@pytest.mark.parametrize("refused", ["states", "takeover", "renew"])
def test_a_call_the_store_refuses_for_one_job_is_retried_after_a_pause_not_in_a_loop(
    refused: str,
) -> None:
    """A backup's check, a takeover or a renewal refused for one job alone is tried again
    after a pause: retried at once, the loop would spin, hammering the store and a core,
    for as long as the refusals last."""
    clock = FakeClock()
    store = Refusing(clock, set())
    s = Scheduler(store, clock=clock, instance="a", lease=3, watch=1)
    s.add_job(lambda: clock.sleep(30), name="job", every=60, jitter=0)
    s.run_pending()
    slot_at = s.upcoming()["job"][0]
    assert slot_at is not None
    clock.advance(slot_at - clock.time())
    if refused == "renew":
        s.run_pending()  # claimed here: its handler runs for 30 s
        assert s.running()
    else:
        store.claim("job", int(slot_at * 1000), "gone", 3)  # another instance, which dies
    store.refused = {refused}
    steps = steps_for(s, clock, 20)
    assert store.calls[refused] >= 2, store.calls  # refused, and tried again
    # A step per pause, not one per millisecond.
    assert steps < 20 * 15, (steps, store.calls)
    assert store.calls[refused] < 20 * 15, store.calls
