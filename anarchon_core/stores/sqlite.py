"""SQLite: the embedded default, for instances on one machine.

URL: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``,
optionally with ``?busy_timeout=SECONDS`` (default 10): how long a step
waits for another writer's lock before the store counts as unavailable.

The database runs in WAL mode; each step is one statement in its own
``BEGIN IMMEDIATE`` transaction (the write lock is taken up front, so
concurrent claimers queue on ``busy_timeout`` instead of failing), with any
``RETURNING`` row fetched before the commit. SQLite's locking needs a local
file system: never put the file on NFS or another network share.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from ..durations import store_timeout
from ..errors import ConfigurationError, Conflict, StoreUnavailable
from ..store import (
    Change,
    Claim,
    ClaimRequest,
    ClaimStatus,
    ControlStore,
    InstanceRecord,
    JobState,
    JobStats,
    LeaseStore,
    OnceEntry,
    OnceStore,
    RegistryStore,
    RunRecord,
    RunState,
    TakeoverRequest,
    refused,
)
from ..urls import scrub, url_options
from . import _sql
from ._lock import CallLock

#: Largest number of job names per ``IN (...)`` list.
_CHUNK = 500


class Rows(NamedTuple):
    """One statement's answer: the rows it returned, and how many rows it changed."""

    rows: list[Any]
    changed: int


def _statement(change: Change) -> tuple[str, dict[str, Any]]:
    """The statement of one change of a batch, with its values."""
    values: dict[str, Any] = {"job": change.job, "token": change.token}
    if change.state is RunState.RUNNING:
        return _sql.RENEW, {**values, "lease": change.lease}
    if change.state is RunState.DISPATCHED:
        return _sql.DISPATCH, {**values, "lease": change.lease}
    return _sql.END, {**values, "state": change.state.value}


