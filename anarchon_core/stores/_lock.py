"""The lock of a store whose calls share one connection, and whose close never waits forever.

A store call holds the lock for as long as it uses the connection. ``close()``
may come while a call holds it: from a signal handler that interrupted that
very call in the same thread (waiting would deadlock), or while a call in
another thread hangs on a server that does not answer. Then the connection is
left to the call, which drops it as it ends, and ``close()`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

#: The longest ``close()`` waits for a call in another thread to end.
CLOSE_WAIT = 1.0


class CallLock:
    """One call at a time on a shared connection; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._close: Callable[[], None] | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the connection for one call."""
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None
                self._run_deferred()

    def close(self, close: Callable[[], None], wait: float = CLOSE_WAIT) -> None:
        """Run ``close`` under the lock, or leave it to the call holding it."""
        if self._owner != threading.get_ident() and self._lock.acquire(timeout=wait):
            try:
                close()
            finally:
                self._lock.release()
            return
        self._close = close
        # The call may have ended since the lock was tried: then nobody would close.
        if self._lock.acquire(blocking=False):
            try:
                self._run_deferred()
            finally:
                self._lock.release()

    def _run_deferred(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            with suppress(Exception):  # closing must not fail the call that ends
                close()
