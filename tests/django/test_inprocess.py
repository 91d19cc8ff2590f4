"""django-celery-beat's rows sent by ``anarchon_celery:DatabaseScheduler``, beats in this process.

Django is configured in the test process (once: an SQLite file, django-celery-beat's
migrations applied), the rows are made and edited through its models as the admin
and the project's code do, and each beat is ``celery.beat.Service(...).scheduler``
ticked in a thread of its own on a memory broker. What beat sends is seen as the
broker would get it (Celery's ``before_task_publish`` signal). The claims are in a
SQLite store file shared by the beats of a test. Real time, on 1 s grids.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, beat, signals

from anarchon_celery import Scheduler
from tests.celery.ticking import drive
from tests.fleet import ROOT
from tests.waiting import wait_until

#: How often each beat reads django-celery-beat's change marker (anarchon_django_poll).
POLL = 0.2
#: An edit is followed by every beat within a poll, plus a margin for a loaded machine.
FOLLOWED = POLL + 0.6
UTC = timezone.utc
MARKER_TABLE = '"django_celery_beat_periodictasks"'
ROWS_TABLE = '"django_celery_beat_periodictask"'


def django_settings(database: Path) -> dict[str, Any]:
    return {
        "DATABASES": {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(database),
                # Several beats write to one SQLite file: each transaction takes the
                # write lock at its start, and waits its turn.
                "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
            }
        },
        "INSTALLED_APPS": [
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django_celery_beat",
        ],
        "USE_TZ": True,
        "TIME_ZONE": "UTC",
        "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
        "SECRET_KEY": "tests-only",
    }


@pytest.fixture(scope="module")
def django_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Django configured in this process (once), django-celery-beat's tables made."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    if settings.configured:
        database = settings.DATABASES["default"]
        if not str(database.get("ENGINE", "")).endswith("sqlite3") or (
            "django_celery_beat" not in settings.INSTALLED_APPS
        ):
            pytest.skip("Django is configured in this process for another project")
        path = Path(database["NAME"])
    else:
        path = tmp_path_factory.mktemp("django") / "rows.sqlite3"
        settings.configure(**django_settings(path))
    django.setup()
    call_command("migrate", verbosity=0)
    return path


@pytest.fixture
def tables(django_db: Path) -> Iterator[None]:
    """django-celery-beat's tables, empty at the start of each test."""
    from django.db import connections
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        PeriodicTasks,
        SolarSchedule,
    )

    for model in (PeriodicTask, PeriodicTasks, IntervalSchedule, CrontabSchedule, SolarSchedule):
        model.objects.all().delete()
    ClockedSchedule.objects.all().delete()
    yield
    connections.close_all()


@dataclass(frozen=True)
class Sent:
    """One task beat published: the slot it is for, and what the broker got."""

    job: str
    slot: float
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    headers: dict[str, Any]
    properties: dict[str, Any]
    routing_key: str


