"""PostgreSQL: a server store for instances on many machines (psycopg 3, psycopg_pool).

URL: ``postgresql://user:password@host:5432/dbname?OPTIONS`` (or ``postgres://``).
The store's own options: ``schema=NAME``, an existing schema for the tables
(default: the first of the role's ``search_path``); ``timeout=SECONDS``
(default 5), the connect timeout, TCP user timeout and longest wait for a
pooled connection, past which a call raises ``StoreUnavailable`` (once the
server was seen away, calls wait at most a second until one succeeds again);
``pool_size=N`` (default 2), the most connections opened. Other parameters go
to libpq (``sslmode``, ``application_name``...). The constructor also takes a
``psycopg_pool.ConnectionPool`` of yours, which :meth:`PostgresStore.close`
leaves open; give it ``autocommit=True`` and ``prepare_threshold=None``.

Tables: each namespace has its own, ``anarchon_<name>_<hash>_jobs`` (a row per
job: slot, owner, attempt, token, state, lease end) and ``..._runs`` (the last
50 attempts), and a trigger function ``..._log``. ``<name>`` is the namespace
lower-cased with other characters as ``_``, cut to 24, for people reading
``psql``; ``<hash>`` (SHA-256 of the exact namespace) keeps namespaces that
read alike apart; the names stay far below PostgreSQL's 63-byte limit. Tables
of their own, rather than a namespace column, keep one application's rows,
locks, grants and vacuum away from another's, and a namespace goes with a
``DROP TABLE``. They are created on first use, idempotently (``IF NOT
EXISTS``, ``CREATE OR REPLACE``), in one transaction holding a transaction-level
advisory lock, so instances starting together do not trip over each other's
DDL. A role that may not create tables needs them made once by one that may;
so does an upgrade that changes the trigger function: a store that finds the
trigger running another version's function replaces it (``CREATE OR REPLACE``).

Each step is one autocommit statement, with no session state, advisory lock or
server-side prepared statement, as PgBouncer in transaction mode requires:
``claim`` is ``INSERT ... ON CONFLICT (job) DO UPDATE ... WHERE <older slot,
ended or lapsed> RETURNING``; ``takeover`` is ``UPDATE ... WHERE <slot, token,
released or lapsed> RETURNING``; either, when it lost, reads the holder with a
``SELECT``. ``renew`` (state ``running``), ``dispatch`` (``dispatched``),
``finish`` and ``release`` are ``UPDATE ... WHERE <token, running or
dispatched>``; an end also matches the record that already carries the token
with that very end (re-sent), and leaves it unchanged. ``claim_many`` sends
every claim with its holder read in one pipeline: one round trip and one
implicit transaction, taking rows in job-name order so that two batches
cannot deadlock. Leases expire by the
server's ``clock_timestamp()`` (``now()`` stands still for a transaction, so a
statement that waited on a row lock would judge by a stale time). A row
trigger keeps the history inside the same statement, as in the SQLite store.

Caveats: libpq has no client-side query timeout, so a server that stops
answering while its host still acknowledges TCP (a frozen process) blocks a
call until it answers again; ``options=-c statement_timeout=5s`` in the URL
bounds lock waits where no PgBouncer sits in between (the tests run against
PostgreSQL 15 and 18 directly, not through PgBouncer). After a failover to an
asynchronous replica, the commits it had not received are lost, claims too.
"""

from __future__ import annotations

import hashlib
import math
import re
import select
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from ..durations import Duration, store_timeout
from ..errors import ConfigurationError, StoreUnavailable
from ..store import HISTORY, Claim, ClaimRequest, ClaimStatus, JobState, RunRecord, RunState, Store
from ..urls import redact, scrub, secrets_in

