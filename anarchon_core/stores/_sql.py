"""The SQL of the SQLite dialect, shared by the SQLite and libSQL stores.

Every step is one statement on ``anarchon_jobs``; the run history in
``anarchon_runs`` follows by triggers, inside the same statement, so the
history can never disagree with the record. ``renew`` and ``dispatch`` set
the state (``running``, ``dispatched``) and the lease of the token's holding
run; ``finish``/``release`` end it, and match again, changing nothing, when
the record already carries the token with that very end (a re-sent end).
``NOW`` is the server's clock in Unix seconds; SQLite fixes ``'now'`` for
the whole statement, triggers included. (``unixepoch('subsec')`` would be
shorter but needs SQLite 3.42.)
"""

from __future__ import annotations

import functools
import re

from ..store import HISTORY

#: The version of the layout this store writes in the server (keys, tables, records),
#: as docs/upgrading.md lists it: raised with every change of that layout.
LAYOUT_VERSION = 2

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
#: The states that hold the lease, as an SQL list.
_HELD_STATES = "('running', 'dispatched')"

_COUNT_START = """INSERT INTO anarchon_stats VALUES (NEW.namespace, NEW.job, 1, NEW.attempt > 1,
            0, 0, NULL, NULL)
        ON CONFLICT (namespace, job) DO UPDATE SET
            runs = runs + 1, takeovers = takeovers + excluded.takeovers;"""

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS anarchon_jobs (
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        slot_ms INTEGER NOT NULL,
        owner TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        token INTEGER NOT NULL,
        state TEXT NOT NULL,
        lease_until REAL NOT NULL,
        PRIMARY KEY (namespace, job)
    )""",
    """CREATE TABLE IF NOT EXISTS anarchon_runs (
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        token INTEGER NOT NULL,
        slot_ms INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        owner TEXT NOT NULL,
        state TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        PRIMARY KEY (namespace, job, token)
    )""",
    """CREATE TABLE IF NOT EXISTS anarchon_instances (
        namespace TEXT NOT NULL,
        instance TEXT NOT NULL,
        info TEXT NOT NULL,
        seen_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (namespace, instance)
    )""",
    # Pause marks: a job's name, or '' for the whole namespace.
    """CREATE TABLE IF NOT EXISTS anarchon_paused (
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        PRIMARY KEY (namespace, job)
    )""",
    # Control entries; the row of key '' counts the namespace's writes, so that
    # versions never repeat (an entry removed and made again gets a new one).
    """CREATE TABLE IF NOT EXISTS anarchon_controls (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        version INTEGER NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (namespace, key)
    )""",
    # Counts per job, kept by the triggers below in the statement that changes the record.
    """CREATE TABLE IF NOT EXISTS anarchon_stats (
        namespace TEXT NOT NULL,
        job TEXT NOT NULL,
        runs INTEGER NOT NULL,
        takeovers INTEGER NOT NULL,
        done INTEGER NOT NULL,
        failed INTEGER NOT NULL,
        last_done REAL,
        last_failed REAL,
        PRIMARY KEY (namespace, job)
    )""",
    # A new attempt (a first claim, a claim of a newer slot, a takeover).
    f"""CREATE TRIGGER IF NOT EXISTS anarchon_count_first AFTER INSERT ON anarchon_jobs BEGIN
        {_COUNT_START}
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS anarchon_count_next AFTER UPDATE OF token ON anarchon_jobs
    WHEN NEW.token != OLD.token BEGIN
        {_COUNT_START}
    END""",
    # A run that ends done or failed (a re-sent end changes no state: not counted).
    f"""CREATE TRIGGER IF NOT EXISTS anarchon_count_end AFTER UPDATE OF state ON anarchon_jobs
    WHEN NEW.token = OLD.token AND NEW.state != OLD.state AND NEW.state IN ('done', 'failed')
    BEGIN
        INSERT INTO anarchon_stats VALUES (NEW.namespace, NEW.job, 0, 0,
            NEW.state = 'done', NEW.state = 'failed',
            CASE WHEN NEW.state = 'done' THEN {NOW} END,
            CASE WHEN NEW.state = 'failed' THEN {NOW} END)
        ON CONFLICT (namespace, job) DO UPDATE SET
            done = done + excluded.done, failed = failed + excluded.failed,
            last_done = coalesce(excluded.last_done, last_done),
            last_failed = coalesce(excluded.last_failed, last_failed);
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS anarchon_run_first AFTER INSERT ON anarchon_jobs BEGIN
        INSERT INTO anarchon_runs VALUES (NEW.namespace, NEW.job, NEW.token, NEW.slot_ms,
            NEW.attempt, NEW.owner, NEW.state, {NOW}, NULL);
    END""",
    # A new token means a new attempt: close the previous one (lost when the
    # same slot is taken over, abandoned when a newer slot supersedes it).
    f"""CREATE TRIGGER IF NOT EXISTS anarchon_run_next AFTER UPDATE OF token ON anarchon_jobs
    WHEN NEW.token != OLD.token BEGIN
        UPDATE anarchon_runs
           SET state = CASE WHEN NEW.slot_ms = OLD.slot_ms THEN 'lost' ELSE 'abandoned' END,
               ended_at = {NOW}
         WHERE namespace = OLD.namespace AND job = OLD.job AND token = OLD.token
           AND ended_at IS NULL;
        INSERT INTO anarchon_runs VALUES (NEW.namespace, NEW.job, NEW.token, NEW.slot_ms,
            NEW.attempt, NEW.owner, NEW.state, {NOW}, NULL);
        DELETE FROM anarchon_runs WHERE namespace = NEW.namespace AND job = NEW.job
           AND token <= (SELECT token FROM anarchon_runs
                          WHERE namespace = NEW.namespace AND job = NEW.job
                          ORDER BY token DESC LIMIT 1 OFFSET {HISTORY});
    END""",
    # The same token changing state: between running and dispatched the attempt
    # stays open; done, failed and released end it. A database made by an older
    # version, whose trigger ended the attempt on any change, has it replaced
    # (see REPLACED_TRIGGERS).
    f"""CREATE TRIGGER IF NOT EXISTS anarchon_run_end AFTER UPDATE OF state ON anarchon_jobs
    WHEN NEW.token = OLD.token AND NEW.state != OLD.state BEGIN
        UPDATE anarchon_runs SET state = NEW.state,
               ended_at = CASE WHEN NEW.state IN {_HELD_STATES} THEN ended_at ELSE {NOW} END
         WHERE namespace = NEW.namespace AND job = NEW.job AND token = NEW.token;
    END""",
]

#: Triggers whose definition changed since an older version, each with a mark found
#: in this version's definition and not in older ones: an older trigger is dropped
#: and created again (SQLite has no CREATE OR REPLACE TRIGGER), once, not at every
#: start. ``anarchon_run_end`` once ended the attempt on any change of state;
#: ``anarchon_run_next`` once kept the attempts whose tokens were within HISTORY of
#: the newest, which assumed consecutive tokens.
REPLACED_TRIGGERS = {
    name: (next(statement for statement in SCHEMA if f" {name} " in statement), mark)
    for name, mark in (
        ("anarchon_run_end", "ended_at = CASE WHEN NEW.state IN"),
        ("anarchon_run_next", f"ORDER BY token DESC LIMIT 1 OFFSET {HISTORY}"),
    )
}
TRIGGER_SQL = "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?"

_RETURNING = f"RETURNING job, slot_ms, owner, attempt, token, state, lease_until - {NOW}"

#: A claim of a job paused by name or with its namespace writes nothing.
PAUSED = "SELECT 1 FROM anarchon_paused WHERE namespace = :ns AND job IN (:job, '')"

#: A claim of a job whose claims won (runs less takeovers) reached its limit writes
#: nothing (with no limit, ``:most`` is NULL and nothing is found).
ENDED = """SELECT 1 FROM anarchon_stats WHERE namespace = :ns AND job = :job
    AND runs - takeovers >= :most"""

#: Won if a row comes back. Conflicts update only an older slot whose run
#: ended or whose lease lapsed; a paused or ended job inserts no row to conflict with.
CLAIM = f"""
INSERT INTO anarchon_jobs (namespace, job, slot_ms, owner, attempt, token, state, lease_until)
SELECT :ns, :job, :slot, :owner, 1, CAST({NOW} * 1000 AS INTEGER), 'running', {NOW} + :lease
WHERE NOT EXISTS ({PAUSED}) AND NOT EXISTS ({ENDED})
ON CONFLICT (namespace, job) DO UPDATE SET
    slot_ms = excluded.slot_ms, owner = excluded.owner, attempt = 1,
    token = max(token + 1, CAST({NOW} * 1000 AS INTEGER)),
    state = 'running', lease_until = excluded.lease_until
