"""MySQL and MariaDB: a server store for instances on many machines (PyMySQL).

URL: ``mysql://user:password@host:3306/dbname?OPTIONS`` (or ``mariadb://``).
Options: ``timeout=SECONDS`` (default 5), the bound of every call: connecting,
each read and write on the connection, the wait for a pooled connection and
for a row lock (``innodb_lock_wait_timeout``), past which a call raises
``StoreUnavailable``; ``pool_size=N`` (default 2), the most connections
opened; TLS: ``ssl_mode`` (``disabled``, ``preferred``, the default: TLS when
the server offers it, ``required``, ``verify_ca``, ``verify_identity``, as the
``mysql`` client names them), ``ssl_ca``, ``ssl_cert``, ``ssl_key`` (PEM files;
``ssl_ca`` alone means ``verify_ca``); ``unix_socket=PATH`` instead of TCP.

Tables: each namespace has its own, ``anarchon_<name>_<hash>_jobs`` (a row per
job: slot, owner, attempt, token, state, lease end), ``..._runs`` (the last 50
attempts), ``..._stats`` (counts per job), ``..._paused`` (pause marks: job
names, ``''`` for the namespace), ``..._controls`` (control entries) and
``..._instances`` (the registry), named as the PostgreSQL store names its own
(:func:`~anarchon_core.names.table_prefix`), all InnoDB. They are created on
first use (``CREATE TABLE IF NOT EXISTS``); the jobs table's comment, ``anarchon
schema N namespace NS``, names the namespace (:meth:`MySQLStore.namespaces`)
and the version of the layout, which a later release reads to migrate it
(tables of a newer layout than this release's are refused, not misread).
No trigger, stored function or event is made: an account that may create
tables is enough, on managed servers with binary logging too.

Each write step is one transaction holding the row locks it needs: it locks
the jobs' rows (``SELECT ... FOR UPDATE``, in key order, so two batches cannot
deadlock), applies the decision table of :mod:`anarchon_core.decide` to them
with the server's ``now`` (and, for claims with a limit, the jobs' counts of
claims won) read after the locks, and writes the records, the
history and the counts it says, then commits: two round trips per batch,
whatever its size, the second one the writes and ``COMMIT`` together. A claim
that finds no row inserts one with a plain ``INSERT``: a concurrent claim of
the same new job fails on the duplicate key and is retried, and then reads
the winner's row. Deadlock victims and those duplicates are retried (nothing
of theirs was applied); lock wait timeouts, lost connections ("server has
gone away") and refused connections raise ``StoreUnavailable``, which the
engine rides out. Sessions run ``READ COMMITTED`` (no gap locks) with the
time zone ``+00:00``; leases are Unix seconds of the server's ``NOW(6)``.

Caveats: a read timeout cannot tell whether a ``COMMIT`` it carried was
applied; the engine treats it as any outage (the record, read again, says).
After a failover to an asynchronous replica, the commits it had not received
are lost, claims too.
"""

from __future__ import annotations

import contextlib
import math
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar
from urllib.parse import unquote, urlsplit

import pymysql
from pymysql.constants import CLIENT

from .. import decide
from ..decide import Decision, Record
from ..durations import Duration, store_timeout
from ..errors import ConfigurationError, Conflict, StoreUnavailable
from ..names import table_prefix
from ..store import (
    HELD_STATES,
    HISTORY,
    NAMESPACE_PAUSE,
    Change,
    Claim,
    ClaimRequest,
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
)
from ..urls import redact, scrub, url_options
from ._sockets import input_waiting

A = TypeVar("A")

#: The version of the tables' layout, in the jobs table's comment (docs/upgrading.md).
SCHEMA_VERSION = 1
#: As the other stores name it.
LAYOUT_VERSION = SCHEMA_VERSION
_COMMENT_HEAD = "anarchon schema "
#: Seconds a call waits for a connection once the server was seen away.
_DOWN_WAIT = 1.0
#: Times a transaction is tried when it is a deadlock's victim or raced on a new row.
_TRIES = 5
#: MySQL's error numbers: a deadlock's victim, a duplicate key (two claims of a new
#: job), and MariaDB's "record has changed since last read" (a snapshot conflict).
_RETRIED = {1213, 1062, 1020}
# The error classes are named as the package exports them (``pymysql.Error``),
# which are the classes PyMySQL raises. ``pymysql.err`` is not used: a Django
# project on PyMySQL (``pymysql.install_as_MySQLdb()``) imports ``MySQLdb.err``,
# which loads pymysql/err.py a second time, with classes of its own, and rebinds
# the attribute ``pymysql.err`` to that copy, whose classes PyMySQL never raises.

#: Errors about the server or the connection, not one item: the engine backs off.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    pymysql.OperationalError,
    pymysql.InterfaceError,
    pymysql.InternalError,
    OSError,
)
#: Errors of a value the server refuses (too long, out of range): refused alone.
_REFUSED = (pymysql.DataError, pymysql.IntegrityError)
_SSL_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
_ACCEPTED = ("timeout", "pool_size", "ssl_mode", "ssl_ca", "ssl_cert", "ssl_key", "unix_socket")

