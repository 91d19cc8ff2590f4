"""Hand-offs asked by many handler threads at once share store calls (a group commit):
each still gets its own answer before its send, a job's hand-offs go one per call, and
a store error reaches every hand-off of the call it broke."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from anarchon_core import FakeClock, Run, RunState, Scheduler, StoreUnavailable
from anarchon_core.clock import SystemClock
from anarchon_core.engine.handoffs import HandOffs
from anarchon_core.store import Change
from anarchon_core.stores.memory import MemoryStore
from tests.waiting import wait_until


class Recording(MemoryStore):
    """The memory store, with each batch of changes it was sent kept, in order."""

    def __init__(self, slow: float = 0.0) -> None:
        super().__init__()
        self.batches: list[list[Change]] = []
        self.slow = threading.Event()
        self.fail: Exception | None = None
        self._delay = slow

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        self.batches.append(list(changes))
        if self._delay:
            self.slow.wait(self._delay)  # a call in flight for a while
        if self.fail is not None:
            raise self.fail
        return super().change_many(changes)


def _claimed(store: MemoryStore, jobs: int) -> list[int]:
    tokens = []
    for k in range(jobs):
        holder = store.claim(f"job{k}", 1_000, "a", 30).holder
        assert holder is not None
        tokens.append(holder.token)
    return tokens


def _at_once(calls: list[threading.Thread]) -> None:
    for thread in calls:
        thread.start()
    for thread in calls:
        thread.join(10)
        assert not thread.is_alive()


def test_hand_offs_asked_while_a_call_is_in_flight_go_together_each_answered() -> None:
    store = Recording(slow=0.2)
    tokens = _claimed(store, 40)
    handoffs = HandOffs(store, SystemClock())
    answers: dict[str, bool] = {}
    # job39's token is one too high: that hand-off alone is refused.
    asks = [(f"job{k}", tokens[k] + (k == 39)) for k in range(40)]
    _at_once(
        [
            threading.Thread(
                target=lambda j=j, t=t: answers.update({j: handoffs.dispatch(j, t, 60)})
            )
            for j, t in asks
        ]
    )
    assert answers == {f"job{k}": k != 39 for k in range(40)}
    assert 2 <= len(store.batches) <= 4  # the first alone, then those asked meanwhile
    assert sum(len(b) for b in store.batches) == 40
    states = store.states(f"job{k}" for k in range(40))
    assert {states[f"job{k}"].state for k in range(39)} == {RunState.DISPATCHED}
    assert states["job39"].state is RunState.RUNNING


class SlowOnTheClock(MemoryStore):
    """The memory store, whose calls of changes take ``seconds`` of ``clock``'s time."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__(clock=clock)
        self.calls = 0
        self._clock, self._seconds = clock, seconds

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        self.calls += 1
        self._clock.sleep(self._seconds)  # the calling handler thread sleeps on the clock
        return super().change_many(changes)


def test_a_hand_off_waiting_for_another_threads_call_waits_through_the_clock() -> None:
    """On a test's clock (FakeClock), a hand-off asked while another handler's call is on
    its way waits as a sleeper of that clock: the clock can move on to the end of that
    call. A wait the clock did not know of held every step until its settle gave up."""
    clock = FakeClock(settle_timeout=5)
    store = SlowOnTheClock(clock, seconds=3)
    tokens = _claimed(store, 2)
    handoffs = HandOffs(store, clock)
    answers: dict[str, bool] = {}

    def ask(k: int) -> None:
        answers[f"job{k}"] = handoffs.dispatch(f"job{k}", tokens[k], 60)

    clock.spawn(lambda: ask(0), "first")
    clock.settle()  # the first call is on its way, its thread asleep on the clock
    clock.spawn(lambda: ask(1), "second")
    clock.settle()  # raised "a spawned thread neither slept nor finished"
    for _ in range(10):
        clock.advance(1)
    assert answers == {"job0": True, "job1": True}
    assert store.calls == 2
    states = store.states(["job0", "job1"])
    assert {states[job].state for job in states} == {RunState.DISPATCHED}


