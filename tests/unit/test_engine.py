"""Every row of the failure table, deterministic: memory store, fake clock, simulated instances."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Sequence

import pytest

from anarchon_core import RunState, Scheduler, StoreUnavailable, slot_id
from anarchon_core.peers import rank, slot_rank
from anarchon_core.store import Claim, ClaimRequest, JobState
from anarchon_core.stores.memory import MemoryStore
from tests.sim import START, Cluster, Span


def every(cluster: Cluster, seconds: float, duration: float, **options: object):
    def setup(s: Scheduler) -> None:
        s.add_job(cluster.handler(duration), name="job", every=seconds, **options)  # type: ignore[arg-type]

    return setup


def assert_no_concurrent_runs(spans: list[Span]) -> None:
    """At no moment do two executions that still hold their lease overlap."""
    live = sorted((s for s in spans if not s.lost and not s.killed), key=lambda s: s.start)
    for before, after in itertools.pairwise(live):
        assert before.end is not None
        assert before.end <= after.start + 1e-6, f"{before} overlaps {after}"


def test_each_slot_runs_exactly_once_and_winners_spread() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, every(cluster, 1, 0.2))
    cluster.run(40.2)
    slots = cluster.slots("job")
    expected = {slot_id("job", _dt(START + k)) for k in range(1, 41)}
    assert set(slots) == expected
    assert all(len(spans) == 1 for spans in slots.values())
    assert all(spans[0].attempt == 1 for spans in slots.values())
    winners = {spans[0].instance for spans in slots.values()}
    assert len(winners) >= 2
    # Every run started within the jitter bound (a tenth of the interval) of its slot.
    for spans in slots.values():
        assert 0 <= spans[0].start - _ts(spans[0].slot_id) <= 0.1 + 1e-6


def test_killed_runner_is_taken_over_as_attempt_2_within_lease() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, every(cluster, 30, 8), lease=3, jitter=0.5)
    cluster.run(31)
    first = cluster.spans[0]
    cluster.kill(first.instance)
    killed_at = cluster.now()
    cluster.run(10)
    attempts = cluster.slots("job")[first.slot_id]
    assert [s.attempt for s in attempts] == [1, 2]
    second = attempts[1]
    assert second.instance != first.instance
    assert second.token > first.token
    assert second.start - killed_at <= 3 + 1.5
    history = cluster.store.history("job")
    assert [(r.attempt, r.state) for r in history[:2]] == [
        (2, RunState.RUNNING),
        (1, RunState.LOST),
    ]


def test_frozen_runner_loses_its_run_and_its_finish_is_refused() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, every(cluster, 60, 6), lease=3, jitter=0.5)
    cluster.run(61)
    first = cluster.spans[0]
    frozen = cluster.freeze(first.instance)
    cluster.run(5)  # longer than the lease
    takeover = cluster.runner_of(first.slot_id)
    assert takeover.attempt == 2
    assert takeover.instance != first.instance
    cluster.thaw(first.instance)
    cluster.run(10)
    assert first.lost  # the handler saw run.lost after it resumed
    assert frozen.stats.get("lost") == 1
    assert frozen.stats.get("finish_refused") == 1
    assert takeover.end is not None
    assert not takeover.lost
    assert cluster.store.state("job").state is RunState.DONE  # type: ignore[union-attr]


def test_graceful_stop_hands_over_at_once() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, every(cluster, 60, 6), lease=10, jitter=0.5)
    cluster.run(62)
    first = cluster.spans[0]
    stopped_at = cluster.now()
    cluster.terminate(first.instance)
    cluster.run(3)
    attempts = cluster.slots("job")[first.slot_id]
    assert [s.attempt for s in attempts] == [1, 2]
    assert attempts[1].start - stopped_at <= 1.0  # far less than the 10 s lease
    assert first.lost  # the stopping instance's handler was told
    assert cluster.all[first.instance].stats.get("handed_over") == 1
    assert [e.detail for e in cluster.kinds("takeover")] == ["hand-over"]


def test_all_instances_restart_mid_run_and_the_slot_runs_again() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, every(cluster, 60, 20), lease=4, jitter=0.5)
    cluster.run(62)
    first = cluster.spans[0]
    for name in "abc":
        cluster.kill(name)
    cluster.run(1)
    for name in "def":
        cluster.add(name, every(cluster, 60, 2), lease=4, jitter=0.5)
    cluster.run(8)
    attempts = cluster.slots("job")[first.slot_id]
    assert [s.attempt for s in attempts] == [1, 2]
    assert attempts[1].instance in "def"
    assert cluster.store.state("job").state is RunState.DONE  # type: ignore[union-attr]


def test_all_down_across_a_slot_then_catch_up_once() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, every(cluster, 60, 1), jitter=0.5)
    cluster.run(62)
    for name in "abc":
        cluster.kill(name)
    cluster.run(60 + 20)  # the slot at START+120 passes with nobody up
    for name in "def":
        cluster.add(name, every(cluster, 60, 1), jitter=0.5)
    cluster.run(5)
    missed = slot_id("job", _dt(START + 120))
    assert len(cluster.slots("job")[missed]) == 1
    assert sum(e.kind == "catch_up" for e in cluster.events) == 1


def test_missed_slots_older_than_the_window_are_not_replayed() -> None:
    cluster = Cluster()
    for name in "ab":
        cluster.add(name, every(cluster, 10, 1), catch_up=15)
    cluster.run(11)
    for name in "ab":
        cluster.kill(name)
    cluster.run(60)  # five slots pass
    for name in "cd":
        cluster.add(name, every(cluster, 10, 1), catch_up=15)
    cluster.run(0.5)
    # Only the most recent missed slot runs; the older ones are not replayed.
    started = [s.slot_id for s in cluster.spans]
    assert started == [slot_id("job", _dt(START + 10)), slot_id("job", _dt(START + 70))]


def test_a_new_job_does_not_fire_a_catch_up_on_first_deploy() -> None:
    cluster = Cluster()
    cluster.clock.advance(5)
    cluster.add("a", every(cluster, 10, 1))
    cluster.run(4)
    assert cluster.spans == []
    cluster.run(2)
    assert [s.slot_id for s in cluster.spans] == [slot_id("job", _dt(START + 10))]


def test_long_handler_never_overlaps_and_skips_are_counted() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, every(cluster, 1, 2.5), lease=3)
    cluster.run(30)
    assert_no_concurrent_runs(cluster.spans)
    assert len(cluster.spans) >= 8
    assert sum(s.stats.get("overlap", 0) for s in cluster.all.values()) >= 10


def test_newer_slot_supersedes_a_lapsed_run_which_is_recorded_abandoned() -> None:
    """With nobody backing the older slot up, the next slot's claim supersedes it."""
    cluster = Cluster()
    cluster.add("a", every(cluster, 5, 30), lease=3, jitter=0.2)
    cluster.run(5.5)
    first = cluster.spans[0]
    cluster.kill(first.instance)
    cluster.run(5.5)  # the lease lapsed at about 8.5; slot 10 came with nobody alive
    cluster.add("b", every(cluster, 5, 30), lease=3, jitter=0.2)
    cluster.run(1)
    assert cluster.spans[1].slot_id == slot_id("job", _dt(START + 10))
    assert cluster.spans[1].attempt == 1
    states = {r.slot_ms: r.state for r in cluster.store.history("job")}
    assert states[int((START + 5) * 1000)] is RunState.ABANDONED
    assert len(cluster.slots("job")[first.slot_id]) == 1  # not retried


