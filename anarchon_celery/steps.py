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

from anarchon_core.deferral import StepGuard

Handler = Callable[[int, FrameType | None], Any]


class Steps:
    """Beat's scheduling steps (a :class:`~anarchon_core.deferral.StepGuard`), and its signals.

    ``close`` is the scheduler's close, called when a step ends if it was
    asked for inside the step; ``lock`` is the lock a step holds while it
    uses the store.
    """

    def __init__(self, close: Callable[[], None], lock: Any) -> None:
        self._close = close
        self._lock = lock
        self._guard = StepGuard(holds=self._holds_lock)
        #: The signal held back until the step under way ends.
        self._signal: tuple[int, FrameType | None] | None = None
        self._handlers: dict[int, Handler] = {}

    @property
    def inside(self) -> bool:
        """Whether the calling thread is inside a step, holding the store's lock.

        Both, not the mark alone: see :attr:`StepGuard.inside
        <anarchon_core.deferral.StepGuard.inside>`.
        """
        return self._guard.inside

    def _holds_lock(self) -> bool:
        is_owned = getattr(self._lock, "_is_owned", None)  # RLock's, as Condition uses it
        return bool(is_owned()) if is_owned is not None else True

    def close_after(self) -> None:
        """Close the scheduler once the step under way ends."""
        self._guard.defer(self._close)

    @contextmanager
    def step(self) -> Iterator[None]:
        """One scheduling step; a close or a signal that came during it follows its end.

        A signal handler (beat's closes the scheduler and raises SystemExit)
        runs only when the step ended without an error.
        """
        try:
            with self._guard.step():
                yield
        finally:
            self._signal = None  # handed to its handler by then, or dropped with the step

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
        if self.inside and not self._guard.deferred(self._resend):
            # Inside a step: the handler would close the scheduler while the step may
            # hold the store's connection. It runs when the step ends.
            self._signal = (signum, frame)
            self._guard.defer(self._resend, if_returned=True)
            return
        # Not inside a step, or the same signal again while a step hangs: run it now
        # (a close() from within the step then waits for the step's end).
        self._redispatch(signum, frame)

    def _resend(self) -> None:
        """Hand the signal held back during the step to its handler."""
        held, self._signal = self._signal, None
        if held is not None:
            self._redispatch(*held)

    def _redispatch(self, signum: int, frame: FrameType | None) -> None:
        handler = self._handlers.get(signum)
        if callable(handler):
            handler(signum, frame)
