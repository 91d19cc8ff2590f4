"""Entries whose schedule decides its own due times: one beat at a time decides, under a lease.

A ``schedule`` subclass with its own ``is_due``, ``solar`` and ``crontab(nowfun=...)``
cannot be put on a grid every beat computes alike: one beat, the entry's owner,
asks its ``is_due`` and claims each due time it decides as a slot of the entry's
job. Several beats run in one process on one memory store, in virtual time (each
beat an engine of its own and beat's own send path, to an in-memory broker); the
schedules read the same virtual clock (``nowfun``). What is checked is what a user
sees: the messages published, one per due time, and the store's record.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import BaseSchedule, crontab, schedstate, schedule, solar
from celery.signals import before_task_publish

from anarchon_celery import Scheduler
from anarchon_celery.entries import EntryJobs
from anarchon_celery.owned import OWNER, WATCH
from anarchon_celery.schedules import read_entry
from anarchon_celery.settings import read_settings
from anarchon_core import ConfigurationError, FakeClock
from anarchon_core import Scheduler as Engine
from anarchon_core.schedules import to_ms
from anarchon_core.store import Claim, ClaimOnlyStore, ClaimRequest, ClaimStatus, JobState
from anarchon_core.store import RunState as State
from anarchon_core.stores.memory import MemoryStore

UTC = timezone.utc
#: 2030-01-01T00:00:00Z.
START = 1_893_456_000.0
#: The owner lease of the tests' entries (``anarchon_lease``), seconds.
LEASE = 3.0
TASK = "owned.report"


class EveryTwo(schedule):  # type: ignore[misc]
    """Due once two seconds have passed since its last run: its own rule, not a grid."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        elapsed = (self.now() - last_run_at).total_seconds()
        if elapsed >= 2:
            return schedstate(True, 2.0)
        return schedstate(False, 2.0 - elapsed)


class Broken(schedule):  # type: ignore[misc]
    def is_due(self, last_run_at: datetime) -> schedstate:
        raise RuntimeError("cannot calculate next run")


class Odd(BaseSchedule):  # type: ignore[misc]
    """Any other schedule type: due every 5 seconds of its own clock."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        left = 5 - (self.now() - last_run_at).total_seconds()
        return schedstate(left <= 0, 5.0 if left <= 0 else left)


@pytest.fixture
def sent() -> Iterator[list[str]]:
    """The slot id of every task message published meanwhile, in order."""
    seen: list[str] = []

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers is not None and "anarchon" in headers:
            seen.append(headers["anarchon"]["slot_id"])

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


def make_app(tmp_path: Path, schedule: dict[str, Any]) -> Celery:
    app = Celery("owned", broker="memory://")
    app.conf.update(
        beat_schedule=schedule,
        anarchon_store=f"sqlite:///{tmp_path / 'unused.db'}",
        anarchon_tracking=False,
        anarchon_lease=LEASE,
        result_expires=None,
    )
    return app


@dataclass
class Beat:
    """One beat: its engine on the shared store, its entries, beat's own send path."""

    name: str
    engine: Engine
    jobs: EntryJobs
    sender: Scheduler
    alive: bool = True
    #: When it ticks next (virtual Unix seconds), and how late it wakes up for a tick.
    tick_at: float = 0.0
    lag: float = 0.0

    def step(self) -> float:
        """One tick of beat: the owner's decisions, then the engine's step."""
        soon = self.jobs.owners.step()
        return min(soon, self.engine.run_pending())

    def close(self) -> None:
        """Beat stops (SIGTERM): its owner leases and its runs handed over."""
        self.alive = False
        self.jobs.owners.release_all()
        self.engine.stop(timeout=0)