class Sends:
    """The tasks published for one namespace, seen from any thread."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._lock = threading.Lock()
        self._seen: list[Sent] = []

    def __call__(
        self,
        sender: Any = None,
        body: Any = None,
        headers: dict[str, Any] | None = None,
        properties: dict[str, Any] | None = None,
        routing_key: str = "",
        **_: Any,
    ) -> None:
        ticket = (headers or {}).get("anarchon")
        if not ticket or ticket.get("namespace") != self.namespace:
            return
        job, _, ms = ticket["slot_id"].rpartition("@")
        args, kwargs, _embed = body
        sent = Sent(
            job,
            int(ms) / 1000,
            str(sender),
            args,
            kwargs,
            headers or {},
            properties or {},
            routing_key,
        )
        with self._lock:
            self._seen.append(sent)

    def of(self, job: str) -> list[Sent]:
        with self._lock:
            return [s for s in self._seen if s.job == job]

    def slots(self, job: str) -> list[float]:
        return sorted(s.slot for s in self.of(job))

    def twice(self) -> dict[tuple[str, float], int]:
        with self._lock:
            counts = Counter((s.job, s.slot) for s in self._seen)
        return {slot: n for slot, n in counts.items() if n > 1}


@pytest.fixture
def app(tables: None, tmp_path: Path) -> Iterator[Celery]:
    """A Celery app of this test: its namespace, queue and claim store its own."""
    namespace = f"dj-{uuid.uuid4().hex[:10]}"
    app = Celery("t", set_as_current=False)
    app.conf.update(
        broker_url="memory://",
        beat_scheduler="anarchon_celery:DatabaseScheduler",
        beat_schedule={},
        anarchon_store=f"sqlite:///{tmp_path}/anarchon.db",
        anarchon_namespace=namespace,
        anarchon_django_poll=POLL,
        anarchon_tracking=False,
        task_default_queue=namespace,
        timezone="UTC",
    )
    yield app
    app.close()


@pytest.fixture
def sends(app: Celery) -> Iterator[Sends]:
    seen = Sends(app.conf.anarchon_namespace)
    signals.before_task_publish.connect(seen, weak=False)
    yield seen
    signals.before_task_publish.disconnect(seen)


@pytest.fixture
def beats(app: Celery) -> Iterator[Callable[[int], list[Scheduler]]]:
    """``beats(n)``: n beats of the test app, as ``celery beat`` builds its scheduler."""
    made: list[Scheduler] = []

    def start(n: int) -> list[Scheduler]:
        for _ in range(n):
            scheduler = beat.Service(app, scheduler_cls=app.conf.beat_scheduler).scheduler
            assert type(scheduler).__name__ == "DatabaseScheduler"
            made.append(scheduler)
        return made[-n:]

    yield start
    for scheduler in reversed(made):  # each restores the signal handlers it replaced
        scheduler.close()


@contextlib.contextmanager
def ticking(schedulers: list[Scheduler]) -> Iterator[None]:
    """Each scheduler ticked in a thread of its own, as separate beats, while the body runs."""
    from django.db import connections

    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(scheduler: Scheduler) -> None:
        try:
            while not stop.is_set():
                stop.wait(min(scheduler.tick(), 0.02))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's own

    threads = [threading.Thread(target=loop, args=(s,)) for s in schedulers]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert not errors, errors


# -- rows, as the admin and the project's code make them --------------------------------


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def interval_row(name: str, every: int, period: str = "seconds", **columns: Any) -> Any:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period=period)
    columns.setdefault("args", json.dumps([name]))
    return PeriodicTask.objects.create(name=name, task="tasks.work", interval=interval, **columns)


def clocked_row(name: str, when: datetime) -> Any:
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    clocked = ClockedSchedule.objects.create(clocked_time=when)
    return PeriodicTask.objects.create(
        name=name, task="tasks.work", clocked=clocked, one_off=True, args=json.dumps([name])
    )


def row(name: str) -> Any:
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.get(name=name)


def reads(queries: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    """The marker reads, the reads of the rows, and every other statement."""
    marker, rows, other = [], [], []
    for query in queries:
        sql = query["sql"]
        if sql.startswith("SELECT") and f"FROM {MARKER_TABLE}" in sql:
            marker.append(sql)
        elif sql.startswith("SELECT") and f"FROM {ROWS_TABLE} " in sql:
            rows.append(sql)
        else:
            other.append(sql)
    return marker, rows, other


# -- the tests ----------------------------------------------------------------------------


def test_beat_reads_the_change_marker_at_each_poll_and_the_rows_only_after_a_change(
    app: Celery, beats: Callable[[int], list[Scheduler]], sends: Sends
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

    # A few hundred daily rows whose next slots are hours away.
    daily, _ = IntervalSchedule.objects.get_or_create(every=1, period="days")
    start = at(math.floor(time.time()) - 12 * 3600)
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"daily{k}", task="tasks.work", interval=daily, start_time=start)
        for k in range(300)
    )
    PeriodicTasks.update_changed()
    [scheduler] = beats(1)
    assert scheduler.engine is not None
    assert {f"daily{k}" for k in range(300)} <= set(scheduler.engine.jobs)

    # Ticked from this thread (the connection captured is this thread's), as often as
    # a busy beat ticks.
    with CaptureQueriesContext(connection) as quiet:
        began = time.monotonic()
        while time.monotonic() - began < 2.0:
            scheduler.tick()
            time.sleep(0.02)
        elapsed = time.monotonic() - began
    marker, rows, other = reads(quiet.captured_queries)
    assert (rows, other) == ([], []), "beat read more than the change marker"
    # One marker read per poll: one at the first tick, then one each POLL seconds
    # (later on a loaded machine, never more often), whatever the ticks.
    assert 3 <= len(marker) <= elapsed / POLL + 1, len(marker)
    assert sends.of("daily0") == []

    # A row edited as the admin saves it: the rows are read once, within a poll.
    edited_row = row("daily7")
    edited_row.interval, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    edited_row.start_time = None
    edited_row.save()
    edited = time.monotonic()
    read_at: float | None = None
    with CaptureQueriesContext(connection) as edit:
        while not sends.of("daily7") and time.monotonic() - edited < 3:
            scheduler.tick()
            if read_at is None and reads(edit.captured_queries)[1]:
                read_at = time.monotonic()
            time.sleep(0.02)
        # ...and the change applied: the row's new interval sends it.
        assert sends.slots("daily7"), "the edited row was not sent"
    marker, rows, other = reads(edit.captured_queries)
    assert len(rows) == 1, rows
    assert read_at is not None and read_at - edited <= FOLLOWED
    # The rest: marker reads, and the sent slot's last_run_at and total_run_count.
    assert all(sql.startswith(f"UPDATE {ROWS_TABLE}") for sql in other), other
    assert [s.job for s in sends.of("daily7")] == ["daily7"]


def test_beat_wakes_up_for_each_poll(app: Celery, beats: Callable[[int], list[Scheduler]]) -> None:
    # Beat sleeps what tick() returns: were it longer than anarchon_django_poll,
    # the marker would be read less often than that (edits followed later).
    interval_row("daily", 1, "days", start_time=at(math.floor(time.time()) - 3600))
    [scheduler] = beats(1)
    sleeps = [scheduler.tick() for _ in range(5)]
    assert max(sleeps) <= POLL, sleeps


def test_two_beats_send_each_slot_of_a_row_once_and_count_it_in_the_table(
    app: Celery, beats: Callable[[int], list[Scheduler]], sends: Sends
) -> None:
    queue = app.conf.anarchon_namespace
    interval_row(
        "every",
        1,
        kwargs=json.dumps({"k": 1}),
        expire_seconds=30,
        queue=queue,
        priority=5,
        headers=json.dumps({"x-custom": "yes"}),
    )
    interval_row("once", 1, one_off=True)
    pair = beats(2)

    def done() -> bool:
        once = sends.slots("once")
        return bool(once) and len([s for s in sends.slots("every") if s > once[0]]) >= 3

    drive(pair, done, timeout=8)

    assert sends.twice() == {}
    every = sends.slots("every")
    assert every == [every[0] + k for k in range(len(every))], "a slot missed"
    assert len(sends.of("once")) == 1

    sent = sends.of("every")[0]
    assert (sent.task, sent.args, sent.kwargs) == ("tasks.work", ["every"], {"k": 1})
    assert sent.headers["periodic_task_name"] == "every"
    assert sent.headers["x-custom"] == "yes"
    assert sent.headers["expires"] == at(sent.slot + 30).isoformat()
    assert sent.properties["priority"] == 5
    assert sent.routing_key == queue

    # The table: counted once per slot, by the beat that sent it; the one-off disabled.
    table = row("every")
    assert table.total_run_count == len(every)
    assert table.last_run_at == at(every[-1])
    assert table.enabled is True
    once = row("once")
    assert (once.enabled, once.total_run_count) == (False, 1)
    assert once.last_run_at == at(sends.slots("once")[0])


def test_a_one_off_row_disabled_by_a_beat_that_dies_before_its_send_is_sent_by_another(
    app: Celery,
    beats: Callable[[int], list[Scheduler]],
    sends: Sends,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The beat that sends a one-off row disables it first, then sends. One that stops
    for good in between (killed, in effect: it neither sends nor renews its lease) leaves
    the row disabled and its slot claimed; the other beat saw the row go at its next
    poll, kept watching the slot all the same, takes it over once the lease lapsed and
    sends it: once, counted once."""
    from anarchon_celery.django import Tables

    app.conf.anarchon_lease = 2
    take_one_off = Tables.take_one_off
    died, thaw = threading.Event(), threading.Event()

    def dies_after_taking(self: Tables, row_id: int, slot: datetime) -> bool:
        mine = take_one_off(self, row_id, slot)
        if mine and not died.is_set():
            died.set()  # the first to take it: the row is disabled, nothing is sent
            thaw.wait(60)
            raise RuntimeError("this beat died before its send")
        return mine

    monkeypatch.setattr(Tables, "take_one_off", dies_after_taking)
    t = math.ceil(time.time())
    clocked_row("clocked", at(t + 2))
    pair = beats(2)
    with ticking(pair):
        try:
            assert died.wait(10), "no beat took the row"
            wait_until(lambda: sends.of("clocked"), 15, "the slot sent by the other beat")
            time.sleep(2 * POLL)  # nothing more comes
        finally:
            thaw.set()
    [sent] = sends.of("clocked")
    assert sent.slot == t + 2
    assert sent.headers["anarchon"]["attempt"] == 2, sent.headers["anarchon"]
    once = row("clocked")
    assert (once.enabled, once.total_run_count) == (False, 1)
    assert once.last_run_at == at(t + 2)


