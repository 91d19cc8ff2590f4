"""The only module that reads the time.

The engine never calls :mod:`time` directly: it asks a :class:`Clock`. The
default :class:`SystemClock` is the real one. :class:`FakeClock` is a virtual
clock for deterministic tests: time moves only when the test calls
:meth:`FakeClock.advance`, and handler threads started through the clock are
tracked, so that ``advance`` returns only once every such thread is asleep on
the fake clock or finished. A whole cluster of schedulers can then be driven
step by step, without a real second passing.

Wall-clock time (``time()``) places slots on the calendar. Durations (lease
renewals, watch intervals, back-off) use ``monotonic()``, which no clock
adjustment can move. Lease expiry itself is judged by the store's clock.
"""

from __future__ import annotations

import heapq
import threading
import time as _time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Time, sleeping and thread starting, as the engine sees them."""

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch (UTC)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Block until ``event`` is set or ``timeout`` passes; return whether it is set."""

    def spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        """Start ``target`` in a daemon thread and return the thread."""


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout))

    def spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread


class FakeClock:
    """A virtual clock for deterministic tests.

    ``time()`` and ``monotonic()`` move together, only through :meth:`advance`.
    Threads started with :meth:`spawn` block in :meth:`sleep` until virtual time
    reaches their deadline. :meth:`advance` wakes them and waits until all of
    them are asleep again or done, so each step of a test sees a settled world.
    """

    def __init__(self, start: float = 1_700_000_000.0, *, settle_timeout: float = 10.0) -> None:
        self._cond = threading.Condition()
        self._wall = float(start)
        self._mono = 0.0
        self._active = 0
        self._sleepers: list[tuple[float, int]] = []
        self._woken: set[int] = set()
        self._seq = 0
        self._local = threading.local()
        self._settle_timeout = settle_timeout

    def time(self) -> float:
        with self._cond:
            return self._wall

    def monotonic(self) -> float:
        with self._cond:
            return self._mono

    def sleep(self, seconds: float) -> None:
        if not getattr(self._local, "managed", False):
            # The driving thread itself sleeping simply moves time forward.
            self.advance(seconds)
            return
        with self._cond:
            self._seq += 1
            ticket = self._seq
            heapq.heappush(self._sleepers, (self._mono + max(0.0, seconds), ticket))
            self._active -= 1
            self._cond.notify_all()
            while ticket not in self._woken:
                self._cond.wait()
            self._woken.discard(ticket)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        if not event.is_set():
            self.sleep(timeout)
        return event.is_set()

    def spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        def managed() -> None:
            self._local.managed = True
            try:
                target()
            finally:
                with self._cond:
                    self._active -= 1
                    self._cond.notify_all()

        with self._cond:
            self._active += 1
        thread = threading.Thread(target=managed, name=name, daemon=True)
        thread.start()
        return thread

    def next_deadline(self) -> float | None:
        """Monotonic time at which the earliest sleeping thread wakes, if any."""
        with self._cond:
            return self._sleepers[0][0] if self._sleepers else None

    def advance(self, seconds: float) -> None:
        """Move time forward, wake due sleepers one deadline at a time, then settle."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._cond:
            target = self._mono + seconds
        while True:
            with self._cond:
                if not self._sleepers or self._sleepers[0][0] > target:
                    break
                deadline = self._sleepers[0][0]
                self._wall += deadline - self._mono
                self._mono = deadline
                while self._sleepers and self._sleepers[0][0] <= deadline:
                    _, ticket = heapq.heappop(self._sleepers)
                    self._woken.add(ticket)
                    self._active += 1
                self._cond.notify_all()
            self.settle()
        with self._cond:
            self._wall += target - self._mono
            self._mono = target
        self.settle()

    def settle(self) -> None:
        """Wait until every thread started through this clock sleeps or has ended."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._active == 0, self._settle_timeout):
                raise RuntimeError("FakeClock: a spawned thread neither slept nor finished")


class SkewedClock:
    """Another clock shifted by a fixed offset on its wall time (for skew tests)."""

    def __init__(self, base: Clock, offset: float) -> None:
        self._base = base
        self.offset = offset

    def time(self) -> float:
        return self._base.time() + self.offset

    def monotonic(self) -> float:
        return self._base.monotonic()

    def sleep(self, seconds: float) -> None:
        self._base.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return self._base.wait(event, timeout)

    def spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        return self._base.spawn(target, name)
