"""django-celery-beat's rows sent by ``anarchon_celery:DatabaseScheduler`` in three real beats.

A real Django project (tests/django/project: settings, migrations applied,
the admin) on PostgreSQL (claims in the Redis broker) and on MariaDB (claims
in the project's own database, ``anarchon_store = "django"``); real
``celery beat`` and ``celery worker`` processes; rows edited as the admin
saves them while the beats run; a beat that just sent SIGKILLed, then
another SIGTERMed; every beat stopped across a clocked row's time. One of
the three beats runs in the worker's pod (``celery worker -B``).
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cleanup import drop_namespace
from tests.django.harness import DjangoFleet, Project
from tests.fleet import Line, fleets, per_slot, slot_seconds
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: How often the beats read the change marker (the project's anarchon_django_poll).
POLL = 1.0
#: An edit is followed by every beat within a poll, plus a margin for a loaded machine
#: (CI runs ten test processes on two cores).
FOLLOWED = POLL + 3.0
#: When, after the rows with times of their own are written, 'expiring' expires,
#: 'clocked' runs and 'later' starts. 'expiring' must be followed and sent before it
#: expires, on a loaded machine: hence the margin. (The crontab minute waited for
#: below takes longer.)
EXPIRING, CLOCKED, LATER = 15, 18, 21


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., DjangoFleet]]:
    yield from fleets(DjangoFleet, tmp_path)


@pytest.fixture(params=["postgres", "mysql"])
def project(request: pytest.FixtureRequest) -> Iterator[tuple[Project, str]]:
    """The project on a new database, and the claim store: the broker (with PostgreSQL),
    the project's database (with MariaDB)."""
    server = request.getfixturevalue(f"{request.param}_url")
    made = Project(server)
    try:
        yield made, "" if request.param == "postgres" else "django"
    finally:
        made.drop()


def seconds_of(starts: list[Line]) -> list[int]:
    return sorted(int(slot_seconds(x["slot_id"])) for x in starts)


def on_grid(every: int, start: float, end: float) -> list[int]:
    """The slots of an ``every``-second grid (anchored at the epoch) between two times."""
    return [s for s in range(math.ceil(start), math.floor(end) + 1) if s % every == 0]


def sent_by_a_beat(fleet: DjangoFleet, starts: list[Line]) -> tuple[Line, str] | None:
    """The last run sent by a running ``celery beat`` pod (not the worker's own beat), and it."""
    for start in reversed(starts):
        try:
            pod = fleet.pod_of(start["sent_by"])
        except (ProcessLookupError, StopIteration):
            continue  # sent by a beat since stopped
        if pod.startswith("b"):
            return start, pod
    return None


# Two minutes of real time at least (a crontab minute, kills and restarts), and each read
# of the table a Django process of its own: more than the suite's 180 s on a loaded machine.
@pytest.mark.timeout(420)
def test_rows_are_sent_once_by_three_beats_through_edits_kills_and_restarts(
    fleet: Callable[..., DjangoFleet], project: tuple[Project, str], redis_url: str
) -> None:
    rows, store = project
    pods = fleet(redis_url, rows, store=store, lease=3)
    namespace = pods.namespace
    rows.rows(
        "create",
        [
            {
                "name": "every2",
                "every": 2,
                "args": ["every2"],
                "kwargs": {"k": 1},
                "queue": namespace,
                "priority": 5,
                "headers": {"x-custom": "yes"},
                "expire_seconds": 60,
            },
            {"name": "minute", "cron": "* * * * *", "timezone": "Asia/Kolkata", "args": ["minute"]},
            {"name": "once", "every": 3, "one_off": True, "args": ["once"]},
            {"name": "off", "every": 2, "args": ["off"]},
            {"name": "gone", "every": 2, "args": ["gone"]},
            {"name": "sun", "solar": "sunset", "args": ["sun"]},
        ],
    )
    # Three beats: one in the worker's pod (celery worker -B), two on their own (celery beat).
    pods.worker("w", beat=True, concurrency=1)
    for name in ("b2", "b3"):
        pods.beat(name)
    try:
        _scenario(pods, rows, store)
    finally:
        pods.stop_all()
        if not store:
            drop_namespace(redis_url, namespace)


