"""Store faults for in-process scenarios: servers that refuse writes, links that go silent.

:class:`TcpProxy` stands between one instance and its server; its
:meth:`~TcpProxy.blackhole` stops forwarding without closing anything, as a
link does when a switch or a NAT table drops it: the kernel still
acknowledges what is sent, so no driver timeout that waits for
acknowledgements fires. The write faults make a server answer every write
with an error while reads still work: Redis without the replicas that
``min-replicas-to-write`` asks for (``NOREPLICAS``), Redis whose snapshot
failed (``MISCONF``), PostgreSQL whose sessions are read-only.
:class:`Attempts` records what handlers did, by the monotonic clock every
thread of the test process shares.
"""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from anarchon_core import Run
from tests.waiting import wait_until

T = TypeVar("T")


@dataclass
class Attempt:
    """One handler call: which run, who ran it, and when (``time.monotonic()``)."""

    job: str
    slot_id: str
    attempt: int
    instance: str
    started: float
    ended: float | None = None
    #: When the handler saw ``run.lost`` turn true, if it did.
    lost_at: float | None = None


class Attempts:
    """The handler calls of every instance of one test, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Attempt] = []

    def begin(self, run: Run) -> Attempt:
        attempt = Attempt(run.job, run.slot_id, run.attempt, run.instance, time.monotonic())
        with self._lock:
            self._items.append(attempt)
        return attempt

    def all(self) -> list[Attempt]:
        with self._lock:
            return list(self._items)

    def watch(self, predicate: Callable[[list[Attempt]], T]) -> Callable[[], T]:
        """A condition for ``wait_until``: ``predicate`` of the calls so far."""
        return lambda: predicate(self.all())


def with_port(url: str, port: int) -> str:
    """``url`` with its host and port replaced by ``127.0.0.1:port`` (user and password kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


class TcpProxy:
    """Forwards connections on a loopback port to ``(host, port)``; can go silent.

    One thread accepts; one thread per connection forwards both ways. While
    :meth:`blackhole` is in force nothing is read on either side, so nothing
    is forwarded and nothing is closed; connections accepted meanwhile stay
    silent too. :meth:`close` closes every socket, which ends the calls
    blocked on them.
    """

    POLL = 0.02

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._silent = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept", daemon=True)]
        self._threads[0].start()

    def url(self, url: str) -> str:
        """``url`` pointed at this proxy."""
        return with_port(url, self.port)

    def blackhole(self) -> None:
        self._silent.set()

    def restore(self) -> None:
        self._silent.clear()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)

    def _accept(self) -> None:
        try:
            while not self._closed.is_set():
                if not select.select([self._listener], [], [], 0.1)[0]:
                    continue
                client, _ = self._listener.accept()
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
                upstream.settimeout(None)
                with self._lock:
                    self._sockets += [client, upstream]
                thread = threading.Thread(
                    target=self._forward, args=(client, upstream), name="proxy-link", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        except OSError:
            pass
        finally:
            self._listener.close()

    def _forward(self, client: socket.socket, upstream: socket.socket) -> None:
        other = {client: upstream, upstream: client}
        try:
            while not self._closed.is_set():
                if self._silent.is_set():
                    time.sleep(self.POLL)
                    continue
                readable = select.select([client, upstream], [], [], self.POLL)[0]
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    other[sock].sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            client.close()
            upstream.close()


# -- servers that refuse writes ------------------------------------------


class WriteFault(Protocol):
    """Makes a server answer writes with an error (:meth:`refuse`) and undoes it."""

    name: str

    def refuse(self) -> None: ...

    def allow(self) -> None: ...


def refuses_writes(client: Any, error: str) -> None:
    """Fail unless a write to Redis now answers ``error``."""
    import redis

    try:
        client.set("anarchon:fault-probe", "1")
    except redis.ResponseError as exc:
        if str(exc).startswith(error):
            return
        raise
    raise AssertionError(f"Redis still accepts writes: {error} was expected")


class RedisNoReplicas:
    """``min-replicas-to-write 1`` on a server with no replica: writes answer NOREPLICAS."""

    name = "NOREPLICAS"

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5)

    def refuse(self) -> None:
        self.client.config_set("min-replicas-to-write", 1)
        refuses_writes(self.client, "NOREPLICAS")

    def allow(self) -> None:
        self.client.config_set("min-replicas-to-write", 0)

    def close(self) -> None:
        self.allow()
        self.client.close()


