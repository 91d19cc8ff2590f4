"""The Celery scheduler with Celery's in-process test fixtures (``celery.contrib.pytest``).

Beat is ``celery.beat.Service(...).scheduler`` ticked by the test, the worker
is the embedded ``celery_worker`` (a thread, solo pool, memory broker), and
the store is a SQLite file: what a user's own test of their periodic tasks
looks like (see "Testing your periodic tasks" in docs/celery.md). Real time,
on a 1 s grid.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, beat
from celery.result import AsyncResult
from celery.utils.nodenames import anon_nodename

from anarchon_celery import Scheduler
from anarchon_core import RunState, Store, open_store
from anarchon_core import Scheduler as Engine
from anarchon_core.cli import run_status
from anarchon_core.dashboard import Dashboard
from anarchon_core.events import Event, EventKind
from anarchon_core.handoff import stray_sends
from anarchon_core.metrics import Metrics
from tests.celery.ticking import drive
from tests.waiting import wait_until

# Celery's fixtures. Registered here, not in tests/celery/conftest.py: pytest accepts
# pytest_plugins only in the top-level conftest. The plugin adds no autouse fixture,
# so other modules are unaffected.
pytest_plugins = ("celery.contrib.pytest",)

Header = dict[str, Any]


class Runs:
    """What the test tasks saw, appended from the worker's thread."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, Header | None]] = []
        self.during: dict[str, Any] = {}

    def slots(self, task: str = "record") -> list[str]:
        return [h["slot_id"] for name, _, h in self.seen if name == task and h]


@pytest.fixture(scope="session")
def celery_config() -> dict[str, Any]:
    """The test app's settings: the in-memory broker and result backend, polled often."""
    return {
        "broker_url": "memory://",
        "broker_transport_options": {"polling_interval": 0.05},
        "result_backend": "cache+memory://",
    }


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/anarchon.db"


@pytest.fixture
def runs(celery_app: Celery, celery_worker: Any, store_url: str) -> Runs:
    """Two tasks on the test app, known to the running worker: one records, one raises."""
    runs = Runs()

    @celery_app.task(bind=True, name="periodic.record")
    def record(self: Any) -> None:
        header = self.request.get("anarchon")
        if header and header.get("tracked"):
            # What the store says while the body runs.
            with closing_store(store_url, header["namespace"]) as store:
                runs.during[header["slot_id"]] = store.state(header["job"])
        runs.seen.append(("record", self.request.id, header))

    @celery_app.task(bind=True, name="periodic.boom")
    def boom(self: Any) -> None:
        runs.seen.append(("boom", self.request.id, self.request.get("anarchon")))
        raise RuntimeError("boom")

    celery_worker.reload()  # the worker started before these tasks existed
    return runs


@contextlib.contextmanager
def closing_store(url: str, namespace: str) -> Iterator[Store]:
    store = open_store(url, namespace=namespace)
    try:
        yield store
    finally:
        store.close()


def configure(app: Celery, store_url: str, schedule: dict[str, Any], **settings: Any) -> None:
    app.conf.update(
        beat_scheduler="anarchon_celery:Scheduler",
        beat_schedule=schedule,
        anarchon_store=store_url,
        **settings,
    )


def beat_scheduler(app: Celery) -> Scheduler:
    """The scheduler ``celery beat`` would build from the app's settings."""
    scheduler = beat.Service(app, scheduler_cls=app.conf.beat_scheduler).scheduler
    assert isinstance(scheduler, Scheduler)
    return scheduler


@pytest.fixture
def close_after() -> Iterator[list[Scheduler]]:
    schedulers: list[Scheduler] = []
    yield schedulers
    for scheduler in reversed(schedulers):  # each restores the signal handlers it replaced
        scheduler.close()


