"""``python -m benchmarks.django_project.rows COMMAND ...``: the tables, made as a project does.

In the project's environment (``BENCH_DJ_DATABASE``):

- ``migrate``: django-celery-beat's migrations, and its change marker
  written once (as the admin's first save does): django-celery-beat's
  scheduler takes the first marker it reads for the current one, so rows made
  while it runs are seen only if a marker was there before;
- ``create COUNT SCHEDULE [LAST_RUN_AT]``: COUNT enabled rows ``r00000``,
  ``r00001``, ... naming the task ``bench.noop``, all on one schedule row:
  ``SCHEDULE`` is a cron expression (one ``CrontabSchedule``, UTC) or a
  number of seconds (one ``IntervalSchedule``); ``LAST_RUN_AT`` (Unix
  seconds) sets every row's ``last_run_at``. One ``bulk_create``, then
  ``PeriodicTasks.update_changed()``, as a bulk insert must (it saves no row
  one by one, so the change marker would not move).
- ``ahead COUNT SCHEDULE LEAD EVERY``: ``create`` with ``LAST_RUN_AT`` one
  interval before the first multiple of ``EVERY`` seconds at least ``LEAD``
  seconds after the moment the rows are written, which it prints: times
  counted from the write, not from the start of this process.
"""

from __future__ import annotations

import math
import sys
import time
from datetime import datetime, timezone

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django_celery_beat.models import (  # noqa: E402
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    PeriodicTasks,
)

TASK = "bench.noop"


def create(count: int, schedule: str, last_run_at: float | None = None) -> None:
    fields: dict[str, object] = {}
    if " " in schedule.strip():
        minute, hour, dom, month, dow = schedule.split()
        fields["crontab"], _ = CrontabSchedule.objects.get_or_create(
            minute=minute,
            hour=hour,
            day_of_month=dom,
            month_of_year=month,
            day_of_week=dow,
            timezone="UTC",
        )
    else:
        fields["interval"], _ = IntervalSchedule.objects.get_or_create(
            every=int(schedule), period=IntervalSchedule.SECONDS
        )
    if last_run_at is not None:
        fields["last_run_at"] = datetime.fromtimestamp(last_run_at, timezone.utc)
    PeriodicTask.objects.bulk_create(
        [PeriodicTask(name=f"r{n:05d}", task=TASK, **fields) for n in range(count)],
        batch_size=2000,
    )
    PeriodicTasks.update_changed()


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "migrate":
        call_command("migrate", verbosity=0, interactive=False)
        PeriodicTasks.update_changed()
    elif command == "create":
        create(int(args[0]), args[1], float(args[2]) if len(args) > 2 else None)
    elif command == "ahead":
        lead, every = float(args[2]), float(args[3])
        first = math.ceil((time.time() + lead) / every) * every
        create(int(args[0]), args[1], first - every)
        print(first)
    else:
        raise SystemExit(f"unknown command {command!r}: migrate, create or ahead")


if __name__ == "__main__":
    main(sys.argv[1:])
