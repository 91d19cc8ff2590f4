"""``anarchon jobs|status|next|trigger`` on a job declared by a running instance, never run.

As a user runs them (subprocesses), against the machine's Redis, PostgreSQL
and a SQLite file, while a scheduler runs in this process: ``daily`` (a slot
a day, the next half a day away) has never run and the store has no record
of it, yet every command knows it from the registry, with its next slots;
``finished`` is past its end; a typo is refused as before.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from anarchon_core import Control, Run, Scheduler
from tests.cleanup import drop_namespace
from tests.cli.command import anarchon, shown
from tests.waiting import wait_until

EXIT_OK, EXIT_EMPTY = 0, 1
DAY = 86_400


def utc(seconds: float) -> list[str]:
    """A moment as the tables show it: a date and a time, two cells."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S").split()


@pytest.fixture(params=["redis", "postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'declared.db'}"
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def namespace(url: str) -> Iterator[str]:
    name = f"decl-{uuid.uuid4().hex[:10]}"
    yield name
    drop_namespace(url, name)


def test_the_commands_know_a_declared_job_before_its_first_slot(url: str, namespace: str) -> None:
    anchor = int(time.time()) + DAY // 2
    ran: list[str] = []

    def daily(run: Run) -> None:
        ran.append(run.slot_id)

    cron = Scheduler(url, namespace=namespace, instance="pod-1")
    first = datetime.fromtimestamp(anchor, timezone.utc)
    cron.add_job(daily, name="daily", every=DAY, anchor=first)
    gone = datetime.fromtimestamp(int(time.time()) - 3600, timezone.utc)
    cron.add_job(daily, name="finished", every=60, end=gone)
    cron.start()
    try:

        def declared() -> bool:
            with Control(url, namespace=namespace) as control:
                return "daily" in control.declarations().jobs

        wait_until(declared, 10, "the instance to declare daily in the registry")
        where = ["--store", url, "--namespace", namespace]

        done = anarchon("jobs", *where)
        assert done.returncode == EXIT_OK, shown(done)
        rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()}
        assert rows["job"][-3:] == ["next", "slot", "(UTC)"], shown(done)
        assert rows["daily"] == ["daily", "no", *["-"] * 8, *utc(anchor)], shown(done)
        assert rows["finished"][-1] == "ended", shown(done)

        done = anarchon("status", *where)
        assert done.returncode == EXIT_OK, shown(done)
        rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line}
        assert rows["daily"] == ["daily", *["-"] * 5, *utc(anchor)], shown(done)
        assert rows["finished"] == ["finished", *["-"] * 5, "ended"], shown(done)
        assert rows["pod-1"][4] == "2", shown(done)  # the instance, and the jobs it declares

        done = anarchon("next", "daily", "-n", "3", *where)
        assert done.returncode == EXIT_OK, shown(done)
        lines = done.stdout.splitlines()
        assert lines[0] == (
            f"daily: every 86400s from {first.isoformat()} (declared by 1 live instance(s))"
        ), shown(done)
        assert lines[1].split() == ["slot", "(UTC)", "note"], shown(done)
        slots = [line.split()[:2] for line in lines[2:]]
        assert slots == [utc(anchor + k * DAY) for k in range(3)], shown(done)
        done = anarchon("next", "finished", *where)
        assert done.returncode == EXIT_EMPTY, shown(done)
        assert done.stdout.splitlines()[-1].startswith("no slot to come: 'finished' ended at")

        # Run now, with no --unrecorded: the instance runs it.
        done = anarchon("trigger", "daily", *where)
        assert done.returncode == EXIT_OK, shown(done)
        slot_id = done.stdout.split()[3]
        assert slot_id.startswith("daily@"), shown(done)
        wait_until(lambda: ran == [slot_id], 15, f"{slot_id} to run", seen=lambda: ran)

        # A name nothing declares nor recorded is still refused, changing nothing.
        for verb in (["trigger"], ["pause"], ["history"], ["next"]):
            done = anarchon(*verb, "dialy", *where)
            assert done.returncode == EXIT_EMPTY, shown(done)
            assert "no job named 'dialy'" in done.stderr, shown(done)
        with Control(url, namespace=namespace) as control:
            assert control.paused().jobs == ()
            assert all(job != "dialy" for job, _ in control.pending())
    finally:
        cron.stop()
