"""The suite's one way to wait: poll a condition until it holds, or fail saying why.

Tests wait on conditions, never on fixed sleeps: a condition returns as soon
as it holds, so a fast machine is not slowed down and a loaded one gets the
whole ``timeout``. A failure names what was awaited and the last value seen
(or what ``seen`` describes), so a timed-out wait explains itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: How often a condition is polled: often enough for sub-second slots, rarely
#: enough to leave the two cores to the processes under test.
INTERVAL = 0.05
#: How much of the last value a failure message shows.
SHOWN = 3000


def wait_until(
    check: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = INTERVAL,
    seen: Callable[[], object] | None = None,
) -> T:
    """The first true value of ``check()`` within ``timeout`` seconds.

    ``check`` may raise to end the wait early (a process it watches died).
    On timeout an ``AssertionError`` says ``what`` was awaited and what was
    last seen: ``seen()`` if given (logs, a report's tail), else the last
    value ``check()`` returned.
    """
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    last = seen() if seen is not None else found
    shown = repr(last) if not isinstance(last, str) else last
    if len(shown) > SHOWN:
        shown = "..." + shown[-SHOWN:]
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {shown}")
