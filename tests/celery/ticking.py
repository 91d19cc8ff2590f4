"""Beats in threads of the test process: each scheduler ticked as its own beat would."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from anarchon_celery import Scheduler


def drive(schedulers: list[Scheduler], until: Callable[[], bool], timeout: float) -> None:
    """Tick each scheduler in its own thread, as separate beats do, until ``until()``."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(scheduler: Scheduler) -> None:
        try:
            while not stop.is_set():
                stop.wait(min(scheduler.tick(), 0.02))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(s,)) for s in schedulers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not until() and time.monotonic() < deadline and not errors:
            time.sleep(0.02)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert not errors, errors
    assert until(), f"not reached within {timeout}s"
