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
50 attempts), ``..._paused`` (pause marks: job names, ``''`` for the
namespace, read by the claim statement itself), ``..._controls`` (control
entries, compare-and-set in one transaction), and a trigger function
``..._log``. ``<name>`` is the namespace
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

Each step is one autocommit statement, with no session state, session-level
advisory lock or server-side prepared statement, as PgBouncer in transaction
mode requires:
``claim`` is ``INSERT ... SELECT ... ON CONFLICT (job) DO UPDATE ... WHERE
<older slot, ended or lapsed> RETURNING``, then a ``SELECT`` of the holder;
``takeover`` is ``UPDATE ... WHERE <slot, token, released or lapsed>
RETURNING`` and, when it lost, a ``SELECT`` of the holder. ``renew`` (state
``running``), ``dispatch`` (``dispatched``), ``finish`` and ``release`` are
``UPDATE ... WHERE <token, running or dispatched>``; an end also matches the
record that already carries the token with that very end (re-sent), and
leaves it unchanged. ``claim_many`` is the claim's statement over arrays of
jobs (``unnest``; ``claim`` is a batch of one), then one ``SELECT`` of the
holders, in one pipeline: one round trip and one implicit transaction,
taking rows in job-name order so that two batches cannot deadlock; claims
with a limit make it an explicit transaction that first takes a
transaction-level advisory lock per job limited (sorted), so that the count
of claims won each reads stays as read until it commits (the locks end with
it, as PgBouncer's transaction mode needs);
``change_many`` (renewals and ends in a batch) sends one statement per
change in one pipeline, in name order likewise. Leases expire by the
server's ``clock_timestamp()`` (``now()`` stands still for a transaction, so a
statement that waited on a row lock would judge by a stale time). A row
trigger keeps the history inside the same statement, as in the SQLite store.

Caveats: libpq has no client-side query timeout, so a call is cut after
``CALL_TIMEOUTS`` times ``timeout`` (its socket shut down; a server that stops
answering while its host still acknowledges TCP, a frozen process or a hung
proxy, would otherwise block it for good) and raises ``StoreUnavailable``;
``options=-c statement_timeout=5s`` in the URL bounds lock waits where no
PgBouncer sits in between (the tests run against PostgreSQL 15 and 18
directly, not through PgBouncer). After a failover to an asynchronous
replica, the commits it had not received are lost, claims too.
"""

from __future__ import annotations

import hashlib
import math
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from ..durations import Duration, store_timeout
from ..errors import ConfigurationError, Conflict, StoreUnavailable
from ..names import table_prefix as table_prefix  # importable from here as before
from ..store import (
    HISTORY,
    NAMESPACE_PAUSE,
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
    item_by_item,
    one_by_one,
    refused,
)
from ..urls import redact, scrub, secrets_in
from . import _deadlines as deadlines
from ._sockets import input_waiting

#: The version of the layout this store writes in the server (keys, tables, records),
#: as docs/upgrading.md lists it: raised with every change of that layout.
LAYOUT_VERSION = 2

#: Seconds a call waits for a connection once the server was seen away.
_DOWN_WAIT = 1.0
#: The longest close() waits for the pool's threads.
CLOSE_WAIT = 1.0
#: A call (one use of a pooled connection) is cut after this many store timeouts.
CALL_TIMEOUTS = 2


def _cut(conn: psycopg.Connection[Any], cut: list[bool]) -> None:
    """Shut ``conn``'s socket down, so that a call blocked on it returns (an outage)."""
    import os
    import socket

    try:
        fd = conn.pgconn.socket
        cut.append(True)
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, psycopg.Error):
        pass


