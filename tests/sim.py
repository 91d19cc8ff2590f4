"""A deterministic cluster: several schedulers, one memory store, one fake clock.

Instances are driven step by step: each step runs every live instance's
``run_pending`` and moves the fake clock to the earliest moment anything is
due. "Killing" an instance stops driving it (no hand-over, no heartbeats);
freezing stops driving it for a while, like SIGSTOP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from anarchon_core import Event, FakeClock, Run, Scheduler, SkewedClock
from anarchon_core.stores.memory import MemoryStore

START = 1_699_999_200.0  # a whole hour: slots of every= grids dividing an hour line up with it


@dataclass
class Span:
    """One handler execution as the handler saw it."""

    instance: str
    job: str
    slot_id: str
    attempt: int
    token: int
    start: float
    end: float | None = None
    lost: bool = False
    killed: bool = False


class Cluster:
    def __init__(self, *, store: MemoryStore | None = None, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock(START)
        self.store = store or MemoryStore(clock=self.clock)
        self.live: dict[str, Scheduler] = {}
        self.all: dict[str, Scheduler] = {}
        self.spans: list[Span] = []
        self.events: list[Event] = []
        self._seed = 0
        self.dead: set[str] = set()

    def now(self) -> float:
        return self.clock.time()

    def handler(self, duration: float) -> Callable[[Run], None]:
        """A handler that works ``duration`` seconds in small steps, noticing a lost lease."""

        def work(run: Run) -> None:
            span = Span(run.instance, run.job, run.slot_id, run.attempt, run.token, self.now())
            self.spans.append(span)
            end = span.start + duration
            while self.now() < end and not run.lost:
                self.clock.sleep(min(0.1, end - self.now()))
                if run.instance in self.dead:
                    span.killed = True
                    break
            span.lost = run.lost
            span.end = self.now()

        return work

    def add(
        self,
        name: str,
        setup: Callable[[Scheduler], None],
        *,
        skew: float = 0.0,
        **options: object,
    ) -> Scheduler:
        self._seed += 1
        clock = SkewedClock(self.clock, skew) if skew else self.clock
        scheduler = Scheduler(
            self.store,
            instance=name,
            clock=clock,
            seed=self._seed,
            listener=self.events.append,
            **options,  # type: ignore[arg-type]
        )
        setup(scheduler)
        self.live[name] = scheduler
        self.all[name] = scheduler
        return scheduler

    def run(self, seconds: float) -> None:
        """Drive the live instances for ``seconds`` of virtual time."""
        end = self.clock.monotonic() + seconds
        while self.clock.monotonic() < end - 1e-9:
            delays = [s.run_pending() for s in list(self.live.values())]
            self.clock.settle()
            wake = self.clock.next_deadline()
            if wake is not None:
                delays.append(wake - self.clock.monotonic())
            step = min([end - self.clock.monotonic(), *delays])
            self.clock.advance(max(step, 0.001))

    def kill(self, name: str) -> None:
        """Like SIGKILL: the instance and its handlers stop without a word to the store."""
        self.live.pop(name, None)
        self.dead.add(name)

    def freeze(self, name: str) -> Scheduler:
        """Like SIGSTOP; :meth:`thaw` is SIGCONT."""
        return self.live.pop(name)

    def thaw(self, name: str) -> None:
        self.live[name] = self.all[name]

    def terminate(self, name: str) -> None:
        """Like SIGTERM: a graceful stop that hands held runs over."""
        self.live.pop(name).stop(timeout=0)

    def runner_of(self, slot_id: str) -> Span:
        spans = [s for s in self.spans if s.slot_id == slot_id]
        return spans[-1]

    def kinds(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def slots(self, job: str) -> dict[str, list[Span]]:
        found: dict[str, list[Span]] = {}
        for span in self.spans:
            if span.job == job:
                found.setdefault(span.slot_id, []).append(span)
        return found
