"""One-off runs: the schedule of a job that runs once, and the store entries that ask for one.

A one-off is a slot of its own of a job (``job@<due ms>``), kept in the store
as an entry (:class:`~anarchon_core.store.OnceEntry`) until a claim of that
slot settles it: the engine reads the entries due from the store's index on
the due time (:meth:`~anarchon_core.store.OnceStore.once_due`), claims the
slot like any other on the job's own record (so it runs once, across every
instance and every restart), and removes the entry. A job declared to run
once (:meth:`Scheduler.once <anarchon_core.Scheduler.once>`) has the schedule
:func:`once_schedule`: its one slot, at its time.
"""

from __future__ import annotations

import json
from datetime import datetime

from .schedules import MAX_INTERVAL, Schedule, make_schedule, moment

#: The interval of a one-off job's grid: the longest there is, anchored at its time,
#: so that its one slot is the only one its bounds let through (as django-celery-beat's
#: clocked rows are read).
ONCE_EVERY = MAX_INTERVAL


def once_schedule(at: datetime | str, name: str = "at") -> Schedule:
    """The schedule of a job that runs once, at ``at`` (an aware datetime or ISO string)."""
    when = moment(name, at)
    return make_schedule(every=ONCE_EVERY, anchor=when, start=when, end=when)


def entry_value(by: str, asked: float, **more: object) -> str:
    """The value of a one-off's entry: who asked for it, when (Unix seconds), and ``more``."""
    return json.dumps({"by": by, "asked": round(asked, 3), **more}, separators=(",", ":"))


def who_asked(value: str) -> str:
    """The ``by`` of an entry's value ("?" if it names nobody)."""
    try:
        by = json.loads(value).get("by")
    except (ValueError, AttributeError):
        return "?"
    return by if isinstance(by, str) and by else "?"
