"""Threads a test started, told apart from the threads of the tests before it.

The process's thread count (``threading.active_count``) includes every thread: a test that
compares two counts also sees threads that earlier tests in the same worker
left ending (a pool's idle threads, a server client's reader), and fails or
passes by their timing. A test that asks which threads it started compares
the threads alive now with the ones alive when it began, by identity.
"""

from __future__ import annotations

import threading


class Born:
    """The threads started since this object was made (and still alive)."""

    def __init__(self) -> None:
        self._before = set(threading.enumerate())

    def alive(self) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in self._before]

    def count(self) -> int:
        return len(self.alive())
