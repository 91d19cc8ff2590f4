"""SQLite's schema: a database made by an older version is brought up to date, once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from anarchon_core import RunState
from anarchon_core.store import HISTORY
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

#: The trigger of the versions whose tokens were consecutive: it kept the attempts
#: whose tokens were within HISTORY of the newest.
OLD_RUN_NEXT = f"""CREATE TRIGGER IF NOT EXISTS anarchon_run_next
    AFTER UPDATE OF token ON anarchon_jobs WHEN NEW.token != OLD.token BEGIN
        UPDATE anarchon_runs
           SET state = CASE WHEN NEW.slot_ms = OLD.slot_ms THEN 'lost' ELSE 'abandoned' END,
               ended_at = {_sql.NOW}
         WHERE namespace = OLD.namespace AND job = OLD.job AND token = OLD.token
           AND ended_at IS NULL;
        INSERT INTO anarchon_runs VALUES (NEW.namespace, NEW.job, NEW.token, NEW.slot_ms,
            NEW.attempt, NEW.owner, NEW.state, {_sql.NOW}, NULL);
        DELETE FROM anarchon_runs WHERE namespace = NEW.namespace AND job = NEW.job
           AND token <= NEW.token - {HISTORY};
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


def test_an_older_database_keeps_its_history_by_count_once_tokens_follow_the_clock(
    tmp_path: Path,
) -> None:
    """A database whose trigger kept attempts by token distance would keep only the
    newest attempt once tokens follow the clock: its trigger is replaced, and the
    history made before the upgrade stays, up to HISTORY attempts."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for statement in _sql.SCHEMA:
            conn.execute(OLD_RUN_NEXT if " anarchon_run_next " in statement else statement)
        # Three attempts an older version wrote, with consecutive tokens.
        conn.execute(
            "INSERT INTO anarchon_jobs VALUES ('default', 'job', 1000, 'old', 1, 1, 'running', 0)"
        )
        for token in (2, 3):
            conn.execute(
                "UPDATE anarchon_jobs SET token = ?, slot_ms = slot_ms + 1000, state = 'done'",
                (token,),
            )
    store = SQLiteStore(str(path))
    for k in range(4):
        holder = store.claim("job", 10_000 + k * 1000, "new", 30).holder
        assert holder is not None and holder.token > 3  # the clock in ms
        assert store.finish("job", holder.token, RunState.DONE)
    history = store.history("job", 100)
    assert [run.owner for run in history] == ["new"] * 4 + ["old"] * 3
    store.close()
