"""The handler threads of the real clock: reused while idle, ended once idle too long."""

from __future__ import annotations

import threading

from anarchon_core.clock import Workers
from tests.threads import Born
from tests.waiting import wait_until


def _burst(workers: Workers, n: int, gate: threading.Event) -> tuple[list[object], list[str]]:
    seen: list[str] = []
    lock = threading.Lock()

    def target() -> None:
        with lock:
            seen.append(threading.current_thread().name)
        gate.wait(5)

    return [workers.spawn(target, f"anarchon:job{k}") for k in range(n)], seen


def test_a_second_burst_runs_on_the_threads_of_the_first() -> None:
    workers, gate = Workers(idle=30), threading.Event()
    born = Born()
    tasks, seen = _burst(workers, 20, gate)
    assert all(t.is_alive() for t in tasks)  # type: ignore[attr-defined]
    gate.set()
    for t in tasks:
        t.join(5)  # type: ignore[attr-defined]
    assert not any(t.is_alive() for t in tasks)  # type: ignore[attr-defined]
    assert sorted(seen) == sorted(f"anarchon:job{k}" for k in range(20))  # named as the run
    started = born.count()
    assert started == 20
    again, _ = _burst(workers, 20, gate)
    for t in again:
        t.join(5)  # type: ignore[attr-defined]
    assert born.count() == 20  # no thread started for the second burst


def test_idle_threads_end_and_a_failing_target_does_not_stop_its_thread() -> None:
    workers, gate = Workers(idle=0.3), threading.Event()
    gate.set()
    born = Born()

    def fails() -> None:
        raise RuntimeError("a handler's own error")

    workers.spawn(fails, "anarchon:fails").join(5)
    ran = threading.Event()
    workers.spawn(ran.set, "anarchon:after").join(5)
    assert ran.is_set()
    wait_until(
        lambda: born.count() == 0,
        5,
        "the idle threads to end",
        seen=threading.enumerate,
    )
    assert born.alive() == []
    # And after they ended, a new target gets a new thread.
    ran.clear()
    workers.spawn(ran.set, "anarchon:later").join(5)
    assert ran.is_set()


def test_a_bounded_pool_runs_at_most_its_limit_at_once_and_the_rest_in_order() -> None:
    workers, gate = Workers(idle=30, limit=3), threading.Event()
    born = Born()
    order: list[int] = []
    running = most = 0
    lock = threading.Lock()

    def target(k: int) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            order.append(k)
        gate.wait(5)
        with lock:
            running -= 1

    tasks = [workers.spawn(lambda k=k: target(k), f"anarchon:job{k}") for k in range(10)]  # type: ignore[misc]
    wait_until(lambda: len(order) == 3, 5, "three targets to start")
    assert born.count() == 3 and workers.threads == 3
    assert sum(t.is_alive() for t in tasks) == 10  # the other seven wait for a thread
    gate.set()
    for t in tasks:
        t.join(5)
    assert not any(t.is_alive() for t in tasks)
    assert most == 3
    assert order[3:] == list(range(3, 10))  # the waiting ones in the order they came
    assert born.count() == 3


def test_a_pool_bound_below_one_is_refused() -> None:
    import pytest

    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="handler_threads="):
            Workers(limit=bad)  # type: ignore[arg-type]
