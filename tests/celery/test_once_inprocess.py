"""One-off ``beat_schedule`` entries (``anarchon_celery.once``, django-celery-beat's
``clocked``) with Celery's in-process fixtures: two beats ticked by the test, the
embedded worker, a SQLite store. Real time.

Each one-off is sent once, by one beat, at its time; beats started again after
it was sent (the same ``beat_schedule``) do not send it again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, beat
from django_celery_beat.clockedschedule import clocked

from anarchon_celery import Scheduler, once
from anarchon_core import ConfigurationError, Control, open_store
from tests.celery.ticking import drive
from tests.waiting import wait_until

pytest_plugins = ("celery.contrib.pytest",)


@pytest.fixture(scope="session")
def celery_config() -> dict[str, Any]:
    return {
        "broker_url": "memory://",
        "broker_transport_options": {"polling_interval": 0.05},
        "result_backend": "cache+memory://",
    }


@pytest.fixture
def sent(celery_app: Celery, celery_worker: Any) -> list[str]:
    """The slot ids the worker ran the test task for."""
    seen: list[str] = []

    @celery_app.task(bind=True, name="once.record")
    def record(self: Any) -> None:
        header = self.request.get("anarchon")
        seen.append(header["slot_id"] if header else "?")

    celery_worker.reload()
    return seen


@pytest.fixture
def beats(celery_app: Celery) -> Iterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for scheduler in reversed(made):
        scheduler.close()


def _beat(app: Celery, made: list[Scheduler]) -> Scheduler:
    scheduler = beat.Service(app, scheduler_cls=app.conf.beat_scheduler).scheduler
    assert isinstance(scheduler, Scheduler)
    made.append(scheduler)
    return scheduler


def test_once_and_clocked_entries_are_sent_once_by_one_of_two_beats_and_not_again(
    celery_app: Celery, sent: list[str], beats: list[Scheduler], tmp_path: Path
) -> None:
    at = datetime.fromtimestamp(int(time.time()) + 3, timezone.utc)
    later = at + timedelta(seconds=1)
    url = f"sqlite:///{tmp_path}/anarchon.db"
    celery_app.conf.update(
        beat_scheduler="anarchon_celery:Scheduler",
        beat_schedule={
            "report": {"task": "once.record", "schedule": once(at)},
            "clocked": {"task": "once.record", "schedule": clocked(later)},
        },
        anarchon_store=url,
    )
    first = [_beat(celery_app, beats), _beat(celery_app, beats)]
    # Kept in the store until their time, once each whatever the number of beats.
    drive(first, lambda: all(b.engine and b.engine.jobs for b in first), timeout=5)
    store = open_store(url, namespace=str(celery_app.main))
    try:
        pending = Control(store).pending_once()
        wait_until(lambda: len(Control(store).pending_once()) == 2, 5, "both one-offs stored")
        expected = {
            f"report@{int(at.timestamp() * 1000)}",
            f"clocked@{int(later.timestamp() * 1000)}",
        }
        drive(first, lambda: len(sent) >= 2, timeout=10)
        drive(first, lambda: time.time() > later.timestamp() + 2, timeout=5)
        assert Counter(sent) == Counter(expected), (sent, pending)
        assert Control(store).pending_once() == []
        won = sum((b.engine.stats if b.engine else {}).get("won", 0) for b in first)
        assert won == 2
        for scheduler in first:
            scheduler.close()
        # The beats start again with the same beat_schedule: nothing is sent again.
        again = [_beat(celery_app, beats), _beat(celery_app, beats)]
        started = time.time()
        drive(again, lambda: time.time() > started + 3, timeout=6)
        assert Counter(sent) == Counter(expected)
        assert Control(store).pending_once() == []
    finally:
        store.close()


def test_a_one_off_entry_with_bounds_or_rules_is_refused_naming_them() -> None:
    from anarchon_celery.schedules import read_entry

    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    entry = read_entry("x", {"task": "t", "schedule": once(at)}, "UTC")
    assert (entry.at, entry.every, entry.cron) == (at, None, None)
    raw = {"task": "t", "schedule": once(at), "options": {"anarchon_end": at}}
    with pytest.raises(ConfigurationError, match=r"beat_schedule\['x'\].*anarchon_end"):
        read_entry("x", raw, "UTC")
    with pytest.raises(ConfigurationError, match="time zone"):
        once("2030-01-01T00:00:00")
