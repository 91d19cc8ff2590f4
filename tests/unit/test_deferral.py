"""The step guard: what is asked for inside a step waits for the step's end."""

from __future__ import annotations

import threading

import pytest

from anarchon_core.deferral import StepGuard


def test_outside_a_step_nothing_is_deferred() -> None:
    guard = StepGuard()
    assert not guard.inside
    assert guard.defer(lambda: None) is False


def test_an_action_deferred_inside_a_step_runs_once_as_it_ends() -> None:
    guard = StepGuard()
    ran: list[str] = []

    def stop() -> None:
        ran.append(f"stop, inside={guard.inside}")

    with guard.step():
        assert guard.inside
        assert guard.defer(stop) and guard.defer(stop)  # the second is the same one
        assert guard.deferred(stop)
        assert ran == []
    assert ran == ["stop, inside=False"]  # the mark is cleared first
    assert not guard.deferred(stop)


def test_another_thread_is_not_inside_the_step() -> None:
    guard = StepGuard()
    seen: list[bool] = []
    with guard.step():
        thread = threading.Thread(target=lambda: seen.append(guard.inside))
        thread.start()
        thread.join()
    assert seen == [False]


def test_if_returned_actions_run_after_the_others_and_only_if_the_step_returned() -> None:
    guard = StepGuard()
    ran: list[str] = []
    with guard.step():
        guard.defer(lambda: ran.append("signal"), if_returned=True)
        guard.defer(lambda: ran.append("close"))
    assert ran == ["close", "signal"]
    ran.clear()

    def failing_step() -> None:
        with guard.step():
            guard.defer(lambda: ran.append("signal"), if_returned=True)
            guard.defer(lambda: ran.append("close"))
            raise RuntimeError("the step failed")

    with pytest.raises(RuntimeError):
        failing_step()
    assert ran == ["close"]
    with guard.step():
        pass
    assert ran == ["close"]  # dropped with the failed step, not carried to the next


def test_holds_is_asked_too() -> None:
    lock = threading.RLock()
    guard = StepGuard(holds=lambda: lock._is_owned())  # type: ignore[attr-defined]
    with guard.step():
        assert not guard.inside  # marked, but the step's lock is not held
        with lock:
            assert guard.inside
