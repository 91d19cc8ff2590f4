"""A stored schedule with ``overlap="allow_all"``, run by a real scheduler, as the CLI shows it.

``anarchon add ... --overlap allow_all`` stores the job; a scheduler in the test
process (real time, on Redis and on a SQLite file) runs its slots side by side,
each in the store's record of its lane. ``anarchon status``, ``jobs`` and
``history`` then show one job, named as the user named it: its newest slot,
its runs counted together, and every lane's runs in one history.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from anarchon_core import Run, Scheduler, open_store
from anarchon_core.schedules import from_ms
from anarchon_core.slots import LANE
from tests.cli.command import Target, shown, target_store
from tests.cli.test_control_cli import attempts
from tests.waiting import wait_until

EXIT_OK = 0
#: The job's slots come every second; a run goes on until the slot two later has
#: started (so three run at once), or for WAIT seconds at most.
EVERY = 1
WAIT = 10.0
#: The runs the test lets start: several lanes, fewer than a history page (20).
RUNS = 6


@pytest.fixture(params=["redis", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    with target_store(request, tmp_path, "aa") as target:
        yield target


@dataclass
class Runs:
    """The runs of the job, as its handler saw them."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    started: list[Run] = field(default_factory=list)
    going: set[int] = field(default_factory=set)
    most_at_once: int = 0
    ended: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    def handler(self, run: Run) -> None:
        ms = int(run.slot.timestamp() * 1000)
        with self.lock:
            self.started.append(run)
            self.going.add(ms)
            self.most_at_once = max(self.most_at_once, len(self.going))
        try:
            wait_until(
                lambda: (
                    self.release.is_set() or any(m >= ms + 2000 * EVERY for m in self.started_ms())
                ),
                WAIT,
                f"the slot two after {run.slot_id} to start beside it",
            )
        finally:
            with self.lock:
                self.going.discard(ms)
                self.ended += 1

    def started_ms(self) -> list[int]:
        with self.lock:
            return [int(r.slot.timestamp() * 1000) for r in self.started]


def job_rows(out: str) -> list[list[str]]:
    """The rows of the first table of ``out`` (``status`` or ``jobs``), split on blanks: up
    to a blank line or a note (``stored schedule: ...``: a table's cells hold no ``": "``)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("job "))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip() or ": " in line:
            break
        rows.append(line.split())
    return rows


def shown_slot(ms: int) -> list[str]:
    """A slot as the tables show it: its date and time, two cells."""
    return from_ms(ms).strftime("%Y-%m-%d %H:%M:%S").split()


def test_an_allow_all_job_runs_side_by_side_and_shows_as_one_job(target: Target) -> None:
    done = target.run(
        "add", "poll", "--handler", "poll", "--every", str(EVERY), "--overlap", "allow_all"
    )
    assert done.returncode == EXIT_OK, shown(done)
    assert "overlap allow_all -> poll" in done.stdout, shown(done)

    runs = Runs()
    scheduler = Scheduler(target.url, namespace=target.namespace, lease=3)
    scheduler.handler("poll")(runs.handler)
    scheduler.start()
    try:
        wait_until(
            lambda: len(runs.started) >= RUNS,
            RUNS * EVERY + 15,
            f"{RUNS} runs",
            seen=lambda: (runs.started, runs.most_at_once),
        )
        # While they go on: one row, the job's, running on the live instance.
        live = target.run("status")
        assert live.returncode == EXIT_OK, shown(live)
        rows = job_rows(live.stdout)
        assert [row[0] for row in rows] == ["poll"], shown(live)
        assert rows[0][4:6] == ["1", "running"], shown(live)
        assert "\x1f" not in live.stdout and "lane" not in live.stdout, shown(live)
        # The live instance holds the job's runs (in several lanes): named once, as the job.
        table = live.stdout.split(" live instance(s)", 1)[1]
        (instance_row,) = [
            line.split() for line in table.splitlines() if line.startswith(scheduler.instance)
        ]
        assert instance_row[-1] == "poll", shown(live)
    finally:
        runs.release.set()
        wait_until(
            lambda: runs.ended == len(runs.started), WAIT, "the runs to end", seen=lambda: runs
        )
        scheduler.stop(timeout=10)
    started = sorted(runs.started_ms())

    # The slots ran side by side, each once, none skipped, each as attempt 1 of the job.
    assert runs.most_at_once >= 3, runs.most_at_once
    assert started == list(range(started[0], started[-1] + 1, 1000 * EVERY)), started
    assert {(r.job, r.attempt) for r in runs.started} == {("poll", 1)}
    # The store kept them in the records of several lanes (what the CLI groups).
    store = open_store(target.url, namespace=target.namespace)
    try:
        lanes = [name for name in store.jobs() if LANE in name]
    finally:
        store.close()
    assert len(lanes) >= RUNS - 1 and {name.split("\x1f")[0] for name in lanes} == {"poll"}

    # status: one row, the job's, with its newest slot.
    status = target.run("status")
    assert status.returncode == EXIT_OK, shown(status)
    assert "\x1f" not in status.stdout and "lane" not in status.stdout, shown(status)
    rows = job_rows(status.stdout)
    assert [row[0] for row in rows] == ["poll"], shown(status)
    assert rows[0][1:3] == shown_slot(started[-1]), shown(status)
    assert rows[0][4:6] == ["1", "done"], shown(status)

    # jobs: one row, the newest slot, every lane's runs counted.
    jobs = target.run("jobs")
    assert jobs.returncode == EXIT_OK, shown(jobs)
    assert "\x1f" not in jobs.stdout and "lane" not in jobs.stdout, shown(jobs)
    rows = job_rows(jobs.stdout)
    assert [row[:2] for row in rows] == [["poll", "no"]], shown(jobs)
    assert rows[0][2:4] == shown_slot(started[-1]), shown(jobs)
    assert rows[0][5:9] == ["1", "done", str(len(started)), "0"], shown(jobs)
    assert "stored schedule: poll v1 every 1s, overlap allow_all -> poll" in jobs.stdout

    # history: the lanes' runs together, newest first, each slot once.
    history = target.run("history", "poll")
    assert history.returncode == EXIT_OK, shown(history)
    assert "\x1f" not in history.stdout and "lane" not in history.stdout, shown(history)
    listed = attempts(history.stdout)
    assert [[row["date"], row["time"][:8]] for row in listed] == [
        shown_slot(ms) for ms in reversed(started)
    ], shown(history)
    assert {(row["how"], row["attempt"], row["state"]) for row in listed} == {
        ("scheduled", "1", "done")
    }, shown(history)
