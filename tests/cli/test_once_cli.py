"""``anarchon once JOB --at TIME``, ``--cancel`` and ``--pending``, run as a user runs them.

On a SQLite file, with a scheduler of the job running in the test process (real
time): the one-off asked by the command runs once, at its time, on that scheduler.
Exit status, as documented: 0 done or shown, 1 nothing changed (an unknown job,
nothing to cancel, nothing pending), 2 bad input or a store that keeps no one-offs.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from anarchon_core import Run, Scheduler
from anarchon_core.errors import MissingDependency
from anarchon_core.urls import store_class
from tests import servers
from tests.cli.command import anarchon, shown
from tests.waiting import wait_until

EXIT_OK, EXIT_EMPTY, EXIT_CONFIG = 0, 1, 2
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_once_asks_for_a_run_at_its_time_and_a_scheduler_runs_it_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"
    ran: list[tuple[str, float]] = []

    def report(run: Run) -> None:
        ran.append((run.slot_id, time.time()))

    scheduler = Scheduler(url, instance="app")
    scheduler.add_job(report, name="report", every=3600)
    scheduler.start()
    try:
        # Far enough ahead that the three commands below, each a Python process (seconds
        # apiece on a loaded machine), see it still pending.
        at = datetime.fromtimestamp(int(time.time()) + 12, timezone.utc)
        slot = f"report@{int(at.timestamp() * 1000)}"
        done = anarchon("once", "report", "--at", _iso(at), "--store", url, "--unrecorded")
        assert done.returncode == EXIT_OK, shown(done)
        assert slot in done.stdout and "once at" in done.stdout, shown(done)
        # Asked again: the same one-off, not a second one.
        assert (
            anarchon("once", "report", "--at", _iso(at), "--store", url, "--unrecorded").returncode
            == 0
        )
        done = anarchon("once", "--pending", "--store", url)
        assert time.time() < at.timestamp(), "the commands took too long to judge --pending"
        assert done.returncode == EXIT_OK, shown(done)
        rows = [line for line in done.stdout.splitlines() if "report" in line]
        assert len(rows) == 1 and at.strftime("%Y-%m-%d %H:%M:%S") in rows[0], shown(done)
        wait_until(lambda: any(slot_id == slot for slot_id, _ in ran), 25, "the one-off to run")
        wait_until(
            lambda: anarchon("once", "--pending", "--store", url).returncode == EXIT_EMPTY,
            10,
            "the one-off's entry settled",
        )
    finally:
        scheduler.stop()
    # The job's own hourly grid runs as well (its latest hour is caught up when the
    # scheduler starts just after one); the one-off ran once, not before its time.
    once = [(slot_id, when) for slot_id, when in ran if slot_id == slot]
    assert len(once) == 1 and once[0][1] >= at.timestamp(), ran
    hours = [slot_id for slot_id, _ in ran if slot_id != slot]
    assert all(int(slot_id.split("@")[1]) % 3_600_000 == 0 for slot_id in hours), ran
    done = anarchon("history", "report", "--store", url)
    assert at.strftime("%Y-%m-%d %H:%M:%S") in done.stdout, shown(done)


def test_cancel_and_the_refusals(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"
    store = ["--store", url]
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    # A job nothing knows of: nothing asked.
    done = anarchon("once", "report", "--at", _iso(at), *store)
    assert done.returncode == EXIT_EMPTY and "no job named 'report'" in done.stderr, shown(done)
    # In the past: refused, naming the way to run now.
    done = anarchon("once", "report", "--at", _iso(at - timedelta(hours=2)), *store, "--unrecorded")
    assert done.returncode == EXIT_CONFIG and "in the past" in done.stderr, shown(done)
    assert "trigger" in done.stderr
    # Without a time, or without a job.
    done = anarchon("once", "report", *store)
    assert done.returncode == EXIT_CONFIG and "--at" in done.stderr, shown(done)
    done = anarchon("once", "--at", _iso(at), *store)
    assert done.returncode == EXIT_CONFIG, shown(done)
    # Asked, then cancelled; cancelling again changes nothing.
    assert anarchon("once", "report", "--at", _iso(at), *store, "--unrecorded").returncode == 0
    done = anarchon("once", "report", "--at", _iso(at), "--cancel", *store)
    assert done.returncode == EXIT_OK and "cancelled" in done.stdout, shown(done)
    done = anarchon("once", "report", "--at", _iso(at), "--cancel", *store)
    assert done.returncode == EXIT_EMPTY and "no one-off" in done.stdout, shown(done)
    done = anarchon("once", "--pending", *store)
    assert done.returncode == EXIT_EMPTY and "no one-off waiting" in done.stdout, shown(done)


def test_a_store_that_keeps_no_one_offs_is_refused() -> None:
    try:
        store_class(AMQP)
    except MissingDependency as exc:
        servers.unavailable(f"the RabbitMQ driver ({exc})")
    at = _iso(datetime.now(timezone.utc) + timedelta(hours=1))
    done = anarchon("once", "report", "--at", at, "--store", AMQP, "--unrecorded")
    assert done.returncode == EXIT_CONFIG, shown(done)
    assert "keeps no one-off runs" in done.stderr, shown(done)
