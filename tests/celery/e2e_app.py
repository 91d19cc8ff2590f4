"""The Celery app that the end-to-end tests run in real worker and beat processes.

Configured from the environment: ``E2E_BROKER``, ``E2E_STORE`` (optional: the
broker serves as the store), ``E2E_NAMESPACE``, ``E2E_LEASE``,
``E2E_SCHEDULE`` (JSON: entry name -> {"every": seconds} or {"cron": "* * * * *"},
plus "work": seconds the task works), ``E2E_REPORT`` (the JSON-lines file
every task appends to).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab

from anarchon_core.tools.instance import Reporter

app = Celery("anarchon_e2e", broker=os.environ["E2E_BROKER"])


def _schedule(spec: dict[str, Any]) -> Any:
    if "cron" in spec:
        minute, hour, day, month, weekday = spec["cron"].split()
        return crontab(minute, hour, weekday, day, month)
    return timedelta(seconds=spec["every"])


app.conf.update(
    beat_scheduler="anarchon_celery:Scheduler",
    anarchon_store=os.environ.get("E2E_STORE") or None,
    anarchon_namespace=os.environ["E2E_NAMESPACE"],
    anarchon_lease=float(os.environ.get("E2E_LEASE", "3")),
    anarchon_metrics_port=int(os.environ["E2E_METRICS_PORT"])
    if os.environ.get("E2E_METRICS_PORT")
    else None,
    anarchon_metrics_host="127.0.0.1",
    beat_schedule={
        name: {
            "task": spec.get("task", "e2e.work"),
            "schedule": _schedule(spec),
            "args": (name, spec.get("work", 0.2)),
        }
        for name, spec in json.loads(os.environ.get("E2E_SCHEDULE", "{}")).items()
    },
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    timezone="UTC",
    # Tests share the broker: each keeps to a queue of its own.
    task_default_queue=os.environ["E2E_NAMESPACE"],
)
_reporter: Reporter | None = None


def report() -> Reporter:
    global _reporter
    if _reporter is None:
        _reporter = Reporter(os.environ["E2E_REPORT"], f"{os.uname().nodename}:{os.getpid()}")
    return _reporter


def _work(task: Any, entry: str, seconds: float) -> None:
    """Report a start, work ``seconds``, report an end: what every test task does."""
    info = task.request.get("anarchon") or {}
    fields = {
        "job": entry,
        "slot_id": info.get("slot_id"),
        "attempt": info.get("attempt"),
        "task_id": task.request.id,
        "worker": task.request.hostname,
        "sent_by": info.get("sent_by"),
        "retries": task.request.retries,
        "info": info,
    }
    report().write("start", **fields)
    time.sleep(seconds)
    report().write("end", **fields)


@app.task(name="e2e.work", bind=True)
def work(self: Any, entry: str, seconds: float) -> None:
    _work(self, entry, seconds)


@app.task(name="e2e.broken", bind=True)
def broken(self: Any, entry: str, seconds: float) -> None:
    """Works, then fails: every run ends failed."""
    _work(self, entry, seconds)
    raise RuntimeError(f"{entry} is broken")


@app.task(name="e2e.flaky", bind=True, max_retries=1)
def flaky(self: Any, entry: str, seconds: float) -> None:
    """Works, then asks for one retry (a second later), then works again and succeeds."""
    _work(self, entry, seconds)
    if self.request.retries == 0:
        raise self.retry(countdown=1)
