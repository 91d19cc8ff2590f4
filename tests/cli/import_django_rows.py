"""django-celery-beat's tables, made by its migrations and filled through its models.

Run as ``python -m tests.cli.import_django_rows`` with
``DJANGO_SETTINGS_MODULE=tests.cli.import_django_settings`` (and its
database variables): one row of each kind ``anarchon import`` reads, carries
or skips (tests/cli/test_import.py names them).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import django


def main() -> None:
    django.setup()
    from django.core.management import call_command
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        SolarSchedule,
    )

    call_command("migrate", "django_celery_beat", verbosity=0)
    now = datetime.now(timezone.utc)
    minute, _ = IntervalSchedule.objects.get_or_create(every=1, period="minutes")
    hours, _ = IntervalSchedule.objects.get_or_create(every=2, period="hours")
    nightly = CrontabSchedule.objects.create(minute="0", hour="3", timezone="Europe/Paris")
    weekdays = CrontabSchedule.objects.create(minute="*/15", hour="9-17", day_of_week="1-5")
    sunset = SolarSchedule.objects.create(event="sunset", latitude=48.85, longitude=2.35)
    soon = ClockedSchedule.objects.create(clocked_time=now + timedelta(days=1))
    rows = [
        {"name": "every-minute", "interval": minute, "args": "[1]", "kwargs": '{"a": 1}',
         "queue": "reports", "priority": 3},
        {"name": "nightly", "crontab": nightly, "headers": '{"team": "ops"}'},
        {"name": "weekdays", "crontab": weekdays},
        {"name": "since-2024", "interval": hours,
         "start_time": datetime(2024, 1, 1, 0, 30, tzinfo=timezone.utc)},
        {"name": "off", "interval": minute, "enabled": False},
        {"name": "sun", "solar": sunset},
        {"name": "once", "clocked": soon, "one_off": True},
        {"name": "one-off", "interval": minute, "one_off": True},
        {"name": "later", "interval": minute,
         "start_time": datetime(2090, 1, 1, 8, 0, 0, 250, tzinfo=timezone.utc)},
        {"name": "ending", "crontab": weekdays,
         "expires": datetime(2090, 7, 1, tzinfo=timezone.utc)},
        {"name": "short-lived", "interval": minute, "expire_seconds": 30},
        {"name": "expired", "interval": minute,
         "expires": datetime(2020, 1, 1, tzinfo=timezone.utc)},
    ]  # fmt: skip
    for row in rows:
        PeriodicTask.objects.create(task=f"tasks.{row['name']}", **row)


if __name__ == "__main__":
    main()