def test_a_backup_takes_a_lapsed_older_slot_over_before_claiming_the_next() -> None:
    """The older slot is taken over first; the next one is skipped as an overlap."""
    cluster = Cluster()
    for name in "abc":
        # Backups look rarely here: the check before the next claim is what finds it.
        cluster.add(name, every(cluster, 5, 30), lease=3, jitter=0.2, watch=20)
    cluster.run(5.5)
    first = cluster.spans[0]
    cluster.kill(first.instance)
    cluster.run(6)  # the next slot's claim may wait for a gone preferred instance
    assert [(s.slot_id, s.attempt) for s in cluster.spans[1:]] == [(first.slot_id, 2)]
    assert cluster.kinds("overlap")[0].slot_id == slot_id("job", _dt(START + 10))


class ClaimsInFlight(MemoryStore):
    """One instance's view of the shared store whose claims reach it ``delay`` seconds
    after they were sent (a busy host, a slow link); its other calls are prompt."""

    def __init__(self, inner: MemoryStore, cluster: Cluster, delay: float) -> None:
        super().__init__(clock=cluster.clock, namespace=inner.namespace)
        self.inner, self.cluster, self.delay = inner, cluster, delay

    def __getattribute__(self, name: str) -> object:
        if name in ("claim_many", "inner", "cluster", "delay", "__class__", "__dict__"):
            return super().__getattribute__(name)
        return getattr(super().__getattribute__("inner"), name)

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        self.cluster.clock.advance(self.delay)
        return self.inner.claim_many(requests, owner)


