"""The Scheduler's wiring of the engine's parts: resolve=, clock, and the step guard."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from anarchon_core import Control, Scheduler
from anarchon_core.clock import FakeClock
from anarchon_core.control import Definition
from anarchon_core.deferral import StepGuard
from anarchon_core.stores.memory import MemoryStore


def test_resolve_makes_the_handlers_of_stored_schedules_instead_of_the_registered_ones() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    ran: list[str] = []
    asked: list[Definition] = []

    def resolve(definition: Definition) -> Callable[..., Any] | None:
        asked.append(definition)
        if definition.handler != "mine":
            return None
        return lambda: ran.append(definition.name)

    s = Scheduler(store, clock=clock, instance="a", inline=True, jitter=0, resolve=resolve)
    s.handler("mine")(lambda: ran.append("registered"))
    assert s.resolve is resolve
    Control(store).add(Definition("stored", "mine", every=1))
    for _ in range(5):
        s.run_pending()
        clock.advance(1)
    assert [d.name for d in asked] == ["stored"]
    assert "stored" in s.jobs and ran and set(ran) == {"stored"}


def test_the_default_resolve_uses_the_registered_handlers_and_is_only_a_parameter() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    ran: list[str] = []
    s = Scheduler(store, clock=clock, instance="a", inline=True, jitter=0)
    s.handler("work")(lambda: ran.append("registered"))
    default = s.resolve
    assert default(Definition("x", "work", every=1)) is not None
    assert default(Definition("x", "other", every=1)) is None
    with pytest.raises(AttributeError):
        s.resolve = lambda definition: None  # type: ignore[misc]
    Control(store).add(Definition("stored", "work", every=1))
    for _ in range(3):
        s.run_pending()
        clock.advance(1)
    assert ran and set(ran) == {"registered"}


def test_the_clock_is_readable() -> None:
    clock = FakeClock()
    s = Scheduler(MemoryStore(clock=clock), clock=clock, instance="a")
    assert s.clock is clock


def test_the_step_guard_defers_what_is_asked_inside_a_step_to_its_end_once() -> None:
    guard, done = StepGuard(), []

    def action() -> None:
        done.append(guard.inside)

    assert not guard.inside
    with guard.step():
        assert guard.inside
        guard.defer(action)
        guard.defer(action)
        assert done == []
    assert done == [False]  # once, after the step's end
    with guard.step():
        pass
    assert done == [False]
