"""Stopping from inside a store call (as a signal handler does) never deadlocks.

A signal handler runs in the main thread between two bytecodes, possibly in
the middle of a store call that holds the store's connection. A ``stop()``
or ``close()`` made from there must return at once and leave the rest to the
end of the interrupted call or step; a ``close()`` from another thread while
a call hangs must give up waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anarchon_core import Scheduler
from anarchon_core.stores.sqlite import SQLiteStore


def in_thread(action: Callable[[], Any], timeout: float) -> bool:
    """Run ``action`` in a daemon thread; whether it ended within ``timeout``."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


def interrupt_next_write(store: SQLiteStore, handler: Callable[[], object]) -> None:
    """Call ``handler`` inside the store's next write call, as a signal would."""
    begin = store._begin

    def interrupted(write: bool) -> Any:
        conn = begin(write)
        if write:
            store._begin = begin  # type: ignore[method-assign]
            handler()
        return conn

    store._begin = interrupted  # type: ignore[method-assign]


def test_closing_a_sqlite_store_from_inside_its_own_call(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"), namespace="n")
    interrupt_next_write(store, store.close)
    assert in_thread(lambda: store.claim("j", 1000, "me", 10), timeout=5), "deadlocked"
    assert store._conn is None  # closed when the call ended
    state = store.state("j")  # the interrupted claim committed, and the store opens again
    assert state is not None and state.slot_ms == 1000


def test_closing_a_sqlite_store_while_another_thread_hangs_in_a_call(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"), namespace="n")
    release = threading.Event()
    interrupt_next_write(store, lambda: release.wait(30))
    caller = threading.Thread(target=lambda: store.claim("j", 1000, "me", 10), daemon=True)
    caller.start()
    time.sleep(0.1)
    started = time.monotonic()
    assert in_thread(store.close, timeout=5), "close waited for the hung call"
    assert time.monotonic() - started < 3
    release.set()
    caller.join(5)
    assert store._conn is None


def test_engine_stop_from_inside_a_step_hands_over_when_the_step_ends(tmp_path: Path) -> None:
    engine = Scheduler(f"sqlite:///{tmp_path / 's.db'}", namespace="n", inline=True, jitter=0)
    engine.add_job(lambda: None, name="j", every=1)
    store = engine.store
    assert isinstance(store, SQLiteStore)
    stopped = threading.Event()

    def stop() -> None:
        engine.stop(timeout=1)
        stopped.set()

    interrupt_next_write(store, stop)

    def step_until_stopped() -> None:
        deadline = time.monotonic() + 5
        while not stopped.is_set() and time.monotonic() < deadline:
            time.sleep(min(engine.run_pending(), 0.05))

    assert in_thread(step_until_stopped, timeout=10), "deadlocked"
    assert stopped.is_set()
    assert store._conn is None  # the step ended, then the engine closed its store
