"""Deadlines for blocking calls that have no timeout of their own: one daemon thread per
process calls a deadline's action once it passes, unless the call cancelled it first.

A call arms a deadline before it blocks and cancels it once it returns; arming and
cancelling cost a heap push and a flag, not a thread per call. Actions run under the
deadlines' lock, which :meth:`Deadline.cancel` takes too: once ``cancel()`` returned,
the action has either run to its end or never will.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Deadline:
    """One armed deadline: :meth:`cancel` before it passes and its action never runs."""

    __slots__ = ("_action", "_lock", "cancelled")

    def __init__(self, action: Callable[[], None], lock: threading.Condition) -> None:
        self._action = action
        self._lock = lock
        self.cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True


class _Watch:
    """The process's deadlines, in a heap, and the thread that acts on them."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, action: Callable[[], None]) -> Deadline:
        deadline = Deadline(action, self._wake)
        at = time.monotonic() + seconds
        with self._wake:
            heapq.heappush(self._heap, (at, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="anarchon-deadlines", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is deadline:
                self._wake.notify()
        return deadline

    def _run(self) -> None:
        while True:
            with self._wake:
                # Cancelled deadlines at the head go without waiting for them.
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._wake.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                _, _, due = heapq.heappop(self._heap)
                due.cancelled = True
                try:
                    due._action()
                except Exception:  # an action must not end the thread that runs them all
                    log.exception("a deadline's action failed")


_WATCH = _Watch()


def arm(seconds: float, action: Callable[[], None]) -> Deadline:
    """Call ``action`` (on the deadlines' thread) in ``seconds`` unless cancelled first."""
    return _WATCH.arm(seconds, action)