WHERE slot_ms < excluded.slot_ms AND (state NOT IN {_HELD_STATES} OR lease_until <= {NOW})
{_RETURNING}
"""

TAKEOVER = f"""
UPDATE anarchon_jobs SET owner = :owner, attempt = attempt + 1,
    token = max(token + 1, CAST({NOW} * 1000 AS INTEGER)),
    state = 'running', lease_until = {NOW} + :lease
WHERE namespace = :ns AND job = :job AND slot_ms = :slot AND token = :token
  AND (state = 'released' OR (state = 'running' AND lease_until <= {NOW}))
{_RETURNING}
"""

_HELD = f"WHERE namespace = :ns AND job = :job AND token = :token AND state IN {_HELD_STATES}"

#: A renewal also picks a dispatched run up: it is running again.
RENEW = f"UPDATE anarchon_jobs SET state = 'running', lease_until = {NOW} + :lease {_HELD}"

DISPATCH = f"UPDATE anarchon_jobs SET state = 'dispatched', lease_until = {NOW} + :lease {_HELD}"

#: finish (done/failed) and release (released) alike end the lease now. The
#: same end re-sent matches too, and changes nothing (its lease end stays).
END = f"""
UPDATE anarchon_jobs SET state = :state,
    lease_until = CASE WHEN state = :state THEN lease_until ELSE {NOW} END
