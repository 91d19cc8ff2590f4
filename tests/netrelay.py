"""A TCP relay whose two directions fail apart: the userspace half of :mod:`tests.netns`.

This machine's kernel has network namespaces, veth pairs and bridges but no ``netem``
queueing discipline (nor ``prio`` or packet filters), so the faults finer than a link
going down are made here, in a process started inside a host's namespace::

    python -m tests.netrelay --listen 127.0.0.1:7000 --target 10.9.0.2:6379 --control FILE

Each direction of every connection (``up``: client to server, ``down``: server to
client) follows the JSON object in ``--control``, read again whenever it changes:

- ``"pass"``: forwarded, after ``delay`` seconds plus up to ``jitter`` more (drawn per
  chunk, in order: a later chunk never overtakes an earlier one);
- ``"drop"``: read and thrown away, so the sender's writes succeed and nothing arrives
  (a one-way cut as the application sees it: a request that arrives and executes while
  its answer never comes back, or the reverse);
- ``"stall"``: not read, so the sender's buffers fill and its writes block (a link
  that stops moving packets without closing anything).

``{"up": "drop", "down": "pass", "delay": 0.2, "jitter": 0.05}``, say. Nothing is
ever closed by a fault: a connection ends when one of its ends closes it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import select
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

#: How often a stalled direction, or a queue waiting for its time, looks again.
POLL = 0.01


class Control:
    """The faults in force, from the control file (read again when its mtime changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: int | None = None
        self._lock = threading.Lock()
        self.state: dict[str, Any] = {"up": "pass", "down": "pass", "delay": 0.0, "jitter": 0.0}

    def now(self) -> dict[str, Any]:
        try:
            stamp = self.path.stat().st_mtime_ns
        except OSError:
            return self.state
        with self._lock:
            if stamp != self._stamp:
                try:
                    read = json.loads(self.path.read_text())
                except ValueError:  # written while read: the next look sees it whole
                    return self.state
                self._stamp = stamp
                self.state = {**self.state, **read}
            return self.state


def pump(source: socket.socket, sink: socket.socket, way: str, control: Control) -> None:
    """Move ``source``'s bytes to ``sink`` as the control file says for ``way``."""
    queue: deque[tuple[float, bytes]] = deque()
    last_due = 0.0
    try:
        while True:
            state = control.now()
            mode = state[way]
            if queue and queue[0][0] <= time.monotonic():
                sink.sendall(queue.popleft()[1])
                continue
            if mode == "stall":
                time.sleep(POLL)
                continue
            wait = POLL if queue else 0.2
            if queue:
                wait = max(0.0, min(wait, queue[0][0] - time.monotonic()))
            if not select.select([source], [], [], wait)[0]:
                continue
            data = source.recv(65536)
            if not data:
                while queue:  # what was in flight still arrives, at its time
                    due, chunk = queue.popleft()
                    time.sleep(max(0.0, due - time.monotonic()))
                    sink.sendall(chunk)
                sink.shutdown(socket.SHUT_WR)
                return
            if mode == "drop":
                continue
            delay = float(state["delay"]) + random.uniform(0, float(state["jitter"]))
            last_due = max(last_due, time.monotonic() + delay)
            queue.append((last_due, data))
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def serve(listen: tuple[str, int], target: tuple[str, int], control: Control) -> None:
    listener = socket.create_server(listen, reuse_port=False)
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(target, timeout=5)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for source, sink, way in ((client, upstream, "up"), (upstream, client, "down")):
            threading.Thread(target=pump, args=(source, sink, way, control), daemon=True).start()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.netrelay")
    parser.add_argument("--listen", type=_address, required=True)
    parser.add_argument("--target", type=_address, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args(argv)
    serve(args.listen, args.target, Control(args.control))


if __name__ == "__main__":
    main()
