"""anarchon: scheduled jobs that run once per slot across every instance of a service.

Every instance runs the same :class:`Scheduler`; at each slot the instances
race to claim it in a store they share, one wins and runs it, and a lease
with heartbeats lets the others take over if the winner dies.
"""

from .clock import Clock, FakeClock, SkewedClock, SystemClock
from .errors import (
    AnarchonError,
    ConfigurationError,
    DispatchFailed,
    LeaseLost,
    MissingDependency,
    StoreUnavailable,
)
from .events import Event, EventKind
from .jobs import Job, JobOptions, Run
from .scheduler import Scheduler
from .schedules import Cron, Every, Schedule, make_schedule, slot_id
from .store import Claim, ClaimRequest, ClaimStatus, JobState, RunRecord, RunState, Store
from .urls import open_store, redact

__all__ = [
    "AnarchonError",
    "Claim",
    "ClaimRequest",
    "ClaimStatus",
    "Clock",
    "ConfigurationError",
    "Cron",
    "DispatchFailed",
    "Event",
    "EventKind",
    "Every",
    "FakeClock",
    "Job",
    "JobOptions",
    "JobState",
    "LeaseLost",
    "MissingDependency",
    "Run",
    "RunRecord",
    "RunState",
    "Schedule",
    "Scheduler",
    "SkewedClock",
    "Store",
    "StoreUnavailable",
    "SystemClock",
    "make_schedule",
    "open_store",
    "redact",
    "slot_id",
]