def _locked(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for another connection's lock (worth a wait)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is None:
        return "locked" in str(exc) or "busy" in str(exc)
    return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED


class SQLDialectStore(LeaseStore, RegistryStore, ControlStore, OnceStore):
    """The store contract over a DB-API connection speaking SQLite's SQL.

    Subclasses provide the connection and the exceptions that mean "the
    store is unavailable"; the statements live once, in ``_sql``.
    """

    _unavailable: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, *, namespace: str) -> None:
        super().__init__(namespace=namespace)
        self._calls = CallLock()
        self._conn: Any = None
        #: Credentials to keep out of every message.
        self._secrets: list[str] = []
        #: The tables and triggers exist (created by the first call otherwise).
        self._ready = False

    def _connect(self) -> Any:
        raise NotImplementedError

    def _begin(self, write: bool) -> Any:
        """Begin a transaction (writes take the lock up front); return its connection."""
        if self._conn is None:
            self._conn = self._connect()
        self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        return self._conn

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        """Hold the connection (set up first); its errors become ``StoreUnavailable``."""
        with self._calls.held():
            try:
                if not self._ready:
                    self._setup(self._begin(True))
                yield
            except self._unavailable as exc:
                self._drop_connection()
                said = str(exc)
                for secret in self._secrets:  # a server's message may quote a token
                    said = scrub(said, secret)
                raise StoreUnavailable(f"{type(self).__name__}: {said}") from exc

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[Any]:
        with self._guarded():
            conn = self._begin(write)
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def _write(self, statements: Sequence[tuple[str, dict[str, Any]]]) -> list[Rows]:
        """Run ``_sql``'s named-parameter ``statements`` in one write transaction.

        Each statement's rows (fetched before the commit, as ``RETURNING``
        needs) and count of rows changed. A store that can send the whole
        transaction at once (libSQL) overrides this.
        """
        with self._transaction() as conn:
            answers = []
            for sql, values in statements:
                cursor = self._run(conn, sql, **values)
                rows = cursor.fetchall()
                answers.append(Rows(rows, int(cursor.rowcount)))
            return answers

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Already failing: the original error is the one to raise.
            with contextlib.suppress(Exception):
                conn.close()

    def _bind(self, sql: str, values: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """One of ``_sql``'s named-parameter statements for this namespace, bound by position."""
        text, names = _sql.positional(sql)
        params = {"ns": self.namespace, **values}
        return text, tuple(params[name] for name in names)

    def _run(self, conn: Any, sql: str, **values: Any) -> Any:
        """Execute one of ``_sql``'s named-parameter statements for this namespace."""
        return conn.execute(*self._bind(sql, values))

    @staticmethod
    def _claim_statements(request: ClaimRequest, owner: str) -> list[tuple[str, dict[str, Any]]]:
        """A claim, then (in the same transaction) the pause mark, the record it left and,
        with a limit, whether the limit is reached."""
        job = request.job
        claim: dict[str, Any] = {
            "job": job,
            "slot": request.slot_ms,
            "owner": owner,
            "lease": request.lease,
            "most": request.limit,
        }
        statements: list[tuple[str, dict[str, Any]]] = [
            (_sql.CLAIM, claim),
            (_sql.PAUSED, {"job": job}),
            (_sql.READ, {"job": job}),
        ]
        if request.limit is not None:
            statements.append((_sql.ENDED, {"job": job, "most": request.limit}))
        return statements

    def _claim_answer(
        self, slot_ms: int, claimed: Rows, paused: Rows, read: Rows, ended: Rows | None = None
    ) -> Claim:
        if claimed.rows:
            return Claim(ClaimStatus.WON, self._job_state(claimed.rows[0]))
        holder = self._job_state(read.rows[0]) if read.rows else None
        return refused(
            slot_ms, holder, paused=bool(paused.rows), ended=ended is not None and bool(ended.rows)
        )

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        if not requests:
            return []
        each = [self._claim_statements(request, owner) for request in requests]
        answers = self._write([s for statements in each for s in statements])
        claims, at = [], 0
        for request, statements in zip(requests, each, strict=True):
            claims.append(self._claim_answer(request.slot_ms, *answers[at : at + len(statements)]))
            at += len(statements)
        return claims

    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        """Every takeover, each followed by a read of the record it left, in one transaction."""
        if not requests:
            return []
        statements = []
        for r in requests:
            values = {"job": r.job, "slot": r.slot_ms, "owner": owner, "lease": r.lease}
            statements += [(_sql.TAKEOVER, {**values, "token": r.seen_token}), (_sql.READ, values)]
        answers = self._write(statements)
        claims = []
        for taken, read in zip(answers[::2], answers[1::2], strict=True):
            if taken.rows:
                claims.append(Claim(ClaimStatus.WON, self._job_state(taken.rows[0])))
            else:
                holder = self._job_state(read.rows[0]) if read.rows else None
                claims.append(Claim(ClaimStatus.TAKEN, holder))
        return claims

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        """Every change in one transaction."""
        if not changes:
            return []
        return [answer.changed == 1 for answer in self._write([_statement(c) for c in changes])]

    def _rows_of(self, sql: str, jobs: Iterable[str]) -> list[Any]:
        """The rows of ``sql`` (its ``{marks}`` the jobs' names) for ``jobs``, in chunks."""
        names = list(dict.fromkeys(jobs))
        rows: list[Any] = []
        with self._transaction(write=False) as conn:
            for i in range(0, len(names), _CHUNK):
                chunk = names[i : i + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                rows += conn.execute(sql.format(marks=marks), (self.namespace, *chunk)).fetchall()
        return rows

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        return {row[0]: self._job_state(row) for row in self._rows_of(_sql.SELECT, jobs)}

    def stats(self, jobs: Iterable[str]) -> dict[str, JobStats]:
        return {row[0]: JobStats(*row) for row in self._rows_of(_sql.STATS, jobs)}

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        with self._transaction(write=False) as conn:
            rows = conn.execute(_sql.HISTORY_SELECT, (self.namespace, job, limit)).fetchall()
        return [self._run_record(row) for row in rows]

    def jobs(self) -> list[str]:
        with self._transaction(write=False) as conn:
            return [row[0] for row in conn.execute(_sql.JOBS, (self.namespace,)).fetchall()]

    def namespaces(self) -> list[str]:
        with self._transaction(write=False) as conn:
            return [row[0] for row in conn.execute(_sql.NAMESPACES).fetchall()]

    def _set_pause(self, key: str, on: bool) -> bool:
        return self._write([(_sql.PAUSE if on else _sql.RESUME, {"job": key})])[0].changed == 1

    def _pause_marks(self) -> set[str]:
        with self._transaction(write=False) as conn:
            return {row[0] for row in self._run(conn, _sql.PAUSE_MARKS).fetchall()}

    def _controls(self, prefixes: tuple[str, ...]) -> dict[str, tuple[int, str]]:
        starts = " OR ".join(["substr(key, 1, length(?)) = ?"] * len(prefixes))
        params = [self.namespace, *(p for prefix in prefixes for p in (prefix, prefix))]
        with self._transaction(write=False) as conn:
            rows = conn.execute(_sql.CONTROLS.format(starts=starts), tuple(params)).fetchall()
        return {key: (int(version), value) for key, version, value in rows}

    def _set_control(self, key: str, value: str | None, expected: int) -> int:
        with self._transaction() as conn:  # one write transaction: the compare and the set
            row = self._run(conn, _sql.CONTROL_VERSION, key=key).fetchone()
            found = int(row[0]) if row else 0
            if found != expected:
                raise Conflict(key, expected, found)
            if value is None:
                self._run(conn, _sql.CONTROL_DELETE, key=key)
                return 0
            version = int(self._run(conn, _sql.CONTROL_COUNT).fetchone()[0])
            self._run(conn, _sql.CONTROL_PUT, key=key, version=version, value=value)
            return version

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        announce = {"instance": instance, "info": info, "ttl": ttl}
        *_, live = self._write([(_sql.ANNOUNCE, announce), (_sql.EXPIRE, {}), (_sql.INSTANCES, {})])
        return [self._instance_record(row) for row in live.rows]

    def withdraw(self, instance: str) -> None:
        self._write([(_sql.WITHDRAW, {"instance": instance})])

    def instances(self) -> list[InstanceRecord]:
        with self._transaction(write=False) as conn:
            rows = self._run(conn, _sql.INSTANCES).fetchall()
        return [self._instance_record(row) for row in rows]

    def _create_schema(self) -> None:
        """Create the tables and triggers now (else the first call does)."""
        with self._transaction():
            pass

    def _setup(self, conn: Any) -> None:
        """In a write transaction: create missing tables and triggers; update an older trigger."""
        try:
            for statement in _sql.SCHEMA:
                conn.execute(statement)
            for name, (statement, mark) in _sql.REPLACED_TRIGGERS.items():
                row = conn.execute(_sql.TRIGGER_SQL, (name,)).fetchone()
                if row is not None and mark not in row[0]:
                    conn.execute(f"DROP TRIGGER {name}")
                    conn.execute(statement)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        self._ready = True

    def close(self) -> None:
        """Close the connection; one still in use is closed when its call ends."""
        self._calls.close(self._drop_connection)

    # -- one-off runs: the table anarchon_once, keyed and read by due time ----------------

    #: Entries written per transaction (and per request, on libSQL).
    _ONCE_CHUNK = 1000

    def _once_table(self) -> None:
        """Create the one-offs' table if it is not there (once per store object)."""
        if not getattr(self, "_once_ready", False):
            self._write([(statement, {}) for statement in _sql.ONCE_SCHEMA])
            self._once_ready = True

    def _add_once(self, entries: list[OnceEntry]) -> None:
        self._once_table()
        for i in range(0, len(entries), self._ONCE_CHUNK):
            chunk = entries[i : i + self._ONCE_CHUNK]
            values = [{"due": e.due_ms, "job": e.job, "value": e.value} for e in chunk]
            self._write([(_sql.ONCE_ADD, v) for v in values])

    def _once_rows(self, sql: str, **values: Any) -> list[OnceEntry]:
        self._once_table()
        with self._transaction(write=False) as conn:
            rows = self._run(conn, sql, **values).fetchall()
        return [OnceEntry(int(due), job, value) for due, job, value in rows]

    def _once_due(
        self, until_ms: int, limit: int, after: tuple[int, str] | None
    ) -> list[OnceEntry]:
        start, job = after if after is not None else (-1, "")
        return self._once_rows(
            _sql.ONCE_DUE, until=until_ms, limit=limit, **{"from": start, "after": job}
        )

    def _remove_once(self, job: str, due_ms: int) -> bool:
        self._once_table()
        return self._write([(_sql.ONCE_REMOVE, {"due": due_ms, "job": job})])[0].changed == 1

    def _pending_once(self, job: str | None, limit: int) -> list[OnceEntry]:
        return self._once_rows(_sql.ONCE_PENDING, job=job or "", limit=limit)


class SQLiteStore(SQLDialectStore):
    """A SQLite database file shared by the instances of one machine."""

    def __init__(
        self, path: str, *, namespace: str = "default", busy_timeout: float = 10.0
    ) -> None:
        super().__init__(namespace=namespace)
        self.path = path
        self.busy_timeout = store_timeout("busy_timeout", busy_timeout)
        self._create_schema()

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> SQLiteStore:
        parts = urlsplit(url)
        if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
            raise ConfigurationError(
                f"SQLite URL {url!r}: expected sqlite:///relative/path.db"
                " or sqlite:////absolute/path.db"
            )
        for key, value in url_options(url, "SQLite", ("busy_timeout",)):
            options.setdefault(key, value)
        path = unquote(parts.path[1:])
        if "\x00" in path:
            raise ConfigurationError(f"SQLite URL {url!r}: the path holds a NUL character")
        return cls(path, namespace=namespace, **options)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            # Switching to WAL needs the exclusive lock, and SQLite answers
            # "database is locked" at once, without its busy handler, while
            # another connection opens or closes the file: wait as for a writer.
            deadline = time.monotonic() + self.busy_timeout
            pause = 0.002
            while True:
                try:
                    conn.execute("PRAGMA journal_mode = WAL")
                    break
                except sqlite3.OperationalError as exc:
                    if not _locked(exc) or time.monotonic() + pause > deadline:
                        raise
                    time.sleep(pause)
                    pause = min(2 * pause, 0.05)
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r} namespace={self.namespace!r}>"
