"""``limit=N``: a job runs N slots in all, counted in the store, then ends.

The count is the store's (claims won, takeovers left out), read inside each
claim's atomic step: every instance hears the same answer, ``ended``, and
stops claiming the job. Driven deterministically: memory store, fake clock,
several instances (tests/sim.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import pytest

from anarchon_core import (
    ClaimStatus,
    ConfigurationError,
    Control,
    FakeClock,
    Scheduler,
    slot_id,
)
from anarchon_core.control import RUN_NOW
from anarchon_core.metrics import Metrics
from anarchon_core.store import Claim, ClaimOnlyStore, ClaimRequest, JobState, RunState
from tests.sim import SETTLE, START, Cluster


def _sid(seconds: float, start: float = START, job: str = "job") -> str:
    """The slot id of ``job`` at ``start + seconds``."""
    return slot_id(job, datetime.fromtimestamp(start + seconds, timezone.utc))


def _job(
    cluster: Cluster, limit: int | None, duration: float = 2.0, **options: object
) -> Callable[[Scheduler], None]:
    """Declares ``job``: every 10 s, ``duration`` s a run, a lease of 3 s, ``limit``."""

    def setup(s: Scheduler) -> None:
        s.add_job(
            cluster.handler(duration),
            name="job",
            every=10,
            lease=3,
            limit=limit,
            **options,  # type: ignore[arg-type]
        )

    return setup


def _runs(cluster: Cluster) -> Counter[str]:
    """How many times each slot's handler began."""
    return Counter(span.slot_id for span in cluster.spans)


def _ended(cluster: Cluster, instance: str) -> list[str | None]:
    """The slots ``instance`` reported ``limit_reached`` for."""
    return [e.slot_id for e in cluster.kinds("limit_reached") if e.instance == instance]


def _run_until(cluster: Cluster, done: Callable[[], bool], most: float = 300) -> None:
    """Drive the cluster in half seconds until ``done()`` (at most ``most`` seconds)."""
    end = cluster.now() + most
    while not done():
        assert cluster.now() < end, "never came"
        cluster.run(0.5)


def test_three_instances_run_exactly_the_limit_a_takeover_not_counted() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, _job(cluster, 5))
    _run_until(cluster, lambda: len(cluster.spans) == 3)
    third = cluster.spans[2]
    assert third.slot_id == _sid(30)
    cluster.run(0.5)
    cluster.kill(third.instance)  # mid-run: a backup takes the slot over as attempt 2
    cluster.run(200)

    # The first five slots ran, each once to its end; the third twice, as the
    # takeover is that slot's second attempt, not a slot of its own.
    assert _runs(cluster) == Counter({_sid(10 * k): 1 for k in (1, 2, 4, 5)} | {_sid(30): 2})
    assert [(s.attempt, s.killed, s.completed) for s in cluster.spans if s.slot_id == _sid(30)] == [
        (1, True, False),
        (2, False, True),
    ]
    assert len(cluster.kinds("takeover")) == 1
    stats = cluster.store.stats(["job"])["job"]
    assert (stats.runs, stats.takeovers, stats.claims, stats.done) == (6, 1, 5, 5)

    # Nothing more ran; each live instance heard it from the store at the sixth slot,
    # once, and shows no next slot.
    live = sorted(cluster.live)
    assert len(live) == 2
    for name in live:
        assert _ended(cluster, name) == [_sid(60)], name
        assert cluster.live[name].upcoming() == {"job": (None, None)}
    [event] = [e for e in cluster.kinds("limit_reached") if e.instance == live[0]]
    assert event.detail == "limit reached (5 of 5)"
    assert cluster.kinds("overlap") == [] and cluster.kinds("missed") == []
    assert cluster.store.state("job") is not None
    assert cluster.store.state("job").slot_ms == int((START + 50) * 1000)  # type: ignore[union-attr]


def test_the_last_slot_allowed_is_backed_up_and_taken_over_not_overlapped() -> None:
    """A last run longer than the interval: the next slot's claims answer ended, not busy
    (no overlap reported), and the run is still backed up: its instance killed, another
    takes it over."""
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, _job(cluster, 1, duration=25))
    _run_until(cluster, lambda: len(cluster.spans) == 1)
    [last] = cluster.spans
    assert last.slot_id == _sid(10)
    cluster.run(15)  # slot 20 comes while it runs
    for name in cluster.live:
        assert _ended(cluster, name) == [_sid(20)], name
    cluster.kill(last.instance)
    cluster.run(100)

    assert _runs(cluster) == Counter({_sid(10): 2})
    [again] = [s for s in cluster.spans if s.attempt == 2]
    assert again.completed and again.instance != last.instance
    assert cluster.kinds("overlap") == []
    stats = cluster.store.stats(["job"])["job"]
    assert (stats.runs, stats.takeovers, stats.claims) == (2, 1, 1)
    for name in cluster.live:
        assert cluster.live[name].upcoming() == {"job": (None, None)}