class RedisMisconf:
    """A snapshot that fails, with ``stop-writes-on-bgsave-error``: writes answer MISCONF.

    A directory is put where the snapshot goes (the server's ``dir`` and
    ``dbfilename``, which Redis 7 does not let a client change): the rename
    that ends the save fails, for root as for anyone. So the server must run
    on this machine, and keep no snapshot of its own there.
    """

    name = "MISCONF"

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
        keys = ("dir", "dbfilename", "save", "stop-writes-on-bgsave-error")
        self.saved = {key: str(self.client.config_get(key)[key]) for key in keys}
        self.blocker = Path(self.saved["dir"], self.saved["dbfilename"])
        if self.blocker.exists():
            raise AssertionError(f"{self.blocker} exists: the server keeps snapshots there")

    def refuse(self) -> None:
        (self.blocker / "blocker").mkdir(parents=True)
        self.client.config_set("save", "3600 1")
        self.client.config_set("stop-writes-on-bgsave-error", "yes")
        if self._snapshot() != "err":
            raise AssertionError(f"the snapshot did not fail: {self.client.info('persistence')}")
        refuses_writes(self.client, "MISCONF")

    def allow(self) -> None:
        shutil.rmtree(self.blocker, ignore_errors=True)
        # Without save points no snapshot is due, and writes go through again;
        # with some, only once a snapshot succeeded.
        self.client.config_set("save", self.saved["save"])
        if self.saved["save"]:
            self._snapshot()
        self.client.config_set(
            "stop-writes-on-bgsave-error", self.saved["stop-writes-on-bgsave-error"]
        )

    def _snapshot(self) -> str:
        """Take a snapshot (BGSAVE); its status, ``ok`` or ``err``."""
        self.client.bgsave()

        def ended() -> str | None:
            info = self.client.info("persistence")
            return None if info["rdb_bgsave_in_progress"] else str(info["rdb_last_bgsave_status"])

        status = wait_until(
            ended,
            5,
            "the snapshot to end",
            interval=0.02,
            seen=lambda: self.client.info("persistence"),
        )
        assert status is not None
        return status

    def close(self) -> None:
        self.allow()
        self.client.close()


class PostgresReadOnly:
    """``default_transaction_read_only`` on one database; its sessions are ended to pick it up.

    The setting applies to sessions opened afterwards, so every session of
    the database (the stores' pooled connections) is terminated: the pools
    reconnect into read-only sessions, where every write fails with
    ``ReadOnlySqlTransaction`` while reads work.
    """

    name = "read-only"

    def __init__(self, admin_url: str, url: str, database: str) -> None:
        import psycopg

        self.url, self.database = url, database
        self.admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=5)

    def _set(self, statement: str) -> None:
        from psycopg import sql

        self.admin.execute(sql.SQL(statement).format(sql.Identifier(self.database)))
        self.terminate()

    def terminate(self) -> None:
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.database,),
        )

    def refuse(self) -> None:
        import psycopg

        self._set("ALTER DATABASE {} SET default_transaction_read_only = on")
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as probe:
            try:
                probe.execute("CREATE TABLE anarchon_fault_probe (x int)")
            except psycopg.errors.ReadOnlySqlTransaction:
                return
        raise AssertionError(f"{self.database} still accepts writes")

    def allow(self) -> None:
        self._set("ALTER DATABASE {} RESET default_transaction_read_only")

    def close(self) -> None:
        self.admin.close()