def test_a_claim_sent_as_the_run_it_backs_up_lapses_waits_and_the_run_is_taken_over() -> None:
    """The check before the next slot's claim finds the older run with half a second of
    lease left; a claim sent then would reach the store after the lapse and supersede
    that run, never taken over. The claim waits for the lapse; the run is taken over."""
    cluster = Cluster()
    cluster.add("a", every(cluster, 5, 30), lease=3.3, jitter=0, watch=20)
    cluster.run(5.2)
    first = cluster.spans[0]
    shared = cluster.store
    cluster.store = ClaimsInFlight(shared, cluster, delay=0.9)
    cluster.add("b", every(cluster, 5, 30), lease=3.3, jitter=0, watch=20)
    cluster.store = shared
    cluster.run(2.3)  # a renewed at 7.2: its lease lapses at 10.5, after slot 10
    cluster.kill("a")
    cluster.run(6)
    assert [(s.slot_id, s.instance, s.attempt) for s in cluster.spans] == [
        (first.slot_id, "a", 1),
        (first.slot_id, "b", 2),
    ]
    assert [e.slot_id for e in cluster.kinds("overlap")] == [slot_id("job", _dt(START + 10))]


class ReadsRefused(MemoryStore):
    """One instance's view of the shared store, whose reads of records are refused by the
    server (an error that is not an outage) ``times`` times in a row from ``after`` on."""

    def __init__(self, inner: MemoryStore, cluster: Cluster, after: float, times: int) -> None:
        super().__init__(clock=cluster.clock, namespace=inner.namespace)
        self.inner, self.cluster, self.after, self.times = inner, cluster, after, times

    def __getattribute__(self, name: str) -> object:
        if name in ("states", "inner", "cluster", "after", "times", "__class__", "__dict__"):
            return super().__getattribute__(name)
        return getattr(super().__getattribute__("inner"), name)

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        if self.times and self.cluster.clock.time() >= self.after:
            self.times -= 1
            raise ReadRefused("READONLY You can't write against a read only replica.")
        return self.inner.states(jobs)


class ReadRefused(Exception):
    """A server's refusal of a call (not an outage, not a bug)."""


@pytest.mark.parametrize("refusals", [1, 2, 4])
def test_a_lapsed_run_whose_check_failed_is_not_superseded_by_the_next_claim(
    refusals: int,
) -> None:
    """The check before the next slot's claim cannot read the lapsed run's record (the
    server refuses, again and again): the claim waits for a check that reads it, and the
    run is taken over; a claim sent without it would supersede the run, never retried."""
    cluster = Cluster()
    cluster.add("a", every(cluster, 5, 40), lease=3, jitter=0, watch=20)
    cluster.run(5.5)
    first = cluster.spans[0]
    shared = cluster.store
    cluster.store = ReadsRefused(shared, cluster, after=START + 10, times=refusals)
    cluster.add("b", every(cluster, 5, 40), lease=3, jitter=0, watch=20)
    cluster.store = shared
    cluster.run(0.5)  # b backs a's run up
    cluster.kill("a")
    cluster.run(15)  # each refusal holds the claim back 2 s (CLAIM_RETRY)
    assert [(s.slot_id, s.instance, s.attempt) for s in cluster.spans[:2]] == [
        (first.slot_id, "a", 1),
        (first.slot_id, "b", 2),
    ]


