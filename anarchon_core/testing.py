"""Test which slots your jobs run, in your own test suite, in virtual time.

:class:`Simulation` runs real :class:`~anarchon_core.Scheduler` instances,
with your own job declarations, on one :class:`~anarchon_core.FakeClock` and
one in-memory store. Virtual time moves forward as fast as the schedulers can
step (the stretches in which nothing is due are skipped), and every run an
instance began comes back as a :class:`Ran`: its job, slot, instance,
attempt and outcome::

    from anarchon_core.testing import Simulation

    def test_nightly_report_on_the_spring_forward_day():
        sim = Simulation(declare_jobs, start="2024-03-10T00:00:00-05:00")
        ran = sim.run(until="2024-03-11T00:00:00-04:00")
        assert [r.local.isoformat() for r in ran] == ["2024-03-10T03:00:00-04:00"]

``import anarchon_core`` does not import this module: only the tests that
use it do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo

from .clock import FakeClock
from .control import CATCH_UP, FILL, RUN_NOW
from .durations import Duration, parse_duration
from .engine.requests import CONTROL_POLL
from .errors import ConfigurationError
from .events import Event, EventKind
from .peers import ANNOUNCE_TTL
from .scheduler import Scheduler
from .schedules import NEVER, moment, zone_of
from .slots import Slot
from .store import HELD_STATES, HISTORY, MAX_TTL, RunState
from .stores.memory import MemoryStore

__all__ = ["Ran", "Simulation"]

#: The events that begin a run (its handler starts), and the outcome each end event records.
_BEGINS = frozenset({EventKind.WON, EventKind.CATCH_UP, EventKind.TAKEOVER, EventKind.MANUAL})
_ENDS = {
    EventKind.FINISHED: RunState.DONE,
    EventKind.FAILED: RunState.FAILED,
    EventKind.DISPATCHED: RunState.DISPATCHED,
    EventKind.DISPATCH_FAILED: RunState.FAILED,
    EventKind.HANDED_OVER: RunState.RELEASED,
    EventKind.LOST: RunState.LOST,
    EventKind.FINISH_REFUSED: RunState.LOST,
}
#: The shortest step of virtual time: a scheduler with something due at once steps again.
_TICK = 0.001
#: Virtual seconds at the start of each :meth:`Simulation.run` stepped one by one, never
#: skipped: every instance reads the store's requests (run now, stored schedules) first.
_QUIET = 1.5 * CONTROL_POLL


@dataclass(frozen=True)
class Ran:
    """One attempt of one slot that an instance won, by a claim or a takeover, and began."""

    #: The job's name.
    job: str
    #: The slot: an aware UTC datetime.
    slot: datetime
    #: The slot in the job's time zone (``timezone=`` of a cron job; UTC for ``every=``).
    local: datetime
    #: The instance that ran it: ``"i1"``, ``"i2"``...
    instance: str
    #: 1, then +1 for each takeover of the slot.
    attempt: int
    #: How the attempt ended, as the run history records it: ``done``, ``failed``,
    #: ``released`` (handed over), ``lost`` (taken over once its lease lapsed),
    #: ``abandoned``, ``dispatched``, or ``running`` (not ended yet).
    outcome: RunState
    #: When the instance began it (virtual time, aware UTC).
    began: datetime
    #: ``"job@unix_ms"``, as the handler's ``run.slot_id``.
    slot_id: str


@dataclass
class _Begun:
    """A run as the events tell it so far."""

    job: str
    slot_id: str
    instance: str
    attempt: int
    began: float
    outcome: RunState | None = None


class Simulation:
    """Real schedulers on a virtual clock and one in-memory store, for tests.

    ``declarations`` are functions that declare your jobs on a scheduler
    (each is called with every instance's :class:`~anarchon_core.Scheduler`);
    :meth:`add_job` declares more. ``start`` (an aware datetime or an ISO 8601
    string with its offset) is when the instances start; as in production, a
    job's first slot is the first one after it. ``instances`` instances,
    named ``i1``, ``i2``..., share the store; ``lease``, ``renew``,
    ``jitter``, ``catch_up`` and ``watch`` are their jobs' defaults, as
    :class:`~anarchon_core.Scheduler` takes them.

    Handlers run on threads of the fake clock, in virtual time: a handler
    that should take time sleeps on :attr:`clock` (``sim.clock.sleep(60)``);
    one that returns at once takes no virtual time. The handlers of each
    instance are those your declarations give it, so a handler shared by
    the instances is called by whichever runs the slot.
    """

    def __init__(
        self,
        *declarations: Callable[[Scheduler], object],
        start: datetime | str,
        instances: int = 1,
        lease: Duration | None = None,
        renew: Duration | None = None,
        jitter: Duration | None = None,
        catch_up: Duration | None = None,
        watch: Duration | None = None,
    ) -> None:
        for declare in declarations:
            if not callable(declare):
                raise ConfigurationError(
                    f"declarations: {declare!r} is not a function that declares jobs"
                    " on the scheduler it is given"
                )
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ConfigurationError(
                f"instances={instances!r}: expected a whole number, at least 1"
            )
        began = moment("start", start)
        #: The virtual clock every instance, its handlers and the store read.
        self.clock = FakeClock(began.timestamp())
        #: The store the instances share.
        self.store = MemoryStore(clock=self.clock)
        #: Every event of every instance, in order.
        self.events: list[Event] = []
        self._begun: dict[tuple[str, str, int], _Begun] = {}
        self._killed: set[str] = set()
        #: Every instance's scheduler, by name (those killed or stopped too).
        self.schedulers: dict[str, Scheduler] = {}
        for n in range(1, instances + 1):
            scheduler = Scheduler(
                self.store,
                instance=f"i{n}",
                clock=self.clock,
                seed=n,
                listener=self._heard,
                lease=lease,
                renew=renew,
                jitter=jitter,
                catch_up=catch_up,
                watch=watch,
            )
            for declare in declarations:
                declare(scheduler)
            self.schedulers[scheduler.instance] = scheduler
        self._live = dict(self.schedulers)

    @property
    def now(self) -> datetime:
        """The virtual time, an aware UTC datetime."""
        return datetime.fromtimestamp(self.clock.time(), timezone.utc)

    def add_job(self, handler: Callable[..., Any], **declaration: Any) -> None:
        """Declare a job on every instance, with the keywords of
        :meth:`Scheduler.add_job <anarchon_core.Scheduler.add_job>`
        (``name=``, ``every=`` or ``cron=``, ``start=``, ``end=``, ``lease=``...)."""
        for scheduler in self.schedulers.values():
            scheduler.add_job(handler, **declaration)

    def run(
        self, until: datetime | str | None = None, *, seconds: Duration | None = None
    ) -> list[Ran]:
        """Move virtual time to ``until`` (or ``seconds`` on), the live instances stepping
        all along; the runs begun meanwhile, in the order they began.

        ``until`` is an aware datetime or an ISO 8601 string with its offset.
        A run that has not ended by then has the outcome ``running``; a later
        call, or :meth:`runs`, tells how it ended.
        """
        if (until is None) == (seconds is None):
            raise ConfigurationError("run(): give until= or seconds=, one of them")
        now = self.clock.time()
        if until is not None:
            end = moment("until", until).timestamp()
            if end < now:
                raise ConfigurationError(
                    f"until={until!s}: before the simulation's time, {self.now.isoformat()}"
                )
        else:
            assert seconds is not None
            end = now + parse_duration("seconds", seconds)
        known = set(self._begun)
        self._drive(end)
        return [ran for key, ran in self._results() if key not in known]

    def runs(self, job: str | None = None) -> list[Ran]:
        """Every run begun so far (of ``job`` alone, if given), in the order they began,
        with their outcome as of now."""
        return [ran for _, ran in self._results() if job is None or ran.job == job]

    def kill(self, instance: str) -> None:
        """Kill ``instance`` as SIGKILL would: it tells the store nothing more.

        Its runs keep their lease until it lapses; then another instance takes
        each over as the next attempt, and the killed attempt's outcome is
        ``lost``. Its handlers still running go on in their threads (a thread
        cannot be killed), but nothing they do is recorded.
        """
        self._live.pop(self._named(instance))
        self._killed.add(instance)

    def stop(self, instance: str) -> None:
        """Stop ``instance`` gracefully, as SIGTERM would: it hands its runs over at once
        (their outcome ``released``) for another instance to take over."""
        self._live.pop(self._named(instance)).stop(timeout=0)

    # -- driving -------------------------------------------------------------

    def _named(self, instance: str) -> str:
        if instance not in self._live:
            known = ", ".join(self._live) or "none"
            raise ConfigurationError(f"instance={instance!r}: not a live instance (live: {known})")
        return instance

    def _drive(self, end: float) -> None:
        """Step every live instance, and move the clock to when anything is due next."""
        clock = self.clock
        quiet_until = clock.time() + _QUIET
        while (now := clock.time()) < end:
            delays = [scheduler.run_pending() for scheduler in self._live.values()]
            clock.settle()
            step = min([end - now, *delays])
            wake = clock.next_deadline()
            if wake is not None:
                # Never past a handler's wake-up: it goes on at its own time.
                step = min(step, wake - clock.monotonic())
            if step > CONTROL_POLL / 4 and now >= quiet_until:
                idle = self._idle_for(now, end)
                if wake is not None:
                    idle = min(idle, wake - clock.monotonic())
                if idle > step:
                    self._keep_registered(idle)
                    step = idle
            clock.advance(max(step, _TICK))
        # The handlers that returned by then are recorded.
        for scheduler in self._live.values():
            scheduler.run_pending()
        clock.settle()

    def _idle_for(self, now: float, end: float) -> float:
        """How long nothing happens from ``now`` (0: something may): no run is held
        anywhere, no request waits, and no job's slot comes before then.

        The instances wake at the next slot, or an hour at most after ``now``:
        while they skip, their registry records must outlive the skip.
        """
        slot_at = min(end, now + MAX_TTL - ANNOUNCE_TTL)
        names: set[str] = set()
        for scheduler in self._live.values():
            if scheduler.running():
                return 0.0
            for name, (slot, _) in scheduler.upcoming().items():
                names.add(name)
                if slot is None:
                    # Not placed yet (declared since the last step), or past its end=.
                    job = scheduler.job_named(name)
                    if job.schedule.next_after(self.now) != NEVER:
                        return 0.0
                    continue
                slot_at = min(slot_at, slot)
        if slot_at <= now:
            return 0.0
        states = self.store.states(names)
        if any(state.state in HELD_STATES for state in states.values()):
            return 0.0  # a run goes on, or its lease may lapse for a backup to take over
        if self.store.controls(RUN_NOW, FILL, CATCH_UP):
            return 0.0  # a run-now request, a backfill or a catch-up waits
        return slot_at - now

    def _keep_registered(self, seconds: float) -> None:
        """Keep the live instances' registry records through a skip of ``seconds``, as
        their announcements every few seconds would have: when they wake, none of them
        finds the others gone (which would change who claims a slot first)."""
        for record in self.store.instances():
            if record.instance in self._live:
                self.store.announce(record.instance, record.info, seconds + ANNOUNCE_TTL)

    # -- what ran ------------------------------------------------------------

    def _heard(self, event: Event) -> None:
        """Every instance's listener: the runs begun, and how each ended."""
        self.events.append(event)
        if event.slot_id is None or event.attempt is None or event.job is None:
            return
        key = (event.instance, event.slot_id, event.attempt)
        if event.kind in _BEGINS:
            self._begun[key] = _Begun(
                event.job, event.slot_id, event.instance, event.attempt, self.clock.time()
            )
        elif event.kind in _ENDS and key in self._begun:
            self._begun[key].outcome = _ENDS[event.kind]

    def _results(self) -> list[tuple[tuple[str, str, int], Ran]]:
        """Every run begun, keyed, with its outcome as of now."""
        found = []
        zones: dict[str, ZoneInfo] = {}
        for key, begun in self._begun.items():
            slot = Slot.from_id(begun.slot_id).time
            outcome = begun.outcome
            if outcome is None and begun.instance in self._killed:
                outcome = self._recorded(begun, slot)
            zone = zones.get(begun.job)
            if zone is None:
                zone = zones[begun.job] = self._zone(begun.job)
            ran = Ran(
                job=begun.job,
                slot=slot,
                local=slot.astimezone(zone),
                instance=begun.instance,
                attempt=begun.attempt,
                outcome=outcome or RunState.RUNNING,
                began=datetime.fromtimestamp(begun.began, timezone.utc),
                slot_id=begun.slot_id,
            )
            found.append((key, ran))
        found.sort(key=lambda item: (item[1].began, item[1].slot, item[1].attempt))
        return found

    def _recorded(self, begun: _Begun, slot: datetime) -> RunState | None:
        """The outcome the store records for a killed instance's attempt, if it still does."""
        ms = Slot(begun.job, slot).ms
        for record in self.store.history(begun.job, HISTORY):
            if record.slot_ms == ms and record.attempt == begun.attempt:
                return record.state
        return None

    def _zone(self, job: str) -> ZoneInfo:
        for scheduler in self.schedulers.values():
            try:
                return _zone(zone_of(scheduler.job_named(job).schedule))
            except KeyError:
                continue
        return _zone("UTC")


@cache
def _zone(key: str) -> ZoneInfo:
    return ZoneInfo(key)