def test_a_jobs_hand_offs_go_one_per_call_in_the_order_asked() -> None:
    store = Recording(slow=0.1)
    (token,) = _claimed(store, 1)
    handoffs = HandOffs(store, SystemClock())
    answers: list[bool] = []
    lock = threading.Lock()

    def ask(lease: float) -> None:
        answer = handoffs.dispatch("job0", token, lease)
        with lock:
            answers.append(answer)

    _at_once([threading.Thread(target=ask, args=(float(30 + k),)) for k in range(5)])
    assert answers == [True] * 5
    assert all(len({c.job for c in batch}) == len(batch) for batch in store.batches)
    assert len(store.batches) == 5


def test_a_store_error_reaches_every_hand_off_of_its_call() -> None:
    store = Recording(slow=0.1)
    tokens = _claimed(store, 10)
    handoffs = HandOffs(store, SystemClock())
    store.fail = StoreUnavailable("the store is down")
    errors: list[BaseException] = []

    def ask(k: int) -> None:
        try:
            handoffs.dispatch(f"job{k}", tokens[k], 60)
        except StoreUnavailable as exc:
            errors.append(exc)

    _at_once([threading.Thread(target=ask, args=(k,)) for k in range(10)])
    assert len(errors) == 10
    store.fail = None
    assert handoffs.dispatch("job0", tokens[0], 60)  # the next call goes on


@pytest.mark.parametrize("jobs", [60])
def test_a_tick_of_dispatching_handlers_costs_a_few_store_calls(jobs: int) -> None:
    """A scheduler whose handlers all hand their slot off at the same tick: every slot
    handed off once; from the second tick on (once the engine has seen the jobs' handlers
    hand off), a tick's hand-offs go in a few calls, not one per slot.

    A hand-off waits at most 5 ms for the others of its tick: on a machine so loaded
    that the handler threads start further apart, a tick's hand-offs go in more calls
    (by design). So of the three later ticks, one at least goes in a few calls; with
    one call per slot, none would."""
    store = Recording()
    handed: list[str] = []
    lock = threading.Lock()

    def send(run: Run) -> None:
        run.hand_off(1)  # nobody picks it up: the next slot, 2 s on, is free
        with lock:
            handed.append(run.slot_id)

    s = Scheduler(store, lease=5, jitter=0)
    for k in range(jobs):
        s.add_job(send, name=f"job{k}", every=2)
    s.start()
    try:
        wait_until(lambda: len(handed) >= 4 * jobs, 30, "four ticks' slots to be handed off")
    finally:
        s.stop()
    dispatched = [b for b in store.batches if any(c.state is RunState.DISPATCHED for c in b)]
    assert len(handed) == len(set(handed))
    assert sum(len(b) for b in dispatched) == len(handed)
    # A job's n-th slot carries its n-th token (its first is the store's clock).
    tokens: dict[str, list[int]] = {}
    for batch in dispatched:
        for c in batch:
            tokens.setdefault(c.job, []).append(c.token)
    nth = {(job, t): n for job, ts in tokens.items() for n, t in enumerate(sorted(ts), 1)}
    by_tick: dict[int, list[int]] = {}
    for batch in dispatched:
        (tick,) = {nth[(c.job, c.token)] for c in batch}
        by_tick.setdefault(tick, []).append(len(batch))
    later = [sizes for tick, sizes in by_tick.items() if tick > 1]
    # A tick's claims may go in a few chunks, each starting its handlers together.
    assert later and any(len(sizes) <= jobs / 6 for sizes in later), by_tick


def test_inline_handlers_hand_off_at_once_each_before_its_send() -> None:
    """Inline handlers (Celery's beat, Dramatiq's host) run one after the other in the
    scheduling thread: each hand-off goes at once, alone, never waiting for others."""
    store = Recording()
    handed: list[str] = []

    def send(run: Run) -> None:
        run.hand_off(1)
        handed.append(run.slot_id)

    s = Scheduler(store, lease=5, jitter=0, inline=True)
    for k in range(20):
        s.add_job(send, name=f"job{k}", every=2)
    s.start()
    try:
        wait_until(lambda: len(handed) >= 40, 20, "two ticks' slots to be handed off")
    finally:
        s.stop()
    handoffs = s._loop._runs.handoffs
    assert handoffs is not None and handoffs.waits == 0
    dispatched = [b for b in store.batches if any(c.state is RunState.DISPATCHED for c in b)]
    assert {len(b) for b in dispatched} == {1}
