"""A smoke of the failover benchmark (benchmarks/failover.py) in its fast mode.

anarchon with a 2 s lease (job every 6 s, handler 5 s) against celery-redbeat
with a 3 s lock, one kill each, redbeat's slow settings capped at 15 s.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from pathlib import Path

import pytest
import redis

from benchmarks.failover import HEADER, measure
from tests import servers

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(90)]

LEASE, CAP = 2.0, 15.0


def children() -> list[int]:
    """The processes this one started that still exist (zombies included)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            found.append(int(stat.parent.name))
    return found


def test_anarchon_fails_over_within_its_lease_and_redbeat_within_its_lock(redis_url: str) -> None:
    if shutil.which("redis-server") is None:
        servers.unavailable("redis-server on PATH")
    namespace = f"failover-test-{uuid.uuid4().hex[:8]}"
    before = set(children())

    anarchon, default, lock_alone, short = measure(
        repeats=1, lease=LEASE, cap=CAP, store=redis_url, namespace=namespace
    )

    assert len(anarchon.times) == 1
    assert anarchon.worst is not None, anarchon.row()
    assert 0 < anarchon.worst <= LEASE + 1.5, anarchon.row()
    # The default lock lapses after 1500 s, and a standby retries every 300 s by default.
    assert default.times == [None], default.row()
    assert lock_alone.times == [None], lock_alone.row()
    assert "1500" in default.setting
    assert short.worst is not None and math.isfinite(short.worst), short.row()
    assert 0 < short.worst <= CAP, short.row()

    columns = HEADER.splitlines()[0].count("|")
    assert all(r.row().count("|") == columns for r in (anarchon, default, lock_alone, short))
    client = redis.Redis.from_url(redis_url)
    try:
        assert not client.keys(f"anarchon:{{{namespace}*"), "the namespace was left in Redis"
    finally:
        client.close()
    assert set(children()) <= before, "a process of the benchmark is still running"