def _preferred_at(names: tuple[str, str], ms: int) -> str:
    """Which of ``names`` claims job ``job``'s slot ``ms`` first (anarchon_core.peers)."""
    return max(names, key=lambda name: slot_rank(rank(name, "job"), ms))


@pytest.mark.parametrize("slot_10_run_by", ["itself", "another"])
def test_a_slot_won_after_the_preferred_instance_skipped_it_is_taken_over_not_superseded(
    slot_10_run_by: str,
) -> None:
    """The preferred instance of slot 20 claims it while the run of slot 10 (its own, or
    another instance's that it backs up) still holds the lease: skipped, an overlap.
    That run ends a moment later, and the other instance, which waited for the preferred
    one, wins slot 20, then crashes. The preferred instance never saw that run, yet
    takes it over before its claim of slot 30, which would otherwise supersede it: the
    skipped slot is watched, and a check that finds a newer slot's run where the run it
    watched was backs that run up."""
    slot_20 = int((START + 20) * 1000)
    p, q = next(
        (p, q)
        for p, q in itertools.permutations("abcdefgh", 2)
        if _preferred_at((p, q), slot_20) == p
    )
    first, second = (p, q) if slot_10_run_by == "itself" else (q, p)
    cluster = Cluster()
    cluster.add(first, every(cluster, 10, 10.3), lease=3, jitter=0, watch=20)
    cluster.run(1)
    cluster.add(second, every(cluster, 10, 10.3), lease=3, jitter=0, watch=20)
    # Slot 10: the first instance's claim goes first (the second knew no peer when it
    # placed it), and runs to 20.3. Slot 20: p's claim finds that run going; q's, after
    # its wait for p, wins.
    cluster.run(20.5)
    assert [(s.slot_id, s.instance) for s in cluster.spans] == [
        (slot_id("job", _dt(START + 10)), first),
        (slot_id("job", _dt(START + 20)), q),
    ]
    cluster.kill(q)
    cluster.run(12)
    assert [(s.slot_id, s.instance, s.attempt) for s in cluster.spans[1:]] == [
        (slot_id("job", _dt(START + 20)), q, 1),
        (slot_id("job", _dt(START + 20)), p, 2),
    ]


class FlakyStore(MemoryStore):
    """A memory store that can be switched off, as a server outage."""

    down = False

    def __getattribute__(self, name: str) -> object:
        attr = super().__getattribute__(name)
        steps = {"claim", "claim_many", "takeover", "change_many", "renew", "finish", "release"}
        steps |= {"takeover_many", "states"}
        if name in steps and super().__getattribute__("down"):
            raise StoreUnavailable("connection refused")
        return attr


def test_store_outage_is_survived_without_duplicates_and_the_runner_gives_up() -> None:
    cluster = Cluster()
    cluster.store = store = FlakyStore(clock=cluster.clock)
    for name in "abc":
        cluster.add(name, every(cluster, 2, 8), lease=3, jitter=0.2)
    cluster.run(2.5)
    running = cluster.spans[0]
    store.down = True
    cluster.run(10)
    # The runner could not renew for longer than its lease: it treated the run as lost.
    assert running.lost
    assert all(s.stats.get("store_unavailable") == 1 for s in cluster.live.values())
    assert len(cluster.spans) == 1  # nothing ran that could not be claimed
    store.down = False
    cluster.run(20.5)
    assert all(s.stats.get("store_recovered") == 1 for s in cluster.live.values())
    slots = cluster.slots("job")
    # The run lost during the outage is taken over once, as attempt 2.
    assert [s.attempt for s in slots[running.slot_id]] == [1, 2]
    assert all(len(spans) == 1 for sid, spans in slots.items() if sid != running.slot_id)
    assert len(slots) >= 3  # scheduling resumed


