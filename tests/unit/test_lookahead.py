"""Claims sent ahead (``Scheduler(lookahead=...)``): a slot won ahead of its time starts
its handler at that time, whatever the store's round trip, and every rule is judged as
it was without the look-ahead.

Deterministic: the memory store and a fake clock; each instance steps in a thread of its
own, and each of its store calls costs ``RTT`` virtual seconds (half before the store
applies it, half after), as over a network.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import pytest

from anarchon_core import ConfigurationError, EventKind, Run, Scheduler, slot_id
from anarchon_core.engine.claims import LOOKAHEAD_SHARE, MAX_LOOKAHEAD
from tests.sim import START, Cluster, SlowStore

pytestmark = pytest.mark.fast

EVERY, LEASE, RTT = 10, 10.0, 0.2
#: The look-ahead asked for: more than a tenth of the lease, so it is bounded to that.
LOOKAHEAD = 5.0
AHEAD = LOOKAHEAD_SHARE * LEASE
#: How often an instance's loop wakes at the longest (its handler's return wakes a real
#: loop at once): the precision of the start times below.
POLL = 0.01


def at(seconds: float) -> str:
    return slot_id("job", datetime.fromtimestamp(START + seconds, timezone.utc))


class Fleet:
    """Instances ``names`` with one job every ``EVERY`` s (jitter 0), each stepping in its
    own thread, each store call costing ``RTT``; every event with its virtual time."""

    def __init__(
        self,
        handler: Callable[[Cluster], Callable[[Run], None]] | None = None,
        *,
        names: str = "ab",
        lookahead: float = LOOKAHEAD,
        every: float = EVERY,
        **options: object,
    ) -> None:
        self.cluster = cluster = Cluster()
        self.clock = cluster.clock
        self.timeline: list[tuple[float, str, str | None, str]] = []
        self.running: dict[str, threading.Event] = {}
        self.handler = handler(cluster) if handler else cluster.handler(0.5)
        self.lookahead = lookahead
        self.every = every
        self.options = options
        for name in names:
            self.add(name)

    def add(self, name: str) -> Scheduler:
        store = SlowStore(self.cluster.store, self.clock.sleep, per_call=RTT, per_item=0.0)

        def listen(event: object) -> None:
            self.cluster.events.append(event)  # type: ignore[arg-type]
            self.timeline.append(
                (self.clock.time(), event.kind, event.slot_id, event.instance)  # type: ignore[attr-defined]
            )

        scheduler = Scheduler(
            store,
            instance=name,
            clock=self.clock,
            seed=len(self.running) + 1,
            listener=listen,
            lookahead=self.lookahead,
            jitter=0,
        )
        options = {"lease": LEASE, **self.options}
        scheduler.add_job(self.handler, name="job", every=self.every, **options)  # type: ignore[arg-type]
        running = self.running[name] = threading.Event()
        running.set()

        def loop() -> None:
            while running.is_set():
                delay = scheduler.run_pending()
                self.clock.sleep(min(max(delay, 0.001), POLL))

        self.cluster.all[name] = scheduler
        self.clock.spawn(loop, f"sim:{name}")
        return scheduler

    def kill(self, name: str) -> None:
        """SIGKILL: its loop and handlers stop without a word to the store."""
        self.running[name].clear()
        self.cluster.dead.add(name)

    def terminate(self, name: str) -> None:
        """SIGTERM: the loop stops, and the runs it holds are handed over."""
        self.running[name].clear()
        self.clock.advance(POLL)
        self.cluster.all[name].stop(timeout=0)

    def run_until(self, seconds: float) -> None:
        """Virtual time up to ``START + seconds``."""
        self.clock.advance(START + seconds - self.clock.time())

    def stop(self) -> None:
        for running in self.running.values():
            running.clear()
        self.clock.advance(1.0)

    def starts(self) -> dict[str, list[float]]:
        """Per slot, when each attempt's handler began (seconds after START)."""
        found: dict[str, list[float]] = {}
        for span in sorted(self.cluster.spans, key=lambda s: s.start):
            found.setdefault(span.slot_id, []).append(round(span.start - START, 3))
        return found

    def first(self, kind: str, slot: str) -> float:
        """When the first event ``kind`` of ``slot`` came (seconds after START)."""
        return min(t for t, k, s, _ in self.timeline if k == kind and s == slot) - START


@contextmanager
def fleet(*args: object, **kwargs: object) -> Iterator[Fleet]:
    f = Fleet(*args, **kwargs)  # type: ignore[arg-type]
    try:
        yield f
    finally:
        f.stop()


def test_a_slot_won_ahead_starts_its_handler_at_its_time_whatever_the_round_trip() -> None:
    with fleet() as f:
        f.run_until(4 * EVERY + 5)
        starts = f.starts()
        won = Counter(s for _, k, s, _ in f.timeline if k == EventKind.WON)
    slots = [at(k * EVERY) for k in range(1, 5)]
    # Each slot once, its handler started at its time (to the loop's wake-up), its claim
    # won ahead: sent a tenth of the lease early, answered after a round trip.
    assert sorted(starts) == slots
    for k, slot in enumerate(slots, 1):
        [start] = starts[slot]
        assert k * EVERY <= start <= k * EVERY + POLL + 1e-6, (slot, start)
        assert f.first(EventKind.WON, slot) < k * EVERY - AHEAD + RTT + POLL
    assert set(won.values()) == {1}
    # Without it, every handler starts at least the claim's round trip late.
    with fleet(lookahead=0) as g:
        g.run_until(2 * EVERY + 5)
        late = [start - k * EVERY for k, (_, [start]) in enumerate(sorted(g.starts().items()), 1)]
    assert len(late) == 2 and min(late) >= RTT - 1e-6, late


