"""The deadlines of blocking calls (anarchon_core.stores._deadlines): one thread for all."""

from __future__ import annotations

import threading
import time

import pytest

from anarchon_core.stores import _deadlines as deadlines
from tests.waiting import wait_until

pytestmark = pytest.mark.fast


def test_a_deadline_acts_once_it_passes_and_a_cancelled_one_never() -> None:
    fired: list[str] = []
    kept = deadlines.arm(0.05, lambda: fired.append("kept"))
    cancelled = deadlines.arm(0.05, lambda: fired.append("cancelled"))
    cancelled.cancel()
    wait_until(lambda: fired, 5, "the deadline to act")
    later = deadlines.arm(0.2, lambda: fired.append("later"))
    wait_until(lambda: "later" in fired, 5, "the later deadline to act")
    assert fired == ["kept", "later"]
    kept.cancel()  # after it acted: nothing
    later.cancel()
    assert fired == ["kept", "later"]


def test_an_earlier_deadline_armed_later_is_not_held_behind_a_later_one() -> None:
    fired = threading.Event()
    far = deadlines.arm(60, lambda: None)
    began = time.monotonic()
    deadlines.arm(0.05, fired.set)
    assert fired.wait(5)
    assert time.monotonic() - began < 5
    far.cancel()


def test_many_calls_share_one_thread_and_a_failing_action_does_not_stop_it() -> None:
    def fails() -> None:
        raise RuntimeError("boom")

    deadlines.arm(0.01, fails)
    handles = [deadlines.arm(30, lambda: None) for _ in range(200)]
    names = [t.name for t in threading.enumerate() if t.name == "anarchon-deadlines"]
    assert names == ["anarchon-deadlines"]
    for handle in handles:
        handle.cancel()
    fired = threading.Event()
    deadlines.arm(0.05, fired.set)
    assert fired.wait(5), "the thread stopped after an action raised"