@pytest.mark.parametrize("skews", [(5.0, 0.0, 0.0), (-5.0, 0.0, 0.0), (5.0, -5.0, 0.0)])
def test_clock_skew_causes_no_double_run_and_no_premature_takeover(
    skews: tuple[float, ...],
) -> None:
    cluster = Cluster()
    for name, skew in zip("abc", skews):
        cluster.add(name, every(cluster, 2, 4.5), lease=3, skew=skew)
    cluster.run(40)
    assert cluster.kinds("takeover") == []
    assert all(len(spans) == 1 for spans in cluster.slots("job").values())
    assert_no_concurrent_runs(cluster.spans)


def test_async_handlers_run() -> None:
    cluster = Cluster()
    seen: list[int] = []

    async def handler(run) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        seen.append(run.attempt)

    cluster.add("a", lambda s: s.add_job(handler, every=1))
    cluster.run(3.5)
    assert seen == [1, 1, 1]


def test_a_failing_handler_finishes_as_failed_and_is_not_retried() -> None:
    cluster = Cluster()

    def boom() -> None:
        raise RuntimeError("boom")

    for name in "ab":
        cluster.add(name, lambda s: s.add_job(boom, name="boom", every=5))
    cluster.run(5.8)
    assert [r.state for r in cluster.store.history("boom")] == [RunState.FAILED]
    assert cluster.kinds("takeover") == []


def _dt(ts: float):  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, timezone.utc)


def _ts(sid: str) -> float:
    return int(sid.rsplit("@", 1)[1]) / 1000


def test_a_restarted_instance_reusing_its_name_takes_over_its_predecessors_slot() -> None:
    cluster = Cluster()
    cluster.add("a", every(cluster, 60, 20), lease=3)
    cluster.run(61)
    first = cluster.spans[0]
    cluster.kill("a")
    cluster.all.pop("a")
    cluster.dead.discard("a")
    cluster.add("a", every(cluster, 60, 1), lease=3)
    cluster.run(6)
    assert [s.attempt for s in cluster.slots("job")[first.slot_id]] == [1, 2]


def test_removing_a_job_lets_its_run_finish_under_its_lease() -> None:
    cluster = Cluster()
    a = cluster.add("a", every(cluster, 60, 8), lease=3)
    cluster.add("b", lambda s: None)
    cluster.run(61)
    a.remove_job("job")
    cluster.run(60)
    assert cluster.kinds("takeover") == []
    assert [r.state for r in cluster.store.history("job")] == [RunState.DONE]
    assert a.jobs == {}
    assert len(cluster.spans) == 1  # no later slot was claimed


def test_system_exit_in_a_handler_fails_the_run_instead_of_holding_the_lease() -> None:
    cluster = Cluster()

    def leave() -> None:
        raise SystemExit(3)

    cluster.add("a", lambda s: s.add_job(leave, name="leave", every=2))
    cluster.run(5.5)
    assert [r.state for r in cluster.store.history("leave")] == [RunState.FAILED] * 2


def test_missed_slots_are_counted_once_during_an_outage() -> None:
    cluster = Cluster()
    cluster.store = store = FlakyStore(clock=cluster.clock)
    a = cluster.add("a", every(cluster, 5, 0.1), catch_up=0)
    cluster.run(1)
    store.down = True
    cluster.run(30)
    store.down = False
    cluster.run(1)
    assert a.stats.get("missed", 0) <= 7  # one per slot that passed, not one per retry


def test_a_slot_skipped_as_overlap_is_not_caught_up_by_a_late_starter() -> None:
    cluster = Cluster()
    cluster.add("a", every(cluster, 10, 14), lease=3)
    cluster.run(25)  # the run of :10 lasts until :24, so :20 was skipped as an overlap
    assert [s.slot_id for s in cluster.spans] == [slot_id("job", _dt(START + 10))]
    cluster.add("b", every(cluster, 10, 1), lease=3)
    cluster.run(4)
    assert [s.slot_id for s in cluster.spans] == [slot_id("job", _dt(START + 10))]


