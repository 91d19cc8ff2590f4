"""A slot: one due time of one job, with the forms the store and the events name it by."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from .schedules import from_ms, slot_id, to_ms

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
        return slot_id(self.job, self.time)

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


def shown(slot: Slot) -> Slot:
    """The slot as handlers and events name it: a backfill's slot is its job's."""
    if slot.job.endswith(BACKFILL):
        return Slot(slot.job[: -len(BACKFILL)], slot.time)
    return slot
