"""SQLite's schema: a database made by an older version is brought up to date, once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from anarchon_core import RunState
from anarchon_core.stores import _sql
from anarchon_core.stores.sqlite import SQLiteStore

#: The history trigger of the versions before the ``dispatched`` state: it ended
#: the attempt on any change of state.
OLD_RUN_END = f"""CREATE TRIGGER IF NOT EXISTS anarchon_run_end
    AFTER UPDATE OF state ON anarchon_jobs
    WHEN NEW.token = OLD.token AND NEW.state != OLD.state BEGIN
        UPDATE anarchon_runs SET state = NEW.state, ended_at = {_sql.NOW}
         WHERE namespace = NEW.namespace AND job = NEW.job AND token = NEW.token;
    END"""


def schema_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA schema_version").fetchone()[0])


def test_an_older_database_gets_the_new_trigger_and_keeps_dispatched_attempts_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for statement in _sql.SCHEMA:
            conn.execute(OLD_RUN_END if "anarchon_run_end" in statement else statement)
    store = SQLiteStore(str(path))
    holder = store.claim("job", 1_000, "a", 30).holder
    assert holder is not None
    assert store.dispatch("job", holder.token, 60)
    assert store.renew("job", holder.token, 30)
    (run,) = store.history("job")
    assert (run.state, run.ended_at) == (RunState.RUNNING, None)  # still open
    store.close()


def test_opening_a_current_database_changes_no_schema(tmp_path: Path) -> None:
    """Instances start often; an unchanged schema takes no schema-changing lock."""
    path = tmp_path / "new.db"
    SQLiteStore(str(path)).close()
    before = schema_version(path)
    for _ in range(3):
        SQLiteStore(str(path)).close()
    assert schema_version(path) == before
