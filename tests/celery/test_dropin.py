"""``anarchon_celery.Scheduler`` as a drop-in for beat's scheduler contract.

What a user who swaps one line of configuration relies on: sends go through
beat's ``apply_entry`` / ``apply_async`` / ``send_task`` (subclass overrides,
beat's log line, tools that patch ``apply_entry``), ``BeatLazyFunc``
arguments, Celery's default entries, ``scheduler.schedule`` and entries added
at run time, schedule subclasses, ``close()`` and a second setup, the loop
interval settings, and a SIGTERM that lands while beat is inside a store call.

In process with a SQLite store and a memory broker, except the SIGTERM tests,
which run real ``celery beat`` processes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery, beat, signals
from celery.beat import BeatLazyFunc, ScheduleEntry
from celery.schedules import BaseSchedule, crontab, schedstate, schedule

from anarchon_celery import Scheduler
from anarchon_celery.schedules import read_entry
from anarchon_core import ConfigurationError, RunState, Store, open_store
from tests.celery.ticking import drive
from tests.fleet import BIN, ROOT

#: Not registered in the app: beat sends it with its own ``send_task``.
TASK = "dropin.nothing"


class Recording(Scheduler):
    """Records each ``apply_entry`` call and what beat's ``send_task`` publishes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.applied: list[tuple[str, ScheduleEntry]] = []
        self.published: list[tuple[str, Any, Any, dict[str, Any]]] = []
        self.fail_sends: Exception | None = None
        super().__init__(*args, **kwargs)

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        assert self.engine is not None
        self.applied.append((self.engine.instance, entry))
        super().apply_entry(entry, producer=producer)

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        if self.fail_sends is not None:
            raise self.fail_sends
        self.published.append((name, args, kwargs, options))


class NeverDue(schedule):  # type: ignore[misc]
    """A schedule whose own is_due says when it runs: not computable from the clock."""

    def is_due(self, last_run_at: Any) -> schedstate:
        return schedstate(False, 5.0)


def make_app(tmp_path: Path, schedule_: dict[str, Any] | None = None, **conf: Any) -> Celery:
    app = Celery("dropin", broker="memory://")
    app.conf.update(
        anarchon_store=f"sqlite:///{tmp_path / 'store.db'}",
        anarchon_tracking=False,
        anarchon_jitter=0,
        beat_schedule=schedule_ if schedule_ is not None else {},
        timezone="UTC",
    )
    app.conf.update(conf)
    return app


@pytest.fixture
def closing() -> Iterator[list[Scheduler]]:
    """Schedulers closed at the end of the test, whatever happened."""
    schedulers: list[Scheduler] = []
    yield schedulers
    for scheduler in schedulers:
        scheduler.close()


@pytest.fixture
def recording(closing: list[Scheduler]) -> Callable[..., Recording]:
    """Makes a :class:`Recording` beat of an app, closed at the end of the test."""

    def make(app: Celery, *, fail_sends: Exception | None = None) -> Recording:
        scheduler = Recording(app)
        closing.append(scheduler)
        if fail_sends is not None:
            scheduler.fail_sends = fail_sends
        return scheduler

    return make


def dropin_store(app: Celery) -> contextlib.closing[Store]:
    """The anarchon store of ``app``'s beats, closed when the ``with`` block ends."""
    return contextlib.closing(open_store(app.conf.anarchon_store, namespace="dropin"))


def every_second(**extra: Any) -> dict[str, Any]:
    return {"e": {"task": TASK, "schedule": 1, **extra}}


# -- 1. sends go through beat's apply_entry / apply_async / send_task ------------------


