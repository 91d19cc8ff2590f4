"""What the tests do to the project's tables, as the admin or the project's code does it.

``python -m tests.django.project.rows COMMAND JSON``, in the project's
environment (``DJ_DATABASE``): ``migrate``; ``create`` (a list of rows:
name, task, and one of every (seconds), cron ("m h dom mon dow" with
timezone), clocked (Unix seconds), solar (event), plus any PeriodicTask
column; a time, clocked, ``start_time`` or ``expires``, may be ``{"in": seconds}``:
that long after the moment the rows are written, which it prints as JSON,
``{"now": unix_seconds}``, so that starting Django takes none of it); ``every``
(name, seconds: the row's interval changed, as the admin's change form saves it);
``disable``, ``delete`` (a name);
``dump`` (every row's enabled, total_run_count and last_run_at as JSON);
``tables`` (the database's table names); ``do`` (a list of such commands,
each ``[command, args...]``, in one process).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from typing import Any

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django_celery_beat.models import (  # noqa: E402
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

#: The fields of a row that hold a time.
_TIMES = ("clocked", "start_time", "expires")


def _interval(seconds: int) -> IntervalSchedule:
    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    return interval


def _time(value: float | dict[str, float], now: float) -> datetime:
    """A row's time: Unix seconds, or ``{"in": seconds}`` after ``now``."""
    at = now + value["in"] if isinstance(value, dict) else value
    return datetime.fromtimestamp(at, timezone.utc)


def create(rows: list[dict[str, Any]]) -> None:
    now = round(time.time())
    if any(isinstance(spec.get(key), dict) for spec in rows for key in _TIMES):
        print(json.dumps({"now": now}))
    for spec in rows:
        spec = dict(spec)
        fields: dict[str, Any] = {"name": spec.pop("name"), "task": spec.pop("task", "dj.work")}
        if "every" in spec:
            fields["interval"] = _interval(spec.pop("every"))
        if "cron" in spec:
            minute, hour, dom, month, dow = spec.pop("cron").split()
            fields["crontab"], _ = CrontabSchedule.objects.get_or_create(
                minute=minute,
                hour=hour,
                day_of_month=dom,
                month_of_year=month,
                day_of_week=dow,
                timezone=spec.pop("timezone", "UTC"),
            )
        if "clocked" in spec:
            at = _time(spec.pop("clocked"), now)
            fields["clocked"] = ClockedSchedule.objects.create(clocked_time=at)
            fields["one_off"] = True
        if "solar" in spec:
            fields["solar"], _ = SolarSchedule.objects.get_or_create(
                event=spec.pop("solar"), latitude=48.85, longitude=2.35
            )
        for key in ("args", "kwargs", "headers"):
            if key in spec:
                spec[key] = json.dumps(spec[key])
        for key in ("start_time", "expires"):
            if key in spec:
                spec[key] = _time(spec[key], now)
        PeriodicTask.objects.create(**fields, **spec)


def every(name: str, seconds: int) -> None:
    """The admin's change form: the row saved with its new interval (the marker moves)."""
    task = PeriodicTask.objects.get(name=name)
    task.interval = _interval(seconds)
    task.save(update_fields=["interval"])


def disable(name: str) -> None:
    task = PeriodicTask.objects.get(name=name)
    task.enabled = False
    task.save(update_fields=["enabled", "last_run_at"])


def delete(name: str) -> None:
    PeriodicTask.objects.get(name=name).delete()


def dump() -> None:
    rows = {
        task.name: {
            "enabled": task.enabled,
            "total_run_count": task.total_run_count,
            "last_run_at": task.last_run_at.timestamp() if task.last_run_at else None,
        }
        for task in PeriodicTask.objects.all()
    }
    print(json.dumps(rows))


def tables() -> None:
    """The names of the database's tables."""
    from django.db import connection

    print(json.dumps(sorted(connection.introspection.table_names())))


COMMANDS = {
    "create": create,
    "every": every,
    "disable": disable,
    "delete": delete,
    "dump": dump,
    "tables": tables,
}


def main(argv: list[str]) -> None:
    """``migrate``, one command with its JSON arguments, or ``do`` a list of commands."""
    command, args = argv[0], [json.loads(a) for a in argv[1:]]
    if command == "migrate":
        call_command("migrate", verbosity=0, interactive=False)
    elif command == "do":
        for name, *values in args[0]:
            COMMANDS[name](*values)
    else:
        COMMANDS[command](*args)


if __name__ == "__main__":
    main(sys.argv[1:])
