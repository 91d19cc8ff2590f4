"""Hosts and links of a test's own: network namespaces on a bridge, and a nemesis.

:class:`Network` makes a namespace per host, each joined to a bridge (in a namespace
of its own) by a veth pair, addresses ``10.77.0.N/24``; everything is removed when
the network closes, and no traffic leaves its namespaces. Processes run inside a
host with :meth:`Host.popen`. The faults, and which layer makes each:

- **kernel**: :meth:`Host.isolate` takes the host's link down (both ways: nothing in
  or out, as a pulled cable or a host cut off by a partition), :meth:`Host.heal`
  brings it back; connections open across it resume if neither end gave up.
- **userspace** (:mod:`tests.netrelay`, since this kernel has no ``netem``, ``prio``
  or packet filters): a :class:`Link` is a relay inside the client's host towards a
  server on another host. Its :meth:`~Link.set` cuts one direction (``drop``: what is
  sent is thrown away, so a request can arrive and execute while its answer is
  lost), stalls one (``stall``: nothing moves, nothing closes), or adds delay and
  jitter per chunk; :meth:`~Link.heal` restores it.

Making namespaces needs root (CI runs as root); where it cannot be done the tests
that need it skip saying why, or fail under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.servers import IN_CI
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
SUBNET = "10.77.0"
_names = itertools.count(1)


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {done.stderr.strip()}")


def unavailable_reason() -> str | None:
    """Why this machine cannot make namespaces for a test, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"anp{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (OSError, RuntimeError) as exc:
        return f"ip netns add failed: {exc}"
    with contextlib.suppress(OSError, RuntimeError):
        _ip("netns", "del", probe)
    return None


def require() -> None:
    """Skip (fail under CI) where namespaces cannot be made."""
    import pytest

    reason = unavailable_reason()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"the network tests need namespaces under CI=true: {reason}")
        pytest.skip(reason)


class Host:
    """One namespace on the bridge: its address, its link, its processes."""

    def __init__(self, network: Network, name: str, index: int) -> None:
        self.network = network
        self.name = name
        self.ns = f"{network.tag}-{name}"
        self.address = f"{SUBNET}.{index}"
        self._outer = f"{network.tag}v{index}"
        self.procs: list[subprocess.Popen[Any]] = []
        _ip("netns", "add", self.ns)
        _ip("link", "add", "eth0", "netns", self.ns, "type", "veth", "peer", "name", self._outer)
        _ip("link", "set", self._outer, "netns", network.switch)
        _ip("-n", network.switch, "link", "set", self._outer, "master", "br0", "up")
        _ip("-n", self.ns, "addr", "add", f"{self.address}/24", "dev", "eth0")
        _ip("-n", self.ns, "link", "set", "eth0", "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``argv`` run inside this host, in a process group of its own."""
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("cwd", ROOT)
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )

    def isolate(self) -> None:
        """The host's link goes down: nothing in or out (kernel level)."""
        _ip("-n", self.network.switch, "link", "set", self._outer, "down")

    def heal(self) -> None:
        _ip("-n", self.network.switch, "link", "set", self._outer, "up")

    def link(self, server: Host, port: int) -> Link:
        """A relay in this host to ``server``'s ``port``; connect to its ``local`` address."""
        return Link(self, server, port)

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


class Link:
    """A userspace relay from ``client``'s loopback to ``server``: one-way cuts, stalls,
    delay and jitter (:mod:`tests.netrelay`)."""

    def __init__(self, client: Host, server: Host, port: int) -> None:
        self.client, self.server = client, server
        self.control = client.network.home / f"link-{next(_names)}.json"
        self.port = 7000 + next(_names)
        self._write({"up": "pass", "down": "pass", "delay": 0.0, "jitter": 0.0})
        argv = [sys.executable, "-m", "tests.netrelay", "--listen", f"127.0.0.1:{self.port}"]
        argv += ["--target", f"{server.address}:{port}", "--control", str(self.control)]
        client.popen(argv)
        wait_until(
            lambda: client.run([*_CONNECTS, str(self.port)]).returncode == 0,
            15,
            f"the relay in {client.name} to listen",
        )

    @property
    def local(self) -> str:
        """Where a process in the client host connects: ``127.0.0.1:port``."""
        return f"127.0.0.1:{self.port}"

    def set(self, **faults: Any) -> None:
        """``up=``/``down=`` ``"pass"|"drop"|"stall"``, ``delay=``, ``jitter=`` (seconds)."""
        unknown = set(faults) - {"up", "down", "delay", "jitter"}
        if unknown:
            raise ValueError(f"unknown link settings: {sorted(unknown)}")
        self._write({**json.loads(self.control.read_text()), **faults})

    def heal(self) -> None:
        self._write({"up": "pass", "down": "pass", "delay": 0.0, "jitter": 0.0})

    def _write(self, state: dict[str, Any]) -> None:
        spare = self.control.with_suffix(".new")
        spare.write_text(json.dumps(state))
        spare.replace(self.control)


#: Whether a port of the host's loopback accepts connections (bash alone: cheaper than
#: a Python process per look).
_CONNECTS = ["bash", "-c", 'exec 3<>"/dev/tcp/127.0.0.1/$0"']


class Network:
    """A bridge and the hosts on it, all removed at :meth:`close`."""

    def __init__(self) -> None:
        self.tag = f"an{os.getpid() % 100000}{next(_names)}"
        self.switch = f"{self.tag}-sw"
        self.home = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.hosts: dict[str, Host] = {}
        #: Called at close, after the hosts' processes stopped (a server's data, say).
        self.cleanups: list[Callable[[], None]] = []
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def host(self, name: str) -> Host:
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        host = self.hosts[name] = Host(self, name, len(self.hosts) + 2)
        return host

    def close(self) -> None:
        for host in self.hosts.values():
            host.stop()
        for ns in [host.ns for host in self.hosts.values()] + [self.switch]:
            with contextlib.suppress(OSError, RuntimeError):
                _ip("netns", "del", ns)
        for cleanup in self.cleanups:
            cleanup()
        shutil.rmtree(self.home, ignore_errors=True)


@contextlib.contextmanager
def network() -> Iterator[Network]:
    require()
    net = Network()
    try:
        yield net
    finally:
        net.close()
