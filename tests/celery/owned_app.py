"""tests/celery/e2e_app.py's app with an entry whose schedule decides its own due times.

The entry ``two`` runs ``e2e.work`` whenever two seconds have passed since its last
run, by the rule of its own ``is_due`` (not a grid): one beat at a time decides.
The processes run it with ``celery -A tests.celery.owned_app``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from celery.schedules import schedstate, schedule

from tests.celery.e2e_app import app


class EveryTwo(schedule):  # type: ignore[misc]
    """Due once two seconds have passed since its last run."""

    def is_due(self, last_run_at: datetime) -> Any:
        elapsed = (self.now() - last_run_at).total_seconds()
        if elapsed >= 2:
            return schedstate(True, 2.0)
        return schedstate(False, 2.0 - elapsed)


app.conf.beat_schedule["two"] = {
    "task": "e2e.work",
    "schedule": EveryTwo(timedelta(seconds=2)),
    "args": ("two", 0.2),
}

__all__ = ["app"]
