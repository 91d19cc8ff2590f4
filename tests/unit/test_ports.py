"""The ports the tests and benchmarks start servers on."""

from __future__ import annotations

import itertools
import socket

import pytest

from benchmarks import ports


def test_ports_lie_below_the_range_the_kernel_gives_client_connections() -> None:
    # A port from that range, once given back, can go to any client connection
    # before the server binds it ("Address already in use"): a Redis Cluster
    # node's bus port (its port + 10,000) landed there once.
    for _ in range(200):
        assert 10000 <= ports.free_port() < ports.EPHEMERAL_FLOOR
        cluster = ports.free_cluster_port()
        assert cluster >= 10000 and cluster + 10000 < ports.EPHEMERAL_FLOOR


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken, socket.socket() as bus_taken:
        taken.bind(("127.0.0.1", ports.free_port()))
        taken.listen()
        busy = taken.getsockname()[1]
        bus_taken.bind(("127.0.0.1", ports.free_port()))
        bus_taken.listen()
        busy_bus = bus_taken.getsockname()[1]
        free = ports.free_cluster_port()

        def drawn(*first: int) -> None:
            draws = itertools.chain(first, itertools.repeat(free))
            monkeypatch.setattr(ports.random, "randint", lambda low, high: next(draws))

        drawn(busy)
        assert ports.free_port() == free
        # Its own port free, its bus port (10,000 higher) in use: passed over too.
        drawn(busy, busy_bus - 10000)
        assert ports.free_cluster_port() == free