def test_a_slot_is_counted_in_the_table_before_its_task_is_sent(
    app: Celery, beats: Callable[[int], list[Scheduler]], sends: Sends
) -> None:
    """A beat killed as it sends has counted the slot: the count is never behind a send."""
    interval_row("every", 1)
    namespace = app.conf.anarchon_namespace
    at_send: list[tuple[float, int, datetime | None]] = []

    def read_the_row(headers: dict[str, Any] | None = None, **_: Any) -> None:
        ticket = (headers or {}).get("anarchon")
        if ticket and ticket.get("namespace") == namespace:
            table = row("every")
            slot = int(ticket["slot_id"].rpartition("@")[2]) / 1000
            at_send.append((slot, table.total_run_count, table.last_run_at))

    signals.before_task_publish.connect(read_the_row, weak=False)
    try:
        drive(beats(2), lambda: len(sends.slots("every")) >= 3, timeout=8)
    finally:
        signals.before_task_publish.disconnect(read_the_row)

    assert sends.twice() == {}
    assert len(at_send) >= 3
    for n, (slot, count, last) in enumerate(sorted(at_send), 1):
        assert (count, last) == (n, at(slot)), f"the row as slot {n} was sent"


def test_each_slot_is_counted_once_whatever_order_the_beats_writes_arrive_in(
    tables: None,
) -> None:
    from anarchon_celery.django import Tables

    every = interval_row("every", 2)
    table = Tables()
    start = datetime(2026, 12, 7, 12, tzinfo=UTC)

    def slot(k: int) -> datetime:
        return start + timedelta(seconds=2 * k)

    table.count(every.id, slot(2), 1)  # one beat's write of a slot arrives first,
    table.count(every.id, slot(1), 1)  # another's, of the slot before, late
    assert (row("every").total_run_count, row("every").last_run_at) == (2, slot(2))
    table.count(every.id, slot(2), 2)  # a takeover of a counted slot,
    table.count(every.id, slot(1), 2)  # of an older counted slot: no more counts
    assert (row("every").total_run_count, row("every").last_run_at) == (2, slot(2))
    table.count(every.id, slot(3), 2)  # a takeover of a slot not counted yet
    assert (row("every").total_run_count, row("every").last_run_at) == (3, slot(3))


