"""The project's Celery app, as django-celery-beat's documentation sets one up."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from anarchon_core.tools.instance import Reporter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.project.settings")

app = Celery("dj")
app.config_from_object("django.conf:settings", namespace="CELERY")

_reporter: Reporter | None = None


def report() -> Reporter:
    global _reporter
    if _reporter is None:
        _reporter = Reporter(os.environ["E2E_REPORT"], f"{os.uname().nodename}:{os.getpid()}")
    return _reporter


@app.task(name="dj.work", bind=True)
def work(self: Any, entry: str, *args: Any, **kwargs: Any) -> None:
    """Report what the worker received: the slot, and what the row said to send."""
    request = self.request
    info = request.get("anarchon") or {}
    delivery = request.delivery_info or {}
    report().write(
        "start",
        job=entry,
        slot_id=info.get("slot_id"),
        attempt=info.get("attempt"),
        task_id=request.id,
        worker=request.hostname,
        sent_by=info.get("sent_by"),
        args=list(args),
        kwargs=kwargs,
        periodic_task_name=request.get("periodic_task_name"),
        expires=str(request.expires) if request.expires else None,
        priority=delivery.get("priority"),
        queue=delivery.get("routing_key"),
        custom=request.get("x-custom"),
    )
