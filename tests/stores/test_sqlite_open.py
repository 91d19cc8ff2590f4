"""Opening a SQLite store while other connections open, write or hold the file."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from anarchon_core.errors import StoreUnavailable
from anarchon_core.stores.sqlite import SQLiteStore

#: Stores opened at once on each fresh file, and how many files.
OPENERS, ROUNDS = 4, 60


def test_stores_opened_at_once_on_a_new_file_all_open(tmp_path: Path) -> None:
    """Instances started together on a new file all start (none sees "database is locked")."""
    failures: list[str] = []
    for round_ in range(ROUNDS):
        path = str(tmp_path / f"store{round_}.db")
        start = threading.Barrier(OPENERS)

        def open_one(path: str = path, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                store = SQLiteStore(path, namespace="ns")
                store.claim("job", 1_000, "a", 30)
                store.close()
            except StoreUnavailable as exc:
                failures.append(str(exc))

        threads = [threading.Thread(target=open_one) for _ in range(OPENERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []


@contextmanager
def held_exclusive(path: Path, seconds: float) -> Iterator[None]:
    """Another connection holds the whole file (as a rollback-journal writer
    does) for ``seconds`` from the start of the block."""
    held = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS other (x)")
        conn.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        yield
    finally:
        holder.join()


def test_opening_waits_for_a_lock_held_within_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with held_exclusive(path, 0.5):
        began = time.monotonic()
        store = SQLiteStore(str(path), namespace="ns", busy_timeout=10)
        took = time.monotonic() - began
    assert took >= 0.3  # it waited for the holder, then opened
    assert store.claim("job", 1_000, "a", 30).holder is not None
    store.close()


def test_opening_past_busy_timeout_is_unavailable_and_names_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with held_exclusive(path, 2.5):
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match="database is locked"):
            SQLiteStore(str(path), namespace="ns", busy_timeout=0.5)
        took = time.monotonic() - began
    assert 0.4 <= took < 2.2  # it waited busy_timeout, not for the holder
