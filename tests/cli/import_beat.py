"""A ``beat_schedule`` for ``anarchon import --beat-schedule`` (tests/cli/test_import.py).

``beat_schedule`` is a plain dict; ``app`` a Celery app holding it, with a
time zone of its own. ``changed`` is the same schedule after an edit: one
entry's crontab moved, one entry added.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from celery import Celery
from celery.schedules import crontab, schedule, solar

beat_schedule = {
    "report-every-minute": {"task": "tasks.report", "schedule": 60.0, "args": (1, "a")},
    "nightly-cleanup": {
        "task": "tasks.cleanup",
        "schedule": crontab(minute=0, hour=3),
        "kwargs": {"dsn": "postgresql://app:s3cr3t-in-kwargs@db/app"},
        "options": {"queue": "slow", "anarchon_lease": "2m"},
    },
    "quarter-hourly": {"task": "tasks.poll", "schedule": timedelta(minutes=15)},
    # Bounded: anarchon_start and anarchon_end become the stored schedule's start and end.
    "first-week-of-2030": {
        "task": "tasks.poll",
        "schedule": 3600.0,
        "options": {
            "anarchon_start": datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=1))),
            "anarchon_end": "2030-01-07T23:00:00+00:00",
        },
    },
    # A bare solar: a real one needs the ephem package, and anarchon refuses any solar.
    "sunrise": {"task": "tasks.wake", "schedule": solar.__new__(solar)},
    "relative": {"task": "tasks.poll", "schedule": schedule(timedelta(hours=1), relative=True)},
}

changed = dict(beat_schedule)
changed["nightly-cleanup"] = {**beat_schedule["nightly-cleanup"], "schedule": crontab(0, 4)}
changed["weekly"] = {"task": "tasks.weekly", "schedule": crontab(0, 6, day_of_week="mon")}

app = Celery("imported", set_as_current=False)
app.conf.timezone = "Europe/Paris"
app.conf.beat_schedule = beat_schedule