WHERE namespace = :ns AND job = :job AND token = :token
  AND (state IN {_HELD_STATES} OR state = :state)
"""

_RECORD = f"SELECT job, slot_ms, owner, attempt, token, state, lease_until - {NOW}"

SELECT = f"""
{_RECORD}
FROM anarchon_jobs WHERE namespace = ? AND job IN ({{marks}})
"""

#: One job's record, by name (for a batch of named-parameter statements).
READ = f"""
{_RECORD}
FROM anarchon_jobs WHERE namespace = :ns AND job = :job
"""

HISTORY_SELECT = """
SELECT job, slot_ms, attempt, token, owner, state, started_at, ended_at
FROM anarchon_runs WHERE namespace = ? AND job = ? ORDER BY token DESC LIMIT ?
"""

JOBS = "SELECT job FROM anarchon_jobs WHERE namespace = ? ORDER BY job"

NAMESPACES = "SELECT DISTINCT namespace FROM anarchon_jobs ORDER BY namespace"

STATS = """SELECT job, runs, takeovers, done, failed, last_done, last_failed
FROM anarchon_stats WHERE namespace = ? AND job IN ({marks})"""

PAUSE = "INSERT INTO anarchon_paused VALUES (:ns, :job) ON CONFLICT DO NOTHING"
RESUME = "DELETE FROM anarchon_paused WHERE namespace = :ns AND job = :job"
PAUSE_MARKS = "SELECT job FROM anarchon_paused WHERE namespace = :ns"

#: With one ``substr(key, 1, length(?)) = ?`` per prefix in ``{starts}``, joined by OR.
CONTROLS = """SELECT key, version, value FROM anarchon_controls
WHERE namespace = ? AND key > '' AND ({starts})"""
CONTROL_VERSION = "SELECT version FROM anarchon_controls WHERE namespace = :ns AND key = :key"
CONTROL_COUNT = """INSERT INTO anarchon_controls VALUES (:ns, '', 1, '')
ON CONFLICT (namespace, key) DO UPDATE SET version = version + 1 RETURNING version"""
CONTROL_PUT = """INSERT INTO anarchon_controls VALUES (:ns, :key, :version, :value)
ON CONFLICT (namespace, key) DO UPDATE SET version = excluded.version, value = excluded.value"""
CONTROL_DELETE = "DELETE FROM anarchon_controls WHERE namespace = :ns AND key = :key"


@functools.cache
def positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with its ``:name`` parameters turned into ``?``, and the names in order."""
    names = tuple(re.findall(r":(\w+)", sql))
    return re.sub(r":\w+", "?", sql), names


#: The registry of live instances: an instance's record, the removal of expired
#: ones, and the live ones (instance, info, age, expires in).
ANNOUNCE = f"""
INSERT INTO anarchon_instances VALUES (:ns, :instance, :info, {NOW}, {NOW} + :ttl)
ON CONFLICT (namespace, instance) DO UPDATE SET
    info = excluded.info, seen_at = excluded.seen_at, expires_at = excluded.expires_at
"""
EXPIRE = f"DELETE FROM anarchon_instances WHERE namespace = :ns AND expires_at <= {NOW}"
WITHDRAW = "DELETE FROM anarchon_instances WHERE namespace = :ns AND instance = :instance"
INSTANCES = f"""
SELECT instance, info, {NOW} - seen_at, expires_at - {NOW} FROM anarchon_instances
WHERE namespace = :ns AND expires_at > {NOW} ORDER BY instance
"""


# -- one-off runs: a table whose key, (namespace, due time, job), is the index read ----

#: Made at the first one-off call (idempotent), beside the tables of an older release.
ONCE_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS anarchon_once (
        namespace TEXT NOT NULL,
        due_ms INTEGER NOT NULL,
        job TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (namespace, due_ms, job)
    ) WITHOUT ROWID""",
]
ONCE_ADD = """INSERT INTO anarchon_once VALUES (:ns, :due, :job, :value)
ON CONFLICT (namespace, due_ms, job) DO UPDATE SET value = excluded.value"""
#: The entries due, after a cursor (``:from``, ``:after``; -1 and '' for none), in order:
#: a range of the table's key.
ONCE_DUE = """SELECT due_ms, job, value FROM anarchon_once
WHERE namespace = :ns AND due_ms <= :until AND due_ms >= :from
  AND (due_ms > :from OR job > :after)
ORDER BY due_ms, job LIMIT :limit"""
ONCE_REMOVE = "DELETE FROM anarchon_once WHERE namespace = :ns AND due_ms = :due AND job = :job"
ONCE_PENDING = """SELECT due_ms, job, value FROM anarchon_once
WHERE namespace = :ns AND (:job = '' OR job = :job) ORDER BY due_ms, job LIMIT :limit"""
