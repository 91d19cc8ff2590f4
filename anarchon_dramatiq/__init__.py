"""anarchon for Dramatiq: periodic actors that run once per slot across every worker.

``broker.add_middleware(anarchon_dramatiq.Anarchon())``, then
``@dramatiq.actor(schedule="*/5 * * * *")`` or ``schedule=every(10)``.
See ``docs/dramatiq.md``.
"""

from anarchon_core.version import __version__

from .declarations import Interval, ScheduleError, every
from .middleware import Anarchon

__all__ = ["Anarchon", "Interval", "ScheduleError", "__version__", "every"]
