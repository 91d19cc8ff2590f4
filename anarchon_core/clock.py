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
from queue import Empty, SimpleQueue
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

    def spawn(self, target: Callable[[], None], name: str) -> Task:
        """Start ``target`` in a daemon thread of its own; its handle joins it."""


class Task(Protocol):
    """A handler started by :meth:`Clock.spawn`: a thread, or a turn of a pooled one."""

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...


class _Turn:
    """One target run by a pooled thread: done once the target returned.

    A lock held until then (lighter to make than an Event, one per handler).
    """

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running = threading.Lock()
        self._running.acquire()

    def done(self) -> None:
        self._running.release()

    def join(self, timeout: float | None = None) -> None:
        if self._running.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._running.release()

    def is_alive(self) -> bool:
        return self._running.locked()


#: The most handler threads a scheduler runs at once, by default (``handler_threads=``).
HANDLER_THREADS = 100


class Workers:
    """Daemon threads that run targets one at a time and wait for the next.

    A target starts on an idle thread if there is one, else on a new thread,
    up to ``limit`` threads (``None``: no bound); past it, targets wait, in
    the order they came, for a thread to finish its own. A thread idle for
    ``idle`` seconds ends. Starting a thread costs far more than handing a
    target to one that waits: an instance that wins a thousand slots at once
    starts their handlers in a fraction of the time.
    """

    def __init__(self, idle: float = 60.0, limit: int | None = None) -> None:
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValueError(f"handler_threads={limit!r}: expected a whole number, at least 1")
        self._idle_for = idle
        self._limit = limit
        self._lock = threading.Lock()
        #: Threads alive; those blocked waiting for a target; targets not yet taken.
        self._threads = self._waiting = self._pending = 0
        self._queue: SimpleQueue[tuple[Callable[[], None], str, _Turn]] = SimpleQueue()

    @property
    def threads(self) -> int:
        """How many threads are alive (running a target or waiting for one)."""
        with self._lock:
            return self._threads

    def spawn(self, target: Callable[[], None], name: str) -> Task:
        turn = _Turn()
        with self._lock:
            self._pending += 1
            start = self._pending > self._waiting and (
                self._limit is None or self._threads < self._limit
            )
            if start:
                self._threads += 1
        self._queue.put((target, name, turn))
        if start:
            threading.Thread(target=self._work, name=name, daemon=True).start()
        return turn

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                self._waiting += 1
            try:
                target, name, turn = self._queue.get(timeout=self._idle_for)
            except Empty:
                with self._lock:
                    self._waiting -= 1
                    if self._pending > self._waiting:
                        continue  # counted on for a target just handed over: take it
                    self._threads -= 1
                    return
            with self._lock:
                self._waiting -= 1
                self._pending -= 1
            me.name = name
            try:
                target()
            except BaseException:  # noqa: S110 - a target reports its own errors
                pass
            finally:
                turn.done()
                me.name = "anarchon:idle"


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

    def __init__(self, handler_threads: int | None = HANDLER_THREADS) -> None:
        """``handler_threads``: the most threads running handlers at once (``None``: no
        bound); handlers past it wait for one, in the order their slots were won."""
        self._workers = Workers(limit=handler_threads)

    def spawn(self, target: Callable[[], None], name: str) -> Task:
        return self._workers.spawn(target, name)


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

    # Read without the lock, as the system's clocks are: each is one float, replaced
    # whole by :meth:`advance` (under the lock), so a read sees the old value or the new.
    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
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

    def spawn(self, target: Callable[[], None], name: str) -> Task:
        return self._base.spawn(target, name)