def test_stop_hands_over_even_with_no_time_to_wait(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import threading

    from anarchon_core.stores.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "stop.db"))
    started = threading.Event()

    def slow(run) -> None:  # type: ignore[no-untyped-def]
        started.set()
        while not run.lost:
            threading.Event().wait(0.02)

    scheduler = Scheduler(store, lease=30, jitter=0)
    scheduler.add_job(slow, name="slow", every=1)
    scheduler.start()
    assert started.wait(5)
    scheduler.stop(timeout=0)
    state = store.state("slow")
    assert state is not None and state.state is RunState.RELEASED
    assert scheduler.stats.get("handed_over") == 1


def test_instances_on_different_schedule_versions_never_run_a_slot_twice() -> None:
    cluster = Cluster()
    cluster.add("old1", every(cluster, 2, 0.2))
    cluster.add("old2", every(cluster, 2, 0.2))
    cluster.add("new", every(cluster, 3, 0.2))
    cluster.run(30.5)
    slots = cluster.slots("job")
    assert all(len(spans) == 1 for spans in slots.values())
    seconds = {int(_ts(sid) - START) for sid in slots}
    assert {2, 3, 4, 8, 9} <= seconds


def test_redeclaring_a_removed_job_during_its_last_run_keeps_that_run_and_the_new_job() -> None:
    cluster = Cluster()
    a = cluster.add("a", every(cluster, 60, 8), lease=3)
    cluster.add("b", lambda s: None)
    cluster.run(61)
    a.remove_job("job")
    a.add_job(cluster.handler(1), name="job", every=30)
    cluster.run(30)
    assert cluster.kinds("takeover") == []
    assert cluster.kinds("finish_refused") == []
    assert "job" in a.jobs
    assert [s.slot_id for s in cluster.spans] == [
        slot_id("job", _dt(START + 60)),
        slot_id("job", _dt(START + 90)),
    ]


def test_a_handed_off_run_is_left_to_its_executor() -> None:
    """Finished by the executor: done. Picked up then silent: taken over. Never picked up: left."""
    cluster = Cluster()
    dispatched: list[tuple[str, int, int]] = []

    def dispatch(run) -> None:  # type: ignore[no-untyped-def]
        run.hand_off(20)
        dispatched.append((run.slot_id, run.attempt, run.token))

    for name in "abc":
        cluster.add(name, lambda s: s.add_job(dispatch, name="job", every=60, lease=2))
    cluster.run(61)
    token = dispatched[0][2]
    state = cluster.store.state("job")
    assert state is not None and state.state is RunState.DISPATCHED
    assert 18 < state.lease_remaining <= 20  # the hand-off lease, and nobody renews it
    assert len(cluster.kinds("dispatched")) == 1
    # 1. The executor finishes it with the token: nothing else happens.
    assert cluster.store.finish("job", token, RunState.DONE)
    cluster.run(30)
    assert len(dispatched) == 1
    # 2. The next slot's executor picks it up (renews with the job's lease), then dies.
    cluster.run(31)
    slot, _, token = dispatched[1]
    assert cluster.store.renew("job", token, 2)
    cluster.run(6)
    assert [(s == slot, a) for s, a, _ in dispatched[1:]] == [(True, 1), (True, 2)]
    assert cluster.kinds("takeover")[0].detail == "lease lapsed"
    # 3. Attempt 2 is never picked up: after its hand-off lease it is not sent again.
    cluster.run(22)
    assert len(dispatched) == 3
    assert any("never picked up" in e.detail for e in cluster.kinds("missed"))
    # The next slot supersedes it.
    cluster.run(60)
    assert dispatched[3][0] != slot and dispatched[3][1] == 1


# -- lease safety under store faults (each once reproduced on the engine) ------


class SlowClaims(MemoryStore):
    """A store whose claims reach the server ``delay`` seconds after they were sent."""

    delay = 0.0

    def claim_many(self, requests, owner):  # type: ignore[no-untyped-def]
        if self.delay:
            self._clock.sleep(self.delay)  # the driving thread: time moves for everyone
        return super().claim_many(requests, owner)