def test_an_instance_started_after_the_end_runs_nothing_and_a_higher_limit_goes_on() -> None:
    cluster = Cluster()
    for name in "ab":
        cluster.add(name, _job(cluster, 2))
    cluster.run(60)
    assert len(cluster.spans) == 2

    late = cluster.add("late", _job(cluster, 2))
    cluster.run(30)
    assert len(cluster.spans) == 2
    assert len(_ended(cluster, "late")) == 1  # its first claim, and no other
    assert late.upcoming() == {"job": (None, None)}

    # Declared again with a higher limit (a deploy): the store's count goes on from 2.
    for scheduler in cluster.live.values():
        scheduler.remove_job("job")
        _job(cluster, 4)(scheduler)
    cluster.run(60)
    # Two more (the first the slot just missed, caught up as on any start), then none.
    assert _runs(cluster) == Counter({_sid(k): 1 for k in (10, 20, 80, 90)})
    assert cluster.store.stats(["job"])["job"].claims == 4
    for scheduler in cluster.live.values():
        assert scheduler.upcoming() == {"job": (None, None)}


def test_the_limit_reached_is_counted_by_the_metrics() -> None:
    cluster = Cluster()
    metrics = Metrics(cluster.add("a", _job(cluster, 1)))
    cluster.run(40)
    name = "anarchon_limit_reached_total"
    labels = {"namespace": "default", "job": "job"}
    assert metrics.registry.get_sample_value(name, labels) == 1
    assert metrics.registry.get_sample_value("anarchon_slots_won_total", labels) == 1


def _near_now(before: float = 0.0) -> Cluster:
    """A cluster whose fake clock starts ``before`` seconds before the real time (run-now
    requests and backfills are placed by the real time), on a whole ten seconds."""
    start = float(int(time.time() - before) // 10 * 10)
    return Cluster(clock=FakeClock(start, settle_timeout=SETTLE))


def test_a_slot_run_now_counts_against_the_limit() -> None:
    cluster = _near_now()
    start = cluster.now()
    a = cluster.add("a", _job(cluster, 2))
    cluster.add("b", _job(cluster, 2))
    cluster.run(1)
    asked = a.trigger("job")  # due 2 s from now, by the real clock: in the first 13 s
    cluster.run(60)
    # The slot run now and one scheduled slot (the first, or the second should the
    # first have come while the slot run now still held its lease), and no other.
    runs = _runs(cluster)
    assert asked in runs and len(runs) == 2 and set(runs.values()) == {1}
    assert set(runs) - {asked} <= {_sid(10, start), _sid(20, start)}
    assert len(cluster.kinds("manual")) == 1
    assert cluster.store.stats(["job"])["job"].claims == 2
    assert {e.instance for e in cluster.kinds("limit_reached")} == {"a", "b"}
    for scheduler in cluster.live.values():
        assert scheduler.upcoming() == {"job": (None, None)}


def test_a_run_now_request_of_an_ended_job_runs_nothing() -> None:
    cluster = _near_now(before=60)
    start = cluster.now()
    a = cluster.add("a", _job(cluster, 1))
    cluster.add("b", _job(cluster, 1))
    cluster.run(25)
    assert _runs(cluster) == Counter({_sid(10, start): 1})

    asked = a.trigger("job")  # its slot comes after the job's last
    cluster.run(80)
    assert len(cluster.spans) == 1
    # Each instance that claimed the request heard the job ended; none calls it missed,
    # and the request is gone.
    assert asked in {e.slot_id for e in cluster.kinds("limit_reached")}
    assert cluster.kinds("missed") == []
    assert cluster.store.controls(RUN_NOW) == {}


def test_a_backfill_runs_on_its_own_record_whatever_the_limit() -> None:
    cluster = _near_now()
    start = cluster.now()
    for name in "ab":
        cluster.add(name, _job(cluster, 1))
    cluster.run(25)
    assert len(cluster.spans) == 1  # the job ended after its first slot
    begin = datetime.fromtimestamp(start - 30, timezone.utc)
    Control(cluster.store).backfill("job", begin, datetime.fromtimestamp(start, timezone.utc))
    cluster.run(30)
    # The three past slots ran, as the backfill's; the job's own count is unchanged.
    assert sorted(_runs(cluster)) == sorted(
        [_sid(10, start), *(_sid(-k, start) for k in (30, 20, 10))]
    )
    assert cluster.store.stats(["job"])["job"].claims == 1


class _Winners(ClaimOnlyStore):
    """A claim-only store: the first claimer of each slot wins."""

    def __init__(self) -> None:
        super().__init__(namespace="n")
        self.won: set[tuple[str, int]] = set()

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        claims = []
        for r in requests:
            if (r.job, r.slot_ms) in self.won:
                claims.append(Claim(ClaimStatus.TAKEN, None))
                continue
            self.won.add((r.job, r.slot_ms))
            holder = JobState(r.job, r.slot_ms, owner, 1, r.slot_ms, RunState.RUNNING, 0.0)
            claims.append(Claim(ClaimStatus.WON, holder))
        return claims


def test_a_limit_on_a_claim_only_store_is_refused_at_add_job() -> None:
    s = Scheduler(_Winners(), clock=FakeClock(START), instance="a")
    with pytest.raises(ConfigurationError, match=r"job 'report': limit=3 needs a store"):
        s.add_job(lambda: None, name="report", every=60, limit=3)
    assert s.jobs == {}  # nothing registered
    s.add_job(lambda: None, name="report", every=60)  # without a limit: as any job
    assert list(s.jobs) == ["report"]