class Fleet:
    """Beats sharing one memory store, in virtual time."""

    def __init__(self, tmp_path: Path, entries: dict[str, dict[str, Any]]) -> None:
        self.tmp_path = tmp_path
        self.entries = entries
        self.clock = FakeClock(START)
        self.store = MemoryStore(namespace="owned", clock=self.clock)
        self.beats: dict[str, Beat] = {}

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.time(), UTC)

    def add(self, name: str, clock: Any = None) -> Beat:
        app = make_app(self.tmp_path, {})
        sender = Scheduler(app, lazy=True)
        engine = Engine(self.store, clock=clock or self.clock, inline=True, instance=name)
        jobs = EntryJobs(engine, app, read_settings(app), sender._dispatcher)
        jobs.apply(
            {key: sender._new_entry(key, raw) for key, raw in self.entries.items()}, strict=True
        )
        # Each beat ticks on its own: 0.137 s after the one added before, and waking up
        # a little later than asked, 7 ms more than the one before.
        beat = self.beats[name] = Beat(name, engine, jobs, sender)
        beat.tick_at = self.clock.time() + 0.137 * (len(self.beats) - 1)
        beat.lag = 0.001 + 0.007 * (len(self.beats) - 1)
        return beat

    def run(self, seconds: float) -> None:
        """Every live beat ticks when it asks to (at least every second) for ``seconds``,
        each on its own: beats added apart tick apart, as processes do."""
        end = self.clock.time() + seconds
        while True:
            now = self.clock.time()
            for beat in self.beats.values():
                if beat.alive and beat.tick_at <= now:
                    beat.tick_at = now + max(0.001, min(1.0, beat.step())) + beat.lag
            due = [b.tick_at for b in self.beats.values() if b.alive]
            if now >= end:
                return
            self.clock.advance(max(0.0, min([*due, end]) - now))

    def owner(self, entry: str) -> str | None:
        """The live beat that decides ``entry``'s due times now, if any."""
        owners = [n for n, b in self.beats.items() if b.alive and b.jobs.owners.holds(entry)]
        assert len(owners) <= 1, owners
        return owners[0] if owners else None

    def close(self) -> None:
        for beat in self.beats.values():
            if beat.alive:
                beat.close()
            beat.sender.close()


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[Callable[[dict[str, dict[str, Any]]], Fleet]]:
    made: list[Fleet] = []

    def make(entries: dict[str, dict[str, Any]]) -> Fleet:
        made.append(fleet := Fleet(tmp_path, entries))
        return fleet

    yield make
    for fleet in made:
        fleet.close()


def fake_now(fleet: Fleet) -> Callable[[], datetime]:
    return fleet.now


def times(sent: list[str]) -> list[float]:
    """The slot times (Unix seconds) of the slot ids ``sent``."""
    return [int(sid.rsplit("@", 1)[1]) / 1000 for sid in sent]


def gaps(sent: list[str]) -> list[float]:
    """The seconds between the slot times of ``sent``, one after the other."""
    return [b - a for a, b in itertools.pairwise(times(sent))]


def assert_once_every_two_seconds(sent: list[str], first: float, last: float) -> None:
    """Each due time sent once; each decided two seconds (and at most a tick) after the
    one before it, from ``first`` to ``last``."""
    assert len(sent) == len(set(sent)), f"a due time sent twice: {sent}"
    at = times(sent)
    assert at == sorted(at), sent
    assert at[0] <= first + 2.0 + 1.0, sent
    assert all(2.0 <= gap <= 2.0 + 1.0 for gap in gaps(sent)), gaps(sent)
    assert at[-1] >= last - 2.0 - 1.0, sent


def two(fleet: Fleet, **options: Any) -> dict[str, Any]:
    return {
        "task": TASK,
        "schedule": EveryTwo(timedelta(seconds=2), nowfun=fake_now(fleet)),
        "options": options,
    }


# -- sent once per due time ------------------------------------------------------------