def test_rows_with_times_of_their_own(
    app: Celery,
    beats: Callable[[int], list[Scheduler]],
    sends: Sends,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="anarchon_celery.django")
    t = math.ceil(time.time())
    # No edit and no one-off send between the beats' start and the first slot of
    # 'later': they notice its start_time by the clock alone.
    interval_row("later", 1, start_time=at(t + 3))
    interval_row("expiring", 1, expires=at(t + 2))
    clocked_row("clocked", at(t + 3))
    clocked_row("missed", at(t - 30))  # no beat ran then; within the catch-up window
    clocked_row("lost", at(t - 2 * 3600))  # beyond it
    began = time.time()
    pair = beats(2)

    def done() -> bool:
        return bool(sends.of("later") and sends.of("clocked") and sends.of("missed"))

    drive(pair, done, timeout=10)

    assert sends.twice() == {}
    assert min(sends.slots("later")) == t + 3  # its first slot is its start_time
    expiring = sends.slots("expiring")
    assert expiring and max(expiring) < t + 2, expiring
    assert sends.slots("clocked") == [t + 3]
    [missed] = sends.slots("missed")
    assert began < missed <= began + 3, "the missed clocked row was not sent at start"
    assert sends.of("lost") == []
    for name in ("clocked", "missed"):
        assert row(name).enabled is False, name
    assert row("lost").enabled is True

    said = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "PeriodicTask 'lost'" in r.getMessage()
    ]
    assert len(said) == 2, caplog.text  # once by each beat
    assert "was due while no beat ran" in said[0].getMessage()


