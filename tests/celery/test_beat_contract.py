"""Celery's own beat scheduler tests, run against ``anarchon_celery.Scheduler``.

Adapted from ``t/unit/app/test_beat.py`` of Celery 5.7.0 (the PyPI sdist
``celery-5.7.0.tar.gz``). docs/celery.md ("Celery's own beat tests") lists
which upstream tests are here, how they were adapted, and why the others are
not. Test names are upstream's; upstream's classes ``test_X`` are ``TestX``
here. Every ``# adapted:`` comment says what differs from upstream and why;
code without one is upstream's, with ``beat.Scheduler`` replaced by
anarchon's scheduler.

The fixtures mirror those of Celery's ``t/unit/conftest.py``: ``app`` is a
``celery.contrib.testing.app.TestApp`` with upstream's unit-test settings,
installed with the current-app trap (any use of the current or default app
raises), plus a SQLite store of the test's own; ``self.app`` is set on every
test class; and no thread started by a test may outlive it, once the
schedulers it made are closed.

The upstream file is:

    Copyright (c) 2017-2026 Asif Saif Uddin, core team & contributors. All rights reserved.
    Copyright (c) 2015-2016 Ask Solem & contributors. All rights reserved.
    Copyright (c) 2012-2014 GoPivotal, Inc.  All rights reserved.
    Copyright (c) 2009, 2010, 2011, 2012 Ask Solem, and individual contributors.
    All rights reserved.

    Redistribution and use in source and binary forms, with or without
    modification, are permitted provided that the following conditions are met:
        * Redistributions of source code must retain the above copyright
          notice, this list of conditions and the following disclaimer.
        * Redistributions in binary form must reproduce the above copyright
          notice, this list of conditions and the following disclaimer in the
          documentation and/or other materials provided with the distribution.
        * Neither the name of Ask Solem, nor the
          names of its contributors may be used to endorse or promote products
          derived from this software without specific prior written permission.

    THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
    AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO,
    THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
    PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL Ask Solem OR CONTRIBUTORS
    BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR
    CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF
    SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS
    INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN
    CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE)
    ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE
    POSSIBILITY OF SUCH DAMAGE.
"""

# Upstream's code style is kept: nested `with` blocks, %-formatting.
# ruff: noqa: SIM117, UP031

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from pickle import dumps, loads
from typing import Any
from unittest.mock import Mock, patch
from zoneinfo import ZoneInfo

import pytest
from celery import beat, uuid
from celery.beat import BeatLazyFunc
from celery.contrib.testing.app import TestApp, setup_default_app
from celery.schedules import crontab, schedule, solar
from kombu import Queue

import anarchon_celery
from anarchon_core.schedules import Every

# -- fixtures (after Celery's t/unit/conftest.py) -------------------------------

#: Upstream's ``celery_config`` fixture.
CELERY_TEST_CONFIG: dict[str, Any] = {
    "broker_url": "memory://",
    "broker_transport_options": {"polling_interval": 0.1},
    "result_backend": "cache+memory://",
    "task_default_queue": "testcelery",
    "task_default_exchange": "testcelery",
    "task_default_routing_key": "testcelery",
    "task_queues": (Queue("testcelery", routing_key="testcelery"),),
    "accept_content": ("json", "pickle"),
}

#: Every scheduler the current test made; closed after it.
_made: list[anarchon_celery.Scheduler] = []


class Scheduler(anarchon_celery.Scheduler):
    """anarchon's scheduler, closed after the test (stands for upstream's ``beat.Scheduler``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _made.append(self)
        super().__init__(*args, **kwargs)


def _threads() -> set[threading.Thread]:
    return {
        t
        for t in threading.enumerate()
        if t.is_alive() and not t.name.startswith("pytest_timeout ")
    }


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Any]:
    """Upstream's ``app``: a TestApp, behind the current-app trap, with a store of its own."""
    config = dict(
        CELERY_TEST_CONFIG,
        anarchon_store=f"sqlite:///{tmp_path}/anarchon.db",
        # No worker answers here; with tracking on, each scheduler would ask for one
        # second at every start and close (TestInterface turns it on).
        anarchon_tracking=False,
    )
    test_app = TestApp(set_as_current=False, config=config)
    with setup_default_app(test_app, use_trap=True):
        yield test_app


@pytest.fixture(autouse=True)
def test_cases_shortcuts(request: pytest.FixtureRequest, app: Any) -> Iterator[None]:
    """Upstream's: ``self.app`` on every test class; here also: close what the test made."""
    before = _threads()
    if request.instance:
        request.instance.app = app
    yield
    made = list(_made)
    _made.clear()
    for scheduler in made:
        scheduler.close()
    if request.instance:
        request.instance.app = None
    # Upstream's threads_not_lingering: a closed scheduler leaves no thread behind.
    lingering = sorted(t.name for t in _threads() - before)
    assert lingering == [], f"threads left running after close(): {lingering}"


