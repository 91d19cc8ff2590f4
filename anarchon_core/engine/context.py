"""What every part of the engine shares: the instance, clock, events, store and jobs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from ..clock import Clock
from ..events import Emitter
from ..peers import Peers
from ..slots import Slot
from .gateway import Gateway
from .table import JobTable
from .tallies import Tallies


@dataclass(frozen=True)
class Context:
    """The parts' common ground, built once by the scheduler."""

    instance: str
    clock: Clock
    emit: Emitter
    gateway: Gateway
    table: JobTable
    peers: Peers
    tallies: Tallies

    def now(self) -> datetime:
        """The wall-clock time, aware UTC."""
        return datetime.fromtimestamp(self.clock.time(), timezone.utc)

    def lateness(self, slot: Slot) -> float:
        """Seconds since ``slot``'s time."""
        return self.clock.time() - slot.time.timestamp()
