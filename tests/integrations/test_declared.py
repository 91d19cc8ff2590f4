"""Celery and Dramatiq alike: the control command knows an entry before its first slot.

One pod (a Celery worker with its beat, ``-B``; a ``dramatiq`` pod with the
Anarchon middleware's scheduler) declares ``daily``, a slot a day at
midnight UTC, never run yet. The integration's own control command (``celery
-A APP anarchon VERB``, ``dramatiq-anarchon VERB APP``: real subprocesses)
lists it with its next slot, prints its next slots, and runs it now without
``--unrecorded``: the pod's worker runs it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from anarchon_core import Control
from tests.celery.harness import CELERY
from tests.cleanup import drop_namespace
from tests.dramatiq.harness import APP
from tests.fleet import BIN, ROOT, shown
from tests.integrations.conftest import FLEETS, Pods
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

JOB = "daily"
DAY = 86_400


@pytest.fixture
def pods(framework: str, tmp_path: Path, redis_broker: str) -> Iterator[Pods]:
    made = FLEETS[framework](tmp_path, redis_broker, {JOB: {"every": DAY, "work": 0.1}})
    try:
        yield made
    finally:
        made.stop_all()
        drop_namespace(redis_broker, made.namespace)


def command(pods: Pods, framework: str, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The integration's control command, as a user runs it: the app's store and namespace."""
    if framework == "celery":
        argv = [CELERY, "-A", "tests.celery.e2e_app", "anarchon", verb, *args]
    else:
        argv = [str(BIN / "dramatiq-anarchon"), verb, APP, *args]
    done = subprocess.run(
        argv, env=pods.env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert "Traceback" not in done.stderr, shown(done)
    return done


@pytest.mark.timeout(180)
def test_the_control_command_knows_a_declared_entry_before_its_first_slot(
    pods: Pods, framework: str, redis_broker: str
) -> None:
    if framework == "celery":
        pods.worker("w1", concurrency=1)
    else:
        pods.worker("w1", processes=1, threads=1)

    def declared() -> bool:
        with Control(redis_broker, namespace=pods.namespace) as control:
            return JOB in control.declarations().jobs

    wait_until(declared, 60, f"the pod's scheduler to declare {JOB}", seen=pods.logs)
    midnight = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    days = [(midnight + timedelta(days=k)).strftime("%Y-%m-%d 00:00:00") for k in (1, 2, 3)]

    done = command(pods, framework, "next", JOB, "-n", "3")
    assert done.returncode == 0, shown(done)
    lines = done.stdout.splitlines()
    assert lines[0] == f"{JOB}: every 86400s (declared by 1 live instance(s))", shown(done)
    assert [" ".join(line.split()[:2]) for line in lines[2:]] == days, shown(done)

    done = command(pods, framework, "jobs")
    assert done.returncode == 0, shown(done)
    [row] = [line.split() for line in done.stdout.splitlines() if line.startswith(JOB)]
    assert row[:3] == [JOB, "no", "-"] and " ".join(row[-2:]) == days[0], shown(done)

    done = command(pods, framework, "trigger", JOB)
    assert done.returncode == 0, shown(done)
    found = re.match(rf"asked to run ({JOB}@\d+) now", done.stdout)
    assert found, shown(done)
    slot_id = found.group(1)
    wait_until(lambda: pods.starts(JOB, slot_id=slot_id), 30, f"{slot_id} to run", seen=pods.tail)

    done = command(pods, framework, "next", "dialy")
    assert done.returncode == 1, shown(done)
    assert "no job named 'dialy'" in done.stderr, shown(done)