@pytest.fixture(autouse=True)
def _not_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Service.start(embedded_process=True)`` marks the process as an embedded beat."""
    import anarchon_celery.scheduler as module

    monkeypatch.setattr(module, "_embedded", False, raising=False)


def tick_until(scheduler: Any, done: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Tick as beat's loop does until ``done()``: a real slot of a 1 s entry comes within 1.1 s."""
    deadline = time.monotonic() + timeout
    while True:
        delay = scheduler.tick()
        assert 0 <= delay <= scheduler.max_interval
        if done():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(min(delay, 0.02))


EVERY_SECOND = schedule(timedelta(seconds=1))
HOURLY = schedule(timedelta(hours=1))


# -- upstream's helpers ---------------------------------------------------------


class mScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent: list[dict[str, Any]] = []
        super().__init__(*args, **kwargs)

    def send_task(self, name=None, args=None, kwargs=None, **options):
        self.sent.append({"name": name, "args": args, "kwargs": kwargs, "options": options})
        return self.app.AsyncResult(uuid())


class mSchedulerSchedulingError(mScheduler):
    def send_task(self, *args, **kwargs):
        raise beat.SchedulingError("Could not apply task")


class mocked_schedule(schedule):
    # adapted: only raising_schedule is still used. anarchon runs a schedule that
    # overrides is_due on one beat at a time, not on the grid of every beat that
    # the tests using always_due, always_pending or mocked_schedule(False, n) are
    # about: they use real intervals instead, EVERY_SECOND (due within a second)
    # and HOURLY (pending).
    def now_func():
        return datetime.now(timezone.utc)

    def __init__(self, is_due, next_run_at, nowfun=now_func):
        self._is_due = is_due
        self._next_run_at = next_run_at
        self.run_every = timedelta(seconds=1)
        self.nowfun = nowfun
        self.default_now = self.nowfun

    def is_due(self, last_run_at):
        return self._is_due, self._next_run_at


class raising_schedule(mocked_schedule):
    def __init__(self):
        super().__init__(False, 1)

    def is_due(self, last_run_at):
        raise RuntimeError("cannot calculate next run")


# -- upstream's test_BeatLazyFunc -----------------------------------------------


class TestBeatLazyFunc:
    def test_beat_lazy_func(self):
        def add(a, b):
            return a + b

        result = BeatLazyFunc(add, 1, 2)
        assert add(1, 2) == result()
        assert add(1, 2) == result.delay()


# -- upstream's test_Scheduler (the tests that do not read the heap) ------------