#: Names and keys are binary: compared and ordered byte for byte (MySQL's text
#: collations ignore trailing spaces, which a job name may end with), the UTF-8
#: bytes of a name in the order of its code points, as Python sorts.
_NAME = "VARBINARY(800) NOT NULL"
_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS `{runs}` (job {name}, token BIGINT NOT NULL,
        slot_ms BIGINT NOT NULL, attempt INT NOT NULL, owner TEXT NOT NULL,
        state VARCHAR(16) NOT NULL, started_at DOUBLE NOT NULL, ended_at DOUBLE NULL,
        PRIMARY KEY (job, token)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS `{stats}` (job {name} PRIMARY KEY, runs BIGINT NOT NULL,
        takeovers BIGINT NOT NULL, done BIGINT NOT NULL, failed BIGINT NOT NULL,
        last_done DOUBLE NULL, last_failed DOUBLE NULL) ENGINE=InnoDB""",
    # Pause marks: a job's name, or '' for the whole namespace.
    "CREATE TABLE IF NOT EXISTS `{paused}` (job {name} PRIMARY KEY) ENGINE=InnoDB",
    # Control entries; the row of key '' counts the namespace's writes (and
    # serializes them), so that versions never repeat.
    """CREATE TABLE IF NOT EXISTS `{controls}` (`key` VARBINARY(1200) NOT NULL PRIMARY KEY,
        version BIGINT NOT NULL, value MEDIUMTEXT NOT NULL)
        ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS `{instances}` (instance {name} PRIMARY KEY,
        info TEXT NOT NULL, seen_at DOUBLE NOT NULL, expires_at DOUBLE NOT NULL)
        ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # The jobs table last: its comment says the others are there.
    """CREATE TABLE IF NOT EXISTS `{jobs}` (job {name} PRIMARY KEY, slot_ms BIGINT NOT NULL,
        owner TEXT NOT NULL, attempt INT NOT NULL, token BIGINT NOT NULL,
        state VARCHAR(16) NOT NULL, lease_until DOUBLE NOT NULL)
        ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT={comment}""",
]
#: The server's clock, Unix seconds to the microsecond (the session's time zone is UTC).
_NOW = "UNIX_TIMESTAMP(NOW(6))"
_RECORD = "job, slot_ms, owner, attempt, token, state, lease_until"
_STATEMENTS = {
    "lock": f"SELECT {_RECORD} FROM `{{jobs}}` WHERE job IN ({{marks}}) ORDER BY job FOR UPDATE",
    "now": f"SELECT {_NOW}",
    "paused_of": "SELECT job FROM `{paused}` WHERE job IN ({marks}) OR job = ''",
    "claims_of": "SELECT job, runs - takeovers FROM `{stats}` WHERE job IN ({marks})",
    "insert": f"INSERT INTO `{{jobs}}` ({_RECORD}) VALUES {{rows}}",
    "replace": f"""INSERT INTO `{{jobs}}` ({_RECORD}) VALUES {{rows}}
        ON DUPLICATE KEY UPDATE slot_ms = VALUES(slot_ms), owner = VALUES(owner),
            attempt = VALUES(attempt), token = VALUES(token), state = VALUES(state),
            lease_until = VALUES(lease_until)""",
    "run_end": """UPDATE `{runs}` SET state = %s, ended_at = %s
        WHERE ended_at IS NULL AND (job, token) IN ({pairs})""",
    "run_start": "INSERT INTO `{runs}` VALUES {rows}",
    # The newest HISTORY attempts of each job are kept, by count (tokens are not
    # consecutive: decide.next_token).
    "run_trim": f"""DELETE r FROM `{{runs}}` r JOIN (
        SELECT job, token FROM (
            SELECT job, token, ROW_NUMBER() OVER (PARTITION BY job ORDER BY token DESC) AS n
              FROM `{{runs}}` WHERE job IN ({{names}})) ranked
         WHERE n > {HISTORY}) old ON r.job = old.job AND r.token = old.token""",
    "count": """INSERT INTO `{stats}` VALUES {rows} ON DUPLICATE KEY UPDATE
        runs = runs + VALUES(runs), takeovers = takeovers + VALUES(takeovers),
        done = done + VALUES(done), failed = failed + VALUES(failed),
        last_done = COALESCE(VALUES(last_done), last_done),
        last_failed = COALESCE(VALUES(last_failed), last_failed)""",
    "states": f"""SELECT job, slot_ms, owner, attempt, token, state, lease_until - {_NOW}
        FROM `{{jobs}}` WHERE job IN ({{marks}})""",
    "history": """SELECT job, slot_ms, attempt, token, owner, state, started_at, ended_at
        FROM `{runs}` WHERE job = %s ORDER BY token DESC LIMIT %s""",
    "jobs": "SELECT job FROM `{jobs}`",
    "stats": """SELECT job, runs, takeovers, done, failed, last_done, last_failed
        FROM `{stats}` WHERE job IN ({marks})""",
    "pause": "INSERT IGNORE INTO `{paused}` VALUES (%s)",
    "resume": "DELETE FROM `{paused}` WHERE job = %s",
    "pause_marks": "SELECT job FROM `{paused}`",
    "controls": """SELECT `key`, version, value FROM `{controls}`
        WHERE `key` > '' AND ({starts})""",
    "control_count": """INSERT INTO `{controls}` VALUES ('', 1, '')
        ON DUPLICATE KEY UPDATE version = version + 1""",
    "control_read": "SELECT `key`, version FROM `{controls}` WHERE `key` IN ('', %s)",
    "control_put": """INSERT INTO `{controls}` VALUES (%s, %s, %s)
        ON DUPLICATE KEY UPDATE version = VALUES(version), value = VALUES(value)""",
    "control_delete": "DELETE FROM `{controls}` WHERE `key` = %s",
    "announce": f"""INSERT INTO `{{instances}}` VALUES (%s, %s, {_NOW}, {_NOW} + %s)
        ON DUPLICATE KEY UPDATE info = VALUES(info), seen_at = VALUES(seen_at),
            expires_at = VALUES(expires_at)""",
    "expire": f"DELETE FROM `{{instances}}` WHERE expires_at <= {_NOW}",
    "withdraw": "DELETE FROM `{instances}` WHERE instance = %s",
    "instances": f"""SELECT instance, info, {_NOW} - seen_at, expires_at - {_NOW}
        FROM `{{instances}}` WHERE expires_at > {_NOW} ORDER BY instance""",
}
#: The jobs tables of the connection's database, with their comments.
_TABLES = """SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'anarchon\\_%%\\_jobs'"""
_COMMENT_OF = """SELECT TABLE_COMMENT FROM information_schema.TABLES
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"""