def _scenario(pods: DjangoFleet, rows: Project, store: str) -> None:
    def starts(job: str) -> list[Line]:
        return pods.starts(job)

    def wait(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
        return wait_until(check, timeout, what, seen=pods.tail)

    wait("tracking in every beat", lambda: pods.tracking("w", "b2", "b3"), 60)
    wait("three runs of every2", lambda: len(starts("every2")) >= 3)
    # Rows with times of their own, added while the beats run: their times count from the
    # moment they are written (t0), not from when the Django process that writes them began.
    added = rows.rows(
        "create",
        [
            {"name": "later", "every": 2, "start_time": {"in": LATER}, "args": ["later"]},
            {"name": "expiring", "every": 2, "expires": {"in": EXPIRING}, "args": ["expiring"]},
            {"name": "clocked", "clocked": {"in": CLOCKED}, "args": ["clocked"]},
        ],
    )
    t0 = json.loads(added)["now"]
    assert time.time() + FOLLOWED + 2 < t0 + EXPIRING, "the rows took too long to add"

    # Edits, as the admin saves them: a new interval, a row disabled, one deleted, one added.
    # They are saved by a Django process of their own, at some moment between ``editing``
    # and ``edited`` (seconds apart on a loaded machine).
    editing = time.time()
    rows.rows(
        "do",
        [
            ["every", "every2", 3],
            ["disable", "off"],
            ["delete", "gone"],
            ["create", [{"name": "added", "every": 2, "args": ["added"]}]],
        ],
    )
    edited = time.time()
    wait("a run of the added row", lambda: starts("added"))
    wait(
        "every2 on its new grid",
        lambda: [s for s in seconds_of(starts("every2")) if s > edited + FOLLOWED],
    )

    # A beat that just sent a slot, SIGKILLed; then another, SIGTERMed.
    for signum, replacement in ((signal.SIGKILL, "b4"), (signal.SIGTERM, "b5")):
        last, pod = wait("a slot sent by a beat", lambda: sent_by_a_beat(pods, starts("every2")))
        if signum == signal.SIGKILL:
            pods.kill(pod)
        else:
            pods.signal(pod, signum)  # it hands its slots over and exits
        pods.beat(replacement)
        wait("every2 sent again", lambda: starts("every2")[-1]["slot_id"] != last["slot_id"], 15)

    # The rows with times of their own come, and a crontab minute passes.
    timed = ("clocked", "later", "minute")
    wait_until(
        lambda: all(starts(job) for job in timed),
        70,
        "the clocked row, the start of 'later', a crontab minute",
        # The end shows (a long one is cut from the front): which of them never came.
        seen=lambda: f"{pods.tail()}\nnot started: {[j for j in timed if not starts(j)]}",
    )
    wait("every2 after 'expiring' expired", lambda: time.time() > t0 + EXPIRING + 2, 20)

    # Every beat down across a clocked row's time: the first beats up send it, once.
    clocked_at = round(time.time()) + 6
    rows.rows("create", [{"name": "clocked2", "clocked": clocked_at, "args": ["clocked2"]}])
    checked_until = time.time()
    # Nothing went wrong on the way: no store error, no traceback in any pod's log. (Read
    # before the pods are stopped: a pod is stopped as a whole, and a worker's pool process
    # that gets the SIGTERM while it runs a task makes Celery log a WorkerLostError.)
    assert pods.mentions("store_unavailable", "Traceback") == []
    for name in list(pods.procs):
        pods.stop(name)
    wait("the clocked row's time, with every beat down", lambda: time.time() > clocked_at + 2, 15)
    pods.worker("w2", beat=True, concurrency=1)
    pods.beat("b6")
    caught = wait("clocked2, caught up", lambda: starts("clocked2"), 30)
    restarted = [
        m for m in pods.mentions("store_unavailable", "Traceback") if m[:3] in ("w2:", "b6:")
    ]
    assert restarted == []
    pods.stop("b6")
    lines = pods.lines()
    every_start = [x for x in lines if x["kind"] == "start"]
    twice = {s: n for s, n in per_slot(every_start).items() if n > 1}
    assert twice == {}, f"slots sent twice: {twice}"

    # every2: each slot of the 2-second grid until the edit, then of the 3-second grid.
    every2 = seconds_of(starts("every2"))
    first = every2[0]
    before = [s for s in every2 if s < editing]
    two = on_grid(2, first, editing - 0.001)
    assert [s for s in before if s in two] == two, "a 2-second slot missed"
    # Placed on its new grid, the row catches up that grid's most recent slot when it
    # came after the last slot sent, within its catch-up window (docs/celery.md): one
    # 3-second slot a little before the edit was saved may come, after the 2-second ones.
    on_new_grid = [s for s in before if s not in two]
    assert len(on_new_grid) <= 1, before
    assert all(s % 3 == 0 and s > two[-1] for s in on_new_grid), before
    after = [s for s in every2 if edited + FOLLOWED < s <= checked_until - 1]
    assert after == on_grid(3, edited + FOLLOWED, checked_until - 1), (
        f"a 3-second slot missed or a 2-second one sent after the edit: {after}"
    )
    sent = starts("every2")[0]
    assert sent["periodic_task_name"] == "every2"
    assert (sent["priority"], sent["custom"], sent["queue"]) == (5, "yes", pods.namespace)
    assert sent["kwargs"] == {"k": 1}
    assert sent["expires"].startswith(
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(slot_seconds(sent["slot_id"]) + 60))
    )

    # Disabled and deleted rows stop within a poll; the added one runs.
    for name in ("off", "gone"):
        assert [s for s in seconds_of(starts(name)) if s > edited + FOLLOWED] == [], name
    assert [s for s in seconds_of(starts("later")) if s < t0 + LATER] == []
    assert seconds_of(starts("expiring")) and max(seconds_of(starts("expiring"))) < t0 + EXPIRING
    assert seconds_of(starts("minute"))[0] % 60 == 0
    assert starts("sun") == []
    for name in ("w", "b2", "b3"):
        assert "PeriodicTask 'sun': solar schedule" in pods.log(name)

    # One-offs: once each, and disabled in the table.
    assert len(starts("once")) == 1
    # Sent at its time, or a little later when the beat that should have sent it was killed.
    [clocked] = seconds_of(starts("clocked"))
    assert t0 + CLOCKED <= clocked <= t0 + CLOCKED + 3
    assert len(caught) == 1 and int(slot_seconds(caught[0]["slot_id"])) >= clocked_at

    # last_run_at and total_run_count: written once per slot, by the beat that sent it.
    # A table read takes a Django process, seconds on a loaded machine: longer than a slot.
    # So the rows still sent are disabled first (their counts settle), but every2 (disabling
    # a row clears its last_run_at), which the worker's own beat still sends: its figures
    # lie between the starts seen before and after the read (one sent may not have started).
    rows.rows("do", [["disable", name] for name in ("added", "later", "minute")])

    def counts_match() -> dict[str, tuple[int, int]]:
        before = seconds_of(starts("every2"))
        table = rows.dump()
        after = seconds_of(starts("every2"))
        wrong = {}
        for name in ("minute", "once", "clocked", "clocked2", "added", "later"):
            started = len(set(seconds_of(starts(name))))
            if table[name]["total_run_count"] != started:
                wrong[name] = (table[name]["total_run_count"], started)
        count = table["every2"]["total_run_count"]
        if not len(set(before)) <= count <= len(set(after)) + 1:
            wrong["every2"] = (count, len(set(after)))
        last = table["every2"]["last_run_at"]
        if last is None or last < max(before) or not (last in after or last > max(after)):
            wrong["every2 last_run_at"] = (last, max(after))
        return wrong

    wait_until(
        lambda: not counts_match(),
        30,
        "total_run_count equal to the slots sent, last_run_at to the newest",
        interval=0.5,
        seen=counts_match,
    )
    # The claims went where the store setting says: the project's database only if chosen.
    made = [t for t in json.loads(rows.rows("tables")) if t.startswith("anarchon_")]
    assert bool(made) == (store == "django"), made
    table = rows.dump()
    for name in ("once", "clocked", "clocked2"):
        assert table[name]["enabled"] is False, name