class TestScheduler:
    app: Any

    def test_custom_schedule_dict(self):
        custom = {"foo": "bar"}
        scheduler = mScheduler(app=self.app, schedule=custom, lazy=True)
        assert scheduler.data is custom

    def test_apply_async_uses_registered_task_instances(self):
        @self.app.task(shared=False)
        def foo():
            pass

        foo.apply_async = Mock(name="foo.apply_async")
        assert foo.name in foo._get_app().tasks

        scheduler = mScheduler(app=self.app)
        scheduler.apply_async(scheduler.Entry(task=foo.name, app=self.app))
        foo.apply_async.assert_called()

    def test_apply_async_with_null_args(self):
        @self.app.task(shared=False)
        def foo():
            pass

        foo.apply_async = Mock(name="foo.apply_async")

        scheduler = mScheduler(app=self.app)
        scheduler.apply_async(scheduler.Entry(task=foo.name, app=self.app, args=None, kwargs=None))
        foo.apply_async.assert_called()

    def test_apply_async_with_null_args_set_to_none(self):
        @self.app.task(shared=False)
        def foo():
            pass

        foo.apply_async = Mock(name="foo.apply_async")

        scheduler = mScheduler(app=self.app)
        entry = scheduler.Entry(task=foo.name, app=self.app, args=None, kwargs=None)
        entry.args = None
        entry.kwargs = None

        scheduler.apply_async(entry, advance=False)
        foo.apply_async.assert_called()

    def test_apply_async_without_null_args(self):
        @self.app.task(shared=False)
        def foo(moo: int):
            return moo

        foo.apply_async = Mock(name="foo.apply_async")

        scheduler = mScheduler(app=self.app)
        entry = scheduler.Entry(task=foo.name, app=self.app, args=None, kwargs=None)
        entry.args = (101,)
        entry.kwargs = None

        scheduler.apply_async(entry, advance=False)
        foo.apply_async.assert_called()
        assert foo.apply_async.call_args[0][0] == [101]

    def test_should_sync(self):
        @self.app.task(shared=False)
        def not_sync():
            pass

        not_sync.apply_async = Mock()

        s = mScheduler(app=self.app)
        s._do_sync = Mock()
        s.should_sync = Mock()
        s.should_sync.return_value = True
        s.apply_async(s.Entry(task=not_sync.name, app=self.app))
        s._do_sync.assert_called_with()

        s._do_sync = Mock()
        s.should_sync.return_value = False
        s.apply_async(s.Entry(task=not_sync.name, app=self.app))
        s._do_sync.assert_not_called()

    def test_should_sync_increments_sync_every_counter(self):
        self.app.conf.beat_sync_every = 2

        @self.app.task(shared=False)
        def not_sync():
            pass

        not_sync.apply_async = Mock()

        s = mScheduler(app=self.app)
        assert s.sync_every_tasks == 2
        s._do_sync = Mock()

        s.apply_async(s.Entry(task=not_sync.name, app=self.app))
        assert s._tasks_since_sync == 1
        s.apply_async(s.Entry(task=not_sync.name, app=self.app))
        s._do_sync.assert_called_with()

        self.app.conf.beat_sync_every = 0

    def test_sync_task_counter_resets_on_do_sync(self):
        self.app.conf.beat_sync_every = 1

        @self.app.task(shared=False)
        def not_sync():
            pass

        not_sync.apply_async = Mock()

        s = mScheduler(app=self.app)
        assert s.sync_every_tasks == 1

        s.apply_async(s.Entry(task=not_sync.name, app=self.app))
        assert s._tasks_since_sync == 0

        self.app.conf.beat_sync_every = 0

    @patch("celery.app.base.Celery.send_task")
    def test_send_task(self, send_task):
        b = Scheduler(app=self.app)
        b.send_task("tasks.add", countdown=10)
        send_task.assert_called_with("tasks.add", countdown=10)

    def test_info(self):
        scheduler = mScheduler(app=self.app)
        assert isinstance(scheduler.info, str)

    def test_apply_entry_handles_empty_result(self):
        s = mScheduler(app=self.app)
        entry = s.Entry(name="a name", task="foo", app=self.app)

        with patch.object(s, "apply_async") as mock_apply_async:
            with patch("celery.beat.debug") as mock_debug:
                mock_apply_async.return_value = None
                s.apply_entry(entry)
        mock_debug.assert_called_once_with("%s sent.", entry.task)

        with patch.object(s, "apply_async") as mock_apply_async:
            with patch("celery.beat.debug") as mock_debug:
                mock_apply_async.return_value = object()
                s.apply_entry(entry)
        mock_debug.assert_called_once_with("%s sent.", entry.task)

        task_id = "taskId123456"
        with patch.object(s, "apply_async") as mock_apply_async:
            with patch("celery.beat.debug") as mock_debug:
                mock_apply_async.return_value = self.app.AsyncResult(task_id)
                s.apply_entry(entry)
        mock_debug.assert_called_once_with("%s sent. id->%s", entry.task, task_id)

    def test_maybe_entry(self):
        s = mScheduler(app=self.app)
        entry = s.Entry(name="add every", task="tasks.add", app=self.app)
        assert s._maybe_entry(entry.name, entry) is entry
        assert s._maybe_entry("add every", {"task": "tasks.add"})

    def test_set_schedule(self):
        s = mScheduler(app=self.app)
        s.schedule = {"foo": "bar"}
        assert s.data == {"foo": "bar"}

    @patch("kombu.connection.Connection.ensure_connection")
    def test_ensure_connection_error_handler(self, ensure):
        s = mScheduler(app=self.app)
        assert s._ensure_connected()
        ensure.assert_called()
        callback = ensure.call_args[0][0]

        callback(KeyError(), 5)

    def test_install_default_entries(self):
        self.app.conf.result_expires = None
        self.app.conf.beat_schedule = {}
        s = mScheduler(app=self.app)
        s.install_default_entries({})
        assert "celery.backend_cleanup" not in s.data
        self.app.backend.supports_autoexpire = False

        self.app.conf.result_expires = 30
        s = mScheduler(app=self.app)
        s.install_default_entries({})
        assert "celery.backend_cleanup" in s.data

        self.app.backend.supports_autoexpire = True
        self.app.conf.result_expires = 31
        s = mScheduler(app=self.app)
        s.install_default_entries({})
        assert "celery.backend_cleanup" not in s.data

    def test_due_tick(self):
        scheduler = mScheduler(app=self.app)
        # adapted: a real 1 s interval for always_due, and a task (anarchon refuses an
        # entry without one). Upstream's tick() == 0 (the heap sends one entry per
        # tick and asks to be called again at once) becomes: the entry is sent, with
        # its args and kwargs, by the ticks of its first slot.
        scheduler.add(
            name="test_due_tick",
            task="c.due",
            schedule=EVERY_SECOND,
            args=(1, 2),
            kwargs={"foo": "bar"},
        )
        tick_until(scheduler, lambda: scheduler.sent, "the due entry sent")
        (sent,) = scheduler.sent
        assert (sent["name"], list(sent["args"])) == ("c.due", [1, 2])
        assert sent["kwargs"] == {"foo": "bar"}
        assert sent["options"]["headers"]["celery_beat_task"] is True

    @patch("celery.beat.error")
    def test_due_tick_SchedulingError(self, error):
        scheduler = mSchedulerSchedulingError(app=self.app)
        # adapted: a real 1 s interval for always_due, a task, and ticks until the
        # send failed (as in test_due_tick).
        scheduler.add(name="test_due_tick_SchedulingError", task="c.due", schedule=EVERY_SECOND)
        tick_until(scheduler, lambda: error.called, "the failed send logged")
        error.assert_called()

    def test_tick_survives_entry_failing_in_populate_heap(self, caplog):
        scheduler = mScheduler(app=self.app)
        # adapted: anarchon asks a schedule's own is_due once when it reads the entry,
        # and refuses one that raises, add() first of all. Put in the schedule
        # directly, the broken entry is logged as not scheduled at the next tick, and
        # the healthy one still runs.
        with pytest.raises(Exception, match="broken"):
            scheduler.add(name="broken", task="c.broken", schedule=raising_schedule())
        scheduler.schedule["broken"] = scheduler.Entry(
            name="broken", task="c.broken", schedule=raising_schedule(), app=self.app
        )
        scheduler.add(name="healthy", task="c.healthy", schedule=EVERY_SECOND)
        with caplog.at_level(logging.ERROR):
            tick_until(scheduler, lambda: scheduler.sent, "the healthy entry sent")
        assert [s["name"] for s in scheduler.sent] == ["c.healthy"]
        assert any("broken" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)

    def test_pending_tick(self):
        scheduler = mScheduler(app=self.app)
        # adapted: an hourly interval for always_pending; at most max_interval, as
        # anarchon wakes beat at least once a second (the 10 ms drift is stock's).
        scheduler.add(name="test_pending_tick", task="c.pending", schedule=HOURLY)
        assert 0 < scheduler.tick() <= scheduler.max_interval
        assert not scheduler.sent

    def test_honors_max_interval(self):
        # adapted: a loop interval under anarchon's 1 s ceiling (upstream's default of
        # 300 s is refused), and an hourly interval for mocked_schedule(False, maxi * 4).
        scheduler = mScheduler(app=self.app, max_interval=0.5)
        maxi = scheduler.max_interval
        scheduler.add(name="test_honors_max_interval", task="c.pending", schedule=HOURLY)
        assert scheduler.tick() == maxi

    def test_ticks(self):
        scheduler = mScheduler(app=self.app)
        nums = [600, 300, 650, 120, 250, 36]
        # adapted: real intervals for mocked_schedule(False, j), each with a task; the
        # delay is bounded by max_interval (anarchon wakes beat every second at least).
        s = {
            "test_ticks%s" % i: {"task": "c.tick", "schedule": schedule(timedelta(seconds=j))}
            for i, j in enumerate(nums)
        }
        scheduler.update_from_dict(s)
        assert 0 < scheduler.tick() <= min(min(nums) - 0.010, scheduler.max_interval)
        assert set(s) <= set(scheduler.schedule)

    @pytest.mark.parametrize(
        ("now", "last_run_at", "after_sunrise"),
        [
            pytest.param(
                datetime.fromisoformat("2026-03-08T01:30:00-05:00"),
                datetime.fromisoformat("2026-03-07T03:00:00-05:00"),
                datetime.fromisoformat("2026-03-08T03:08:00-04:00"),
                id="spring-forward",
            ),
            pytest.param(
                datetime.fromisoformat("2026-11-01T01:45:00-04:00"),
                datetime.fromisoformat("2026-10-31T03:00:00-04:00"),
                datetime.fromisoformat("2026-11-01T01:41:00-05:00"),
                id="fall-back",
            ),
        ],
    )
    def test_tick_solar_across_dst(self, now, last_run_at, after_sunrise):
        pytest.importorskip("ephem")
        tz = self.app.timezone = ZoneInfo("America/New_York")
        now_utc = now.astimezone(timezone.utc)
        s = solar("sunrise", 0, -15, app=self.app, nowfun=lambda: now_utc.astimezone(tz))
        # adapted: a set-up scheduler (a lazy one has no engine), and the entry's task
        # named. Its due times are decided by this beat, its owner (anarchon_celery.owned).
        scheduler = mScheduler(app=self.app)
        entry = scheduler.add(
            name="sunrise",
            task="t.fake.task",
            schedule=s,
            last_run_at=last_run_at,
        )

        delays = []
        for _ in range(5):
            delays.append(scheduler.tick())
            now_utc += timedelta(seconds=1)

        assert scheduler.sent == []
        assert all(delay > 0 for delay in delays)

        now_utc = after_sunrise.astimezone(timezone.utc)
        # adapted: "sent" means sent by the ticks that follow (the owner asks is_due at
        # least every second, and the slot it decides is claimed as any), not by one
        # tick; the entry's last run is the slot's time, which the owner took from the
        # clock (upstream: the schedule's now).
        tick_until(scheduler, lambda: scheduler.sent, "the sunrise sent")
        assert [sent["name"] for sent in scheduler.sent] == ["t.fake.task"]
        reserved = scheduler.schedule[entry.name]
        assert reserved.total_run_count == 1
        slot_id = scheduler.sent[0]["options"]["headers"]["anarchon"]["slot_id"]
        slot_ms = int(slot_id.rsplit("@", 1)[1])
        assert reserved.last_run_at.astimezone(timezone.utc).timestamp() == slot_ms / 1000

        now_utc += timedelta(seconds=1)
        assert scheduler.tick() > 0
        assert len(scheduler.sent) == 1

    def test_ticks_schedule_change(self):
        # adapted: anarchon's engine takes the heap's place: its job for the entry
        # shows the interval being scheduled (upstream reads the heap's top entry).
        scheduler = mScheduler(app=self.app)

        # set initial schedule and check heap is updated
        schedule_5 = schedule(5)
        scheduler.add(name="test_schedule", task="c.change", schedule=schedule_5)
        scheduler.tick()
        assert scheduler.schedule["test_schedule"].schedule == schedule_5
        assert scheduler.engine.jobs["test_schedule"].schedule == Every(timedelta(seconds=5))

        # update schedule and check heap is updated
        schedule_10 = schedule(10)
        scheduler.add(name="test_schedule", task="c.change", schedule=schedule(10))
        scheduler.tick()
        assert scheduler.schedule["test_schedule"].schedule == schedule_10
        assert scheduler.engine.jobs["test_schedule"].schedule == Every(timedelta(seconds=10))

    def test_interface(self):
        # adapted: with execution tracking on, so that the worker-check thread of both
        # setups is joined by close() too (checked after every test).
        self.app.conf.anarchon_tracking = True
        scheduler = mScheduler(app=self.app)
        scheduler.sync()
        scheduler.setup_schedule()
        scheduler.close()

    def test_merge_inplace(self):
        a = mScheduler(app=self.app)
        b = mScheduler(app=self.app)
        # adapted: real intervals for mocked_schedule(True, n), each with a task.
        a.update_from_dict(
            {
                "foo": {"task": "c.foo", "schedule": schedule(10)},
                "bar": {"task": "c.bar", "schedule": schedule(20)},
            }
        )
        b.update_from_dict(
            {
                "bar": {"task": "c.bar", "schedule": schedule(40)},
                "baz": {"task": "c.baz", "schedule": schedule(10)},
            }
        )
        a.merge_inplace(b.schedule)

        assert "foo" not in a.schedule
        assert "baz" in a.schedule
        assert a.schedule["bar"].schedule == schedule(40)

    def create_schedule_entry(self, schedule=None, args=(), kwargs={}, options={}, task=None):
        entry = {
            "name": "celery.unittest.add",
            "schedule": schedule,
            "app": self.app,
            "args": args,
            "kwargs": kwargs,
            "options": options,
            "task": task,
        }
        return beat.ScheduleEntry(**dict(entry))

    def test_schedule_equal_schedule_vs_schedule_success(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(schedule=schedule(5))}
        b = {"a": self.create_schedule_entry(schedule=schedule(5))}
        assert scheduler.schedules_equal(a, b)

    def test_schedule_equal_schedule_vs_schedule_fail(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(schedule=schedule(5))}
        b = {"a": self.create_schedule_entry(schedule=schedule(10))}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_crontab_vs_crontab_success(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(schedule=crontab(minute=5))}
        b = {"a": self.create_schedule_entry(schedule=crontab(minute=5))}
        assert scheduler.schedules_equal(a, b)

    def test_schedule_equal_crontab_vs_crontab_fail(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(schedule=crontab(minute=5))}
        b = {"a": self.create_schedule_entry(schedule=crontab(minute=10))}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_crontab_vs_schedule_fail(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(schedule=crontab(minute=5))}
        b = {"a": self.create_schedule_entry(schedule=schedule(5))}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_different_key_fail(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(schedule=schedule(5))}
        b = {"b": self.create_schedule_entry(schedule=schedule(5))}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_args_vs_args_success(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(args="a")}
        b = {"a": self.create_schedule_entry(args="a")}
        assert scheduler.schedules_equal(a, b)

    def test_schedule_equal_args_vs_args_fail(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(args="a")}
        b = {"a": self.create_schedule_entry(args="b")}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_kwargs_vs_kwargs_success(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(kwargs={"a": "a"})}
        b = {"a": self.create_schedule_entry(kwargs={"a": "a"})}
        assert scheduler.schedules_equal(a, b)

    def test_schedule_equal_kwargs_vs_kwargs_fail(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(kwargs={"a": "a"})}
        b = {"a": self.create_schedule_entry(kwargs={"b": "b"})}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_options_vs_options_success(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(options={"a": "a"})}
        b = {"a": self.create_schedule_entry(options={"a": "a"})}
        assert scheduler.schedules_equal(a, b)

    def test_schedule_equal_options_vs_options_fail(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(options={"a": "a"})}
        b = {"a": self.create_schedule_entry(options={"b": "b"})}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_task_vs_task_success(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(task="a")}
        b = {"a": self.create_schedule_entry(task="a")}
        assert scheduler.schedules_equal(a, b)

    def test_schedule_equal_task_vs_task_fail(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(task="a")}
        b = {"a": self.create_schedule_entry(task="b")}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_none_entry_vs_entry(self):
        scheduler = Scheduler(app=self.app)
        a = None
        b = {"a": self.create_schedule_entry(task="b")}
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_entry_vs_none_entry(self):
        scheduler = Scheduler(app=self.app)
        a = {"a": self.create_schedule_entry(task="a")}
        b = None
        assert not scheduler.schedules_equal(a, b)

    def test_schedule_equal_none_entry_vs_none_entry(self):
        scheduler = Scheduler(app=self.app)
        a = None
        b = None
        assert scheduler.schedules_equal(a, b)

    def test_apply_async_adds_beat_header(self):
        scheduler = mScheduler(app=self.app)
        entry = scheduler.Entry(
            name="test_task",
            task="test_task",
            schedule=schedule(10.0),
            options={"queue": "test_queue"},
            app=self.app,
        )

        result = scheduler.apply_async(entry)
        assert result.id

        sent_task = scheduler.sent[0]
        assert "headers" in sent_task["options"]
        assert sent_task["options"]["headers"]["celery_beat_task"] is True

    def test_apply_async_preserves_existing_headers(self):
        scheduler = mScheduler(app=self.app)
        entry = scheduler.Entry(
            name="test_task",
            task="test_task",
            schedule=schedule(10.0),
            options={"queue": "test_queue", "headers": {"existing_header": "value"}},
            app=self.app,
        )

        result = scheduler.apply_async(entry)
        assert result.id

        sent_task = scheduler.sent[0]
        assert "headers" in sent_task["options"]
        assert sent_task["options"]["headers"]["existing_header"] == "value"
        assert sent_task["options"]["headers"]["celery_beat_task"] is True