def test_two_beats_on_one_store_send_each_slot_once(
    celery_app: Celery, runs: Runs, store_url: str, close_after: list[Scheduler]
) -> None:
    # No jitter: both beats claim each slot at the same instant.
    configure(
        celery_app,
        store_url,
        {"record": {"task": "periodic.record", "schedule": 1}},
        anarchon_jitter=0,
    )
    beats = [beat_scheduler(celery_app), beat_scheduler(celery_app)]
    close_after.extend(beats)

    # The slots counted are those after both engines are up (on a loaded machine the
    # first step may come after the next slot's catch-up window, which then passes).
    def up() -> bool:
        return all(b.engine is not None and b.engine.health().ready for b in beats)

    drive(beats, up, timeout=10)  # beat's ticks step the engines
    assert up(), "the beats' engines did not come up"
    # What each beat's claims were told, per slot: a slot due before the window may
    # still be claimed in it on a loaded machine, so counts are by slot, not by time.
    told: list[dict[str, str]] = [{}, {}]
    for one, answers in zip(beats, told, strict=True):
        assert one.engine is not None

        def listen(event: Event, answers: dict[str, str] = answers) -> None:
            if event.slot_id and event.kind in (EventKind.WON, EventKind.CATCH_UP):
                answers[event.slot_id] = "won"
            elif event.slot_id and event.kind is EventKind.TAKEN:
                answers[event.slot_id] = "taken"

        one.engine.add_listener(listen)
    started = time.time()
    # Stop half-way between two slots, after at least two slots.
    stop_at = int(started) + 2.5 + (started % 1 > 0.5)
    drive(beats, lambda: time.time() > stop_at, timeout=5)
    expected = {f"record@{s * 1000}" for s in range(int(started) + 1, int(stop_at) + 1)}
    assert len(expected) >= 2
    wait_until(
        lambda: expected <= set(runs.slots()),
        5,
        f"the slots {sorted(expected)} sent to run",
        seen=runs.slots,
    )
    time.sleep(0.3)  # room for a second message of a slot to arrive

    counts = Counter(runs.slots())
    assert [s for s, n in counts.items() if n > 1] == [], f"slots run twice: {counts}"
    # Every slot that came while both beats ticked ran, and was won by one beat only.
    assert {s for s in counts if _after(s, started)} == expected
    # Both beats claimed every slot: one was told it won, the other that it was taken.
    for slot in expected:
        assert sorted(answers.get(slot, "") for answers in told) == ["taken", "won"], told


def _after(slot_id: str, started: float) -> bool:
    """Whether the slot ``slot_id`` (``job@ms``) came after ``started``."""
    return int(slot_id.rsplit("@", 1)[1]) > started * 1000


def test_the_task_sees_its_slot_and_attempt(
    celery_app: Celery, runs: Runs, store_url: str, close_after: list[Scheduler]
) -> None:
    configure(celery_app, store_url, {"record": {"task": "periodic.record", "schedule": 1}})
    scheduler = beat_scheduler(celery_app)
    close_after.append(scheduler)
    drive([scheduler], lambda: bool(runs.seen), timeout=4)
    wait_until(lambda: bool(runs.seen), 3, "the beat to send a task")

    name, task_id, header = runs.seen[0]
    assert header is not None
    job, _, slot_ms = header["slot_id"].partition("@")
    assert (name, job, header["job"]) == ("record", "record", "record")
    assert int(slot_ms) % 1000 == 0  # a point of the 1 s grid
    assert header["namespace"] == celery_app.main
    assert header["attempt"] == 1
    assert isinstance(header["token"], int)
    assert header["sent_by"].endswith(":beat")
    assert task_id == f"anarchon:{celery_app.main}:{header['slot_id']}:1"

    # The same task called in another way has no slot.
    runs.seen.clear()
    celery_app.tasks["periodic.record"].delay().get(timeout=5)
    assert [(name, header) for name, _, header in runs.seen] == [("record", None)]


