"""anarchon: scheduled jobs that run once per slot across every instance of a service.

Every instance runs the same :class:`Scheduler`; at each slot the instances
race to claim it in a store they share, one wins and runs it, and a lease
with heartbeats lets the others take over if the winner dies.
"""

from .clock import Clock, FakeClock, SkewedClock, SystemClock
from .control import Control, JobStatus
from .errors import (
    AnarchonError,
    BatchRefused,
    Cancelled,
    ConfigurationError,
    DispatchFailed,
    JobPaused,
    LeaseLost,
    MissingDependency,
    StoreUnavailable,
    UnknownJob,
)
from .events import Event, EventKind
from .jobs import Job, JobOptions, Overlap, Rules, Run
from .scheduler import Scheduler
from .schedules import Bounded, Cron, Every, Schedule, Upcoming, make_schedule, preview, slot_id
from .store import (
    Change,
    Claim,
    ClaimRequest,
    ClaimStatus,
    InstanceRecord,
    JobState,
    JobStats,
    LeaseStore,
    Paused,
    RunRecord,
    RunState,
    Store,
    TakeoverRequest,
)
from .urls import open_store, redact
from .version import __version__

__all__ = [
    "AnarchonError",
    "BatchRefused",
    "Bounded",
    "Cancelled",
    "Change",
    "Claim",
    "ClaimRequest",
    "ClaimStatus",
    "Clock",
    "ConfigurationError",
    "Control",
    "Cron",
    "DispatchFailed",
    "Event",
    "EventKind",
    "Every",
    "FakeClock",
    "InstanceRecord",
    "Job",
    "JobOptions",
    "JobPaused",
    "JobState",
    "JobStats",
    "JobStatus",
    "LeaseLost",
    "LeaseStore",
    "MissingDependency",
    "Overlap",
    "Paused",
    "Rules",
    "Run",
    "RunRecord",
    "RunState",
    "Schedule",
    "Scheduler",
    "SkewedClock",
    "Store",
    "StoreUnavailable",
    "SystemClock",
    "TakeoverRequest",
    "UnknownJob",
    "Upcoming",
    "__version__",
    "make_schedule",
    "open_store",
    "preview",
    "redact",
    "slot_id",
]