class _Seen(NamedTuple):
    """What a transaction read besides the records, once it held their locks."""

    #: The pause marks of the jobs and of the namespace.
    paused: set[str]
    #: The claims won so far (runs less takeovers) of the jobs asked for.
    claims: dict[str, int]


class _Later(dict[str, str]):
    """Names given now to ``str.format_map``; any other field is kept for a later format."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _marks(count: int) -> str:
    return ", ".join(["%s"] * count)


def _text(value: Any) -> str:
    """A name read back from a binary column."""
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _dropped(conn: pymysql.connections.Connection) -> bool:
    """Whether an idle pooled connection is closed or was dropped by the server."""
    sock = getattr(conn, "_sock", None)  # the driver has no public fileno()
    return not conn.open or sock is None or input_waiting(sock.fileno())


class _Pool:
    """At most ``size`` connections, opened on demand; a broken one is closed, not kept."""

    def __init__(self, connect: Callable[[], pymysql.connections.Connection], size: int) -> None:
        self._connect = connect
        self._size = size
        self._idle: list[pymysql.connections.Connection] = []
        self._opened = 0
        self._free = threading.Condition()
        self._closed = False

    def get(self, wait: float) -> pymysql.connections.Connection:
        deadline = time.monotonic() + wait
        with self._free:
            while True:
                if self._closed:
                    raise pymysql.InterfaceError(0, "the store is closed")
                while self._idle:
                    conn = self._idle.pop()
                    if not _dropped(conn):
                        return conn
                    self._discard(conn)
                if self._opened < self._size:
                    self._opened += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise pymysql.OperationalError(
                        0, f"no pooled connection came free within {wait:g} s"
                    )
                self._free.wait(left)
        try:
            return self._connect()
        except BaseException:
            with self._free:
                self._opened -= 1
                self._free.notify()
            raise

    def put(self, conn: pymysql.connections.Connection, healthy: bool) -> None:
        with self._free:
            if healthy and conn.open and not self._closed:
                self._idle.append(conn)
            else:
                self._discard(conn)
            self._free.notify()

    def _discard(self, conn: pymysql.connections.Connection) -> None:
        self._opened -= 1
        _close(conn)

    def close(self) -> None:
        with self._free:
            self._closed = True
            while self._idle:
                self._discard(self._idle.pop())
            self._free.notify_all()


def _tls(mode: str | None, ca: str | None, cert: str | None, key: str | None) -> dict[str, Any]:
    """PyMySQL's TLS arguments for ``ssl_mode`` and the PEM files."""
    if mode is None:
        mode = "verify_ca" if ca else "preferred"
    if mode == "disabled":
        if ca or cert or key:
            raise ConfigurationError("ssl_mode=disabled with ssl_ca, ssl_cert or ssl_key")
        return {"ssl_disabled": True}
    if mode == "preferred" and not (cert or key):
        # The driver's own default (PyMySQL 1.2): TLS when the server offers it,
        # unverified, else plain.
        return {}
    context = ssl.create_default_context(cafile=ca)
    if mode in ("preferred", "required"):
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    else:
        context.check_hostname = mode == "verify_identity"
        context.verify_mode = ssl.CERT_REQUIRED
    if cert or key:
        if not (cert and key):
            raise ConfigurationError("ssl_cert and ssl_key go together")
        context.load_cert_chain(cert, key)
    # A context given to the driver makes TLS required: refused if the server lacks it.
    return {"ssl": context}