# -- upstream's test_SchedulerShutdown ------------------------------------------


class TestSchedulerShutdown:
    app: Any

    # adapted: upstream's two schedulers are stock beat's base class, lazy, and
    # PersistentScheduler over a mock shelve. Here: anarchon's, lazy, and set up
    # (an engine on its store, where PersistentScheduler has its shelve). Where
    # upstream checks that the shelve was synced and closed, the set-up scheduler
    # is checked to have closed its engine.
    @pytest.fixture(params=["lazy", "set-up"])
    def scheduler(self, request):
        if request.param == "set-up":
            scheduler = Scheduler(app=self.app)
            assert scheduler.engine is not None
            return scheduler
        return Scheduler(app=self.app, lazy=True)

    def test_close_releases_connection_and_channel(self, scheduler):
        with scheduler.connection as connection:
            channel = scheduler.producer.channel
            assert connection.connected
            assert not channel.closed

            with patch.object(connection, "release", wraps=connection.release) as release:
                scheduler.close()

                assert not connection.connected
                assert channel.closed
                assert "connection" not in scheduler.__dict__
                assert "producer" not in scheduler.__dict__
                assert scheduler.engine is None  # adapted: the shelve's synced and closed
                scheduler.close()
                release.assert_called_once_with()

    def test_close_releases_plain_subclass_attributes(self):
        class CustomScheduler(Scheduler):
            connection = None
            producer = None

        scheduler = CustomScheduler(app=self.app, lazy=True)
        with self.app.connection_for_write() as connection:
            scheduler.connection = connection
            scheduler.producer = scheduler.Producer(connection)
            channel = scheduler.producer.channel

            scheduler.close()

            assert not connection.connected
            assert channel.closed
            assert "connection" not in scheduler.__dict__
            assert "producer" not in scheduler.__dict__

    def test_base_publishing_resources_recreated_after_close(self):
        scheduler = Scheduler(app=self.app, lazy=True)
        with scheduler.connection as old_connection:
            old_producer = scheduler.producer
            old_channel = old_producer.channel
            scheduler.close()

            with scheduler.connection as connection:
                producer = scheduler.producer
                channel = producer.channel
                try:
                    producer.publish({"probe": True})
                    assert connection is not old_connection
                    assert producer is not old_producer
                    assert channel is not old_channel
                    assert connection.connected
                    assert not channel.closed
                    assert not old_connection.connected
                    assert old_channel.closed
                finally:
                    scheduler.close()

    def test_close_does_not_create_broker_resources(self, scheduler):
        with (
            patch.object(self.app, "connection_for_write") as connect,
            patch.object(scheduler, "Producer") as producer,
        ):
            scheduler.close()
        connect.assert_not_called()
        producer.assert_not_called()

    def test_close_releases_connection_after_producer_creation_fails(self, scheduler):
        with scheduler.connection as connection:
            with patch.object(scheduler, "Producer", side_effect=RuntimeError("producer failed")):
                with pytest.raises(RuntimeError, match="producer failed"):
                    scheduler.producer
            assert connection.connected

            scheduler.close()

            assert not connection.connected

    def test_close_releases_resources_when_sync_fails(self, scheduler):
        with scheduler.connection as connection:
            channel = scheduler.producer.channel
            with patch.object(scheduler, "sync", side_effect=RuntimeError("sync failed")):
                with pytest.raises(RuntimeError, match="sync failed"):
                    scheduler.close()

            assert not connection.connected
            assert channel.closed
            assert scheduler.engine is None  # adapted: the shelve's closed

    @pytest.mark.parametrize("error_type", ["connection_errors", "channel_errors"])
    def test_close_ignores_broker_errors(self, scheduler, error_type):
        with scheduler.connection as connection:
            scheduler.producer.channel
            error = getattr(connection, error_type)[0]("broker unavailable")
            with patch.object(connection, "release", side_effect=error) as release:
                scheduler.close()
            release.assert_called_once_with()
            assert "connection" not in scheduler.__dict__
            assert "producer" not in scheduler.__dict__
            assert scheduler.engine is None  # adapted: the shelve's closed

    @pytest.mark.parametrize("sync_fails", [False, True])
    def test_close_prioritizes_sync_over_unexpected_release_error(self, scheduler, sync_fails):
        sync_error = RuntimeError("sync failed")
        release_error = RuntimeError("unexpected release failure")
        with scheduler.connection as connection:
            scheduler.producer.channel
            with (
                patch.object(connection, "release", side_effect=release_error) as release,
                patch.object(
                    scheduler,
                    "sync",
                    wraps=scheduler.sync,
                    side_effect=sync_error if sync_fails else None,
                ),
                patch("celery.beat.error") as log_error,
            ):
                with pytest.raises(RuntimeError) as exc:
                    scheduler.close()
            assert exc.value is (sync_error if sync_fails else release_error)
            release.assert_called_once_with()
            if sync_fails:
                log_error.assert_called_once()
                assert log_error.call_args.kwargs["exc_info"]
            else:
                log_error.assert_not_called()
            assert "connection" not in scheduler.__dict__
            assert "producer" not in scheduler.__dict__
            assert scheduler.engine is None  # adapted: the shelve's closed

    def test_persistent_close_releases_connection_when_store_close_fails(self):
        # adapted: PersistentScheduler's shelve is anarchon's store here, and only
        # sync_fails=False is kept (anarchon's sync writes nothing). Whether close()
        # raises the store's error is left open; the broker connection must be
        # released either way.
        scheduler = Scheduler(app=self.app)
        store = scheduler.engine.store
        with scheduler.connection as connection:
            channel = scheduler.producer.channel
            store_error = RuntimeError("store close failed")
            with patch.object(store, "close", side_effect=store_error):
                with contextlib.suppress(RuntimeError):
                    scheduler.close()
            assert not connection.connected
            assert channel.closed
        store.close()


