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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

from ..durations import store_timeout
from ..errors import ConfigurationError, StoreUnavailable
from ..store import Claim, ClaimRequest, ClaimStatus, JobState, RunRecord, RunState, Store
from ..urls import scrub, url_options
from . import _sql
from ._lock import CallLock

#: Largest number of job names per ``IN (...)`` list.
_CHUNK = 500


class SQLDialectStore(Store):
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
    def _transaction(self, write: bool = True) -> Iterator[Any]:
        with self._calls.held():
            try:
                if not self._ready:
                    self._setup(self._begin(True))
                conn = self._begin(write)
                try:
                    yield conn
                except BaseException:
                    conn.rollback()
                    raise
                conn.commit()
            except self._unavailable as exc:
                self._drop_connection()
                said = str(exc)
                for secret in self._secrets:  # a server's message may quote a token
                    said = scrub(said, secret)
                raise StoreUnavailable(f"{type(self).__name__}: {said}") from exc

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Already failing: the original error is the one to raise.
            with contextlib.suppress(Exception):
                conn.close()

    def _run(self, conn: Any, sql: str, **values: Any) -> Any:
        """Execute one of ``_sql``'s named-parameter statements for this namespace.

        Parameters are bound by position: the libsql client takes no names.
        """
        text, names = _sql.positional(sql)
        params = {"ns": self.namespace, **values}
        return conn.execute(text, tuple(params[name] for name in names))

    def _read(self, conn: Any, job: str) -> JobState | None:
        row = conn.execute(_sql.SELECT.format(marks="?"), (self.namespace, job)).fetchone()
        return self._job_state(row) if row else None

    def _claim(self, conn: Any, job: str, slot_ms: int, owner: str, lease: float) -> Claim:
        row = self._run(
            conn, _sql.CLAIM, job=job, slot=slot_ms, owner=owner, lease=lease
        ).fetchone()
        if row is not None:
            return Claim(ClaimStatus.WON, self._job_state(row))
        return self._lost(slot_ms, self._read(conn, job))

    def claim(self, job: str, slot_ms: int, owner: str, lease: float) -> Claim:
        with self._transaction() as conn:
            return self._claim(conn, job, slot_ms, owner, lease)

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        with self._transaction() as conn:
            return [self._claim(conn, r.job, r.slot_ms, owner, r.lease) for r in requests]

    def takeover(self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int) -> Claim:
        with self._transaction() as conn:
            row = self._run(
                conn,
                _sql.TAKEOVER,
                job=job,
                slot=slot_ms,
                owner=owner,
                lease=lease,
                token=seen_token,
            ).fetchone()
            if row is not None:
                return Claim(ClaimStatus.WON, self._job_state(row))
            return Claim(ClaimStatus.TAKEN, self._read(conn, job))

    def _change(self, sql: str, **values: Any) -> bool:
        with self._transaction() as conn:
            return int(self._run(conn, sql, **values).rowcount) == 1

    def renew(self, job: str, token: int, lease: float) -> bool:
        return self._change(_sql.RENEW, job=job, token=token, lease=lease)

    def dispatch(self, job: str, token: int, pickup: float) -> bool:
        return self._change(_sql.DISPATCH, job=job, token=token, lease=pickup)

    def _end(self, job: str, token: int, state: RunState) -> bool:
        return self._change(_sql.END, job=job, token=token, state=state.value)

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(dict.fromkeys(jobs))
        found: dict[str, JobState] = {}
        with self._transaction(write=False) as conn:
            for i in range(0, len(names), _CHUNK):
                chunk = names[i : i + _CHUNK]
                sql = _sql.SELECT.format(marks=", ".join("?" * len(chunk)))
                for row in conn.execute(sql, (self.namespace, *chunk)).fetchall():
                    found[row[0]] = self._job_state(row)
        return found

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        with self._transaction(write=False) as conn:
            rows = conn.execute(_sql.HISTORY_SELECT, (self.namespace, job, limit)).fetchall()
        return [self._run_record(row) for row in rows]

    def jobs(self) -> list[str]:
        with self._transaction(write=False) as conn:
            return [row[0] for row in conn.execute(_sql.JOBS, (self.namespace,)).fetchall()]

    def _create_schema(self) -> None:
        """Create the tables and triggers now (else the first call does)."""
        with self._transaction():
            pass

    def _setup(self, conn: Any) -> None:
        """In a write transaction: create missing tables and triggers; update an older trigger."""
        try:
            for statement in _sql.SCHEMA:
                conn.execute(statement)
            row = conn.execute(_sql.TRIGGER_SQL, ("anarchon_run_end",)).fetchone()
            if row is not None and _sql.RUN_END_MARK not in row[0]:
                conn.execute("DROP TRIGGER anarchon_run_end")
                conn.execute(_sql.RUN_END)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        self._ready = True

    def close(self) -> None:
        """Close the connection; one still in use is closed when its call ends."""
        self._calls.close(self._drop_connection)


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
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r} namespace={self.namespace!r}>"