class MySQLStore(LeaseStore, RegistryStore, ControlStore, OnceStore):
    """The store contract on MySQL or MariaDB; see the module docstring."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 3306,
        user: str = "root",
        password: str | None = None,
        database: str,
        namespace: str = "default",
        timeout: Duration = 5.0,
        pool_size: int = 2,
        ssl_mode: str | None = None,
        ssl_ca: str | None = None,
        ssl_cert: str | None = None,
        ssl_key: str | None = None,
        unix_socket: str | None = None,
    ) -> None:
        super().__init__(namespace=namespace)
        self.timeout = store_timeout("timeout", timeout)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ConfigurationError(f"pool_size={pool_size!r}: expected a whole number >= 1")
        if not database:
            raise ConfigurationError("MySQL store: no database (mysql://user@host:3306/DATABASE)")
        if ssl_mode is not None and ssl_mode.lower() not in _SSL_MODES:
            raise ConfigurationError(
                f"ssl_mode={ssl_mode!r}: expected one of {', '.join(_SSL_MODES)}"
            )
        try:
            tls = _tls(ssl_mode and ssl_mode.lower(), ssl_ca, ssl_cert, ssl_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"MySQL store: TLS files: {exc}") from None
        self._secret = password or None
        where = unix_socket or f"{host}:{port}"
        self._where = f"mysql://{user}@{where}/{database}"
        seconds = self.timeout
        # Whole seconds, under the read timeout: a lock wait ends with the server's
        # answer (the connection stays usable) rather than a lost connection.
        lock_wait = max(1, math.ceil(seconds) - 1)
        self._params: dict[str, Any] = {
            "host": host,
            "port": port,
            "user": user,
            "password": password or "",
            "database": database,
            "unix_socket": unix_socket,
            "connect_timeout": seconds,
            "read_timeout": seconds,
            "write_timeout": seconds,
            "autocommit": True,
            "charset": "utf8mb4",
            # FOUND_ROWS: an UPDATE answers the rows it matched, not those it changed.
            "client_flag": CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS,
            "init_command": (
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;"
                f" SET SESSION time_zone = '+00:00', SESSION innodb_lock_wait_timeout = {lock_wait}"
            ),
            **tls,
        }
        self._pool = _Pool(self._open, pool_size)
        prefix = table_prefix(namespace)
        self._tables = {
            part: f"{prefix}_{part}"
            for part in ("jobs", "runs", "stats", "paused", "controls", "instances")
        }
        comment = pymysql.converters.escape_string(self._comment())
        self._schema = [
            s.format(name=_NAME, comment=f"'{comment}'", **self._tables) for s in _SCHEMA
        ]
        # The tables' names now; the lists of a call's values ({marks}, {rows}...) per call.
        self._sql = {k: v.format_map(_Later(self._tables)) for k, v in _STATEMENTS.items()}
        self._ready = False
        self._ready_lock = threading.Lock()
        #: How long the next call waits for a pooled connection.
        self._wait = self.timeout

    def _comment(self) -> str:
        return f"{_COMMENT_HEAD}{SCHEMA_VERSION} namespace {self.namespace}"

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> MySQLStore:
        """``mysql://user:password@host:port/dbname?timeout=&pool_size=&ssl_mode=...``."""
        name = urlsplit(url).scheme.lower()
        store = "MariaDB" if name == "mariadb" else "MySQL"
        for key, value in url_options(url, store, _ACCEPTED):
            if not value:
                raise ConfigurationError(f"{store} URL {redact(url)!r}: {key} is empty")
            if key == "pool_size":
                if not (value.isascii() and value.isdigit()):
                    raise ConfigurationError(f"{store} URL {redact(url)!r}: pool_size={value!r}")
                options.setdefault(key, int(value))
            else:
                options.setdefault(key, value)
        parts = urlsplit(url)
        try:
            port = parts.port or 3306
        except ValueError:
            raise ConfigurationError(
                f"{store} URL {redact(url)!r}: the port is not 0-65535"
            ) from None
        database = unquote(parts.path.lstrip("/"))
        if not database or "/" in database:
            raise ConfigurationError(
                f"{store} URL {redact(url)!r}: name one database, as in mysql://user@host:3306/db"
            )
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=port,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password) if parts.password is not None else None,
            database=database,
            namespace=namespace,
            **options,
        )

    # -- connections -----------------------------------------------------------

    def _open(self) -> pymysql.connections.Connection:
        return pymysql.connect(**self._params)

    @contextmanager
    def _connection(self) -> Iterator[pymysql.connections.Connection]:
        try:
            conn = self._pool.get(self._wait)
            healthy = False
            try:
                if not self._ready:
                    self._create_schema(conn)
                yield conn
                healthy = True
            except _UNAVAILABLE:
                raise
            except BaseException:
                # Refused by the server, or a conflict: the connection stays usable.
                healthy = conn.open
                raise
            finally:
                self._pool.put(conn, healthy)
        except _UNAVAILABLE as exc:
            # While the server is away, fail fast instead of waiting the whole
            # timeout on every call: the engine backs off and decides leases.
            self._wait = min(self.timeout, _DOWN_WAIT)
            said = scrub(" ".join(str(exc).split()), self._secret)
            raise StoreUnavailable(f"MySQL {self._where}: {said}") from exc
        self._wait = self.timeout

    def _create_schema(self, conn: pymysql.connections.Connection) -> None:
        with self._ready_lock:
            if self._ready:
                return
            with conn.cursor() as cur:
                cur.execute(_COMMENT_OF, (self._tables["jobs"],))
                row = cur.fetchone()
                if row is None:
                    try:
                        for statement in self._schema:
                            cur.execute(statement)
                    except pymysql.MySQLError as exc:
                        said = scrub(" ".join(str(exc).split()), self._secret)
                        raise pymysql.OperationalError(
                            0, f"cannot create the store's tables: {said}"
                        ) from exc
                else:
                    version = _schema_version(_text(row[0]))
                    if version != SCHEMA_VERSION:
                        raise pymysql.OperationalError(
                            0,
                            f"the tables of namespace {self.namespace!r} have layout version"
                            f" {version}, this release reads {SCHEMA_VERSION}: run the release"
                            " that made them, or a newer one",
                        )
            self._ready = True

    @contextmanager
    def _cursor(self) -> Iterator[pymysql.cursors.Cursor]:
        """A cursor in autocommit: each statement its own atomic step."""
        with self._connection() as conn, conn.cursor() as cur:
            yield cur

    def _transaction(
        self,
        reads: list[tuple[str, Sequence[Any]]],
        decide: Callable[[list[Sequence[Any]]], tuple[list[tuple[str, list[Any]]], A]],
    ) -> A:
        """A transaction in two round trips: ``reads``, then what ``decide`` writes, committed.

        The first round trip starts the transaction and runs ``reads`` (those
        that lock rows, ``FOR UPDATE``, first); ``decide`` gets the rows of
        each and answers the statements to write and the answer; the second
        sends the writes and ``COMMIT`` together. A deadlock's victim, or a
        transaction that raced another on a new row, is rolled back and run
        again from the start (nothing of it was applied).
        """
        for attempt in range(_TRIES):
            with self._connection() as conn, conn.cursor() as cur:
                try:
                    results = _run(cur, [("START TRANSACTION", ()), *reads])[1:]
                    writes, answer = decide(results)
                    _run(cur, [*writes, ("COMMIT", ())])
                    return answer
                except pymysql.MySQLError as exc:
                    _roll_back(conn)
                    code = exc.args[0] if exc.args else 0
                    if code in _RETRIED and attempt < _TRIES - 1:
                        time.sleep(0.005 * (attempt + 1))
                        continue
                    raise
                except BaseException:
                    _roll_back(conn)
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the decisions ---------------------------------------------------------

    def _decide(
        self,
        jobs: Sequence[str],
        rule: Callable[[int, Record | None, float, _Seen], Decision[A]],
        *,
        pauses: bool = False,
        counted: Sequence[str] = (),
    ) -> list[A]:
        """Lock ``jobs``' rows, decide each item by ``rule``, write what it says, commit.

        ``rule(i, record, now, seen)`` decides item ``i``; every job appears
        once. The server's ``now`` is read after the locks are granted, and so
        are (in ``seen``) the pause marks (with ``pauses``) and the claims won
        of the jobs ``counted``: only a step that holds a job's row lock (or
        inserts it) changes its counts.
        """
        names = sorted(set(jobs))
        marks = _marks(len(names))
        reads: list[tuple[str, Sequence[Any]]] = [
            (self._sql["lock"].format(marks=marks), names),
            (self._sql["now"], ()),
        ]
        if pauses:
            reads.append((self._sql["paused_of"].format(marks=marks), names))
        counted = sorted(set(counted))
        if counted:
            reads.append((self._sql["claims_of"].format(marks=_marks(len(counted))), counted))

        def decided(results: list[Sequence[Any]]) -> tuple[list[tuple[str, list[Any]]], list[A]]:
            records = {_text(row[0]): _record(row) for row in results[0]}
            now = float(results[1][0][0])
            marked = {_text(row[0]) for row in results[2]} if pauses else set()
            claims = {_text(row[0]): int(row[1]) for row in results[-1]} if counted else {}
            seen = _Seen(marked, claims)
            olds = [records.get(job) for job in jobs]
            steps = [rule(i, old, now, seen) for i, old in enumerate(olds)]
            writes = self._writes(list(zip(olds, steps, strict=True)), now)
            return writes, [step.answer for step in steps]

        return self._transaction(reads, decided)

    def _writes(
        self, steps: list[tuple[Record | None, Decision[Any]]], now: float
    ) -> list[tuple[str, list[Any]]]:
        """The statements that write what the decisions say: records, history, counts.

        Each kind of write is one statement for the whole batch, in job order.
        """
        written = sorted(
            ((old, d.record, d) for old, d in steps if d.record is not None),
            key=lambda step: step[1].job,
        )
        writes: list[tuple[str, list[Any]]] = []
        for kind, chosen in (
            ("insert", [new for old, new, _ in written if old is None]),
            ("replace", [new for old, new, _ in written if old is not None]),
        ):
            if chosen:
                rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chosen))
                values: list[Any] = [
                    v
                    for r in chosen
                    for v in (
                        *(r.job, r.slot_ms, r.owner, r.attempt, r.token),
                        *(r.state.value, r.lease_until),
                    )
                ]
                writes.append((self._sql[kind].format(rows=rows), values))
        # The attempt open before the step: ended (or moved between running and dispatched).
        ends: dict[RunState, list[Any]] = {}
        for old, _, d in written:
            if d.previous is not None and old is not None:
                ends.setdefault(d.previous, []).extend((old.job, old.token))
        for state, pairs in sorted(ends.items()):
            ended_at = None if state in HELD_STATES else now
            marks = ", ".join(["(%s, %s)"] * (len(pairs) // 2))
            args = [state.value, ended_at, *pairs]
            writes.append((self._sql["run_end"].format(pairs=marks), args))
        started = [new for _, new, d in written if d.started]
        if started:
            rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, NULL)"] * len(started))
            values = [
                v
                for r in started
                for v in (r.job, r.token, r.slot_ms, r.attempt, r.owner, r.state.value, now)
            ]
            writes.append((self._sql["run_start"].format(rows=rows), values))
            jobs = sorted({r.job for r in started})
            marks = ", ".join(["%s"] * len(jobs))
            writes.append((self._sql["run_trim"].format(names=marks), jobs))
        counts: list[Any] = []
        for _, new, d in written:
            end = d.ended
            if d.started or end is not None:
                counts.extend(
                    (
                        new.job,
                        int(d.started),
                        int(d.started and new.attempt > 1),
                        int(end is RunState.DONE),
                        int(end is RunState.FAILED),
                        now if end is RunState.DONE else None,
                        now if end is RunState.FAILED else None,
                    )
                )
        if counts:
            rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * (len(counts) // 7))
            writes.append((self._sql["count"].format(rows=rows), counts))
        return writes

    # -- the lease steps -------------------------------------------------------

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """One transaction: the rows locked and the pause marks read, then written, committed.

        A batch the server refuses (having applied nothing) is sent again
        claim by claim, so that only the claims it refuses alone are refused.
        """
        if not requests:
            return []
        if len({r.job for r in requests}) < len(requests):
            # One record, several claims: each on its own, in turn.
            return one_by_one(
                lambda r: self.claim(r.job, r.slot_ms, owner, r.lease, r.limit), requests, _REFUSED
            )
        return item_by_item(lambda batch: self._claim_batch(batch, owner), requests, _REFUSED)

    def _claim_batch(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        def rule(i: int, old: Record | None, now: float, seen: _Seen) -> Decision[Claim]:
            r = requests[i]
            paused = bool(seen.paused & {r.job, NAMESPACE_PAUSE})
            claims = seen.claims.get(r.job, 0)
            return decide.claim(
                old,
                r.job,
                r.slot_ms,
                owner,
                r.lease,
                now,
                paused=paused,
                limit=r.limit,
                claims=claims,
                clock_token=decide.first_token(now),
            )

        limited = [r.job for r in requests if r.limit is not None]
        return self._decide([r.job for r in requests], rule, pauses=True, counted=limited)

    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        """One transaction for the batch, as :meth:`claim_many`."""
        if not requests:
            return []
        if len({r.job for r in requests}) < len(requests):
            return one_by_one(
                lambda r: self.takeover(r.job, r.slot_ms, owner, r.lease, r.seen_token),
                requests,
                _REFUSED,
            )

        def batch(items: Sequence[TakeoverRequest]) -> list[Claim]:
            def rule(i: int, old: Record | None, now: float, _: _Seen) -> Decision[Claim]:
                r = items[i]
                return decide.takeover(
                    old,
                    r.job,
                    r.slot_ms,
                    owner,
                    r.lease,
                    r.seen_token,
                    now,
                    clock_token=decide.first_token(now),
                )

            return self._decide([r.job for r in items], rule)

        return item_by_item(batch, requests, _REFUSED)

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        """One transaction for the batch (renewals, hand-offs, ends), as :meth:`claim_many`."""
        if not changes:
            return []
        if len({c.job for c in changes}) < len(changes):
            # Several changes of one run (a renewal, then its end): in turn.
            return one_by_one(lambda c: self._change_batch([c])[0], changes, _REFUSED)
        return item_by_item(self._change_batch, changes, _REFUSED)

    def _change_batch(self, changes: Sequence[Change]) -> list[bool]:
        def rule(i: int, old: Record | None, now: float, _: _Seen) -> Decision[bool]:
            return decide.change(old, changes[i], now)

        return self._decide([c.job for c in changes], rule)

    # -- reads -----------------------------------------------------------------

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(dict.fromkeys(jobs))
        if not names:
            return {}
        with self._cursor() as cur:
            cur.execute(self._sql["states"].format(marks=_marks(len(names))), names)
            rows = cur.fetchall()
        return {_text(row[0]): self._job_state((_text(row[0]), *row[1:])) for row in rows}

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        with self._cursor() as cur:
            cur.execute(self._sql["history"], (job, limit))
            rows = cur.fetchall()
        return [self._run_record((_text(row[0]), *row[1:])) for row in rows]

    def jobs(self) -> list[str]:
        with self._cursor() as cur:
            cur.execute(self._sql["jobs"])
            # Sorted here rather than by the server's collation, as in every store.
            return sorted(_text(row[0]) for row in cur.fetchall())

    def namespaces(self) -> list[str]:
        """The namespaces of the database with a job recorded, named by their jobs
        table's comment."""
        with self._cursor() as cur:
            cur.execute(_TABLES)
            named = {}
            for table, comment in cur.fetchall():
                head, _, namespace = _text(comment).partition(" namespace ")
                # Only a comment that names the table's own namespace (one a user wrote may not).
                if head.startswith(_COMMENT_HEAD) and f"{table_prefix(namespace)}_jobs" == table:
                    named[table] = namespace
            if not named:
                return []
            # The names were checked against the namespaces' own: safe to quote as they are.
            cur.execute(
                " UNION ALL ".join(
                    f"SELECT %s FROM DUAL WHERE EXISTS (SELECT 1 FROM `{table}`)" for table in named
                ),
                list(named.values()),
            )
            return sorted(_text(row[0]) for row in cur.fetchall())

    def stats(self, jobs: Iterable[str]) -> dict[str, JobStats]:
        names = list(dict.fromkeys(jobs))
        if not names:
            return {}
        with self._cursor() as cur:
            cur.execute(self._sql["stats"].format(marks=_marks(len(names))), names)
            rows = cur.fetchall()
        return {
            _text(row[0]): JobStats(_text(row[0]), *(int(v) for v in row[1:5]), *row[5:])
            for row in rows
        }

    # -- pause marks and control entries ----------------------------------------

    def _set_pause(self, key: str, on: bool) -> bool:
        with self._cursor() as cur:
            return bool(cur.execute(self._sql["pause" if on else "resume"], (key,)) == 1)

    def _pause_marks(self) -> set[str]:
        with self._cursor() as cur:
            cur.execute(self._sql["pause_marks"])
            return {_text(row[0]) for row in cur.fetchall()}

    def _controls(self, prefixes: tuple[str, ...]) -> dict[str, tuple[int, str]]:
        starts = " OR ".join(["LEFT(`key`, LENGTH(CAST(%s AS BINARY))) = %s"] * len(prefixes))
        with self._cursor() as cur:
            cur.execute(
                self._sql["controls"].format(starts=starts),
                [v for prefix in prefixes for v in (prefix, prefix)],
            )
            rows = cur.fetchall()
        return {_text(key): (int(version), value) for key, version, value in rows}

    def _set_control(self, key: str, value: str | None, expected: int) -> int:
        # The count's row lock orders every control write of the namespace.
        reads: list[tuple[str, Sequence[Any]]] = [
            (self._sql["control_count"], ()),
            (self._sql["control_read"], (key,)),
        ]

        def decided(results: list[Sequence[Any]]) -> tuple[list[tuple[str, list[Any]]], int]:
            versions = {_text(k): int(v) for k, v in results[1]}
            found = versions.get(key, 0)
            if found != expected:
                raise Conflict(key, expected, found)
            if value is None:
                return [(self._sql["control_delete"], [key])], 0
            version = versions[""]
            return [(self._sql["control_put"], [key, version, value])], version

        return self._transaction(reads, decided)

    # -- the registry ----------------------------------------------------------

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        with self._cursor() as cur:
            # One round trip; each statement its own atomic step.
            steps: list[tuple[str, Sequence[Any]]] = [
                (self._sql["announce"], (instance, info, ttl))
            ]
            steps += [(self._sql["expire"], ()), (self._sql["instances"], ())]
            rows = _run(cur, steps)[-1]
        return [self._instance_record((_text(row[0]), *row[1:])) for row in rows]

    def withdraw(self, instance: str) -> None:
        with self._cursor() as cur:
            cur.execute(self._sql["withdraw"], (instance,))

    def instances(self) -> list[InstanceRecord]:
        with self._cursor() as cur:
            cur.execute(self._sql["instances"])
            rows = cur.fetchall()
        return [self._instance_record((_text(row[0]), *row[1:])) for row in rows]

    def close(self) -> None:
        """Close the store's connections."""
        self._pool.close()

    def __repr__(self) -> str:
        return f"<MySQLStore {self._where} namespace={self.namespace!r}>"

    # -- one-off runs: the table ..._once, clustered on its key (due_ms, job) ---------------

    def _once_cursor(self) -> contextlib.AbstractContextManager[pymysql.cursors.Cursor]:
        """A cursor, the one-offs' table made first if this store has not seen it yet.

        The table is not part of the layout the jobs table's comment versions: a
        release that predates it never reads it, so it is made here, at first use,
        beside an existing namespace's tables, and the layout's version stays.
        """
        if not getattr(self, "_once_ready", False):
            with self._cursor() as cur:
                cur.execute(_ONCE["create"].format(once=self._once_name))
            self._once_ready = True
        return self._cursor()

    @property
    def _once_name(self) -> str:
        return f"{table_prefix(self.namespace)}_once"

    def _add_once(self, entries: list[OnceEntry]) -> None:
        with self._once_cursor() as cur:
            for i in range(0, len(entries), _ONCE_CHUNK):
                chunk = entries[i : i + _ONCE_CHUNK]
                rows = ", ".join(["(%s, %s, %s)"] * len(chunk))
                values = [v for e in chunk for v in (e.due_ms, e.job, e.value)]
                cur.execute(_ONCE["add"].format(once=self._once_name, rows=rows), values)

    def _once_rows(self, statement: str, values: Sequence[Any]) -> list[OnceEntry]:
        with self._once_cursor() as cur:
            cur.execute(_ONCE[statement].format(once=self._once_name), values)
            rows = cur.fetchall()
        return [OnceEntry(int(due), _text(job), value) for due, job, value in rows]

    def _once_due(
        self, until_ms: int, limit: int, after: tuple[int, str] | None
    ) -> list[OnceEntry]:
        start, job = after if after is not None else (-1, "")
        return self._once_rows("due", (until_ms, start, start, job, limit))

    def _remove_once(self, job: str, due_ms: int) -> bool:
        with self._once_cursor() as cur:
            return bool(cur.execute(_ONCE["remove"].format(once=self._once_name), (due_ms, job)))

    def _pending_once(self, job: str | None, limit: int) -> list[OnceEntry]:
        return self._once_rows("pending", (job or "", job or "", limit))


#: Entries written per statement.
_ONCE_CHUNK = 1000
#: The one-offs' statements (``{once}``: the table's name). The due read is a range of the
#: primary key's first column, the cursor's tie on it broken by the job.
_ONCE = {
    "create": """CREATE TABLE IF NOT EXISTS `{once}` (due_ms BIGINT NOT NULL,
        job VARBINARY(800) NOT NULL, value TEXT NOT NULL, PRIMARY KEY (due_ms, job))
        ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    "add": """INSERT INTO `{once}` VALUES {rows}
        ON DUPLICATE KEY UPDATE value = VALUES(value)""",
    "due": """SELECT due_ms, job, value FROM `{once}`
        WHERE due_ms <= %s AND due_ms >= %s AND (due_ms > %s OR job > %s)
        ORDER BY due_ms, job LIMIT %s""",
    "remove": "DELETE FROM `{once}` WHERE due_ms = %s AND job = %s",
    "pending": """SELECT due_ms, job, value FROM `{once}` WHERE %s = '' OR job = %s
        ORDER BY due_ms, job LIMIT %s""",
}


def _record(row: Sequence[Any]) -> Record:
    job, slot_ms, owner, attempt, token, state, lease_until = row
    return Record(
        _text(job), int(slot_ms), owner, int(attempt), int(token), RunState(state), lease_until
    )


def _run(cur: pymysql.cursors.Cursor, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
    """``statements`` in one round trip; the rows of each (empty for a write), in order.

    The server stops at the first that fails, whose error is raised here.
    """
    args = [arg for _, values in statements for arg in values]
    cur.execute(";\n".join(sql for sql, _ in statements), args or None)
    results = [cur.fetchall()]
    while cur.nextset():
        results.append(cur.fetchall())
    return results


def _schema_version(comment: str) -> int | None:
    """The layout version a jobs table's comment names (``None``: not one of ours)."""
    if not comment.startswith(_COMMENT_HEAD):
        return None
    number = comment[len(_COMMENT_HEAD) :].split(" ", 1)[0]
    return int(number) if number.isdigit() else None


def _roll_back(conn: pymysql.connections.Connection) -> None:
    """End a failed transaction; a connection that cannot is closed (the pool drops it)."""
    try:
        conn.rollback()
    except Exception:  # the connection is gone or broken: closed, the pool drops it
        _close(conn)


def _close(conn: pymysql.connections.Connection) -> None:
    """Close ``conn`` whatever its state (the driver closes its socket in any case)."""
    with contextlib.suppress(pymysql.Error):
        conn.close()
