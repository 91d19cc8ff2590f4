"""Beat's scheduling steps, and the SIGTERM or SIGINT that waits for a step's end.

Beat's SIGTERM/SIGINT handler closes the scheduler from the signal handler. A
signal that arrives while a scheduling step runs (the step may hold the
store's connection) is held back until the step ends, then handed to the
handler that was installed, so nothing waits on the interrupted step. The
same signal again while a step hangs runs the handler at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]


class Steps:
    """Marks the scheduling step under way; holds signals and ``close()`` back until it ends.

    ``close`` is the scheduler's close, called when a step ends if it was
    asked for inside the step; ``lock`` is the lock a step holds while it
    uses the store.
    """

    def __init__(self, close: Callable[[], None], lock: Any) -> None:
        self._close = close
        self._lock = lock
        self._stepping: int | None = None
        self._close_pending = False
        self._deferred: list[tuple[int, FrameType | None]] = []
        self._handlers: dict[int, Handler] = {}

    @property
    def inside(self) -> bool:
        """Whether the calling thread is inside a step, holding the store's lock.

        Both, not the mark alone: a signal whose handler raised SystemExit on
        the step's first or last line leaves the mark set with no step under
        way, and a close deferred to that step's end would never come.
        """
        return self._stepping == threading.get_ident() and self._holds_lock()

    def _holds_lock(self) -> bool:
        is_owned = getattr(self._lock, "_is_owned", None)  # RLock's, as Condition uses it
        return bool(is_owned()) if is_owned is not None else True

    def close_after(self) -> None:
        """Close the scheduler once the step under way ends."""
        self._close_pending = True

    @contextmanager
    def step(self) -> Iterator[None]:
        """One scheduling step; a close or a signal that came during it follows its end.

        A signal handler (beat's closes the scheduler and raises SystemExit)
        runs only when the step ended without an error.
        """
        ended = False
        self._stepping = threading.get_ident()
        try:
            yield
            ended = True
        finally:
            self._stepping = None
            deferred, self._deferred = self._deferred, []
            if self._close_pending:
                self._close_pending = False
                self._close()
        if ended and deferred:
            self._redispatch(*deferred[0])

    def install_signal_handlers(self) -> None:
        """Wrap the SIGTERM and SIGINT handlers so that they never run inside a step."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            current = signal.getsignal(sig)
            if current == self._on_signal or not callable(current):
                continue
            self._handlers[sig] = current
            signal.signal(sig, self._on_signal)

    def restore_signal_handlers(self) -> None:
        """Put back the handlers that were wrapped."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, original in self._handlers.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, original)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.inside and not self._deferred:
            # Inside a step: the handler would close the scheduler while the step may
            # hold the store's connection. It runs when the step ends.
            self._deferred.append((signum, frame))
            return
        # Not inside a step, or the same signal again while a step hangs: run it now
        # (a close() from within the step then waits for the step's end).
        self._redispatch(signum, frame)

    def _redispatch(self, signum: int, frame: FrameType | None) -> None:
        handler = self._handlers.get(signum)
        if callable(handler):
            handler(signum, frame)