def test_a_claim_that_wins_over_the_instances_own_lapsed_run_tells_that_run() -> None:
    """Case 3: the older run of the job is lost before any newer one begins, and says why."""
    cluster = Cluster()
    cluster.store = store = SlowClaims(clock=cluster.clock)
    runs: list = []  # type: ignore[type-arg]
    believing_at_start: list[int] = []

    def work(run) -> None:  # type: ignore[no-untyped-def]
        believing_at_start.append(sum(not r.lost for r in runs))
        runs.append(run)
        while not run.lost:
            cluster.clock.sleep(0.1)

    cluster.add("a", lambda s: s.add_job(work, name="job", every=5, lease=3), jitter=0)
    cluster.run(5.5)
    assert len(runs) == 1 and not runs[0].lost
    store.delay = 4.0  # the next slot's claim lands after the running lease lapsed
    cluster.run(5)
    first = runs[0]
    assert first.lost
    assert "ran out" in first.lost_reason or "superseded" in first.lost_reason
    assert [e.slot_id for e in cluster.kinds("lost")][:1] == [first.slot_id]
    store.delay = 0.0
    cluster.run(3)
    # The slot won late is not run on a lease it cannot rely on: it is taken over.
    assert [(r.slot_id, r.attempt) for r in runs[1:]] == [(slot_id("job", _dt(START + 10)), 2)]
    assert believing_at_start == [0, 0]  # no run of the job believed when another began


def dispatcher(cluster: Cluster, sent: list, pickup: float):  # type: ignore[no-untyped-def,type-arg]
    def dispatch(run) -> None:  # type: ignore[no-untyped-def]
        run.hand_off(pickup)
        sent.append((run.slot_id, run.attempt, run.instance))

    return lambda s: s.add_job(dispatch, name="job", every=60, lease=2)


def test_a_dispatch_never_picked_up_is_not_sent_again_by_a_beat_started_later() -> None:
    """Case 4: the record says "dispatched", whoever reads it and whenever."""
    cluster = Cluster()
    sent: list = []  # type: ignore[type-arg]
    cluster.add("a", dispatcher(cluster, sent, pickup=20))
    cluster.run(61)
    assert [a for _, a, _ in sent] == [1]
    cluster.kill("a")
    cluster.run(25)  # the pickup lease lapsed with nobody watching
    cluster.add("late", dispatcher(cluster, sent, pickup=20))
    cluster.run(10)
    assert [a for _, a, _ in sent] == [1]  # not sent again
    missed = [e for e in cluster.kinds("missed") if e.instance == "late"]
    assert missed and "never picked up" in missed[0].detail


def test_a_rolling_deploy_that_changes_the_lease_keeps_takeovers() -> None:
    """Case 5: a backup with a shorter lease takes a crashed runner's longer lease over."""
    cluster = Cluster()
    cluster.add("old", every(cluster, 60, 30), lease=8, jitter=0)
    cluster.run(61)
    cluster.add("new", every(cluster, 60, 30), lease=2)
    cluster.run(1)
    cluster.kill("old")
    cluster.run(12)
    spans = cluster.slots("job")[slot_id("job", _dt(START + 60))]
    assert [(s.instance, s.attempt) for s in spans] == [("old", 1), ("new", 2)]
    assert not cluster.kinds("missed")


class BrokerDown(Exception):
    pass