def test_rows_timed_in_code_run_at_their_times(
    app: Celery, beats: Callable[[int], list[Scheduler]], sends: Sends
) -> None:
    # The project's code makes rows with timezone.now() and its microseconds.
    from django.utils import timezone as django_timezone

    soon = django_timezone.now() + timedelta(seconds=1.5)
    interval_row("from-soon", 1, start_time=soon)
    clocked_row("at-soon", soon)
    [scheduler] = beats(1)
    drive([scheduler], lambda: bool(sends.of("from-soon") and sends.of("at-soon")), timeout=4)
    assert min(sends.slots("from-soon")) >= soon.timestamp()
    [clocked] = sends.slots("at-soon")
    assert soon.timestamp() <= clocked < soon.timestamp() + 1


def test_a_solar_row_is_refused_once_naming_it_and_the_others_run(
    app: Celery,
    beats: Callable[[int], list[Scheduler]],
    sends: Sends,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from django_celery_beat.models import PeriodicTask, SolarSchedule

    caplog.set_level(logging.ERROR)
    sun, _ = SolarSchedule.objects.get_or_create(event="sunset", latitude=48.85, longitude=2.35)
    PeriodicTask.objects.create(name="sun", task="tasks.work", solar=sun)
    interval_row("every", 1)
    [scheduler] = beats(1)
    with ticking([scheduler]):
        wait_until(lambda: sends.of("every"), 3, "the other row sent")
        interval_row("added", 1)  # the rows read again
        wait_until(lambda: sends.of("added"), 3, "the added row sent")
    assert sends.of("sun") == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.levelname for r in errors] == ["ERROR"], caplog.text
    assert "PeriodicTask 'sun': solar" in errors[0].getMessage()