def test_a_schedule_with_its_own_is_due_is_sent_once_per_due_time_by_three_beats(
    fleets: Callable[..., Fleet], sent: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    fleet = fleets({})
    fleet.entries["two"] = two(fleet)
    for name in ("a", "b", "c"):
        fleet.add(name)
    said = [r.getMessage() for r in caplog.records if "decides its own due times" in r.getMessage()]
    assert (
        said
        == [
            "anarchon: entry two: its schedule (EveryTwo) decides its own due times: sent by one"
            " beat at a time under a lease (takeover after 3s), not on a shared grid"
        ]
        * 3
    )
    start = fleet.clock.time()
    fleet.run(21)
    assert fleet.owner("two") is not None
    assert_once_every_two_seconds(sent, start, fleet.clock.time())
    assert len(sent) >= 9
    # Each due time is a slot of the entry's own job, recorded as any slot.
    record = fleet.store.state("two")
    assert record is not None and f"two@{record.slot_ms}" == sent[-1]
    assert record.state is State.DONE
    # The owner lease is no job: nothing else is recorded, nothing pending.
    assert fleet.store.jobs() == ["two"]
    assert fleet.store.pending_once() == []
    assert list(fleet.store.controls(OWNER)) == [OWNER + "two"]


def test_any_other_schedule_type_is_decided_by_its_owner_too(
    fleets: Callable[..., Fleet], sent: list[str]
) -> None:
    fleet = fleets({})
    fleet.entries["odd"] = {"task": TASK, "schedule": Odd(nowfun=fake_now(fleet))}
    fleet.add("a")
    fleet.add("b")
    fleet.run(21)
    assert len(sent) == len(set(sent)) == 4, sent
    assert all(5.0 <= gap <= 6.0 for gap in gaps(sent)), gaps(sent)


def test_a_crontab_with_its_own_nowfun_is_sent_once_per_due_time_by_three_beats(
    fleets: Callable[..., Fleet], sent: list[str]
) -> None:
    fleet = fleets({})
    # Its own clock, 30 s behind: every even minute of it is 30 s past one of the fleet's.
    fleet.entries["shifted"] = {
        "task": TASK,
        "schedule": crontab(minute="*/2", nowfun=lambda: fleet.now() - timedelta(seconds=30)),
    }
    start = fleet.clock.time()  # a whole hour
    for name in ("a", "b", "c"):
        fleet.add(name)
    fleet.run(5 * 60 + 35)
    assert len(sent) == len(set(sent)) == 3, sent
    for at, due in zip(times(sent), (30, 150, 270), strict=True):
        assert 0 <= at - (start + due) <= 1.1, sent


def test_solar_is_sent_once_per_sunrise_by_three_beats(
    fleets: Callable[..., Fleet], sent: list[str]
) -> None:
    pytest.importorskip("ephem")
    fleet = fleets({})
    sunrise = solar("sunrise", 48.85, 2.35, nowfun=fake_now(fleet))
    fleet.entries["dawn"] = {"task": TASK, "schedule": sunrise}
    # Virtual time moves to a minute before the next sunrise: the schedule's own answer.
    fleet.clock.advance(sunrise.remaining_estimate(fleet.now()).total_seconds() - 60)
    first = fleet.now() + timedelta(seconds=60)
    for name in ("a", "b", "c"):
        fleet.add(name)
    fleet.run(180)
    assert times(sent) == [pytest.approx(first.timestamp(), abs=1.1)], sent
    # The next day's: every beat sleeps until a minute before it (their leases lapse).
    following = fleet.now() + sunrise.remaining_estimate(fleet.now())
    assert timedelta(hours=23) < following - first < timedelta(hours=25)
    fleet.clock.advance((following - fleet.now()).total_seconds() - 60)
    fleet.run(180)
    assert len(sent) == len(set(sent)) == 2, sent
    assert times(sent)[1] == pytest.approx(following.timestamp(), abs=1.1)


# -- the owner changes -------------------------------------------------------------------


def test_the_owner_closed_hands_over_at_once_and_another_goes_on_without_a_duplicate(
    fleets: Callable[..., Fleet], sent: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    fleet = fleets({})
    fleet.entries["two"] = two(fleet)
    for name in ("a", "b", "c"):
        fleet.add(name)
    start = fleet.clock.time()
    fleet.run(7)
    first = fleet.owner("two")
    assert first is not None
    fleet.beats[first].close()  # SIGTERM: released
    closed_at = fleet.clock.time()
    fleet.run(WATCH + 0.01)
    second = fleet.owner("two")
    assert second not in (None, first)
    assert f"anarchon: entry two: this beat decides its due times now ({first} released it" in (
        caplog.text
    )
    fleet.run(10)
    assert_once_every_two_seconds(sent, start, fleet.clock.time())
    assert any(at > closed_at for at in times(sent))


def test_the_owner_killed_is_taken_over_after_its_lease_without_a_duplicate(
    fleets: Callable[..., Fleet], sent: list[str]
) -> None:
    fleet = fleets({})
    fleet.entries["two"] = two(fleet)
    for name in ("a", "b", "c"):
        fleet.add(name)
    fleet.run(7)
    first = fleet.owner("two")
    assert first is not None
    fleet.beats[first].alive = False  # SIGKILL: nothing released
    killed_at, before = fleet.clock.time(), len(sent)
    # Its last renewal came at most a third of the lease before: nobody decides until a
    # whole lease after it (two thirds of the lease at least), taken within a lease
    # and a read.
    fleet.run(LEASE * 2 / 3 - 0.1)
    assert fleet.owner("two") is None
    fleet.run(LEASE / 3 + WATCH + 0.2)
    assert fleet.owner("two") not in (None, first)
    fleet.run(8)
    assert len(sent) == len(set(sent)), sent
    after = times(sent)[before:]
    assert after and after[0] >= killed_at, sent
    assert all(gap >= 2.0 for gap in gaps(sent)), gaps(sent)


def test_a_frozen_owner_stops_deciding_before_another_takes_over(
    fleets: Callable[..., Fleet], sent: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    fleet = fleets({})
    fleet.entries["two"] = two(fleet)
    fleet.add("a")
    fleet.run(3)
    fleet.add("b")
    fleet.run(3)
    assert fleet.owner("two") == "a"
    a = fleet.beats["a"]
    a.alive = False  # frozen (SIGSTOP): it ticks no more, and believes nothing new
    fleet.run(LEASE * (1 - 0.05) + 0.01)
    assert not a.jobs.owners.holds("two")  # its lease ran out on its own clock first
    fleet.run(2)
    assert fleet.owner("two") == "b"
    a.alive = True  # resumes (SIGCONT): it reads that b holds the lease
    with caplog.at_level(logging.WARNING, logger="anarchon_celery"):
        fleet.run(5)
    assert fleet.owner("two") == "b"
    assert "entry two: this beat no longer decides its due times: b holds its lease" in (
        caplog.text
    )
    assert len(sent) == len(set(sent)), sent
    assert all(gap >= 2.0 for gap in gaps(sent)), gaps(sent)


def test_a_due_time_decided_by_an_owner_that_died_before_its_claim_runs_once_late(
    fleets: Callable[..., Fleet], sent: list[str]
) -> None:
    fleet = fleets({})
    fleet.entries["two"] = two(fleet)
    # A beat decided a due time (its lease's value says so) and died before writing
    # its one-off: nothing in the store shows it but the lease.
    decided = to_ms(fleet.now())
    value = {"by": "gone:1:beat", "term": "x", "n": 7, "lease": LEASE, "decided": decided}
    fleet.store.set_control(OWNER + "two", json.dumps(value), 0)
    for name in ("a", "b"):
        fleet.add(name)
    fleet.run(LEASE + 2)
    assert sent[:1] == [f"two@{decided}"], sent
    fleet.run(6)
    assert len(sent) == len(set(sent)) >= 3, sent
    assert all(gap >= 2.0 for gap in gaps(sent)), gaps(sent)


def test_a_due_time_decided_twice_is_claimed_once(
    fleets: Callable[..., Fleet], sent: list[str]
) -> None:
    fleet = fleets({})
    fleet.entries["two"] = two(fleet)
    a = fleet.add("a")
    fleet.run(1)
    assert fleet.owner("two") == "a"
    fleet.add("b")
    # a decides a due time and writes its one-off, then freezes before any claim.
    fleet.clock.advance(1.5)
    a.jobs.owners.step()
    (pending,) = fleet.store.pending_once("two")
    a.alive = False
    # b takes the lease over and writes the same due time again; a comes back and
    # claims it too. The entry's record lets one claim of that slot win.
    fleet.run(LEASE + 1.5)
    assert fleet.owner("two") == "b"
    a.alive = True
    fleet.run(6)
    assert sent.count(f"two@{pending.due_ms}") == 1, sent
    assert len(sent) == len(set(sent)), sent


def test_the_next_due_time_waits_for_the_run_of_the_last_one(
    fleets: Callable[..., Fleet], sent: list[str]
) -> None:
    fleet = fleets({})
    fleet.entries["two"] = two(fleet)
    fleet.add("a")
    fleet.run(3)
    (first,) = sent
    record = fleet.store.state("two")
    assert record is not None
    # The run of its slot still holds the lease (a worker on it): nothing more decided.
    fleet.store.claim("two", record.slot_ms + 1, "worker", lease=10)
    lapse = fleet.clock.time() + 10
    fleet.run(8)
    assert sent == [first]
    fleet.run(4)  # the lease lapsed: the next due time is decided, and sent
    assert len(sent) >= 2, sent
    assert lapse <= times(sent)[1] <= lapse + 1.1, sent


def test_a_stopped_beats_leases_are_released_and_an_entry_removed_releases_its_own(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets({})
    fleet.entries["two"] = two(fleet)
    a = fleet.add("a")
    fleet.run(1)
    assert a.jobs.owners.holds("two")
    a.jobs.apply({})  # the entry removed from beat's schedule
    value = json.loads(fleet.store.controls(OWNER)[OWNER + "two"][1])
    assert value["released"] is True and value["by"] == "a"


# -- what is refused -------------------------------------------------------------------


def test_a_schedule_whose_is_due_raises_is_refused_naming_the_entry(tmp_path: Path) -> None:
    app = make_app(tmp_path, {})
    beat = Scheduler(app, lazy=True)
    try:
        with pytest.raises(
            ConfigurationError,
            match=r"entry 'broken': its schedule \(Broken\) decides its own due times, and its"
            r" is_due\(\) fails: RuntimeError: cannot calculate next run",
        ):
            beat.add(name="broken", task=TASK, schedule=Broken(timedelta(seconds=1)))
    finally:
        beat.close()


@pytest.mark.parametrize("option", ["anarchon_overlap", "anarchon_limit"])
def test_overlap_and_limit_are_refused_for_an_entry_that_decides_its_due_times(
    option: str,
) -> None:
    value = {"anarchon_overlap": "buffer_one", "anarchon_limit": 3}[option]
    raw = {"task": TASK, "schedule": EveryTwo(timedelta(seconds=2)), "options": {option: value}}
    with pytest.raises(
        ConfigurationError,
        match=rf"beat_schedule\['two'\]: its schedule \(EveryTwo\) decides its own due times,"
        rf" one at a time .*: {option} do not apply",
    ):
        read_entry("two", raw, "UTC", owned=True)


def test_outside_beat_such_a_schedule_is_still_refused() -> None:
    # An import into stored schedules needs slots computed from the clock alone.
    raw = {"task": TASK, "schedule": EveryTwo(timedelta(seconds=2))}
    with pytest.raises(ConfigurationError, match="EveryTwo overrides is_due"):
        read_entry("two", raw, "UTC")
    assert read_entry("two", raw, "UTC", owned=True).decides == "EveryTwo"


class _Claims(ClaimOnlyStore):
    """A claim-only store (as RabbitMQ): the first claim of a slot wins."""

    def claim_many(self, requests: list[ClaimRequest], owner: str) -> list[Claim]:
        return [
            Claim(ClaimStatus.WON, JobState(r.job, r.slot_ms, owner, 1, 1, State.RUNNING, 0))
            for r in requests
        ]


def test_a_store_without_leases_refuses_such_an_entry_at_beat_start(tmp_path: Path) -> None:
    app = make_app(tmp_path, {})
    sender = Scheduler(app, lazy=True)
    engine = Engine(_Claims(namespace="owned"), inline=True)
    try:
        jobs = EntryJobs(engine, app, read_settings(app), sender._dispatcher)
        entry = sender._new_entry("two", {"task": TASK, "schedule": EveryTwo(2)})
        with pytest.raises(
            ConfigurationError,
            match=r"beat_schedule\['two'\]: its schedule \(EveryTwo\) decides its own due"
            r" times: .* _Claims keeps no leases or one-off runs",
        ):
            jobs.apply({"two": entry}, strict=True)
        assert engine.jobs == {}
    finally:
        engine.stop(timeout=0)
        sender.close()


# -- beat's own ticks, in real time ------------------------------------------------------


def test_beats_ticking_in_real_time_on_sqlite_hand_the_entry_over_when_one_closes(
    tmp_path: Path, sent: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    entries = {"two": {"task": TASK, "schedule": EveryTwo(timedelta(seconds=2))}}
    beats = [Scheduler(make_app(tmp_path, entries)) for _ in range(2)]
    try:

        def tick_until(done: Callable[[], bool], what: str, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while not done():
                assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s ({sent})"
                delays = [beat.tick() for beat in beats if beat.engine is not None]
                time.sleep(max(0.005, min(delays)))

        tick_until(lambda: len(sent) >= 2, "two due times sent", 10)
        (owner,) = [b for b in beats if b._entries and b._entries.owners.holds("two")]
        owner.close()  # as on SIGTERM: its lease released, the other beat takes it at once
        closed_at, before = time.time(), len(sent)
        tick_until(lambda: len(sent) >= before + 2, "two more, from the other beat", 10)
        assert "its owner lease released" in caplog.text
        assert len(sent) == len(set(sent)), sent
        assert all(2.0 <= gap <= 2.0 + 1.5 for gap in gaps(sent)), gaps(sent)
        assert times(sent)[before] > closed_at
    finally:
        for beat in beats:
            beat.close()
