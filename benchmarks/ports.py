"""Free loopback ports for the servers the benchmarks and the tests start.

Chosen below the kernel's ephemeral range: a port the kernel picked (``bind`` to
port 0) and gave back can be handed to any client connection before the server
binds it, and the server then fails with "Address already in use".
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

#: The lowest port the kernel hands out to outgoing connections. Ports the tests
#: choose for servers lie below it: a port the kernel picked (``bind(0)``) and gave
#: back can be taken by any client connection before the server binds it.
EPHEMERAL_FLOOR = 32768
with contextlib.suppress(OSError, ValueError, IndexError):
    EPHEMERAL_FLOOR = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def _free_ports(offsets: tuple[int, ...]) -> int:
    """A port ``p`` below the kernel's ephemeral range with ``p + offset`` free for each offset."""
    top = EPHEMERAL_FLOOR - 1 - max(offsets)
    for _ in range(500):
        port = random.randint(10000, top)
        try:
            with contextlib.ExitStack() as held:
                for offset in offsets:
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port below {EPHEMERAL_FLOOR} with {offsets} free")


def free_port() -> int:
    """A free loopback port no client connection can be given meanwhile."""
    return _free_ports((0,))


def free_cluster_port() -> int:
    """A free port whose cluster bus port (10,000 higher) is free too: Redis Cluster needs both."""
    return _free_ports((0, 10000))
