"""A slot: one due time of one job, with the forms the store and the events name it by."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from .schedules import from_ms, to_ms

_MS = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class Slot:
    """One due time of one job.

    ``time`` is the aware datetime the job's schedule gives. The store keys
    the slot by :attr:`ms` (Unix milliseconds, floored); events and runs name
    it by :attr:`id`, ``"job@ms"``, the same on every instance.
    """

    job: str
    time: datetime
    #: Unix milliseconds of ``time``, floored: the store's key of the slot.
    ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Refuses a naive datetime, naming it.
        object.__setattr__(self, "ms", to_ms(self.time))

    @property
    def id(self) -> str:
        """``"job@ms"``: the slot's name in events and runs, an idempotency key."""
        return f"{self.job}@{self.ms}"

    @classmethod
    def from_ms(cls, job: str, ms: int) -> Slot:
        """The slot of ``job`` that the store keys by ``ms``."""
        return cls(job, from_ms(ms))

    @classmethod
    def from_id(cls, slot_id: str) -> Slot:
        """The slot named ``"job@ms"`` (a job name may itself contain ``@``)."""
        job, at, ms = slot_id.rpartition("@")
        if not at or not job or not _MS.fullmatch(ms):
            raise ValueError(f"slot id {slot_id!r}: expected 'job@unix_ms'")
        return cls.from_ms(job, int(ms))


#: Appended to a job's name, the store's record of that job's backfill: its
#: slots are claimed there, in order, apart from the job's live schedule. No
#: job name has it (job names hold no control characters).
BACKFILL = "\x1fbackfill"

#: Appended to a job's name and a lane number, the store's record of one of
#: the job's lanes (``overlap="allow_all"``): each slot of such a job is
#: claimed in the record of its lane (:func:`lane_of`), so that runs of
#: different slots hold leases of their own and run side by side.
LANE = "\x1flane"

#: The lanes of a job with ``overlap="allow_all"``: the store keeps one record per
#: lane, and each slot is claimed in its lane's (:func:`lane_of`: any ``LANES``
#: consecutive slots of a regular grid have lanes of their own). A slot whose lane
#: still holds the run of an older slot (``LANES`` slots before it, on a regular
#: grid) is skipped as an overlap.
LANES = 16

#: Every record that is not a job's own starts its suffix with this character,
#: which no job name holds.
_RECORD_MARK = "\x1f"


def lane_record(job: str, lane: int) -> str:
    """The name of the store's record of ``job``'s lane ``lane``."""
    return f"{job}{LANE}{lane}"


def lane_records(job: str) -> list[str]:
    """The names of the store's records of every lane of ``job``, in lane order."""
    return [lane_record(job, lane) for lane in range(LANES)]


def lane_of(slot_ms: int, interval_ms: int, lanes: int) -> int:
    """The lane of the slot ``slot_ms`` of a job whose slots are at least
    ``interval_ms`` apart: the number of whole intervals since the epoch, modulo
    ``lanes``. The same on every instance; two slots less than ``lanes``
    intervals apart never share a lane (on a regular grid: any ``lanes``
    consecutive slots have lanes of their own)."""
    return (slot_ms // max(1, interval_ms)) % lanes


def record_job(record: str) -> str:
    """The job a store record belongs to: the job's own, its backfill's, or a lane's."""
    return record.split(_RECORD_MARK, 1)[0]


def is_own_record(record: str) -> bool:
    """Whether ``record`` is a job's own record (not a backfill's or a lane's)."""
    return _RECORD_MARK not in record


def shown(slot: Slot) -> Slot:
    """The slot as handlers and events name it: a backfill's or a lane's slot is its job's."""
    if not is_own_record(slot.job):
        return Slot(record_job(slot.job), slot.time)
    return slot