def test_apply_entry_runs_once_per_slot_and_only_on_the_beat_that_won_it(
    tmp_path: Path,
    closing: list[Scheduler],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level("INFO", logger="celery.beat")
    app = make_app(tmp_path, every_second(args=(1,), options={"queue": "q"}))
    # Two beats of one process: named apart as beats on two hosts would be.
    monkeypatch.setattr(socket, "gethostname", lambda: "beat-1")
    first = Recording(app)
    monkeypatch.setattr(socket, "gethostname", lambda: "beat-2")
    second = Recording(app)
    closing += [first, second]
    assert first.engine is not None and second.engine is not None
    assert {first.engine.instance, second.engine.instance} == {
        f"beat-{n}:{os.getpid()}:beat" for n in (1, 2)
    }

    def slots() -> set[str]:
        return {e.options["task_id"] for _, e in first.applied + second.applied}

    drive([first, second], lambda: len(slots()) >= 4, timeout=10)

    applied = first.applied + second.applied
    ids = [entry.options["task_id"] for _, entry in applied]
    assert len(ids) == len(set(ids)), "an apply_entry ran twice for one slot"
    with dropin_store(app) as store:
        owners = {f"e@{r.slot_ms}": r.owner for r in store.history("e")}
    for instance, entry in applied:
        header = entry.options["headers"]["anarchon"]
        assert header["sent_by"] == instance
        assert owners[header["slot_id"]] == instance, "apply_entry ran on a beat that lost"
        # beat's own entry type, with the entry's real schedule and anarchon's id and header
        assert isinstance(entry, ScheduleEntry)
        assert isinstance(entry.schedule, schedule)
        assert entry.schedule.run_every == timedelta(seconds=1)
        assert (entry.name, entry.task, entry.args) == ("e", TASK, (1,))
        assert entry.options["task_id"].startswith("anarchon:dropin:e@")
    # stock apply_async ran: it published through send_task, with beat's header
    published = first.published + second.published
    assert sorted(o["task_id"] for *_, o in published) == sorted(ids)
    for name, args, _kwargs, options in published:
        assert (name, list(args), options["queue"]) == (TASK, [1], "q")
        assert options["headers"]["celery_beat_task"] is True
        assert options["headers"]["anarchon"]["slot_id"]
    assert caplog.text.count(f"Scheduler: Sending due task e ({TASK})") == len(ids)


def test_a_patched_apply_entry_sees_each_send_and_may_add_headers(
    tmp_path: Path, recording: Callable[..., Recording], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Sentry's beat monitoring does: patch beat's apply_entry, read the schedule."""
    seen: list[Any] = []
    original = beat.Scheduler.apply_entry

    def patched(self: Any, entry: ScheduleEntry, producer: Any = None) -> Any:
        seen.append(entry.schedule)
        entry.options.setdefault("headers", {})["monitor"] = entry.name
        return original(self, entry, producer=producer)

    monkeypatch.setattr(beat.Scheduler, "apply_entry", patched)
    scheduler = recording(make_app(tmp_path, every_second()))
    drive([scheduler], lambda: len(scheduler.published) >= 2, timeout=6)
    assert all(isinstance(s, schedule) and s.seconds == 1 for s in seen)
    for *_, options in scheduler.published:
        assert options["headers"]["monitor"] == "e"
        assert "anarchon" in options["headers"]


def test_a_send_that_fails_inside_apply_entry_still_fails_the_slot(
    tmp_path: Path, recording: Callable[..., Recording]
) -> None:
    """Beat's apply_entry only logs a failed send: the slot must still end as failed."""
    app = make_app(tmp_path, every_second())
    scheduler = recording(app, fail_sends=TypeError("Object of type set is not JSON serializable"))
    with dropin_store(app) as store:
        drive([scheduler], lambda: len(scheduler.applied) >= 2, timeout=6)
        finished = [r.state for r in store.history("e") if r.ended_at is not None]
    assert finished, "no slot finished"
    assert set(finished) == {RunState.FAILED}


def test_a_send_the_broker_refused_is_sent_again_as_the_next_attempt(
    tmp_path: Path, recording: Callable[..., Recording]
) -> None:
    """An unreachable broker fails no slot: it is sent again as the next attempt."""
    # Slots may be sent up to 10 s late: the retries stay within the window.
    app = make_app(tmp_path, every_second(), anarchon_catch_up=10)
    scheduler = recording(app, fail_sends=ConnectionError("the broker is gone"))
    with dropin_store(app) as store:
        drive([scheduler], lambda: len(scheduler.applied) >= 2, timeout=6)
        scheduler.fail_sends = None  # the broker is back

        def resent() -> list[dict[str, Any]]:
            """Sends that reached the broker as a later attempt of a slot already tried."""
            tried = {f"e@{r.slot_ms}" for r in store.history("e") if r.state is RunState.LOST}
            sent = [p[3]["headers"]["anarchon"] for p in list(scheduler.published)]
            return [h for h in sent if h["slot_id"] in tried and h["attempt"] > 1]

        # The refused slot comes again as its next attempt (the slots due meanwhile
        # are sent too, on time or as a next attempt themselves).
        drive([scheduler], lambda: bool(resent()), timeout=8)
        history = store.history("e")
    ended = {r.state for r in history if r.ended_at is not None}
    assert RunState.FAILED not in ended and RunState.LOST in ended  # taken over, not failed


def test_an_apply_entry_that_sends_by_itself_is_called_once_per_slot(
    tmp_path: Path, closing: list[Scheduler]
) -> None:
    sent: list[ScheduleEntry] = []

    class OwnSend(Scheduler):
        def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
            sent.append(entry)  # no apply_async: this beat sends in its own way

    app = make_app(tmp_path, every_second())
    scheduler = OwnSend(app)
    closing.append(scheduler)
    drive([scheduler], lambda: len(sent) >= 2, timeout=6)
    assert len({e.options["task_id"] for e in sent}) == len(sent)
    with dropin_store(app) as store:
        states = {r.state for r in store.history("e")} - {RunState.RUNNING}
    assert states == {RunState.DONE}


# -- 2. BeatLazyFunc ----------------------------------------------------------------


def test_beat_lazy_func_arguments_are_evaluated_at_each_send(
    tmp_path: Path, recording: Callable[..., Recording]
) -> None:
    counter = itertools.count()
    lazy = {"n": BeatLazyFunc(lambda: next(counter))}
    scheduler = recording(make_app(tmp_path, every_second(kwargs=lazy)))
    drive([scheduler], lambda: len(scheduler.published) >= 2, timeout=6)
    assert [kwargs for _, _, kwargs, _ in scheduler.published[:2]] == [{"n": 0}, {"n": 1}]


# -- 3 and 5. scheduler.schedule, default entries, entries added at run time --------


def test_the_schedule_shows_the_entries_and_celery_backend_cleanup(
    tmp_path: Path, closing: list[Scheduler]
) -> None:
    """Without a result backend that expires results itself, beat cleans them up daily."""
    app = make_app(tmp_path, every_second())
    assert not app.backend.supports_autoexpire
    scheduler = Scheduler(app)
    closing.append(scheduler)
    assert set(scheduler.schedule) == {"e", "celery.backend_cleanup"}
    assert all(isinstance(e, ScheduleEntry) for e in scheduler.schedule.values())
    cleanup = scheduler.schedule["celery.backend_cleanup"]
    assert cleanup.task == "celery.backend_cleanup"
    assert isinstance(cleanup.schedule, crontab)
    assert scheduler.engine is not None
    job = scheduler.engine.jobs["celery.backend_cleanup"]
    assert getattr(job.schedule, "expression", None) == "0 4 * * *"


def test_no_backend_cleanup_when_results_do_not_expire(
    tmp_path: Path, closing: list[Scheduler]
) -> None:
    scheduler = Scheduler(make_app(tmp_path, every_second(), result_expires=None))
    closing.append(scheduler)
    assert set(scheduler.schedule) == {"e"}
    assert scheduler.engine is not None and set(scheduler.engine.jobs) == {"e"}


def test_an_entry_added_in_a_beat_init_handler_is_sent(tmp_path: Path) -> None:
    app = make_app(tmp_path, {})
    service = beat.Service(app, scheduler_cls=Recording)

    def add_entry(sender: Any = None, **_: Any) -> None:
        if sender is service:
            sender.scheduler.add(name="late", task=TASK, schedule=1, args=(7,))

    signals.beat_init.connect(add_entry, weak=False)
    thread = threading.Thread(target=service.start, daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            if "scheduler" in service.__dict__ and service.scheduler.published:
                break
            time.sleep(0.05)
    finally:
        signals.beat_init.disconnect(add_entry)
        service.stop()
        thread.join(5)
    assert not thread.is_alive()
    name, args, _, options = service.scheduler.published[0]
    assert (name, list(args)) == (TASK, [7])
    assert options["headers"]["anarchon"]["job"] == "late"


def test_entries_added_changed_and_removed_at_run_time(
    tmp_path: Path, closing: list[Scheduler]
) -> None:
    scheduler = Scheduler(make_app(tmp_path, {}, result_expires=None))
    closing.append(scheduler)
    engine = scheduler.engine
    assert engine is not None and engine.jobs == {}

    scheduler.update_from_dict({"x": {"task": TASK, "schedule": 5}})
    assert getattr(engine.jobs["x"].schedule, "interval", None) == timedelta(seconds=5)
    scheduler.update_from_dict({"x": {"task": TASK, "schedule": timedelta(seconds=10)}})
    assert getattr(engine.jobs["x"].schedule, "interval", None) == timedelta(seconds=10)
    entry = scheduler.add(name="y", task=TASK, schedule=crontab(minute="*/5"))
    assert scheduler.schedule["y"] is entry
    assert getattr(engine.jobs["y"].schedule, "expression", None) == "*/5 * * * *"

    # Invalid: refused with the entry named, nothing changed.
    with pytest.raises(ConfigurationError, match=r"entry 'z'.*relative=True\) is not supported"):
        scheduler.add(name="z", task=TASK, schedule=schedule(timedelta(seconds=1), relative=True))
    with pytest.raises(
        ConfigurationError, match=r"entry 'w': every=0.5s: intervals under 1 second"
    ):
        scheduler.update_from_dict({"w": {"task": TASK, "schedule": 0.5}})
    assert set(scheduler.schedule) == set(engine.jobs) == {"x", "y"}

    # Changed or removed in the schedule itself: noticed at the next step.
    scheduler.schedule["y"].schedule = crontab(minute="*/10")
    del scheduler.schedule["x"]
    scheduler.tick()
    assert set(engine.jobs) == {"y"}
    assert getattr(engine.jobs["y"].schedule, "expression", None) == "*/10 * * * *"


# -- 4. schedule subclasses -----------------------------------------------------------


class Plain(schedule):  # type: ignore[misc]
    """A subclass that changes nothing about when it is due."""


class PlainCron(crontab):  # type: ignore[misc]
    pass


class ShiftedCron(crontab):  # type: ignore[misc]
    def remaining_estimate(self, last_run_at: Any, ffwd: Any = None) -> timedelta:
        return timedelta(minutes=7)


class Custom(BaseSchedule):  # type: ignore[misc]
    def is_due(self, last_run_at: Any) -> schedstate:
        return schedstate(True, 60.0)


class TokyoCron(crontab):  # type: ignore[misc]
    """A crontab read in its own time zone, as Celery does with a subclass's ``tz``."""

    tz = ZoneInfo("Asia/Tokyo")


def test_schedule_subclasses_run_as_they_would_in_stock_beat() -> None:
    entry = read_entry("a", {"task": "t", "schedule": Plain(timedelta(seconds=30))}, "UTC")
    assert (entry.every, entry.cron) == (30.0, None)
    entry = read_entry("b", {"task": "t", "schedule": PlainCron(minute=5, hour=8)}, "Europe/Rome")
    assert (entry.every, entry.cron, entry.timezone) == (None, "5 8 * * *", "Europe/Rome")
    entry = read_entry("c", {"task": "t", "schedule": TokyoCron(minute=0, hour=9)}, "UTC")
    assert (entry.cron, entry.timezone) == ("0 9 * * *", "Asia/Tokyo")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (NeverDue(timedelta(seconds=10)), "NeverDue overrides is_due"),
        (ShiftedCron(minute=0), "ShiftedCron overrides remaining_estimate"),
        (Custom(), "unsupported schedule"),
        (crontab(minute=0, nowfun=lambda: None), "nowfun"),
    ],
)
def test_schedules_whose_slots_cannot_be_computed_are_refused(value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        read_entry("odd", {"task": "t", "schedule": value}, "UTC")
    assert "beat_schedule['odd']" in str(info.value)
    assert "use a number of seconds" in str(info.value) or "nowfun" in message


def test_beat_stops_at_setup_on_a_schedule_it_would_run_as_something_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    relative = schedule(timedelta(seconds=5), relative=True)
    app = make_app(tmp_path, {"odd": {"task": TASK, "schedule": relative}})
    with pytest.raises(SystemExit):
        Scheduler(app)
    assert "beat_schedule['odd']: schedule(..., relative=True) is not supported" in caplog.text


# -- 6. close() and a second setup --------------------------------------------------------


def test_close_waits_for_the_worker_check_thread(tmp_path: Path) -> None:
    scheduler = Scheduler(make_app(tmp_path, every_second(), anarchon_tracking=True))
    assert scheduler.workers is not None
    thread = scheduler.workers._thread
    time.sleep(0.1)  # the check is now inside its first 'inspect conf'
    assert thread.is_alive()
    scheduler.close()
    assert not thread.is_alive()


def test_a_second_setup_stops_the_first_engine(tmp_path: Path, closing: list[Scheduler]) -> None:
    def checks() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "anarchon-workers" and t.is_alive()]

    before = len(checks())
    scheduler = Scheduler(make_app(tmp_path, every_second(), anarchon_tracking=True))
    closing.append(scheduler)
    first = scheduler.engine
    scheduler.setup_schedule()
    assert scheduler.engine is not first and scheduler.engine is not None
    assert first is not None and first._stopping.is_set()
    assert len(checks()) == before + 1
    assert set(scheduler.engine.jobs) == {"e", "celery.backend_cleanup"}


# -- settings that cannot take effect --------------------------------------------------


def test_the_loop_interval_is_one_second_and_a_longer_one_is_refused(
    tmp_path: Path, closing: list[Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = Scheduler(make_app(tmp_path, every_second()))
    closing.append(scheduler)
    assert scheduler.max_interval == 1.0
    closing.append(Scheduler(make_app(tmp_path, every_second()), max_interval=1))
    with pytest.raises(SystemExit):
        Scheduler(make_app(tmp_path, every_second()), max_interval=30)
    assert "a loop interval of 30s (beat_max_loop_interval or --max-interval)" in caplog.text
    caplog.clear()
    with pytest.raises(SystemExit):
        Scheduler(make_app(tmp_path, every_second(), beat_max_loop_interval=5))
    assert "a loop interval of 5s" in caplog.text


def test_beat_cron_starting_deadline_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(SystemExit):
        Scheduler(make_app(tmp_path, every_second(), beat_cron_starting_deadline=600))
    assert "beat_cron_starting_deadline is not supported" in caplog.text
    assert "anarchon_catch_up" in caplog.text


# -- 7. SIGTERM while beat is inside a store call -------------------------------------

BEAT_APP = '''
"""A beat app whose store calls, once armed, announce themselves and take a while."""
import os
import time

from celery import Celery, signals
from anarchon_core.stores import sqlite

app = Celery("sigterm_app", broker="memory://")
app.conf.update(
    beat_scheduler="anarchon_celery:Scheduler",
    anarchon_store="sqlite:///" + os.environ["BEAT_DB"],
    anarchon_tracking=False,
    anarchon_jitter=0,
    beat_schedule={f"e{k}": {"task": "noop", "schedule": 1} for k in range(3)},
    timezone="UTC",
)
armed = []


@signals.beat_init.connect
def arm(**_):
    armed.append(True)  # only the ticks' store calls, not the setup's


begin = sqlite.SQLDialectStore._begin


def slow_begin(self, write):
    conn = begin(self, write)
    if armed and write:
        with open(os.environ["BEAT_MARKER"], "a") as marker:
            marker.write(f"{os.getpid()}\\n")  # this process is in a store call
        time.sleep(float(os.environ["BEAT_HOLD"]))
        armed.clear()  # once
    return conn


sqlite.SQLDialectStore._begin = slow_begin
'''


def start_beat(tmp_path: Path, hold: float) -> tuple[subprocess.Popen[str], Path]:
    tmp_path.mkdir()
    (tmp_path / "sigterm_app.py").write_text(textwrap.dedent(BEAT_APP))
    marker = tmp_path / "marker"
    env = dict(
        os.environ,
        BEAT_DB=str(tmp_path / "store.db"),
        BEAT_MARKER=str(marker),
        BEAT_HOLD=str(hold),
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
    )
    argv = [str(BIN / "celery"), "-A", "sigterm_app", "beat", "--loglevel", "INFO"]
    argv += ["-s", str(tmp_path / "beat-schedule")]
    process = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 30
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"beat never reached a store call:\n{process.communicate()[0]}")
        time.sleep(0.005)
    return process, marker


def stopped_within(process: subprocess.Popen[str], limit: float) -> float | None:
    """Seconds to exit, or None (then killed) if beat is still alive after ``limit``."""
    start = time.monotonic()
    try:
        process.wait(limit)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None
    return time.monotonic() - start


@pytest.mark.scenario
def test_sigterm_inside_a_store_call_never_hangs_beat(tmp_path: Path) -> None:
    """Beat's handler closes the scheduler from the signal handler: no deadlock, no delay.

    A SIGTERM during a store call is held back until the scheduling step ends,
    then beat stops at once; if the store call hangs, a second SIGTERM stops it.
    """
    process, _ = start_beat(tmp_path / "short", hold=0.3)
    process.send_signal(signal.SIGTERM)
    took = stopped_within(process, 10)
    output = process.communicate()[0]
    assert took is not None, f"beat hung after SIGTERM:\n{output}"
    # The held call (0.3 s), the hand-over and the interpreter's exit; on a loaded
    # machine the exit alone can take seconds. A deadlock never ends.
    assert took < 8.0, f"beat took {took:.2f}s to stop:\n{output}"
    assert process.returncode == 0, output
    assert "Traceback" not in output, output

    process, _ = start_beat(tmp_path / "hung", hold=60)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    held_back = process.poll() is None  # the store call has not ended
    process.send_signal(signal.SIGTERM)
    # The store call hangs for 60 s: a beat that waited for it would take that long. The
    # close, the hand-over and the exit take seconds on a loaded machine.
    took = stopped_within(process, 15)
    output = process.communicate()[0]
    assert held_back, output
    assert took is not None, f"beat hung after a second SIGTERM:\n{output}"