def test_the_worker_holds_the_lease_and_finishes_the_slot(
    celery_app: Celery, runs: Runs, store_url: str, close_after: list[Scheduler]
) -> None:
    configure(
        celery_app,
        store_url,
        {
            "record": {"task": "periodic.record", "schedule": 1},
            "boom": {"task": "periodic.boom", "schedule": 1},
        },
        anarchon_lease=3,
        anarchon_pickup=30,
    )
    scheduler = beat_scheduler(celery_app)
    close_after.append(scheduler)
    # The embedded worker announces its hooks; beat hands slots off once it has heard.
    assert celery_app.conf.get("anarchon_worker_tracking") is True
    wait_until(lambda: scheduler.tracking, 10, "beat to see the worker's hooks")

    drive([scheduler], lambda: len(runs.seen) >= 2, timeout=4)
    namespace = celery_app.main
    assert namespace is not None
    with closing_store(store_url, namespace) as store:

        def finished(job: str) -> bool:
            state = store.state(job)
            return state is not None and state.state not in (RunState.RUNNING, RunState.DISPATCHED)

        wait_until(lambda: finished("record") and finished("boom"), 5, "record and boom to finish")
        record, boom = store.state("record"), store.state("boom")
        assert record is not None and boom is not None
        assert (record.state, boom.state) == (RunState.DONE, RunState.FAILED)
        headers = {name: h for name, _, h in runs.seen if h}
        slot, failed = headers["record"], headers["boom"]
        assert slot["tracked"] is True
        assert failed["tracked"] is True
        # The very attempts the worker ran ended done and failed.
        outcomes = {
            (r.job, f"{r.job}@{r.slot_ms}", r.attempt): r.state
            for job in ("record", "boom")
            for r in store.history(job)
        }
        assert outcomes[("record", slot["slot_id"], 1)] is RunState.DONE
        assert outcomes[("boom", failed["slot_id"], 1)] is RunState.FAILED

    # While the body ran, the lease was the worker's (renewed to anarchon_lease),
    # not the 30 s pickup lease the beat handed off with.
    during = runs.during[slot["slot_id"]]
    assert during.state is RunState.RUNNING
    assert during.token == slot["token"]
    assert 0 < during.lease_remaining <= 3

    # The same message delivered again, after its attempt finished: skipped, revoked.
    again = f"{slot['slot_id']}-again"
    runs.seen.clear()
    celery_app.tasks["periodic.record"].apply_async(task_id=again, headers={"anarchon": slot})
    wait_until(
        lambda: AsyncResult(again, app=celery_app).state == "REVOKED", 5, "the task to be revoked"
    )
    assert runs.seen == []


def test_beat_stops_once_its_scheduler_closed_even_if_the_signals_exit_is_lost(
    celery_app: Celery, store_url: str
) -> None:
    # Beat's SIGTERM handler closes the scheduler (service.sync()), then raises
    # SystemExit to end the loop. Raised while the main thread runs a finalizer,
    # that SystemExit is only printed ("Exception ignored") and beat would sleep
    # on, unscheduled, until killed. Here the handler's first half runs alone.
    configure(celery_app, store_url, {"record": {"task": "periodic.record", "schedule": 1.0}})
    service = beat.Service(celery_app, scheduler_cls=celery_app.conf.beat_scheduler)
    loop = threading.Thread(target=service.start, daemon=True)
    loop.start()
    wait_until(
        lambda: getattr(service.scheduler, "engine", None) is not None, 5, "the engine to start"
    )
    service.sync()  # what the handler does before its SystemExit
    loop.join(5)
    assert not loop.is_alive(), "beat kept looping after its scheduler was closed"
    assert service._is_shutdown.is_set()


def test_close_is_not_deferred_to_a_step_that_a_signal_cut_short(
    celery_app: Celery, store_url: str
) -> None:
    # A SIGTERM whose handler raised SystemExit on a step's first or last line
    # leaves the step's mark set with no step under way: beat's final close()
    # must still close (hand over, release the store), not wait for that step.
    configure(celery_app, store_url, {"record": {"task": "periodic.record", "schedule": 1.0}})
    scheduler = beat_scheduler(celery_app)
    assert scheduler.engine is not None
    scheduler._steps._stepping = threading.get_ident()  # the mark a cut step leaves
    scheduler.close()
    assert scheduler.engine is None