def test_a_dispatch_that_fails_is_sent_again_by_another_instance() -> None:
    """Case 6: an instance that cannot reach the broker releases; one that can sends."""
    from anarchon_core import DispatchFailed

    cluster = Cluster()
    sent: list = []  # type: ignore[type-arg]

    def setup(reachable: bool):  # type: ignore[no-untyped-def]
        def dispatch(run) -> None:  # type: ignore[no-untyped-def]
            run.hand_off(20)
            if not reachable:
                raise DispatchFailed("the broker is unreachable")
            sent.append((run.slot_id, run.attempt, run.instance))

        return lambda s: s.add_job(dispatch, name="job", every=60, lease=2)

    cluster.add("cut-off", setup(False), jitter=0)  # always claims first
    cluster.add("fine", setup(True))
    cluster.run(63)
    # Sent once, by the instance that reaches the broker, as a later attempt.
    assert [i for *_, i in sent] == ["fine"] and sent[0][1] > 1
    assert cluster.kinds("dispatch_failed")[0].instance == "cut-off"
    history = cluster.store.history("job")
    # Attempt 1 was cut to a back-off and taken over: never recorded failed.
    assert [(r.attempt, r.state) for r in reversed(history)][:1] == [(1, RunState.LOST)]
    assert RunState.FAILED not in {r.state for r in history}


def test_an_instance_started_during_a_run_longer_than_the_interval_backs_it_up() -> None:
    """It takes the older slot over when its runner dies, rather than superseding it later."""
    cluster = Cluster()
    cluster.add("a", every(cluster, 60, 100), lease=3, jitter=0)
    cluster.run(130)  # slot 60 runs; slot 120 was skipped as an overlap
    cluster.add("b", every(cluster, 60, 100), lease=3)
    cluster.run(1)
    cluster.kill("a")
    cluster.run(6)
    first = slot_id("job", _dt(START + 60))
    assert [(s.instance, s.attempt) for s in cluster.slots("job")[first]] == [("a", 1), ("b", 2)]


@pytest.mark.parametrize("removed_at", [120.3, 124.0], ids=["before-its-claim", "backing-it-up"])
def test_a_job_removed_watching_its_runs_takes_over_the_slot_due_then_and_no_later_one(
    removed_at: float,
) -> None:
    """A one-off that disables itself as it runs (django-celery-beat's rows): the other
    instances remove the job as they learn of it, maybe before their deferred claim of
    the slot went (0.3 s in), maybe while backing its run up (4 s in). Its runner then
    dies: one of them takes the slot over, and no later slot is claimed anywhere."""
    cluster = Cluster()
    schedulers = {
        name: cluster.add(name, every(cluster, 60, 8), lease=3, jitter=0) for name in "abc"
    }
    cluster.run(removed_at)  # the second slot: the first is claimed by all, peers unknown
    first = cluster.spans[-1]
    assert first.slot_id == slot_id("job", _dt(START + 120))
    others = [s for name, s in schedulers.items() if name != first.instance]
    for scheduler in others:
        scheduler.remove_job("job", keep_watching=True)
    cluster.kill(first.instance)
    cluster.run(12)
    attempts = cluster.slots("job")[first.slot_id]
    assert [s.attempt for s in attempts] == [1, 2]
    assert attempts[1].instance != first.instance
    assert attempts[1].end is not None  # ran to its end
    cluster.run(60)  # past the next slot's time
    assert max(cluster.slots("job")) == first.slot_id
    assert all("job" not in s.jobs for s in others)  # gone once its run ended


def test_a_job_removed_without_watching_leaves_its_runs_to_their_runner() -> None:
    """The default (``remove_job(name)``): the instances that removed the job watch none
    of its runs; its runner killed, the slot is not run again by them."""
    cluster = Cluster()
    schedulers = {
        name: cluster.add(name, every(cluster, 60, 8), lease=3, jitter=0) for name in "abc"
    }
    cluster.run(122)
    first = cluster.spans[-1]
    for name, scheduler in schedulers.items():
        if name != first.instance:
            scheduler.remove_job("job")
            assert "job" not in scheduler.jobs
    cluster.kill(first.instance)
    cluster.run(70)
    assert [s.attempt for s in cluster.slots("job")[first.slot_id]] == [1]
    assert max(cluster.slots("job")) == first.slot_id


def test_a_job_removed_watching_its_runs_before_its_slot_is_due_goes_at_once() -> None:
    cluster = Cluster()
    a = cluster.add("a", every(cluster, 60, 1), lease=3, jitter=0)
    cluster.run(30)
    a.remove_job("job", keep_watching=True)
    assert "job" not in a.jobs
    cluster.run(60)
    assert cluster.spans == []