#: Errors about the server, not one call: the engine backs off and retries. A
#: session that may not write (a standby after a failover, a read-only
#: database) refuses every write alike.
_UNAVAILABLE = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    PoolTimeout,
    psycopg.errors.ReadOnlySqlTransaction,
)
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
    # Pause marks: a job's name, or '' for the whole namespace.
    "CREATE TABLE IF NOT EXISTS {paused} (job text PRIMARY KEY)",
    # Counts per job, kept by the trigger function with each change of a record.
    """CREATE TABLE IF NOT EXISTS {stats} (job text PRIMARY KEY, runs bigint NOT NULL,
        takeovers bigint NOT NULL, done bigint NOT NULL, failed bigint NOT NULL,
        last_done timestamptz, last_failed timestamptz)""",
    # Control entries; the row of key '' counts the namespace's writes (and
    # serializes them), so that versions never repeat.
    """CREATE TABLE IF NOT EXISTS {controls} (key text PRIMARY KEY, version bigint NOT NULL,
        value text NOT NULL)""",
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
                IF NEW.state IN ('done', 'failed') THEN
                    INSERT INTO {{stats}} VALUES (NEW.job, 0, 0,
                        (NEW.state = 'done')::int, (NEW.state = 'failed')::int,
                        CASE WHEN NEW.state = 'done' THEN clock_timestamp() END,
                        CASE WHEN NEW.state = 'failed' THEN clock_timestamp() END)
                    ON CONFLICT (job) DO UPDATE SET
                        done = {{stats}}.done + excluded.done,
                        failed = {{stats}}.failed + excluded.failed,
                        last_done = coalesce(excluded.last_done, {{stats}}.last_done),
                        last_failed = coalesce(excluded.last_failed, {{stats}}.last_failed);
                END IF;
            END IF;
            RETURN NULL;
        ELSIF TG_OP = 'UPDATE' THEN
            UPDATE {{runs}} SET ended_at = clock_timestamp(),
                   state = CASE WHEN NEW.slot_ms = OLD.slot_ms THEN 'lost' ELSE 'abandoned' END
             WHERE job = OLD.job AND token = OLD.token AND ended_at IS NULL;
            -- The newest HISTORY attempts are kept, by count: tokens are not consecutive.
            DELETE FROM {{runs}} WHERE job = NEW.job AND token <= (
                SELECT token FROM {{runs}} WHERE job = NEW.job
                 ORDER BY token DESC LIMIT 1 OFFSET {HISTORY - 1});
        END IF;
        INSERT INTO {{runs}} VALUES (NEW.job, NEW.token, NEW.slot_ms, NEW.attempt,
            NEW.owner, NEW.state, clock_timestamp(), NULL);
        INSERT INTO {{stats}} VALUES (NEW.job, 1, (NEW.attempt > 1)::int, 0, 0, NULL, NULL)
        ON CONFLICT (job) DO UPDATE SET runs = {{stats}}.runs + 1,
            takeovers = {{stats}}.takeovers + excluded.takeovers;
        RETURN NULL;
    END $$""",
]
#: The registry of live instances: created at the first announce, so that a
#: role that may not create it still runs every job (without the registry).
_REGISTRY = [
    """CREATE TABLE IF NOT EXISTS {instances} (instance text PRIMARY KEY, info text NOT NULL,
        seen_at timestamptz NOT NULL, expires_at timestamptz NOT NULL)""",
]
_HAS_TRIGGER = """SELECT 1 FROM pg_trigger
    WHERE tgrelid = to_regclass({name}) AND tgname = 'anarchon_history'"""
#: The trigger exists and runs this version's function: nothing to create or replace.
_IS_CURRENT = """SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
    WHERE t.tgrelid = to_regclass({name}) AND t.tgname = 'anarchon_history'
      AND p.prosrc = {body} AND to_regclass({paused}) IS NOT NULL
      AND to_regclass({controls}) IS NOT NULL
      AND obj_description(to_regclass({name}), 'pg_class') = {comment}"""
#: The jobs table's comment names its namespace (the table names hash it):
#: :meth:`PostgresStore.namespaces` reads them back.
_COMMENT = "COMMENT ON TABLE {jobs} IS {comment}"
_COMMENT_HEAD = "anarchon namespace "
#: The comments of the jobs tables of the store's schema (by default the first of
#: the search path), with the tables' names.
_NAMESPACES = """SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c
    WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'anarchon\\_%%\\_jobs'
      AND c.relnamespace = (SELECT oid FROM pg_namespace
                            WHERE nspname = coalesce(%(schema)s, current_schema()))"""
#: The lowest token of a new attempt: the server's clock in ms (decide.first_token).
_FIRST_CLAIM_NUMBER = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_TRIGGER = """CREATE TRIGGER anarchon_history AFTER INSERT OR UPDATE OF token, state
    ON {jobs} FOR EACH ROW EXECUTE FUNCTION {log}()"""
#: The statement of each change of a batch (any other state is an end).
_CHANGES = {RunState.RUNNING: "renew", RunState.DISPATCHED: "dispatch"}

_STATEMENTS = {
    # A claim of every job of a batch (one alone too), in one statement. NOT
    # EXISTS spares the row lock (and the commit's WAL flush) of claims that must
    # lose, since slots only grow; ON CONFLICT's WHERE decides the rest. Rows are
    # taken in name order by code point, the order of change_many's statements
    # (Python's sort): two batches lock shared rows in one order and cannot
    # deadlock.
    "claim_many": f"""INSERT INTO {{jobs}} AS j (job, slot_ms, owner, attempt, token, state,
            lease_until)
        SELECT r.job, r.slot, %(owner)s, 1, {_FIRST_CLAIM_NUMBER}, 'running',
               clock_timestamp() + make_interval(secs => r.lease)
          FROM unnest(%(jobs)s::text[], %(slots)s::bigint[], %(leases)s::float8[],
                      %(limits)s::bigint[])
               AS r(job, slot, lease, lim)
         WHERE NOT EXISTS (SELECT FROM {{jobs}} WHERE job = r.job AND slot_ms >= r.slot)
           AND NOT EXISTS (SELECT FROM {{paused}} WHERE job IN (r.job, ''))
           AND NOT EXISTS (SELECT FROM {{stats}} s
                           WHERE s.job = r.job AND s.runs - s.takeovers >= r.lim)
         ORDER BY r.job COLLATE "C"
        ON CONFLICT (job) DO UPDATE SET slot_ms = excluded.slot_ms, owner = excluded.owner,
            attempt = 1, token = greatest(j.token + 1, {_FIRST_CLAIM_NUMBER}), state = 'running',
            lease_until = excluded.lease_until
        WHERE j.slot_ms < excluded.slot_ms
          AND (j.state NOT IN {_HELD_STATES} OR j.lease_until <= clock_timestamp())
        RETURNING {_COLUMNS}""",
    "takeover": f"""UPDATE {{jobs}} SET owner = %(owner)s, attempt = attempt + 1,
            token = greatest(token + 1, {_FIRST_CLAIM_NUMBER}), state = 'running',
            lease_until = {_LEASE}
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
    "pause": "INSERT INTO {paused} VALUES (%(job)s) ON CONFLICT DO NOTHING",
    "resume": "DELETE FROM {paused} WHERE job = %(job)s",
    "pause_marks": "SELECT job FROM {paused}",
    "stats": """SELECT job, runs, takeovers, done, failed,
        extract(epoch FROM last_done)::float8, extract(epoch FROM last_failed)::float8
        FROM {stats} WHERE job = ANY(%(jobs)s)""",
    "controls": """SELECT key, version, value FROM {controls}
        WHERE key > '' AND EXISTS (SELECT FROM unnest(%(prefixes)s::text[]) AS p(prefix)
                                   WHERE starts_with(key, p.prefix))""",
    "control_count": """INSERT INTO {controls} VALUES ('', 1, '')
        ON CONFLICT (key) DO UPDATE SET version = {controls}.version + 1 RETURNING version""",
    "control_version": "SELECT version FROM {controls} WHERE key = %(key)s",
    "control_put": """INSERT INTO {controls} VALUES (%(key)s, %(version)s, %(value)s)
        ON CONFLICT (key) DO UPDATE SET version = excluded.version, value = excluded.value""",
    "control_delete": "DELETE FROM {controls} WHERE key = %(key)s",
    "paused_of": "SELECT job FROM {paused} WHERE job = ANY(%(jobs)s) OR job = ''",
    # The claims of a batch's jobs that carry a limit go one at a time per job: each
    # takes a transaction-level advisory lock of its job (in the order given: sorted)
    # before its claim reads the job's count, until it commits.
    "claim_locks": "SELECT pg_advisory_xact_lock(k) FROM unnest(%(keys)s::bigint[]) AS k",
    "claims_of": "SELECT job, runs - takeovers FROM {stats} WHERE job = ANY(%(jobs)s)",
    "announce": """INSERT INTO {instances} VALUES (%(instance)s, %(info)s, clock_timestamp(),
            clock_timestamp() + make_interval(secs => %(ttl)s::float8))
        ON CONFLICT (instance) DO UPDATE SET info = excluded.info, seen_at = excluded.seen_at,
            expires_at = excluded.expires_at""",
    "expire": "DELETE FROM {instances} WHERE expires_at <= clock_timestamp()",
    "withdraw": "DELETE FROM {instances} WHERE instance = %(instance)s",
    "instances": """SELECT instance, info,
            extract(epoch FROM clock_timestamp() - seen_at)::float8,
            extract(epoch FROM expires_at - clock_timestamp())::float8
        FROM {instances} WHERE expires_at > clock_timestamp() ORDER BY instance""",
}