def test_edits_are_followed_within_a_poll(
    app: Celery, beats: Callable[[int], list[Scheduler]], sends: Sends
) -> None:
    from django_celery_beat.models import IntervalSchedule

    for name in ("every", "off", "gone"):
        interval_row(name, 1)
    pair = beats(2)
    with ticking(pair):
        wait_until(
            lambda: all(sends.of(n) for n in ("every", "off", "gone")),
            4,
            "a slot of each row",
        )
        # As the admin saves them: a new interval, a row disabled, one deleted, one added.
        edited = time.time()
        every = row("every")
        every.interval, _ = IntervalSchedule.objects.get_or_create(every=2, period="seconds")
        every.save()
        off = row("off")
        off.enabled = False
        off.save()
        row("gone").delete()
        interval_row("added", 1)
        wait_until(
            lambda: (
                sends.of("added")
                and len([s for s in sends.slots("every") if s > edited + FOLLOWED]) >= 2
            ),
            6,
            "the added row sent, and two slots of the new interval",
        )
        checked = time.time()

    assert sends.twice() == {}, "a slot sent twice around the edits"
    every_slots = sends.slots("every")
    before = [s for s in every_slots if s < edited]
    assert before == [before[0] + k for k in range(len(before))]
    after = [s for s in every_slots if edited + FOLLOWED < s <= checked]
    assert after and all(s % 2 == 0 for s in after), f"not on the 2 s grid: {after}"
    assert after == [after[0] + 2 * k for k in range(len(after))], "a 2 s slot missed"
    for name in ("off", "gone"):
        assert [s for s in sends.slots(name) if s > edited + FOLLOWED] == [], name


def test_a_row_replaces_the_beat_schedule_entry_of_its_name(
    app: Celery,
    beats: Callable[[int], list[Scheduler]],
    sends: Sends,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery.django")
    app.conf.beat_schedule = {
        "shared": {"task": "tasks.configured", "schedule": 1.0},
        "configured-only": {"task": "tasks.configured", "schedule": 1.0},
    }
    interval_row("shared", 1)
    [scheduler] = beats(1)
    drive(
        [scheduler],
        lambda: len(sends.of("shared")) >= 2 and bool(sends.of("configured-only")),
        timeout=5,
    )
    assert {(s.task, tuple(s.args)) for s in sends.of("shared")} == {("tasks.work", ("shared",))}
    assert {s.task for s in sends.of("configured-only")} == {"tasks.configured"}
    said = [
        r.getMessage() for r in caplog.records if "replaces the beat_schedule" in r.getMessage()
    ]
    assert said == ["anarchon: PeriodicTask 'shared' replaces the beat_schedule entry of that name"]
    assert [r.levelname for r in caplog.records if r.getMessage() == said[0]] == ["INFO"]


def test_a_disabled_row_keeps_the_beat_schedule_entry_of_its_name_off(
    app: Celery, beats: Callable[[int], list[Scheduler]], sends: Sends
) -> None:
    # django-celery-beat writes each beat_schedule entry as a row of its name, and
    # sends only while that row is enabled: disabling it in the admin stops the entry.
    app.conf.beat_schedule = {
        "shared": {"task": "tasks.configured", "schedule": 1.0},
        "configured-only": {"task": "tasks.configured", "schedule": 1.0},
    }
    interval_row("shared", 1, enabled=False)
    [scheduler] = beats(1)
    drive([scheduler], lambda: len(sends.of("configured-only")) >= 2, timeout=5)
    assert sends.of("shared") == []


MISSING_TABLES = """
import logging, sys
import django
from django.conf import settings
from tests.django.test_inprocess import django_settings

settings.configure(**django_settings(sys.argv[1]))
django.setup()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
from celery import Celery, beat

app = Celery("t", set_as_current=False)
app.conf.update(
    broker_url="memory://",
    anarchon_store="sqlite:///" + sys.argv[2],
    anarchon_tracking=False,
)
beat.Service(app, scheduler_cls="anarchon_celery:DatabaseScheduler").scheduler
print("beat started")
"""


def test_beat_stops_with_one_critical_line_when_the_tables_are_missing(
    tmp_path: Path,
) -> None:
    # A database without django-celery-beat's migrations (a process of its own:
    # this one's Django has its tables).
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            MISSING_TABLES,
            str(tmp_path / "empty.sqlite3"),
            str(tmp_path / "s"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "beat started" not in done.stdout
    critical = [line for line in done.stderr.splitlines() if line.startswith("CRITICAL")]
    assert critical == [
        "CRITICAL anarchon_celery.scheduler anarchon: beat cannot start: cannot read"
        " django-celery-beat's tables (OperationalError: no such table:"
        " django_celery_beat_periodictasks); are its migrations applied?"
    ], done.stderr
    assert "Traceback" not in done.stderr