def outcomes(handler: float, lookahead: float, until: float) -> tuple[list[str], set[str]]:
    """The slots started (each once) and those skipped as overlaps, with ``handler``
    seconds of work per run."""
    with fleet(lambda c: c.handler(handler), lookahead=lookahead) as f:
        f.run_until(until)
        starts = f.starts()
        skipped = {e.slot_id for e in f.cluster.events if e.kind == EventKind.OVERLAP}
    assert all(len(times) == 1 for times in starts.values()), starts
    skipped -= set(starts)  # reported by one instance, run late by another
    assert all(
        f.first(EventKind.OVERLAP, slot) >= (int(slot.rsplit("@")[1]) / 1000 - START)
        for slot in skipped
    ), "an overlap judged before the slot's time"
    return sorted(starts), skipped


@pytest.mark.parametrize("work", [EVERY - 0.8, EVERY + 3.0])
def test_a_run_holding_its_lease_when_the_claim_goes_ahead_is_judged_as_without_it(
    work: float,
) -> None:
    """9.2 s of work: each run still holds its lease when the next slot's claim goes, a
    second ahead, and has ended by that slot's time. Judged at the claim sent ahead,
    every other slot would be skipped; judged when the claim would have gone without the
    look-ahead, none is. 10.5 s: each run still holds its lease at the next slot's time,
    and the fleet skips (or runs late) the same slots as without the look-ahead."""
    ahead = outcomes(work, LOOKAHEAD, 5 * EVERY + 2)
    assert ahead == outcomes(work, 0.0, 5 * EVERY + 2)
    if work < EVERY:
        assert ahead == ([at(k * EVERY) for k in range(1, 6)], set())
    else:
        assert ahead == ([at(k * EVERY) for k in (1, 3, 5)], {at(2 * EVERY), at(4 * EVERY)})


def test_a_pause_is_judged_at_the_slots_time_not_at_the_claim_sent_ahead() -> None:
    with fleet() as f:
        store = f.cluster.store
        f.run_until(EVERY - 2)
        assert store.pause("job")
        f.run_until(EVERY - 0.5)  # the claims went ahead, and were refused: paused
        assert store.resume("job")
        f.run_until(EVERY + 5)
        # Resumed before the slot's time: it runs, once, claimed at its time (a round
        # trip later), as without the look-ahead.
        [(slot, [start])] = f.starts().items()
        assert slot == at(EVERY) and EVERY <= start <= EVERY + RTT + POLL
        # Paused across the next slot's time: refused then, reported once per instance.
        f.run_until(2 * EVERY - 2)
        assert store.pause("job")
        f.run_until(2 * EVERY + 5)
        assert at(2 * EVERY) not in f.starts()
        paused = [t for t, k, s, _ in f.timeline if k == EventKind.PAUSED and s == at(2 * EVERY)]
        assert len(paused) == 2 and min(paused) >= START + 2 * EVERY


@pytest.mark.parametrize("how", ["killed", "terminated"])
def test_an_instance_gone_after_winning_ahead_is_taken_over_never_before_the_slot(
    how: str,
) -> None:
    # Every 20 s with a 20 s lease: claims go 2 s ahead.
    every = lease = 2 * EVERY
    ahead = LOOKAHEAD_SHARE * lease
    with fleet(every=every, lease=lease, watch=0.2) as f:
        f.run_until(every - ahead + 2 * RTT)  # a claim won ahead, the slot's time to come
        [(_, _, slot, winner)] = [e for e in f.timeline if e[1] == EventKind.WON]
        assert slot == at(every)
        (f.kill if how == "killed" else f.terminate)(winner)
        f.run_until(every + lease + 5)
        starts = f.starts()
        takeovers = [e for e in f.timeline if e[1] == EventKind.TAKEOVER]
    # Killed: the lease lapses a lease after the claim, and a backup runs the slot once.
    # Handed over: a backup takes it at once (it checks every 0.2 s), before the slot's
    # time, and starts it at that time, not before.
    [(taken_at, _, taken, by)] = takeovers
    assert taken == at(every) and by != winner
    [start] = starts[at(every)]
    if how == "killed":
        assert start >= every - ahead + lease - RTT
    else:
        assert taken_at - START < every
        assert every <= start <= every + POLL + 1e-6


def test_the_look_ahead_is_for_jobs_that_skip_overlaps() -> None:
    """A job whose slots wait for one another claims at its time, as without it."""
    with fleet(overlap="buffer_one") as f:
        f.run_until(2 * EVERY + 5)
        for k in (1, 2):
            assert f.first(EventKind.WON, at(k * EVERY)) >= k * EVERY


def test_lookahead_is_a_duration_within_bounds() -> None:
    Scheduler("memory://", lookahead="1s").stop()
    for bad in (-1, "soon", MAX_LOOKAHEAD + 1):
        with pytest.raises(ConfigurationError, match="lookahead="):
            Scheduler("memory://", lookahead=bad)  # type: ignore[arg-type]
