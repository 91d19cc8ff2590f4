"""anarchon for Celery: ``beat_scheduler = "anarchon_celery:Scheduler"``.

Beat can then run in every worker pod (``celery worker -B``) or as several
``celery beat`` processes: each slot of each ``beat_schedule`` entry is sent
by one instance only. See ``docs/celery.md``.
"""

from .scheduler import Scheduler

__all__ = ["Scheduler"]