def test_a_sigterm_while_beat_builds_its_scheduler_stops_beat(
    celery_app: Celery, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beat installs its SIGTERM handler before the Service builds the scheduler
    # (at its first use, in Service.start). The handler asks the Service for
    # the scheduler to close it: during that build, the Service built a second
    # scheduler inside the handler (importing and connecting again), and beat
    # ran on, its SIGTERM lost. Here the handler runs at the end of the build.
    configure(celery_app, store_url, {"record": {"task": "periodic.record", "schedule": 1.0}})
    service = beat.Service(celery_app, scheduler_cls=celery_app.conf.beat_scheduler)
    built: list[Scheduler] = []
    start_engine = Scheduler._start_engine

    def signalled_while_building(self: Scheduler, settings: Any) -> Any:
        entries = start_engine(self, settings)
        built.append(self)
        if len(built) == 1:
            service.sync()  # beat's handler: close the Service's scheduler...
            raise SystemExit()  # ...and stop
        return entries

    monkeypatch.setattr(Scheduler, "_start_engine", signalled_while_building)
    with pytest.raises(SystemExit):
        service.scheduler
    assert len(built) == 1, "the handler built a second scheduler with its own store"
    assert built[0].engine is None  # the one being built was torn down, its store closed
    assert service._is_stopped.is_set()


def test_a_sigterm_lost_while_beat_builds_its_scheduler_still_stops_beat(
    celery_app: Celery, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same signal, its SystemExit lost (raised inside an import's compile,
    # which swallows it): the scheduler built closes itself, and beat's loop
    # ends at its first tick.
    configure(celery_app, store_url, {"record": {"task": "periodic.record", "schedule": 1.0}})
    service = beat.Service(celery_app, scheduler_cls=celery_app.conf.beat_scheduler)
    start_engine = Scheduler._start_engine
    calls: list[int] = []

    def signalled_while_building(self: Scheduler, settings: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            service.sync()  # beat's handler, its SystemExit lost
        return start_engine(self, settings)

    monkeypatch.setattr(Scheduler, "_start_engine", signalled_while_building)
    loop = threading.Thread(target=service.start, daemon=True)
    loop.start()
    loop.join(5)
    assert not loop.is_alive(), "beat ran on after its SIGTERM"
    assert len(calls) == 1
    assert service.scheduler.engine is None


def test_a_stock_beat_left_running_is_said_once_per_entry_and_counted(
    celery_app: Celery,
    runs: Runs,
    store_url: str,
    close_after: list[Scheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    configure(celery_app, store_url, {"record": {"task": "periodic.record", "schedule": 1}})
    scheduler = beat_scheduler(celery_app)
    close_after.append(scheduler)
    drive([scheduler], lambda: bool(runs.seen), timeout=4)
    wait_until(lambda: bool(runs.seen), 3, "anarchon's beat to send")
    scheduler.close()
    runs.seen.clear()
    caplog.set_level("INFO", logger="anarchon_celery.tracking")

    # One pod still on stock beat, mid-migration: it sends the entry's task as
    # Celery's beat does (the celery_beat_task header, no anarchon ticket).
    stock = beat.Scheduler(celery_app, lazy=False)
    try:
        for _ in range(3):
            stock.apply_async(stock.schedule["record"], advance=False)
        wait_until(
            lambda: len(runs.seen) == 3, 5, "the stock beat's 3 sends", seen=lambda: runs.seen
        )
    finally:
        stock.close()
    assert all(header is None for _, _, header in runs.seen)  # they ran: only said

    said = [
        r
        for r in caplog.records
        if r.name == "anarchon_celery.tracking" and "not anarchon's" in r.getMessage()
    ]
    assert len(said) == 1, caplog.text
    assert said[0].levelname == "WARNING"
    message = said[0].getMessage()
    assert message.startswith("anarchon: entry record was sent by a beat that is not anarchon's")
    assert "Migrating from stock beat" in message
    with closing_store(store_url, celery_app.main) as store:
        (counted,) = stray_sends(store)
    assert (counted.job, counted.count) == ("record", 3)
    assert counted.sender == anon_nodename()  # Celery's origin header: the sending host
    assert f"from {counted.sender}" in message

    # A task called in any other way is no beat's send: nothing said or counted.
    celery_app.tasks["periodic.record"].delay().get(timeout=5)
    with closing_store(store_url, celery_app.main) as store:
        assert [s.count for s in stray_sends(store)] == [3]

    # Status, the dashboard and the metrics show it.
    out, err = io.StringIO(), io.StringIO()
    assert run_status(store_url, celery_app.main, out, err, prog="celery anarchon") == 0
    shown = out.getvalue()
    assert "1 job(s) also sent by a scheduler that is not anarchon's" in shown, shown
    assert re.search(rf"^record\s+3\s+\S+ \S+\s+{re.escape(counted.sender)}$", shown, re.M), shown
    page = Dashboard(store_url, namespace=celery_app.main)
    try:
        assert [(s["job"], s["count"]) for s in page.state()["strays"]] == [("record", 3)]
    finally:
        page.close()
    engine = Engine(store_url, namespace=celery_app.main)
    try:
        registry = Metrics(engine).registry
        labels = {"namespace": celery_app.main, "job": "record"}
        assert registry.get_sample_value("anarchon_stray_sends_total", labels) == 3
    finally:
        engine.stop(timeout=0)


def test_claims_sent_ahead_send_each_task_at_its_slots_time(
    celery_app: Celery, runs: Runs, store_url: str, close_after: list[Scheduler]
) -> None:
    """``anarchon_lookahead``: each beat claims ahead (a tenth of the 1 s interval), and
    the beat that won sends the task at the slot's time, not before; each slot once."""
    from celery.signals import before_task_publish

    configure(
        celery_app,
        store_url,
        {"record": {"task": "periodic.record", "schedule": 1}},
        anarchon_jitter=0,
        anarchon_lookahead=0.5,
    )
    beats = [beat_scheduler(celery_app), beat_scheduler(celery_app)]
    close_after.extend(beats)
    won: dict[str, float] = {}
    sent: dict[str, list[float]] = {}

    def heard(event: Any) -> None:
        if event.kind == "won":
            won.setdefault(event.slot_id, time.time())

    def published(headers: dict[str, Any] | None = None, **_: Any) -> None:
        info = (headers or {}).get("anarchon")
        if info:
            sent.setdefault(info["slot_id"], []).append(time.time())

    for b in beats:
        assert b.engine is not None
        b.engine.add_listener(heard)
    before_task_publish.connect(published, weak=False)
    try:
        started = time.time()
        stop_at = int(started) + 3.5
        drive(beats, lambda: time.time() > stop_at, timeout=6)
    finally:
        before_task_publish.disconnect(published)
    wait_until(lambda: len(runs.slots()) >= len(sent), 5, "the tasks sent to run", seen=runs.slots)
    expected = {f"record@{s * 1000}" for s in range(int(started) + 1, int(stop_at) + 1)}
    assert set(sent) == expected and Counter(runs.slots()) == Counter(expected)
    ahead = 0
    for slot, times in sent.items():
        at = int(slot.rsplit("@", 1)[1]) / 1000
        # Sent once, never before the slot's time.
        assert len(times) == 1 and times[0] >= at, (slot, times)
        ahead += won[slot] < at
    # Won ahead of their time: the claim's round trip was over when the slot came (all of
    # them on an idle machine; a beat thread held up past the tenth of a second may not).
    assert ahead >= 1, {slot: won[slot] for slot in sent}
