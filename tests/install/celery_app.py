"""A Celery app that uses only what ``anarchon[celery]`` installs.

Copied into an empty directory and run by the ``celery`` command of a virtual
environment holding the project and one extra, nothing else. Configured from
the environment: ``APP_BROKER``, ``APP_STORE`` (optional: the broker serves as
the store), ``APP_NAMESPACE`` (also the queue), ``APP_REPORT`` (the JSON-lines
file the task appends to).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from celery import Celery

NAMESPACE = os.environ["APP_NAMESPACE"]

app = Celery("anarchon_install", broker=os.environ["APP_BROKER"])
app.conf.update(
    beat_scheduler="anarchon_celery:Scheduler",
    beat_schedule={"tick": {"task": "install.tick", "schedule": timedelta(seconds=1)}},
    # A pod on a loaded machine may stall for longer than the 1 s interval: the slots it
    # then finds late are still sent within this window (one missed past it fails the test).
    anarchon_catch_up=10,
    anarchon_namespace=NAMESPACE,
    broker_connection_retry_on_startup=True,
    task_default_queue=NAMESPACE,
    task_ignore_result=True,
    timezone="UTC",
)
if os.environ.get("APP_STORE"):
    app.conf.anarchon_store = os.environ["APP_STORE"]


@app.task(name="install.tick", bind=True)
def tick(self: Any) -> None:
    info = self.request.get("anarchon") or {}
    line = {"slot_id": info.get("slot_id"), "attempt": info.get("attempt"), "id": self.request.id}
    fd = os.open(os.environ["APP_REPORT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
