"""A deterministic cluster: several schedulers, one memory store, one fake clock.

Instances are driven step by step: each step runs every live instance's
``run_pending`` and moves the fake clock to the earliest moment anything is
due. "Killing" an instance stops driving it (no hand-over, no heartbeats);
freezing stops driving it for a while, like SIGSTOP.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import math
import random
import sys
import threading
import time as _time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from anarchon_core import Event, FakeClock, Run, Scheduler, SkewedClock, StoreUnavailable
from anarchon_core.jobs import held_for
from anarchon_core.store import (
    Change,
    Claim,
    ClaimRequest,
    ControlStore,
    InstanceRecord,
    JobState,
    LeaseStore,
    RegistryStore,
    RunRecord,
    RunState,
    TakeoverRequest,
)
from anarchon_core.stores.memory import MemoryStore

START = 1_699_999_200.0  # a whole hour: slots of every= grids dividing an hour line up with it
#: Real seconds a simulated instance's thread may take before it sleeps on the fake clock
#: (a step that claims thousands of slots, in a test run at a low CPU priority on a busy
#: machine, takes many); longer is a hang, which the test's own time limit reports.
SETTLE = 300.0


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
    #: The handler did all its work (it was not stopped by a lost run or a kill).
    completed: bool = False


class Cluster:
    def __init__(self, *, store: MemoryStore | None = None, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock(START, settle_timeout=SETTLE)
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
            span.completed = not span.killed and span.end >= end - 1e-9

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


# ---------------------------------------------------------------------------
# Overload: a fleet that cannot keep up
# ---------------------------------------------------------------------------


class SlowStore(LeaseStore, RegistryStore):
    """One instance's view of the shared store on a starved machine: each call costs
    virtual time, by the round trip and by the items it carries, times ``slowness``.

    ``wait(seconds)`` lets that time pass for the caller while the other
    instances go on. Half of it passes before the store applies the call,
    half after.
    """

    def __init__(
        self, inner: MemoryStore, wait: Callable[[float], None], *, per_call: float,
        per_item: float, slowness: float = 1.0,
    ) -> None:  # fmt: skip
        super().__init__(namespace=inner.namespace)
        self.inner, self.wait = inner, wait
        self.per_call, self.per_item, self.slowness = per_call, per_item, slowness

    def _costly(self, items: int, step: Callable[[], Any]) -> Any:
        cost = (self.per_call + self.per_item * items) * self.slowness
        self.wait(cost / 2)
        result = step()
        self.wait(cost / 2)
        return result

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        return list(self._costly(len(requests), lambda: self.inner.claim_many(requests, owner)))

    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        return list(self._costly(len(requests), lambda: self.inner.takeover_many(requests, owner)))

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        return list(self._costly(len(changes), lambda: self.inner.change_many(changes)))

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(jobs)
        return dict(self._costly(len(names), lambda: self.inner.states(names)))

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        return self.inner.history(job, limit)

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        return list(self._costly(1, lambda: self.inner._announce(instance, info, ttl)))

    def withdraw(self, instance: str) -> None:
        self.inner.withdraw(instance)

    def instances(self) -> list[InstanceRecord]:
        return self.inner.instances()

    def jobs(self) -> list[str]:
        return self.inner.jobs()

    def namespaces(self) -> list[str]:
        return self.inner.namespaces()


#: How often an instance of :func:`overloaded` looks for work (virtual seconds), as a
#: handler's return wakes a real loop at once.
POLL = 0.02


def overloaded(
    *,
    jobs: int = 600,
    every: int = 10,
    lease: float = 3.0,
    seconds: float = 90.0,
    per_item: float = 0.004,
    slowness: Sequence[float] = (0.3, 1.0, 3.0),
    seed: int = 0,
) -> Cluster:
    """A fleet that cannot keep up: ``jobs`` due at once every ``every`` seconds, on
    instances whose store calls cost ``per_item`` virtual seconds per item (times each
    instance's ``slowness``): one batch of every job's claim takes longer than the lease.

    Each instance steps in a thread of its own on the fake clock, so that a
    call's cost holds up its caller alone, as a process of its own would.
    Handlers return at once or after up to two seconds. Returns the cluster
    run for ``seconds``; :func:`started_again` is its invariant.
    """
    cluster = Cluster()
    clock = cluster.clock
    rnd = random.Random(seed)
    durations = [rnd.choice([0.0, 0.0, rnd.uniform(0.1, 2.0)]) for _ in range(jobs)]
    running = threading.Event()
    running.set()

    def loop(scheduler: Scheduler) -> None:
        while running.is_set():
            delay = scheduler.run_pending()
            clock.sleep(min(max(delay, 0.001), POLL))

    for k, slow in enumerate(slowness):
        store = SlowStore(
            cluster.store, clock.sleep, per_call=0.005, per_item=per_item, slowness=slow
        )
        scheduler = Scheduler(
            store,
            instance=f"i{k}",
            clock=clock,
            seed=k + 1,
            listener=cluster.events.append,
            lease=lease,
        )
        for n, duration in enumerate(durations):
            scheduler.add_job(cluster.handler(duration), name=f"job{n:05d}", every=every)
        cluster.all[scheduler.instance] = scheduler
        clock.spawn(functools.partial(loop, scheduler), f"sim:{scheduler.instance}")
    clock.advance(seconds)
    running.clear()
    clock.advance(lease)  # the loops see they are to end
    return cluster


def started_again(cluster: Cluster) -> list[str]:
    """The slots whose handler did all its work and that were started again afterwards
    (whether the run was lost meanwhile or not: the work was done)."""
    again: list[str] = []
    for slot_id, spans in sorted(_by_slot(cluster.spans).items()):
        for done in spans:
            if not done.completed or done.end is None:
                continue
            if any(other is not done and other.start >= done.end for other in spans):
                again.append(slot_id)
                break
    return again


def _by_slot(spans: Iterable[Span]) -> dict[str, list[Span]]:
    found: dict[str, list[Span]] = {}
    for span in spans:
        found.setdefault(span.slot_id, []).append(span)
    return found


# ---------------------------------------------------------------------------
# The fault-injecting simulation
# ---------------------------------------------------------------------------
#
# Many instances share one memory store and one fake clock; each sees the store
# through a FaultyStore that injects the faults production stores have, and
# runs on its own clock (wall offset, rate drift within the stated bound).
# A seeded timeline of kills, freezes, graceful stops, rolling restarts with
# other options, partitions, error episodes and broker outages is played;
# after every step the invariants are checked. Everything random comes from
# the seed, so a failing seed replays the same run.

try:  # the engine's own (absent from engines that predate them)
    from anarchon_core.store import HELD_STATES
except ImportError:  # pragma: no cover - only when replaying on an older engine
    HELD_STATES = (RunState.RUNNING,)  # type: ignore[assignment]

try:
    from anarchon_core.slots import LANES, record_job
except ImportError:  # pragma: no cover - only when replaying on an older engine
    LANES = 16

    def record_job(record: str) -> str:
        return record.split("\x1f", 1)[0]


try:
    from anarchon_core import DispatchFailed
except ImportError:  # pragma: no cover - only when replaying on an older engine

    class DispatchFailed(Exception):  # type: ignore[no-redef]
        pass


try:
    from anarchon_core import Cancelled
except ImportError:  # pragma: no cover - only when replaying on an older engine

    class Cancelled(Exception):  # type: ignore[no-redef]
        pass


#: The backups' watch interval in the simulation (the default).
WATCH = 0.5
#: How many of the longest lease a slot waiting may stay behind a run that ended, with an
#: instance healthy all along, before (g) calls its queue stuck.
STUCK = 3
#: The clock-rate bound the engine documents (two clocks differ by at most 2 %).
RATE_SPREAD = 0.01
#: Timeline events: SIGKILL, SIGSTOP/SIGCONT, SIGTERM (each followed by a restart),
#: an instance's link flaky (some calls refused, answered with errors, slow, or
#: with their reply lost after the write), a blackhole partition, connections
#: refused, a server answering every write with an error, the broker down.
TIMELINE = ("kill", "freeze", "terminate", "flaky", "partition", "refused", "errors", "broker")
#: Faults of single calls on a flaky link; each is on when the fault before "_" is.
CALL_FAULTS = ("refused", "errors", "lost_reply", "slow", "slow_lost")
#: Every fault the simulation knows; "drift" gives instances clock offsets and rate
#: drift within the bound, "deploy" restarts instances with another lease,
#: "handoff" makes some jobs dispatch their work to simulated workers, "lost" and
#: "slow" are the call faults of a flaky link.
FAULTS = (*TIMELINE, "lost", "slow", "drift", "deploy", "handoff")


class ServerError(Exception):
    """A store server answering with an error (Redis NOREPLICAS/MISCONF, a read-only PostgreSQL)."""


class DriftClock:
    """A monotonic clock running at ``rate`` times the base clock; a wall clock ``offset`` off.

    The wall clock keeps its offset (NTP disciplines it); the monotonic clock,
    which leases are measured with, drifts.
    """

    def __init__(self, base: FakeClock, rate: float, offset: float) -> None:
        self._base = base
        self.rate = rate
        self.offset = offset
        self._mono0 = base.monotonic()

    def _elapsed(self) -> float:
        return (self._base.monotonic() - self._mono0) * self.rate

    def time(self) -> float:
        return self._base.time() + self.offset

    def monotonic(self) -> float:
        return 1000.0 + self._elapsed()

    def sleep(self, seconds: float) -> None:
        self._base.sleep(seconds / self.rate)

    def wait(self, event: Any, timeout: float) -> bool:
        return self._base.wait(event, timeout / self.rate)

    def spawn(self, target: Callable[[], None], name: str) -> Any:
        return self._base.spawn(target, name)


@dataclass
class Condition:
    """What an instance's link to the store does from ``start`` to ``end`` (base seconds)."""

    kind: str  # "flaky", "partition" (blackhole), "refused", "errors"
    start: float
    end: float
    rate: float = 0.3  # flaky: the share of calls that fail


class FaultyStore(LeaseStore, RegistryStore):
    """One instance's view of the shared store, with the faults of its condition."""

    def __init__(self, inner: MemoryStore, sim: Chaos, inc: Incarnation) -> None:
        super().__init__(namespace=inner.namespace)
        self.inner, self.sim, self.inc = inner, sim, inc

    def _call(self, step: Callable[[], Any]) -> Any:
        sim, inc = self.sim, self.inc
        sim.calls += 1
        sim.blocked_for = 0.0
        condition = sim.condition_of(inc)
        if condition is None:
            return step()
        rnd = sim.rnd
        sim.blocked_for = 0.0
        if condition.kind == "partition":  # the link goes silent: the call times out
            sim.block(inc, sim.call_timeout)
            sim.faults += 1
            raise StoreUnavailable("timed out (partition)")
        if condition.kind == "refused":
            sim.faults += 1
            raise StoreUnavailable("connection refused")
        if condition.kind == "errors":
            sim.faults += 1
            raise ServerError("NOREPLICAS Not enough good replicas to write.")
        if rnd.random() >= condition.rate:
            return step()
        sim.faults += 1
        faults = [f for f in CALL_FAULTS if f.partition("_")[0] in sim.faults_on]
        if not faults:
            return step()
        fault = rnd.choice(faults)
        if fault == "refused":
            raise StoreUnavailable("connection reset")
        if fault == "errors":
            raise ServerError("READONLY You can't write against a read only replica.")
        sim.blocked_for = 0.0
        if fault.startswith("slow"):
            sim.blocked_for = rnd.uniform(0.2, 1.5) * sim.max_lease
            sim.block(inc, sim.blocked_for)
        result = step()
        if fault in ("lost_reply", "slow_lost"):
            raise StoreUnavailable("connection lost after the request was sent")
        return result

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        def step() -> list[Claim]:
            before = self.inner.states([r.job for r in requests])
            now = self.sim.clock.time()
            claims = self.inner.claim_many(requests, owner)
            for request, claim in zip(requests, claims, strict=True):
                old = before.get(request.job)
                superseded = (
                    claim.won
                    and old is not None
                    and old.slot_ms < request.slot_ms
                    and old.state in HELD_STATES
                )
                if superseded and old is not None:  # its lease lapsed this long ago
                    self.sim.superseded[_slot_id(old.job, old.slot_ms)] = (
                        -old.lease_remaining,
                        self.sim.blocked_for,
                    )
                if claim.won:  # applied on the server, whatever the reply's fate
                    self.sim.claimed.setdefault(_slot_id(request.job, request.slot_ms), now)
                    if old is not None and old.state is RunState.RELEASED:
                        self.sim.released.add(_slot_id(old.job, old.slot_ms))
            return claims

        claims: list[Claim] = self._call(step)
        for claim in claims:
            if claim.won and claim.holder is not None:
                self.sim.token_won(claim.holder)
        return claims

    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        claims: list[Claim] = self._call(lambda: self.inner.takeover_many(requests, owner))
        for claim in claims:
            if claim.won and claim.holder is not None:
                self.sim.token_won(claim.holder)
        return claims

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        # One call, as on a server: a fault hits the whole batch (a lost reply
        # after every change was applied).
        return list(self._call(lambda: self.inner.change_many(changes)))

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(jobs)
        return dict(self._call(lambda: self.inner.states(names)))

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        return self.inner.history(job, limit)

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        return list(self._call(lambda: self.inner._announce(instance, info, ttl)))

    def withdraw(self, instance: str) -> None:
        self._call(lambda: self.inner.withdraw(instance))

    def instances(self) -> list[InstanceRecord]:
        return self.inner.instances()

    def jobs(self) -> list[str]:
        return self.inner.jobs()

    def namespaces(self) -> list[str]:
        return self.inner.namespaces()


class ControlledFaultyStore(FaultyStore, ControlStore):
    """A :class:`FaultyStore` that keeps control entries too (``overlap="cancel_other"``
    asks the instance running a slot to stop through them), with the same faults."""

    def _set_pause(self, key: str, on: bool) -> bool:
        return bool(self._call(lambda: self.inner._set_pause(key, on)))

    def _pause_marks(self) -> set[str]:
        return set(self._call(self.inner._pause_marks))

    def _controls(self, prefixes: tuple[str, ...]) -> dict[str, tuple[int, str]]:
        return dict(self._call(lambda: self.inner._controls(prefixes)))

    def _set_control(self, key: str, value: str | None, expected: int) -> int:
        return int(self._call(lambda: self.inner._set_control(key, value, expected)))


@dataclass
class Incarnation:
    """One process of an instance: killed or stopped, it is replaced by a new one."""

    name: str
    gen: int
    lease: float
    clock: DriftClock
    scheduler: Scheduler | None = None
    state: str = "live"  # live, frozen, dead (killed), stopped (SIGTERM)
    started: float = 0.0
    #: Base times during which it was live and its link had no fault.
    healthy: list[tuple[float, float]] = field(default_factory=list)
    healthy_since: float | None = None
    #: When it was killed or stopped (base seconds); None while it lives (or is frozen).
    gone_at: float | None = None


@dataclass
class Belief:
    """One attempt of one slot that may believe it holds the slot: a handler or an executor."""

    job: str
    slot_id: str
    attempt: int
    token: int
    holder: str
    start: float
    run: Run | None = None  # a handler's run: it believes while not run.lost
    inc: Incarnation | None = None
    ended: float | None = None
    completed: bool = False
    #: An executor's own deadline (base seconds), by the same lease rule as a runner.
    deadline: float = math.inf
    #: The store's record the attempt's token belongs to: the job's own, or its lane's
    #: (``overlap="allow_all"``, whose lanes count their tokens each on its own).
    key: str = ""

    def __post_init__(self) -> None:
        self.key = self.key or self.job

    @property
    def claim(self) -> tuple[str, int]:
        """The claim (or takeover) the attempt holds: its record and token."""
        return self.key, self.token


@dataclass
class Message:
    """A dispatched slot's message, and what becomes of it."""

    job: str
    slot_id: str
    attempt: int
    token: int
    lease: float
    fate: str  # "runs", "dies", "lost", "untracked"
    pick_at: float
    duration: float
    belief: Belief | None = None
    next_renew: float = 0.0
    done_at: float = 0.0
    #: The store's record of the slot's run (its job's, or its lane's: ``run.key``).
    key: str = ""

    def __post_init__(self) -> None:
        self.key = self.key or self.job


@dataclass
class Plan:
    """One job of the simulated fleet."""

    name: str
    every: int
    duration: float
    handoff: bool


class Violation(AssertionError):
    pass


class Killed(BaseException):
    """Raised in an instance's step when it was killed while one of its calls blocked."""


class Chaos:
    """A seeded run of a fleet under faults; :meth:`run` raises :class:`Violation`."""

    def __init__(
        self,
        seed: int,
        *,
        instances: int = 3,
        seconds: float = 300.0,
        faults: Iterable[str] = FAULTS,
        overlap: str | None = None,
        lookahead: float = 0.0,
    ) -> None:
        self.seed = seed
        #: Every job's overlap policy (None: the default, ``skip``).
        self.overlap = overlap
        #: Every instance's ``lookahead``: claims sent ahead of the slot's time.
        self.lookahead = lookahead
        #: Handlers begun before their slot's time by their instance's clock (j).
        self.early: list[str] = []
        self.faults_on = frozenset(faults)
        unknown = self.faults_on - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
        self.rnd = random.Random(seed)
        self.seconds = seconds
        self.clock = FakeClock(START, settle_timeout=SETTLE)
        self.store = MemoryStore(clock=self.clock)
        self.instances = instances
        self.incarnations: list[Incarnation] = []
        self.blocked: list[Incarnation] = []
        self.conditions: dict[int, list[Condition]] = {}
        self.broker_down: list[tuple[float, float]] = []
        self.beliefs: list[Belief] = []
        self.messages: list[Message] = []
        self.events: list[Event] = []
        self.timeline: list[tuple[float, str, str]] = []
        #: The timeline as played, for the replay of a failing seed.
        self.log: list[str] = []
        self.tokens: dict[str, int] = {}
        #: Slots whose lapsed run a newer slot's claim superseded: (lapsed for, call blocked for).
        self.superseded: dict[str, tuple[float, float]] = {}
        #: When each slot was first won by a claim (its attempt 1), by slot id.
        self.claimed: dict[str, float] = {}
        #: Slots handed over (released) and superseded by a newer slot before a takeover.
        self.released: set[str] = set()
        #: Slots that waited for the job's previous run (the overlap policy): when one was
        #: first seen waiting on an instance, and the incarnations alive then.
        self.buffered: dict[str, tuple[float, list[Incarnation]]] = {}
        #: The instances each of those slots waited on.
        self.waited_on: dict[str, set[str]] = {}
        #: Slots whose run was asked to stop (``cancel_other``).
        self.cancelled: set[str] = set()
        #: When each slot skipped as an overlap was first reported so (base seconds).
        self.skipped_at: dict[str, float] = {}
        #: The most slots of each job whose handlers were seen running at once, on any
        #: instances (``allow_all`` runs them side by side, the other policies one by one).
        self.together: dict[str, int] = {}
        #: How long the store call under way was held up (a slow call).
        self.blocked_for = 0.0
        self.calls = self.faults = self.steps = 0
        self.call_timeout = self.rnd.choice([1.0, 3.0, 8.0])
        self.driver = threading.get_ident()
        leases = [2.0, 3.0, 5.0]
        self.leases = self.rnd.sample(leases, 2)
        self.max_lease = max(self.leases)
        # Some runs outlast their interval: the next slot comes while they hold it. With
        # allow_all, most do, some by two intervals: several runs of a job go on at once.
        longest = 2.5 if overlap == "allow_all" else 1.3
        self.jobs = [
            Plan(f"job{i}", every, self.rnd.uniform(0.1, longest) * every, self.rnd.random() < 0.3)
            for i, every in enumerate(self.rnd.choices([10, 15, 20, 30], k=3))
        ]
        self._plan_timeline()

    # -- the timeline ------------------------------------------------------

    def _plan_timeline(self) -> None:
        rnd, end = self.rnd, START + self.seconds
        for k in range(self.instances):
            self.timeline.append((START, "start", f"i{k}"))
        t = START + rnd.uniform(5, 20)
        kinds = [k for k in TIMELINE if k in self.faults_on]
        while kinds and t < end - 30:
            kind = rnd.choice(kinds)
            self.timeline.append((t, kind, f"i{rnd.randrange(self.instances)}"))
            t += rnd.expovariate(1 / 12)
        self.timeline.sort()

    def _play(self, now: float) -> None:
        while self.timeline and self.timeline[0][0] <= now:
            at, kind, name = self.timeline.pop(0)
            self.log.append(f"{at - START:8.3f} {kind} {name}")
            current = self._current(name)
            if kind == "start":
                self._start(name, self.leases[0])
            elif kind == "broker":
                self.broker_down.append((now, now + self.rnd.uniform(1, 8)))
            elif current is None:
                continue
            elif kind in ("flaky", "partition", "refused", "errors"):
                length = self.rnd.uniform(1, 3 * self.max_lease)
                cond = Condition(kind, now, now + length, rate=self.rnd.uniform(0.05, 0.5))
                self.conditions.setdefault(id(current), []).append(cond)
                self._health(current, now)
            elif kind == "freeze" and current.state == "live":
                current.state = "frozen"
                self._health(current, now)
                self.timeline.append((now + self.rnd.uniform(1, 3 * self.max_lease), "thaw", name))
                self.timeline.sort()
            elif kind == "thaw" and current.state == "frozen":
                current.state = "live"
                self._health(current, now)
            elif kind in ("kill", "terminate") and current.state == "live":
                current.gone_at = now
                if kind == "kill":
                    current.state = "dead"
                else:
                    current.state = "stopped"
                    assert current.scheduler is not None
                    self._guard(current, lambda: current.scheduler.stop(timeout=0))  # type: ignore[union-attr]
                self._health(current, now)
                # A restart, with the other lease in a rolling deploy that changes it.
                restart = now + self.rnd.uniform(0.5, 5)
                self.timeline.append((restart, "restart", name))
                self.timeline.sort()
            elif kind == "restart" and current.state in ("dead", "stopped"):
                deploy = "deploy" in self.faults_on
                self._start(name, self.rnd.choice(self.leases) if deploy else current.lease)

    def _current(self, name: str) -> Incarnation | None:
        found = [inc for inc in self.incarnations if inc.name == name]
        return found[-1] if found else None

    def _start(self, name: str, lease: float) -> None:
        now = self.clock.time()
        drift = "drift" in self.faults_on
        rate = 1 + self.rnd.uniform(-RATE_SPREAD, RATE_SPREAD) if drift else 1.0
        clock = DriftClock(self.clock, rate, self.rnd.uniform(-0.3, 0.3) if drift else 0.0)
        inc = Incarnation(name, len(self.incarnations), lease, clock, started=now)
        faulty = ControlledFaultyStore if self.overlap == "cancel_other" else FaultyStore
        store = faulty(self.store, self, inc)
        rules = {} if self.overlap is None else {"overlap": self.overlap}
        scheduler = Scheduler(
            store,
            instance=name,  # a restarted process may reuse its name
            clock=clock,
            seed=self.rnd.getrandbits(32),
            listener=self._heard,
            lease=lease,
            lookahead=self.lookahead,
        )
        for plan in self.jobs:
            handoff = plan.handoff and "handoff" in self.faults_on
            handler = self._dispatcher(plan, inc) if handoff else self._handler(plan, inc)
            scheduler.add_job(handler, name=plan.name, every=plan.every, **rules)  # type: ignore[arg-type]
        inc.scheduler = scheduler
        self.incarnations.append(inc)
        self._health(inc, now)

    def _heard(self, event: Event) -> None:
        self.events.append(event)
        if event.kind == "overlap" and event.slot_id is not None:
            self.skipped_at.setdefault(event.slot_id, self.clock.time())

    # -- handlers and executors ---------------------------------------------

    def _began(self, run: Run, inc: Incarnation) -> None:
        """(j) no handler begins before its slot's time, by its instance's clock (a slot
        won ahead, ``lookahead``, waits for it)."""
        if inc.clock.time() < run.slot.timestamp() - 1e-6:
            self.early.append(
                f"(j) {run.slot_id} attempt {run.attempt} began on {inc.name}"
                f" {run.slot.timestamp() - inc.clock.time():.3f}s before its time"
            )

    def _handler(self, plan: Plan, inc: Incarnation) -> Callable[[Run], None]:
        def work(run: Run) -> None:
            self._began(run, inc)
            belief = Belief(
                run.job,
                run.slot_id,
                run.attempt,
                run.token,
                inc.name,
                self.clock.time(),
                run,
                inc,
                key=run.key,
            )
            self.beliefs.append(belief)
            end = belief.start + plan.duration
            try:
                while self.clock.time() < end - 1e-9 and inc.state != "dead":
                    # As a handler should: LeaseLost once the run is lost, Cancelled once
                    # a newer slot waits for it (overlap="cancel_other").
                    run.check()
                    self.clock.sleep(min(0.5, end - self.clock.time()))
                belief.completed = inc.state != "dead"
            except Cancelled:
                self.cancelled.add(run.slot_id)
                raise
            finally:
                belief.ended = self.clock.time()

        return work

    def _dispatcher(self, plan: Plan, inc: Incarnation) -> Callable[[Run], None]:
        def dispatch(run: Run) -> None:
            self._began(run, inc)
            now = self.clock.time()
            pickup = inc.lease * 4
            run.hand_off(pickup)
            if any(a <= now < b for a, b in self.broker_down):  # the send fails
                raise DispatchFailed("broker unreachable")
            fate = self.rnd.choices(["runs", "dies", "lost", "untracked"], [6, 2, 1, 1])[0]
            delay = self.rnd.uniform(0, pickup * 0.8)
            self.messages.append(
                Message(
                    run.job,
                    run.slot_id,
                    run.attempt,
                    run.token,
                    inc.lease,
                    fate,
                    now + delay,
                    plan.duration,
                    key=run.key,
                )
            )

        return dispatch

    def _worker_belief(self, msg: Message, now: float, *, deadline: float) -> Belief:
        """A worker starting on ``msg`` at ``now``: recorded as its belief, until ``deadline``."""
        msg.belief = Belief(
            msg.job, msg.slot_id, msg.attempt, msg.token, "worker", now, deadline=deadline,
            key=msg.key,
        )  # fmt: skip
        self.beliefs.append(msg.belief)
        return msg.belief

    def _executors(self, now: float) -> None:
        """Workers taking, renewing and finishing dispatched slots (their link never fails)."""
        for msg in self.messages:
            belief = msg.belief
            if belief is None and msg.fate != "lost" and msg.pick_at <= now:
                if msg.fate == "untracked":  # runs without taking the lease (an older worker)
                    untracked = self._worker_belief(msg, now, deadline=now + msg.duration)
                    untracked.ended = now + msg.duration
                    msg.fate = "gone"
                    continue
                if not self.store.renew(msg.key, msg.token, msg.lease):
                    msg.fate = "gone"  # a later attempt was sent: skipped
                    continue
                self._worker_belief(msg, now, deadline=now + held_for(msg.lease))
                msg.next_renew = now + msg.lease / 3
                msg.done_at = now + (msg.duration if msg.fate == "runs" else msg.duration / 2)
            elif belief is not None and belief.ended is None:
                if now >= msg.done_at:
                    belief.ended = now
                    if msg.fate == "runs" and now < belief.deadline:
                        belief.completed = self.store.finish(msg.key, msg.token, RunState.DONE)
                elif now >= belief.deadline:
                    belief.ended = belief.deadline
                elif now >= msg.next_renew:
                    sent = now
                    if self.store.renew(msg.key, msg.token, msg.lease):
                        belief.deadline = sent + held_for(msg.lease)
                        msg.next_renew = now + msg.lease / 3
                    else:
                        belief.ended = now

    # -- driving ---------------------------------------------------------------

    def condition_of(self, inc: Incarnation) -> Condition | None:
        now = self.clock.time()
        for cond in self.conditions.get(id(inc), ()):
            if cond.start <= now < cond.end:
                return cond
        return None

    def _health(self, inc: Incarnation, now: float) -> None:
        healthy = inc.state == "live" and self.condition_of(inc) is None and inc not in self.blocked
        if healthy and inc.healthy_since is None:
            inc.healthy_since = now
        elif not healthy and inc.healthy_since is not None:
            inc.healthy.append((inc.healthy_since, now))
            inc.healthy_since = None

    def block(self, inc: Incarnation, seconds: float) -> None:
        """``inc``'s store call takes ``seconds``: the others go on meanwhile."""
        if threading.get_ident() != self.driver:
            self.clock.sleep(seconds)  # a handler's call (a hand-off): its thread sleeps
            return
        if len(self.blocked) >= 2:
            self.clock.advance(0)  # too deep: the call returns at once
            return
        self.blocked.append(inc)
        self._health(inc, self.clock.time())
        try:
            self._drive(self.clock.time() + seconds)
        finally:
            self.blocked.remove(inc)
            self._health(inc, self.clock.time())
        if inc.state == "dead":
            raise Killed  # SIGKILL while the call was in flight: the process goes no further

    def _guard(self, inc: Incarnation, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except Killed:
            return 0.0
        except Violation:
            raise
        except Exception as exc:
            raise Violation(
                f"(d) the step of {inc.name}#{inc.gen} raised {type(exc).__name__}: {exc}"
            ) from exc

    def _drive(self, until: float) -> None:
        while self.clock.time() < until - 1e-9:
            now = self.clock.time()
            self._play(now)
            for inc in self.incarnations:
                self._health(inc, now)
            delays: list[float] = [until - now]
            for inc in list(self.incarnations):
                if inc.state != "live" or inc in self.blocked or inc.scheduler is None:
                    continue
                self.steps += 1
                scheduler = inc.scheduler
                delay = self._guard(inc, scheduler.run_pending)
                delays.append(delay / inc.clock.rate)
                now = self.clock.time()
            self.clock.settle()
            self._executors(self.clock.time())
            self._check(self.clock.time())
            if self.overlap is not None:
                self._note_waiting(self.clock.time())
            wake = self.clock.next_deadline()
            if wake is not None:
                delays.append(wake - self.clock.monotonic())
            if self.timeline:
                delays.append(self.timeline[0][0] - self.clock.time())
            for msg in self.messages:
                if msg.belief is None and msg.fate in ("runs", "dies", "untracked"):
                    delays.append(msg.pick_at - self.clock.time())
                elif msg.belief is not None and msg.belief.ended is None:
                    delays.append(min(msg.next_renew, msg.done_at, msg.belief.deadline) - now)
            step = min(delays)
            self.clock.advance(max(step, 0.001))

    def run(self) -> None:
        try:
            self._drive(START + self.seconds)
            for inc in self.incarnations:
                self._health(inc, START + self.seconds)
                if inc.healthy_since is not None:
                    inc.healthy.append((inc.healthy_since, START + self.seconds))
            self._check_liveness()
            if self.overlap is not None:
                self._check_overlap()
        except Violation as exc:
            replay = "\n".join(self.log[-40:])
            raise Violation(
                f"seed {self.seed}: {exc}\nreplay: {self.replay_command()}\n"
                f"the last events of the timeline:\n{replay}"
            ) from None
        finally:
            for inc in self.incarnations:
                inc.state = "dead"
            self.clock.advance(60)  # let the handler threads see they are dead

    def replay_command(self) -> str:
        """The command that plays this very run again."""
        command = f"python -m tests.sim --seed {self.seed} --seconds {self.seconds:g}"
        if self.instances != 3:
            command += f" --instances {self.instances}"
        if self.faults_on != frozenset(FAULTS):
            command += f" --faults {','.join(sorted(self.faults_on))}"
        if self.overlap is not None:
            command += f" --overlap {self.overlap}"
        if self.lookahead:
            command += f" --lookahead {self.lookahead:g}"
        return command

    # -- the invariants ----------------------------------------------------------

    def token_won(self, holder: JobState) -> None:
        """(b) tokens strictly rise per job."""
        last = self.tokens.get(holder.job, 0)
        if holder.token <= last:
            raise Violation(f"(b) token {holder.token} of {holder.job} after {last}")
        self.tokens[holder.job] = holder.token

    def _believes(self, belief: Belief, now: float) -> bool:
        if belief.ended is not None and belief.ended <= now:
            return False
        if belief.run is not None:
            assert belief.inc is not None
            return belief.inc.state != "dead" and not belief.run.lost
        return now < belief.deadline

    def _check(self, now: float) -> None:
        """(a) never two attempts of one slot believing they hold it at one instant, and
        never two slots of one record run at once by one instance: of one job, or, with
        ``allow_all`` (whose slots run side by side), of one lane of it. And (j)."""
        if self.early:
            raise Violation(self.early[0])
        holding: dict[str, Belief] = {}
        per_instance: dict[tuple[int, str], Belief] = {}
        running: dict[str, set[str]] = {}
        for belief in self.beliefs:
            if not self._believes(belief, now):
                continue
            if belief.run is not None:
                running.setdefault(belief.job, set()).add(belief.slot_id)
            other = holding.get(belief.slot_id)
            if other is not None and other.claim != belief.claim:
                raise Violation(
                    f"(a) at {now - START:.3f}: {belief.slot_id} attempt {other.attempt} on"
                    f" {other.holder} and attempt {belief.attempt} on {belief.holder}"
                    " both believe they hold it"
                )
            holding[belief.slot_id] = belief
            if belief.inc is not None:
                key = (belief.inc.gen, belief.key)
                mine = per_instance.get(key)
                if mine is not None:
                    of = "one job" if belief.key == belief.job else "one lane of its job"
                    raise Violation(
                        f"(a) at {now - START:.3f}: {belief.holder} runs {mine.slot_id} and"
                        f" {belief.slot_id} of {of}, neither told it lost"
                    )
                per_instance[key] = belief
        for job, slots in running.items():
            self.together[job] = max(self.together.get(job, 0), len(slots))

    def _check_liveness(self) -> None:
        """(c) every slot due while an instance was healthy through its window ran.

        Plain jobs: a handler ran it to its end. Dispatching jobs: it was
        dispatched, if the broker was up for three seconds running within the
        window (the longest back-off between two attempts, 2 s, plus a watch
        interval). Exempt: slots skipped as overlaps (a documented rule).
        """
        end = START + self.seconds
        exempt = {e.slot_id for e in self.events if e.kind == "overlap"}
        # Slots that waited for the run before them start late, however late: (g) checks
        # them. Runs asked to stop (cancel_other) end early by design, and one that lapsed
        # or was handed over is superseded by the slot waiting, not taken over.
        exempt |= set(self.buffered) | self.cancelled
        if self.overlap == "cancel_other":
            exempt |= set(self.superseded) | self.released
        # Superseded in the instant between a backup's look and the claim (a documented
        # race: the lease ended within a watch interval, plus the claim's own delay).
        exempt |= {
            slot
            for slot, (lapsed_for, blocked) in self.superseded.items()
            if lapsed_for <= WATCH + blocked + 0.05
        }
        dispatched = {e.slot_id for e in self.events if e.kind == "dispatched"}
        attempts = _by_slot_id(self.beliefs)
        for plan in self.jobs:
            handoff = plan.handoff and "handoff" in self.faults_on
            t = START + plan.every
            while t + plan.every + 2 * self.max_lease + plan.duration < end:
                slot = f"{plan.name}@{int(t * 1000)}"
                window = (t - plan.every, t + plan.every + 2 * self.max_lease + plan.duration)
                covered = any(
                    a <= window[0] and window[1] <= b
                    for inc in self.incarnations
                    for a, b in inc.healthy
                )
                if handoff:
                    covered = covered and self._broker_up(t, t + plan.every - 1, 3.0)
                    ran = slot in dispatched
                else:
                    ran = self._ran(attempts.get(slot, []), window[1])
                if covered and not ran and slot not in exempt:
                    raise Violation(f"(c) {slot} never ran, though an instance was healthy")
                t += plan.every

    def _note_waiting(self, now: float) -> None:
        """Note the slots waiting on the live instances (their overlap policy), when first seen."""
        alive = [inc for inc in self.incarnations if inc.state in ("live", "frozen")]
        for inc in alive:
            if inc.scheduler is None:
                continue
            for plan in self.jobs:
                rt = inc.scheduler._table.get(plan.name)
                for slot in rt.waiting if rt is not None else ():
                    if slot.id not in self.buffered:
                        self.buffered[slot.id] = (now, alive)
                    self.waited_on.setdefault(slot.id, set()).add(inc.name)

    def _check_overlap(self) -> None:
        """The overlap policies' invariants.

        (e) a slot is won by a claim once (its attempt 1 starts once), and (f) the
        attempts 1 of a job's slots start in the order of their slots; (g) every slot
        that waited for the run before it was won once that run ended: none is lost to
        the crash of an instance it waited on, none stays stuck behind a run that
        ended; (h) the instances decide alike: no slot waits on one instance and is
        skipped as an overlap by another that never queues it (an instance may skip a
        slot that came within the clocks' difference of the start of the run before
        it, and queue it once it hears of that run).

        Exempt from (g): a slot still waiting when the simulation ends behind a
        run that holds the lease or ended moments ago (or with no instance healthy
        since), and a slot whose every instance alive when it came was killed or
        stopped before it started (the instances started since work it out from the
        record, as catch-up does: once every instance that saw it come was gone, a
        run that ended meanwhile leaves nothing waiting).
        """
        firsts: dict[str, list[Belief]] = {}
        for belief in self.beliefs:
            if belief.attempt == 1 and belief.holder != "worker":
                firsts.setdefault(belief.slot_id, []).append(belief)
        for slot, beliefs in firsts.items():
            won = {b.claim for b in beliefs}
            if len(won) > 1:
                raise Violation(f"(e) {slot} was won by a claim {len(won)} times")
        per_job: dict[str, list[Belief]] = {}
        for beliefs in firsts.values():
            per_job.setdefault(beliefs[0].job, []).append(beliefs[0])
        for job, starts in per_job.items():
            starts.sort(key=lambda b: (b.start, b.token))
            for before, after in itertools.pairwise(starts):
                if _ms(after.slot_id) < _ms(before.slot_id):
                    raise Violation(
                        f"(f) {after.slot_id} of {job} started after the newer {before.slot_id}"
                    )
        end = START + self.seconds
        records = self.store.states([plan.name for plan in self.jobs])
        for slot, (seen, alive) in sorted(self.buffered.items()):
            if slot in self.claimed:
                continue
            job = slot.rpartition("@")[0]
            record = records.get(job)
            if all(inc.gone_at is not None and inc.gone_at > seen for inc in alive):
                continue  # every instance that saw it come went before its turn
            if record is None or record.slot_ms >= _ms(slot):
                raise Violation(f"(g) {slot} waited (from {seen - START:.3f}) and never started")
            ended = end + record.lease_remaining
            stuck = STUCK * self.max_lease
            if not record.held and end - ended > stuck and self._healthy(ended, ended + stuck):
                raise Violation(
                    f"(g) {slot} waits (from {seen - START:.3f}) behind {job}@{record.slot_ms},"
                    f" whose run ended at {ended - START:.3f}"
                )
        for event in self.events:
            queued = self.waited_on.get(event.slot_id or "", set())
            if event.kind == "overlap" and queued and event.instance not in queued:
                raise Violation(
                    f"(h) {event.slot_id} waited on {', '.join(sorted(queued))},"
                    f" {event.instance} skipped it"
                )
        if self.overlap == "allow_all":
            self._check_lanes()

    def _check_lanes(self) -> None:
        """(i) ``allow_all``: a slot is skipped as an overlap only while its lane still holds
        the run of an older slot (on the grids of the simulation, the slot ``LANES``
        intervals before it): the runs of other slots going on never hold it back.

        The lane is worked out here from the documented rule (the slot's time in whole
        intervals, modulo ``LANES``), not from the engine's. The older slot's lane is
        held from its claim until its last attempt ended, plus the time a crashed run's
        lease takes to lapse and a dispatched message to be given up (the simulation
        keeps no record of either, so the longest of them is allowed for).
        """
        every = {plan.name: plan.every * 1000 for plan in self.jobs}
        held_after = 6 * self.max_lease + WATCH
        ends: dict[str, float] = {}
        for belief in self.beliefs:
            end = math.inf if belief.ended is None else belief.ended
            ends[belief.slot_id] = max(ends.get(belief.slot_id, -math.inf), end)
        for slot, at in sorted(self.skipped_at.items()):
            job, ms = slot.rpartition("@")[0], _ms(slot)
            interval = every[job]
            lane = (ms // interval) % LANES
            busy = [
                older
                for older, won in self.claimed.items()
                if older.rpartition("@")[0] == job
                and _ms(older) < ms
                and (_ms(older) // interval) % LANES == lane
                and won <= at
                and max(won, ends.get(older, -math.inf)) + held_after >= at
            ]
            if not busy:
                raise Violation(
                    f"(i) {slot} was skipped as an overlap at {at - START:.3f}, though no run"
                    f" of an older slot held its lane ({lane})"
                )

    def _healthy(self, start: float, end: float) -> bool:
        """Whether an instance was live, with a link without fault, from ``start`` to ``end``."""
        return any(a <= start and end <= b for inc in self.incarnations for a, b in inc.healthy)

    def _ran(self, attempts: list[Belief], latest_start: float) -> bool:
        """Whether a slot ran: one of its ``attempts`` did all its work, or the slot began
        within its window (its first attempt began by ``latest_start``) and an attempt of
        it still runs, unhurt, at the end.

        Each takeover begins the handler anew: a slot whose runners were
        interrupted twice or more (each by a fault of its own) may still be
        running when the simulation ends, its last takeover begun after its
        window (handlers longer than the interval, as with ``allow_all``, are
        interrupted more often), which is no miss.
        """
        if any(b.completed for b in attempts):
            return True
        end = START + self.seconds
        began = min((b.start for b in attempts), default=math.inf)
        return began <= latest_start and any(
            b.ended is None and self._believes(b, end) for b in attempts
        )

    def _broker_up(self, start: float, end: float, length: float) -> bool:
        """Whether the broker was up ``length`` seconds running between ``start`` and ``end``."""
        t = start
        for a, b in sorted(self.broker_down):
            if b <= t:
                continue
            if a - t >= length:
                return True
            t = max(t, b)
            if t >= end:
                return False
        return end - t >= length


def _ms(slot_id: str) -> int:
    return int(slot_id.rpartition("@")[2])


def _by_slot_id(beliefs: Iterable[Belief]) -> dict[str, list[Belief]]:
    """The attempts of each slot, by slot id."""
    found: dict[str, list[Belief]] = {}
    for belief in beliefs:
        found.setdefault(belief.slot_id, []).append(belief)
    return found


def _slot_id(record: str, slot_ms: int) -> str:
    """The id of the slot ``slot_ms`` claimed in ``record`` (a job's, or one of its
    lanes' with ``overlap="allow_all"``), as handlers and events name it."""
    return f"{record_job(record)}@{slot_ms}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.sim --seed N`` replays one seed; ``--seeds A:B`` soaks a range."""
    parser = argparse.ArgumentParser(prog="python -m tests.sim")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--seeds", default="0:20", help="a range A:B of seeds")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--faults", default=",".join(FAULTS), help="the faults on, comma-separated")
    parser.add_argument(
        "--overlap",
        help="every job's overlap policy: buffer_one, buffer_all, cancel_other or allow_all"
        " (default: skip)",
    )
    parser.add_argument(
        "--lookahead", type=float, default=0.0, help="every instance's lookahead (seconds)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    seeds = [args.seed] if args.seed is not None else range(*map(int, args.seeds.split(":")))
    steps = calls = faults = failed = 0
    began = _time.monotonic()
    for seed in seeds:
        chaos = Chaos(
            seed,
            instances=args.instances,
            seconds=args.seconds,
            faults=args.faults.split(","),
            overlap=args.overlap,
            lookahead=args.lookahead,
        )
        try:
            chaos.run()
        except Violation as exc:
            failed += 1
            print(exc, file=sys.stderr)
        steps, calls, faults = steps + chaos.steps, calls + chaos.calls, faults + chaos.faults
    print(
        f"{len(seeds)} seeds, {failed} failed: {steps} instance-steps, {calls} store calls,"
        f" {faults} faults injected, {args.seconds * args.instances * len(seeds) / 3600:.1f}"
        f" simulated instance-hours, {_time.monotonic() - began:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