# -- upstream's test_Service ------------------------------------------------------


def create_service_scheduler() -> type[Scheduler]:
    """Upstream's create_persistent_scheduler(), without the mock shelve."""

    class ServiceScheduler(Scheduler):
        tick_raises_exit = False
        shutdown_service = None

        def tick(self):
            if self.tick_raises_exit:
                raise SystemExit()
            # adapted: a real scheduling step (upstream's mock does none), then as
            # upstream: shut the service down if asked, and ask to be called at once.
            super().tick()
            if self.shutdown_service:
                self.shutdown_service._is_shutdown.set()
            return 0.0

    return ServiceScheduler


class TestService:
    app: Any

    def get_service(self):
        # adapted: no shelve to return; the entries come from beat_schedule.
        return beat.Service(app=self.app, scheduler_cls=create_service_scheduler())

    def test_pickleable(self):
        # adapted: anarchon's scheduler by name, as beat_scheduler gives it, for Mock.
        s = beat.Service(app=self.app, scheduler_cls="anarchon_celery:Scheduler")
        assert loads(dumps(s))

    def test_start_records_the_effective_max_interval(self):
        s = self.get_service()
        assert s.effective_max_interval is None
        s.scheduler.shutdown_service = s
        s.start()
        assert s.effective_max_interval == s.scheduler.max_interval

    def test_start_stamps_last_tick(self):
        s = self.get_service()
        assert s._last_tick is None
        s.scheduler.shutdown_service = s
        s.start()
        assert s._last_tick is not None

    def test_reduce_preserves_hostname(self):
        s = beat.Service(
            app=self.app, scheduler_cls="anarchon_celery:Scheduler", hostname="probe@example.com"
        )
        cls, args = s.__reduce__()
        assert cls(*args).hostname == "probe@example.com"

    def test_reduce_preserves_remote_control(self):
        # EmbeddedService forces remote_control off, and billiard pickles
        # the service when the embedded beat runs under a spawning start
        # method.  If __reduce__ drops the flag the child re-reads the
        # config and silently starts a control node anyway.
        self.app.conf.beat_enable_remote_control = True
        s = beat.Service(
            app=self.app, scheduler_cls="anarchon_celery:Scheduler", remote_control=False
        )
        cls, args = s.__reduce__()
        assert cls(*args).remote_control is False

    def test_start(self):
        # adapted: the entries to find are beat_schedule's (upstream: the shelve's).
        self.app.conf.beat_schedule = {
            "probe": {"task": "c.probe", "schedule": 10},
            "nightly": {"task": "c.nightly", "schedule": crontab(minute=0, hour=3)},
        }
        s = self.get_service()
        schedule = s.scheduler.schedule
        assert isinstance(schedule, dict)
        assert isinstance(s.scheduler, beat.Scheduler)
        scheduled = list(schedule.keys())
        for task_name in self.app.conf.beat_schedule:
            assert task_name in scheduled

        s.sync()
        assert s.scheduler.engine is None  # adapted: the shelve's closed and synced
        assert s._is_stopped.is_set()
        s.sync()
        s.stop(wait=False)
        assert s._is_shutdown.is_set()
        s.stop(wait=True)
        assert s._is_shutdown.is_set()

    def test_start_embedded_process(self):
        s = self.get_service()
        s._is_shutdown.set()
        s.start(embedded_process=True)

    def test_start_thread(self):
        s = self.get_service()
        s._is_shutdown.set()
        s.start(embedded_process=False)

    def test_start_tick_raises_exit_error(self):
        s = self.get_service()
        s.scheduler.tick_raises_exit = True
        s.start()
        assert s._is_shutdown.is_set()

    def test_start_manages_one_tick_before_shutdown(self):
        s = self.get_service()
        s.scheduler.shutdown_service = s
        s.start()
        assert s._is_shutdown.is_set()

    def test_start_starts_and_stops_pidbox_when_enabled(self):
        self.app.conf.beat_enable_remote_control = True
        s = self.get_service()
        s.scheduler.shutdown_service = s
        with patch("celery.beat.BeatPidbox") as BeatPidbox:
            s.start()
        BeatPidbox.assert_called_once_with(s)
        BeatPidbox.return_value.start.assert_called_once_with()
        BeatPidbox.return_value.stop.assert_called_once_with()

    def test_start_does_not_start_pidbox_by_default(self):
        s = self.get_service()
        s.scheduler.shutdown_service = s
        with patch("celery.beat.BeatPidbox") as BeatPidbox:
            s.start()
        BeatPidbox.assert_not_called()

    def test_remote_control_argument_overrides_setting(self):
        self.app.conf.beat_enable_remote_control = True
        s = beat.Service(
            app=self.app, scheduler_cls="anarchon_celery:Scheduler", remote_control=False
        )
        assert s.remote_control is False
        s2 = self.get_service()
        assert s2.remote_control is True