def _dropped(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server dropped an idle pooled connection: it has input waiting."""
    return bool(conn.closed) or input_waiting(conn.fileno())


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
#: The smallest and largest value each takes (the operating system's, for the
#: TCP options: Linux refuses a keepalive time, interval or count of 0).
_LIBPQ_INTEGERS = {
    "port": (0, 65535),
    "connect_timeout": (0, 2**31 - 1),
    "keepalives": (0, 1),
    "keepalives_idle": (1, 32767),
    "keepalives_interval": (1, 32767),
    "keepalives_count": (1, 127),
    "tcp_user_timeout": (0, 2**31 - 1),
}


def _check_libpq_values(conninfo: str, params: dict[str, Any]) -> None:
    for key, value in params.items():
        text = str(value)
        choices = _LIBPQ_CHOICES.get(key)
        low, high = _LIBPQ_INTEGERS.get(key, (0, 0))
        if choices is not None and text not in choices:
            expected = f"one of {', '.join(choices)}"
        elif key in _LIBPQ_INTEGERS and not all(
            part.isascii() and part.isdigit() and low <= int(part) <= high
            for part in text.split(",")
        ):
            expected = f"a whole number from {low} to {high}"
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


class PostgresStore(LeaseStore, RegistryStore, ControlStore, OnceStore):
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
            except UnicodeDecodeError:
                # A percent-escape that is no UTF-8 (in the user, password, host
                # or database): libpq takes bytes, psycopg reads them as text.
                raise ConfigurationError(
                    f"PostgreSQL URL {redact(conninfo)!r}: a percent-escape (%XX) decodes to"
                    " bytes that are not UTF-8"
                ) from None
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
        self._schema_name = schema
        names = {
            part: sql.Identifier(*([schema] if schema else []), f"{prefix}_{part}")
            for part in ("jobs", "runs", "log", "instances", "paused", "controls", "stats")
        }
        jobs = names["jobs"].as_string(None)
        self._sql = {k: sql.SQL(v).format(**names).as_bytes(None) for k, v in _STATEMENTS.items()}
        self._schema = [sql.SQL(s).format(**names).as_bytes(None) for s in _SCHEMA]
        self._registry = [sql.SQL(s).format(**names).as_bytes(None) for s in _REGISTRY]
        self._registry_ready = False
        self._trigger = sql.SQL(_TRIGGER).format(**names).as_bytes(None)
        comment = sql.Literal(_COMMENT_HEAD + namespace)
        self._comment = sql.SQL(_COMMENT).format(comment=comment, **names).as_bytes(None)
        self._has_trigger = sql.SQL(_HAS_TRIGGER).format(name=sql.Literal(jobs)).as_bytes(None)
        instances = sql.Literal(names["instances"].as_string(None))
        self._registry_exists = (
            sql.SQL("SELECT to_regclass({}) IS NOT NULL").format(instances).as_bytes(None)
        )
        function = self._schema[-1].decode()
        body = sql.Literal(function[function.index("$$") + 2 : function.rindex("$$")])
        self._is_current = (
            sql.SQL(_IS_CURRENT)
            .format(
                name=sql.Literal(jobs),
                body=body,
                paused=sql.Literal(names["paused"].as_string(None)),
                controls=sql.Literal(names["controls"].as_string(None)),
                comment=comment,
            )
            .as_bytes(None)
        )
        digest = hashlib.sha256(f"anarchon:{jobs}".encode()).digest()
        self._lock_key = int.from_bytes(digest[:8], "big", signed=True)
        self._jobs_table = jobs
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
        cut: list[bool] = []  # set when the call's deadline cut it
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
            # libpq has no client-side query timeout: a call whose request or answer
            # is lost past the kernel (a proxy that hangs, a link that stalls while
            # TCP is still acknowledged) would wait forever. Past the deadline its
            # socket is shut down, which ends the call as an outage.
            deadline = deadlines.arm(self.timeout * CALL_TIMEOUTS, partial(_cut, conn, cut))
            try:
                if not self._ready:
                    self._create_schema(conn)
                yield conn
                if not conn.autocommit:
                    conn.commit()
            finally:
                deadline.cancel()
                self._pool.putconn(conn)
        except _UNAVAILABLE as exc:
            # While the server is away, fail fast instead of waiting the whole
            # timeout on every call: the engine backs off and decides leases.
            self._wait = min(self.timeout, _DOWN_WAIT)
            message = scrub(str(exc), self._secret)
            if cut:
                message = f"no answer within {self.timeout * CALL_TIMEOUTS:g} s: the call was cut"
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
                conn.execute(self._comment)
            self._ready = True

    def _write(self, statement: str, params: dict[str, Any]) -> tuple[Any, Any]:
        """A takeover, then the holder's record if it lost: (won row, holder row)."""
        with self._connection() as conn:
            won = conn.execute(self._sql[statement], params).fetchone()
            # A statement of its own, after the write's commit: the write's
            # snapshot may predate the commit of the winner that made it lose.
            return won, None if won else conn.execute(self._sql["holder"], params).fetchone()

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """One statement claims every job, one more reads the holders of those it lost:
        one pipeline, one round trip, one implicit transaction.

        The statement takes the rows in name order, so two batches cannot
        deadlock. The holders are read by a statement of their own, after the
        claims: its snapshot sees the winners that made a claim lose. A batch
        the server refuses (having applied nothing) is sent again claim by
        claim, so that only the claims it refuses alone are refused.
        """
        if not requests:
            return []
        if len({r.job for r in requests}) < len(requests):
            # One statement cannot change a row twice: each claim on its own.
            return one_by_one(
                lambda r: self.claim(r.job, r.slot_ms, owner, r.lease, r.limit),
                requests,
                psycopg.Error,
            )
        return item_by_item(lambda batch: self._claim_batch(batch, owner), requests, psycopg.Error)

    def _claim_batch(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """The batch's claims in one pipeline; see :meth:`claim_many`.

        Claims that carry a limit make it one transaction that first takes an
        advisory lock of each of their jobs (sorted: two batches cannot
        deadlock), so that the count each reads cannot change before it
        commits: only a claim changes a job's count of claims won, and every
        claim of the job with a limit waits for the lock.
        """
        params = {
            "owner": owner,
            "jobs": [r.job for r in requests],
            "slots": [r.slot_ms for r in requests],
            "leases": [float(r.lease) for r in requests],
            "limits": [r.limit for r in requests],
        }
        limited = sorted({r.job for r in requests if r.limit is not None})
        with self._connection() as conn:
            with conn.transaction() if limited else nullcontext(), conn.pipeline():
                if limited:
                    keys = sorted(self._claim_key(job) for job in limited)
                    conn.execute(self._sql["claim_locks"], {"keys": keys})
                claimed = conn.execute(self._sql["claim_many"], params)
                read = conn.execute(self._sql["states"], {"jobs": params["jobs"]})
                marks = conn.execute(self._sql["paused_of"], {"jobs": params["jobs"]})
                if limited:
                    counted = conn.execute(self._sql["claims_of"], {"jobs": limited})
            won = {row[0]: row for row in claimed.fetchall()}
            found = {row[0]: row for row in read.fetchall()}
            paused = {row[0] for row in marks.fetchall()}
            claims = {row[0]: int(row[1]) for row in counted.fetchall()} if limited else {}
        answers = []
        for r in requests:
            if r.job in won:
                answers.append(Claim(ClaimStatus.WON, self._job_state(won[r.job])))
                continue
            holder = self._job_state(found[r.job]) if r.job in found else None
            ended = r.limit is not None and claims.get(r.job, 0) >= r.limit
            halted = bool(paused & {r.job, NAMESPACE_PAUSE})
            answers.append(refused(r.slot_ms, holder, paused=halted, ended=ended))
        return answers

    def _claim_key(self, job: str) -> int:
        """The advisory lock of ``job``'s claims that carry a limit."""
        digest = hashlib.sha256(f"anarchon:{self._jobs_table}/{job}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        """Each takeover in turn, its own transaction; one the server refuses is refused alone."""
        return one_by_one(lambda r: self._takeover(r, owner), requests, psycopg.Error)

    def _takeover(self, r: TakeoverRequest, owner: str) -> Claim:
        params = {"job": r.job, "slot": r.slot_ms, "owner": owner, "lease": r.lease}
        won, found = self._write("takeover", {**params, "token": r.seen_token})
        if won:
            return Claim(ClaimStatus.WON, self._job_state(won))
        return Claim(ClaimStatus.TAKEN, self._job_state(found) if found else None)

    def _change(self, statement: str, **params: Any) -> bool:
        with self._connection() as conn:
            return conn.execute(self._sql[statement], params).rowcount == 1

    def _set_pause(self, key: str, on: bool) -> bool:
        return self._change("pause" if on else "resume", job=key)

    def _pause_marks(self) -> set[str]:
        with self._connection() as conn:
            return {row[0] for row in conn.execute(self._sql["pause_marks"]).fetchall()}

    def stats(self, jobs: Iterable[str]) -> dict[str, JobStats]:
        names = list(dict.fromkeys(jobs))
        if not names:
            return {}
        with self._connection() as conn:
            rows = conn.execute(self._sql["stats"], {"jobs": names}).fetchall()
        return {row[0]: JobStats(*row) for row in rows}

    def _controls(self, prefixes: tuple[str, ...]) -> dict[str, tuple[int, str]]:
        with self._connection() as conn:
            rows = conn.execute(self._sql["controls"], {"prefixes": list(prefixes)}).fetchall()
        return {key: (int(version), value) for key, version, value in rows}

    def _set_control(self, key: str, value: str | None, expected: int) -> int:
        with self._connection() as conn, conn.transaction():
            # The count's row lock orders every control write of the namespace.
            (version,) = conn.execute(self._sql["control_count"]).fetchone() or (0,)
            row = conn.execute(self._sql["control_version"], {"key": key}).fetchone()
            found = int(row[0]) if row else 0
            if found != expected:
                raise Conflict(key, expected, found)
            if value is None:
                conn.execute(self._sql["control_delete"], {"key": key})
                return 0
            params = {"key": key, "version": version, "value": value}
            conn.execute(self._sql["control_put"], params)
            return int(version)

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        """Every change in one pipeline, rows taken in job-name order: one round trip.

        A batch the server refuses (having applied nothing) is sent again
        change by change, so that only the changes it refuses alone are refused.
        """
        if not changes:
            return []
        return item_by_item(self._change_batch, changes, psycopg.Error)

    def _change_batch(self, changes: Sequence[Change]) -> list[bool]:
        order = sorted(range(len(changes)), key=lambda i: changes[i].job)
        with self._connection() as conn:
            with conn.pipeline():
                sent = {}
                for i in order:
                    c = changes[i]
                    statement = _CHANGES.get(c.state, "end")
                    params = {"job": c.job, "token": c.token, "lease": c.lease}
                    sent[i] = conn.execute(self._sql[statement], {**params, "state": c.state.value})
            return [sent[i].rowcount == 1 for i in range(len(changes))]

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

    def namespaces(self) -> list[str]:
        """The namespaces of the store's schema, named by their jobs table's comment.

        A namespace's tables created by an older release get the comment at
        the first start of this one.
        """
        with self._connection() as conn:
            rows = conn.execute(_NAMESPACES, {"schema": self._schema_name}).fetchall()
        found = []
        for table, comment in rows:
            namespace = (comment or "").removeprefix(_COMMENT_HEAD)
            # Only a comment that names the table's own namespace (one a user wrote may not).
            if comment != namespace and f"{table_prefix(namespace)}_jobs" == table:
                found.append(namespace)
        return sorted(found)

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        params = {"instance": instance, "info": info, "ttl": ttl}
        with self._connection() as conn:
            if not self._registry_ready:
                with conn.transaction():
                    conn.execute(b"SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                    for statement in self._registry:
                        conn.execute(statement)
                self._registry_ready = True
            with conn.pipeline():
                conn.execute(self._sql["announce"], params)
                conn.execute(self._sql["expire"])
                live = conn.execute(self._sql["instances"])
            return [self._instance_record(row) for row in live.fetchall()]

    def withdraw(self, instance: str) -> None:
        if self._registry_ready:
            with self._connection() as conn:
                conn.execute(self._sql["withdraw"], {"instance": instance})

    def instances(self) -> list[InstanceRecord]:
        with self._connection() as conn:
            exists = conn.execute(self._registry_exists).fetchone()
            if not exists or not exists[0]:
                return []
            rows = conn.execute(self._sql["instances"]).fetchall()
        return [self._instance_record(row) for row in rows]

    def close(self) -> None:
        """Close the pool if this store opened it."""
        if self._owns_pool:
            # The pool's threads may be opening a connection: a stop must not wait
            # for them long (they are daemons; the process may end under them).
            self._pool.close(timeout=CLOSE_WAIT)

    def __repr__(self) -> str:
        return f"<PostgresStore {self._where} namespace={self.namespace!r}>"

    # -- one-off runs: the table ..._once, its primary key (due_ms, job) the index read -----

    def _once_statements(self) -> dict[str, bytes]:
        """The one-off statements on this namespace's ``..._once`` table (made once)."""
        found: dict[str, bytes] | None = getattr(self, "_once_sql", None)
        if found is None:
            schema = self._schema_name
            table = sql.Identifier(
                *([schema] if schema else []), f"{table_prefix(self.namespace)}_once"
            )
            name = sql.Literal(table.as_string(None))
            found = {
                k: sql.SQL(v).format(once=table, name=name).as_bytes(None) for k, v in _ONCE.items()
            }
            self._once_sql = found
        return found

    def _once_exists(self, conn: psycopg.Connection[Any], create: bool) -> bool:
        """Whether the one-offs' table is there; with ``create``, made if not (under the
        namespace's lock, as the other tables). Reads make nothing: a role that may not
        create tables runs every job without it."""
        if getattr(self, "_once_ready", False):
            return True
        statements = self._once_statements()
        row = conn.execute(statements["exists"]).fetchone()
        if row is None or not row[0]:
            if not create:
                return False
            try:
                with conn.transaction():
                    conn.execute(b"SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                    conn.execute(statements["create"])
            except _UNAVAILABLE:
                raise
            except psycopg.Error as exc:
                said = scrub(" ".join(str(exc).split()), self._secret)
                raise StoreUnavailable(
                    f"PostgreSQL {self._where}: cannot create the one-offs' table: {said}"
                ) from exc
        self._once_ready = True
        return True

    def _add_once(self, entries: list[OnceEntry]) -> None:
        add = self._once_statements()["add"]
        for i in range(0, len(entries), _ONCE_CHUNK):
            chunk = entries[i : i + _ONCE_CHUNK]
            params = {
                "dues": [e.due_ms for e in chunk],
                "jobs": [e.job for e in chunk],
                "values": [e.value for e in chunk],
            }
            # Each chunk a call of its own, under its own deadline: a call's deadline
            # bounds one round trip's worth of work, and 100,000 entries are a hundred.
            with self._connection() as conn:
                self._once_exists(conn, create=True)
                conn.execute(add, params)

    def _once_rows(self, statement: str, params: dict[str, Any]) -> list[OnceEntry]:
        with self._connection() as conn:
            if not self._once_exists(conn, create=False):
                return []
            rows = conn.execute(self._once_statements()[statement], params).fetchall()
        return [OnceEntry(int(due), job, value) for due, job, value in rows]

    def _once_due(
        self, until_ms: int, limit: int, after: tuple[int, str] | None
    ) -> list[OnceEntry]:
        start, job = after if after is not None else (-1, "")
        params = {"until": until_ms, "from": start, "after": job, "limit": limit}
        return self._once_rows("due", params)

    def _remove_once(self, job: str, due_ms: int) -> bool:
        with self._connection() as conn:
            if not self._once_exists(conn, create=False):
                return False
            cursor = conn.execute(self._once_statements()["remove"], {"due": due_ms, "job": job})
            return cursor.rowcount == 1

    def _pending_once(self, job: str | None, limit: int) -> list[OnceEntry]:
        return self._once_rows("pending", {"job": job or "", "limit": limit})


#: Entries written per statement.
_ONCE_CHUNK = 1000
#: The one-offs' statements; ``{once}`` the table, ``{name}`` its name as a literal. The
#: job's collation is "C" (code point order, as Python sorts): reads and their cursor
#: agree with the engine's order of (due time, job).
_ONCE = {
    "exists": "SELECT to_regclass({name}) IS NOT NULL",
    "create": """CREATE TABLE IF NOT EXISTS {once} (due_ms bigint NOT NULL,
        job text COLLATE "C" NOT NULL, value text NOT NULL, PRIMARY KEY (due_ms, job))""",
    "add": """INSERT INTO {once} SELECT * FROM unnest(%(dues)s::bigint[], %(jobs)s::text[],
            %(values)s::text[])
        ON CONFLICT (due_ms, job) DO UPDATE SET value = excluded.value""",
    "due": """SELECT due_ms, job, value FROM {once}
        WHERE due_ms <= %(until)s AND (due_ms, job) > (%(from)s, %(after)s)
        ORDER BY due_ms, job LIMIT %(limit)s""",
    "remove": "DELETE FROM {once} WHERE due_ms = %(due)s AND job = %(job)s",
    "pending": """SELECT due_ms, job, value FROM {once} WHERE %(job)s = '' OR job = %(job)s
        ORDER BY due_ms, job LIMIT %(limit)s""",
}
