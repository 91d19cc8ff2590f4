"""The network harness itself (tests/netns.py): hosts in namespaces, a real Redis on one
of them, and each fault doing what its name says, as a client in another host sees it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import servers
from tests.netns import Host, network
from tests.waiting import wait_until

#: A client run inside a host: sends ``argv[3:]`` to Redis at argv[1]:argv[2] as one
#: command on a new connection (nothing else first: the faults apply to that command),
#: waits 1.5 s at most, and prints the answer's words and how long it took, as JSON.
CLIENT = """
import json, socket, sys, time
began = time.monotonic()
words = [w.encode() for w in sys.argv[3:]]
request = b"*%d\\r\\n" % len(words) + b"".join(b"$%d\\r\\n%s\\r\\n" % (len(w), w) for w in words)
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5) as sock:
        sock.sendall(request)
        answer = sock.recv(65536).decode()
    print(json.dumps({"answer": answer.split(), "took": time.monotonic() - began}))
except OSError as exc:
    print(json.dumps({"error": type(exc).__name__, "took": time.monotonic() - began}))
"""


def ask(host: Host, address: str, *command: str) -> dict[str, object]:
    where, _, port = address.rpartition(":")
    done = host.run([sys.executable, "-c", CLIENT, where, port, *command])
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.timeout(120)
def test_each_fault_is_seen_as_its_name_says_and_heals() -> None:
    binary = servers.redis_binary()
    if binary is None:
        servers.unavailable("a Redis or Valkey binary")
    assert binary is not None
    with network() as net:
        app, store = net.host("app"), net.host("store")
        server = store.popen(
            [
                binary,
                "--bind",
                store.address,
                "--port",
                "6379",
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        direct = f"{store.address}:6379"

        def up() -> bool:
            assert server.poll() is None, "redis-server exited"
            return ask(app, direct, "PING").get("answer") == ["+PONG"]

        wait_until(up, 20, "Redis in its namespace")
        # The hosts have no route but their subnet: nothing they send leaves it.
        routes = [line.split()[:3] for line in app.run(["ip", "route"]).stdout.splitlines()]
        assert routes == [["10.77.0.0/24", "dev", "eth0"]]

        # Kernel level: the app's link down, then up.
        app.isolate()
        assert ask(app, direct, "PING")["error"] in ("TimeoutError", "OSError")
        app.heal()
        assert ask(app, direct, "PING")["answer"] == ["+PONG"]

        link = app.link(store, 6379)
        assert ask(app, link.local, "PING")["answer"] == ["+PONG"]
        # Answers lost: the write arrives and executes, the client hears nothing.
        link.set(down="drop")
        assert ask(app, link.local, "SET", "k1", "v")["error"] == "TimeoutError"
        assert ask(app, direct, "GET", "k1")["answer"] == ["$1", "v"]
        # Requests lost: nothing executes, nothing comes back.
        link.set(down="pass", up="drop")
        assert ask(app, link.local, "SET", "k2", "v")["error"] == "TimeoutError"
        assert ask(app, direct, "EXISTS", "k2")["answer"] == [":0"]
        # A stall: nothing moves while it lasts.
        link.set(up="stall")
        assert ask(app, link.local, "PING")["error"] == "TimeoutError"
        # Delay, each way: a round trip takes at least twice it.
        link.set(up="pass", delay=0.3, jitter=0.1)
        slow = ask(app, link.local, "PING")
        assert slow["answer"] == ["+PONG"] and float(str(slow["took"])) >= 0.6, slow
        link.heal()
        fast = ask(app, link.local, "PING")
        assert fast["answer"] == ["+PONG"] and float(str(fast["took"])) < 0.6, fast