#: Seconds a call waits for a connection once the server was seen away.
_DOWN_WAIT = 1.0
#: The longest close() waits for the pool's threads.
CLOSE_WAIT = 1.0
_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)
_COLUMNS = "job, slot_ms, owner, attempt, token, state, "
_COLUMNS += "extract(epoch FROM lease_until - clock_timestamp())::float8"
_LEASE = "clock_timestamp() + make_interval(secs => %(lease)s::float8)"
_HELD_STATES = "('running', 'dispatched')"

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS {jobs} (job text PRIMARY KEY, slot_ms bigint NOT NULL,
        owner text NOT NULL, attempt integer NOT NULL, token bigint NOT NULL,
        state text NOT NULL, lease_until timestamptz NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS {runs} (job text, token bigint, slot_ms bigint NOT NULL,
        attempt integer NOT NULL, owner text NOT NULL, state text NOT NULL,
        started_at timestamptz NOT NULL, ended_at timestamptz, PRIMARY KEY (job, token))""",
    # A new token is a new attempt: close the previous one (lost when the same
    # slot is taken over, abandoned when a newer slot supersedes it; one that
    # already ended keeps its state), start the next, trim the oldest.
    f"""CREATE OR REPLACE FUNCTION {{log}}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
        IF TG_OP = 'UPDATE' AND NEW.token = OLD.token THEN
            -- Between running and dispatched the attempt stays open; done,
            -- failed and released end it; an unchanged state (a renewal, an
            -- end re-sent) leaves it be.
            IF NEW.state IS DISTINCT FROM OLD.state THEN
                UPDATE {{runs}} SET state = NEW.state, ended_at = CASE
                       WHEN NEW.state IN {_HELD_STATES} THEN ended_at ELSE clock_timestamp() END
                 WHERE job = NEW.job AND token = NEW.token;
            END IF;
            RETURN NULL;
        ELSIF TG_OP = 'UPDATE' THEN
            UPDATE {{runs}} SET ended_at = clock_timestamp(),
                   state = CASE WHEN NEW.slot_ms = OLD.slot_ms THEN 'lost' ELSE 'abandoned' END
             WHERE job = OLD.job AND token = OLD.token AND ended_at IS NULL;
            DELETE FROM {{runs}} WHERE job = NEW.job AND token <= NEW.token - {HISTORY};
        END IF;
        INSERT INTO {{runs}} VALUES (NEW.job, NEW.token, NEW.slot_ms, NEW.attempt,
            NEW.owner, NEW.state, clock_timestamp(), NULL);
        RETURN NULL;
    END $$""",
]
_HAS_TRIGGER = """SELECT 1 FROM pg_trigger
    WHERE tgrelid = to_regclass({name}) AND tgname = 'anarchon_history'"""
#: The trigger exists and runs this version's function: nothing to create or replace.
_IS_CURRENT = """SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
    WHERE t.tgrelid = to_regclass({name}) AND t.tgname = 'anarchon_history'
      AND p.prosrc = {body}"""
_TRIGGER = """CREATE TRIGGER anarchon_history AFTER INSERT OR UPDATE OF token, state
    ON {jobs} FOR EACH ROW EXECUTE FUNCTION {log}()"""
_STATEMENTS = {
    # NOT EXISTS spares the row lock (and the commit's WAL flush) of claims that
    # must lose, since slots only grow; ON CONFLICT's WHERE decides the rest.
    "claim": f"""INSERT INTO {{jobs}} AS j (job, slot_ms, owner, attempt, token, state,
            lease_until) SELECT %(job)s, %(slot)s, %(owner)s, 1, 1, 'running', {_LEASE}
        WHERE NOT EXISTS (SELECT FROM {{jobs}} WHERE job = %(job)s AND slot_ms >= %(slot)s)
        ON CONFLICT (job) DO UPDATE SET slot_ms = excluded.slot_ms, owner = excluded.owner,
            attempt = 1, token = j.token + 1, state = 'running', lease_until = {_LEASE}
        WHERE j.slot_ms < excluded.slot_ms
          AND (j.state NOT IN {_HELD_STATES} OR j.lease_until <= clock_timestamp())
        RETURNING {_COLUMNS}""",
    "takeover": f"""UPDATE {{jobs}} SET owner = %(owner)s, attempt = attempt + 1,
            token = token + 1, state = 'running', lease_until = {_LEASE}
        WHERE job = %(job)s AND slot_ms = %(slot)s AND token = %(token)s
          AND (state = 'released' OR (state = 'running' AND lease_until <= clock_timestamp()))
        RETURNING {_COLUMNS}""",
    # A renewal also picks a dispatched run up: it is running again.
    "renew": f"""UPDATE {{jobs}} SET state = 'running', lease_until = {_LEASE}
        WHERE job = %(job)s AND token = %(token)s AND state IN {_HELD_STATES}""",
    "dispatch": f"""UPDATE {{jobs}} SET state = 'dispatched', lease_until = {_LEASE}
        WHERE job = %(job)s AND token = %(token)s AND state IN {_HELD_STATES}""",
    # finish (done/failed) and release (released) alike end the lease now. The
    # same end re-sent matches too and changes nothing (its lease end stays).
    "end": f"""UPDATE {{jobs}} SET state = %(state)s, lease_until = CASE
            WHEN state = %(state)s THEN lease_until ELSE clock_timestamp() END
        WHERE job = %(job)s AND token = %(token)s
          AND (state IN {_HELD_STATES} OR state = %(state)s)""",
    "holder": f"SELECT {_COLUMNS} FROM {{jobs}} WHERE job = %(job)s",
    "states": f"SELECT {_COLUMNS} FROM {{jobs}} WHERE job = ANY(%(jobs)s)",
    "history": """SELECT job, slot_ms, attempt, token, owner, state,
            extract(epoch FROM started_at)::float8, extract(epoch FROM ended_at)::float8
        FROM {runs} WHERE job = %(job)s ORDER BY token DESC LIMIT %(limit)s""",
    "jobs": "SELECT job FROM {jobs}",
}


def table_prefix(namespace: str) -> str:
    """``anarchon_<readable namespace>_<hash>``, the prefix of a namespace's tables."""
    readable = re.sub(r"[^a-z0-9_]", "_", namespace.lower())[:24]
    return f"anarchon_{readable}_{hashlib.sha256(namespace.encode()).hexdigest()[:10]}"


def _dropped(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server dropped an idle pooled connection: it has input waiting."""
    if conn.closed:
        return True
    if not hasattr(select, "poll"):  # pragma: no cover - Windows
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


#: The URL options this store reads itself; the others go to libpq.
_ACCEPTED = "schema, timeout, pool_size"


#: libpq parameters with a fixed set of values, and those that take whole numbers:
#: checked when the store is opened (libpq would refuse them only when connecting).
_LIBPQ_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ),
    "load_balance_hosts": ("disable", "random"),
}
#: The largest value each takes (the operating system's, for the TCP options).
_LIBPQ_INTEGERS = {
    "port": 65535,
    "connect_timeout": 2**31 - 1,
    "keepalives": 1,
    "keepalives_idle": 32767,
    "keepalives_interval": 32767,
    "keepalives_count": 127,
    "tcp_user_timeout": 2**31 - 1,
}


def _check_libpq_values(conninfo: str, params: dict[str, Any]) -> None:
    for key, value in params.items():
        text = str(value)
        choices = _LIBPQ_CHOICES.get(key)
        if choices is not None and text not in choices:
            expected = f"one of {', '.join(choices)}"
        elif key in _LIBPQ_INTEGERS and not all(
            part.isascii() and part.isdigit() and int(part) <= _LIBPQ_INTEGERS[key]
            for part in text.split(",")
        ):
            expected = f"a whole number from 0 to {_LIBPQ_INTEGERS[key]}"
        else:
            continue
        raise ConfigurationError(
            f"PostgreSQL conninfo {redact(conninfo)!r}: {key}={text!r}: expected {expected}"
        )


def _recording(store: PostgresStore) -> type[psycopg.Connection[Any]]:
    """A connection class that keeps what libpq said when a connection failed.

    The pool connects in the background and only logs the error; a caller
    waiting for a connection would see "couldn't get a connection" alone.
    """
    owner = weakref.ref(store)

    class Recording(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                conn = super().connect(*args, **kwargs)
            except psycopg.Error as exc:
                found = owner()
                if found is not None:
                    found.connect_error = scrub(" ".join(str(exc).split()), found._secret)
                raise
            found = owner()
            if found is not None:
                found.connect_error = None
            return conn

    return Recording


class PostgresStore(Store):
    """The store contract on PostgreSQL; see the module docstring."""

    def __init__(
        self,
        *,
        conninfo: str | None = None,
        pool: ConnectionPool[Any] | None = None,
        namespace: str = "default",
        schema: str | None = None,
        timeout: Duration = 5.0,
        pool_size: int = 2,
    ) -> None:
        super().__init__(namespace=namespace)
        if (conninfo is None) == (pool is None):
            raise ConfigurationError("PostgresStore: give either conninfo or pool")
        self.timeout = store_timeout("timeout", timeout)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ConfigurationError(f"pool_size={pool_size!r}: expected a whole number >= 1")
        self._secret: str | None = None
        self._owns_pool = pool is None
        if pool is not None:
            self._pool, self._where = pool, f"pool {pool.name!r}"
        else:
            assert conninfo is not None
            try:
                params = conninfo_to_dict(conninfo)
            except psycopg.Error as exc:
                # Not chained, and scrubbed: libpq's message may quote the string.
                said = " ".join(str(exc).split())
                for secret in secrets_in(conninfo):
                    said = scrub(said, secret)
                raise ConfigurationError(
                    f"PostgreSQL conninfo {redact(conninfo)!r}: {said} (accepted: {_ACCEPTED}"
                    " and libpq's connection parameters)"
                ) from None
            _check_libpq_values(conninfo, params)
            self._secret = str(params.get("password") or "") or None
            host, port = params.get("host", ""), params.get("port", 5432)
            self._where = f"postgresql://{params.get('user', '')}@{host}:{port}/"
            self._where += str(params.get("dbname", ""))
            seconds = max(2, math.ceil(self.timeout))
            defaults = {"connect_timeout": seconds, "tcp_user_timeout": seconds * 1000}
            defaults |= {"keepalives_idle": seconds, "keepalives_interval": 1}
            self._pool = ConnectionPool(
                make_conninfo(conninfo, **{k: v for k, v in defaults.items() if k not in params}),
                connection_class=_recording(self),
                kwargs={"autocommit": True, "prepare_threshold": None},
                min_size=1,
                max_size=pool_size,
                timeout=self.timeout,
                # Stop the background reconnection soon: a call after that
                # connects at once instead of waiting out a backoff that has
                # grown for the whole outage.
                reconnect_timeout=_DOWN_WAIT * 2,
                name=f"anarchon-{namespace}",
                open=True,
            )
        prefix = table_prefix(namespace)
        names = {
            part: sql.Identifier(*([schema] if schema else []), f"{prefix}_{part}")
            for part in ("jobs", "runs", "log")
        }
        jobs = names["jobs"].as_string(None)
        self._sql = {k: sql.SQL(v).format(**names).as_bytes(None) for k, v in _STATEMENTS.items()}
        self._schema = [sql.SQL(s).format(**names).as_bytes(None) for s in _SCHEMA]
        self._trigger = sql.SQL(_TRIGGER).format(**names).as_bytes(None)
        self._has_trigger = sql.SQL(_HAS_TRIGGER).format(name=sql.Literal(jobs)).as_bytes(None)
        function = self._schema[-1].decode()
        body = sql.Literal(function[function.index("$$") + 2 : function.rindex("$$")])
        self._is_current = (
            sql.SQL(_IS_CURRENT).format(name=sql.Literal(jobs), body=body).as_bytes(None)
        )
        digest = hashlib.sha256(f"anarchon:{jobs}".encode()).digest()
        self._lock_key = int.from_bytes(digest[:8], "big", signed=True)
        self._ready = False
        self._ready_lock = threading.Lock()
        #: What libpq said when the pool last failed to connect (scrubbed), if it did.
        self.connect_error: str | None = None
        #: How long the next call waits for a pooled connection.
        self._wait = self.timeout

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> PostgresStore:
        """``postgresql://user:password@host:port/dbname?schema=&timeout=&pool_size=``."""
        parts = urlsplit(url)
        libpq = []
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in ("schema", "timeout", "pool_size") and not value:
                raise ConfigurationError(f"PostgreSQL URL {redact(url)!r}: {key} is empty")
            if key == "pool_size":
                if not (value.isascii() and value.isdigit()):
                    raise ConfigurationError(f"PostgreSQL URL {redact(url)!r}: pool_size={value!r}")
                options.setdefault(key, int(value))
            elif key in ("schema", "timeout"):
                options.setdefault(key, value)
            else:
                libpq.append((key, value))
        # quote, not quote_plus: libpq does not read "+" as a space.
        conninfo = urlunsplit(parts._replace(query=urlencode(libpq, quote_via=quote)))
        return cls(conninfo=conninfo, namespace=namespace, **options)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            conn = self._pool.getconn(self._wait)
            if _dropped(conn):
                # The server restarted or went away since this connection was
                # used: discard it and every other stale one, then get a new one.
                self._wait = min(self.timeout, _DOWN_WAIT)
                conn.close()
                self._pool.putconn(conn)
                self._pool.check()
                conn = self._pool.getconn(self._wait)
            try:
                if not self._ready:
                    self._create_schema(conn)
                yield conn
                if not conn.autocommit:
                    conn.commit()
            finally:
                self._pool.putconn(conn)
        except _UNAVAILABLE as exc:
            # While the server is away, fail fast instead of waiting the whole
            # timeout on every call: the engine backs off and decides leases.
            self._wait = min(self.timeout, _DOWN_WAIT)
            message = scrub(str(exc), self._secret)
            if isinstance(exc, PoolTimeout) and self.connect_error:
                # "couldn't get a connection" says nothing: say what the server said.
                message = f"cannot connect: {self.connect_error}"
            raise StoreUnavailable(f"PostgreSQL {self._where}: {message}") from exc
        self._wait = self.timeout

    def _create_schema(self, conn: psycopg.Connection[Any]) -> None:
        try:
            self._create_schema_now(conn)
        except _UNAVAILABLE:
            raise
        except psycopg.Error as exc:
            # A schema= that does not exist, a role that may not create tables:
            # the server's answer, told as an outage the engine rides out.
            said = scrub(" ".join(str(exc).split()), self._secret)
            raise StoreUnavailable(
                f"PostgreSQL {self._where}: cannot create the store's tables: {said}"
            ) from exc

    def _create_schema_now(self, conn: psycopg.Connection[Any]) -> None:
        with self._ready_lock:
            # An older version's function (an existing database) is replaced.
            if self._ready or conn.execute(self._is_current).fetchone():
                self._ready = True
                return
            with conn.transaction():
                # Concurrent CREATE ... IF NOT EXISTS or OR REPLACE can still
                # fail on catalog races; this lock ends with the transaction.
                conn.execute(b"SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                for statement in self._schema:
                    conn.execute(statement)
                if not conn.execute(self._has_trigger).fetchone():
                    conn.execute(self._trigger)
            self._ready = True

    def _write(self, statement: str, params: dict[str, Any]) -> tuple[Any, Any]:
        """A claim or takeover, then the holder's record if it lost: (won row, holder row)."""
        with self._connection() as conn:
            won = conn.execute(self._sql[statement], params).fetchone()
            # A statement of its own, after the write's commit: the write's
            # snapshot may predate the commit of the winner that made it lose.
            return won, None if won else conn.execute(self._sql["holder"], params).fetchone()

    def _claimed(self, slot_ms: int, won: Any, found: Any) -> Claim:
        """The answer to a claim from its won row, or else the holder's row read after it."""
        if won:
            return Claim(ClaimStatus.WON, self._job_state(won))
        return self._lost(slot_ms, self._job_state(found) if found else None)

    def claim(self, job: str, slot_ms: int, owner: str, lease: float) -> Claim:
        params = {"job": job, "slot": slot_ms, "owner": owner, "lease": lease}
        return self._claimed(slot_ms, *self._write("claim", params))

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """Every claim with its holder read in one pipeline: one round trip."""
        if not requests:
            return []
        # One implicit transaction holds the rows it locks until its end:
        # taking them in name order keeps two batches from deadlocking.
        order = sorted(range(len(requests)), key=lambda i: requests[i].job)
        with self._connection() as conn:
            with conn.pipeline():
                sent = {}
                for i in order:
                    r = requests[i]
                    params = {"job": r.job, "slot": r.slot_ms, "owner": owner, "lease": r.lease}
                    sent[i] = (
                        conn.execute(self._sql["claim"], params),
                        conn.execute(self._sql["holder"], params),
                    )
            return [
                self._claimed(r.slot_ms, sent[i][0].fetchone(), sent[i][1].fetchone())
                for i, r in enumerate(requests)
            ]

    def takeover(self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int) -> Claim:
        params = {"job": job, "slot": slot_ms, "owner": owner, "lease": lease, "token": seen_token}
        won, found = self._write("takeover", params)
        if won:
            return Claim(ClaimStatus.WON, self._job_state(won))
        return Claim(ClaimStatus.TAKEN, self._job_state(found) if found else None)

    def _change(self, statement: str, **params: Any) -> bool:
        with self._connection() as conn:
            return conn.execute(self._sql[statement], params).rowcount == 1

    def renew(self, job: str, token: int, lease: float) -> bool:
        return self._change("renew", job=job, token=token, lease=lease)

    def dispatch(self, job: str, token: int, pickup: float) -> bool:
        return self._change("dispatch", job=job, token=token, lease=pickup)

    def _end(self, job: str, token: int, state: RunState) -> bool:
        return self._change("end", job=job, token=token, state=state.value)

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(dict.fromkeys(jobs))
        if not names:
            return {}
        with self._connection() as conn:
            rows = conn.execute(self._sql["states"], {"jobs": names}).fetchall()
        return {row[0]: self._job_state(row) for row in rows}

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        with self._connection() as conn:
            rows = conn.execute(self._sql["history"], {"job": job, "limit": limit}).fetchall()
        return [self._run_record(row) for row in rows]

    def jobs(self) -> list[str]:
        with self._connection() as conn:
            # Sorted here rather than by the server's collation, as in every store.
            return sorted(row[0] for row in conn.execute(self._sql["jobs"]).fetchall())

    def close(self) -> None:
        """Close the pool if this store opened it."""
        if self._owns_pool:
            # The pool's threads may be opening a connection: a stop must not wait
            # for them long (they are daemons; the process may end under them).
            self._pool.close(timeout=CLOSE_WAIT)

    def __repr__(self) -> str:
        return f"<PostgresStore {self._where} namespace={self.namespace!r}>"
