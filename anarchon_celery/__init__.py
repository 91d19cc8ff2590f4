"""anarchon for Celery: ``beat_scheduler = "anarchon_celery:Scheduler"``.

Beat can then run in every worker pod (``celery worker -B``) or as several
``celery beat`` processes: each slot of each ``beat_schedule`` entry is sent
by one instance only. See ``docs/celery.md``.
"""

from anarchon_core.version import __version__

from .scheduler import Scheduler
from .schedules import once

__all__ = ["Scheduler", "__version__", "once"]


def __getattr__(name: str) -> object:
    # DatabaseScheduler imports Django: only when asked for
    # (beat_scheduler = "anarchon_celery:DatabaseScheduler").
    if name == "DatabaseScheduler":
        from .django import DatabaseScheduler

        return DatabaseScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
