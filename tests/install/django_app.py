"""A Django project in one module, using only what ``anarchon[django]`` installs.

Its settings (this module is the settings module: SQLite, which Python
ships, and django-celery-beat), its Celery app, and its setup: ``python
django_app.py setup`` applies the migrations and saves one PeriodicTask row
every second, as the admin would. Configured from the environment:
``APP_BROKER`` (the broker serves as the store), ``APP_NAMESPACE`` (also the
queue), ``APP_REPORT`` (the JSON-lines file the task appends to).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_app")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(Path(__file__).resolve().parent / "db.sqlite3"),
    }
}
INSTALLED_APPS = ["django_celery_beat"]
USE_TZ = True
TIME_ZONE = "UTC"
SECRET_KEY = "install-test"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

NAMESPACE = os.environ.get("APP_NAMESPACE", "install")

app = Celery("anarchon_django_install", broker=os.environ.get("APP_BROKER"))
app.conf.update(
    beat_scheduler="anarchon_celery:DatabaseScheduler",
    # A pod on a loaded machine may stall for longer than the 1 s interval: the slots it
    # then finds late are still sent within this window (one missed past it fails the test).
    anarchon_catch_up=10,
    anarchon_namespace=NAMESPACE,
    anarchon_django_poll=1,
    broker_connection_retry_on_startup=True,
    task_default_queue=NAMESPACE,
    task_ignore_result=True,
    timezone="UTC",
)


@app.task(name="install.tick", bind=True)
def tick(self: Any) -> None:
    info = self.request.get("anarchon") or {}
    line = {"slot_id": info.get("slot_id"), "attempt": info.get("attempt"), "id": self.request.id}
    fd = os.open(os.environ["APP_REPORT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def setup() -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", verbosity=0, interactive=False)
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    PeriodicTask.objects.create(name="tick", task="install.tick", interval=every)


if __name__ == "__main__" and sys.argv[1:] == ["setup"]:
    setup()
