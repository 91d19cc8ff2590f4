"""Overload safety (anarchon_core.engine.pacing): late, then missed, never twice; and seen.

A real scheduler on a memory store, stepped by hand on a fake clock. An
instance "behind" is one whose steps come too late for its own runs: the
clock moves on without a step, as a starved process's does.
"""

from __future__ import annotations

import io
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence

import pytest

from anarchon_core import ConfigurationError, Event, EventKind, FakeClock, Run, Scheduler
from anarchon_core.check import check
from anarchon_core.cli import instances
from anarchon_core.engine import pacing
from anarchon_core.metrics import Metrics
from anarchon_core.probes import serve
from anarchon_core.store import Change, Claim, ClaimRequest, JobState, RunState
from anarchon_core.stores.memory import MemoryStore

START = 1_699_999_200.0


class Counting(MemoryStore):
    """A memory store that keeps each batch call's size, and takes ``per_item`` seconds
    of the caller's (fake) time per item, as a real store's round trip does."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.claim_batches: list[int] = []
        self.claim_times: list[float] = []
        self.change_batches: list[tuple[int, float]] = []
        #: When each job's last claim was answered, and its last end (done) was sent.
        self.claimed_at: dict[str, float] = {}
        self.ended_at: dict[str, float] = {}
        self.per_item = 0.0
        self._fake = clock

    def _cost(self, items: int) -> None:
        if self.per_item:
            self._fake.advance(self.per_item * items)

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        self.claim_batches.append(len(requests))
        self.claim_times.append(self._fake.monotonic())
        self._cost(len(requests))
        self.claimed_at.update((r.job, self._fake.monotonic()) for r in requests)
        return super().claim_many(requests, owner)

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        self.change_batches.append((len(changes), self._fake.monotonic()))
        ends = {c.job: self._fake.monotonic() for c in changes if c.state is RunState.DONE}
        self.ended_at.update(ends)
        self._cost(len(changes))
        return super().change_many(changes)

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(jobs)
        self._cost(len(names))
        return super().states(names)


def fleet_of_one(
    jobs: int, *, lease: float = 10.0, hold: threading.Event | None = None, inline: bool = False
) -> tuple[Scheduler, Counting, FakeClock, list[Event]]:
    clock = FakeClock(START)
    store = Counting(clock)
    events: list[Event] = []
    scheduler = Scheduler(
        store,
        instance="a",
        clock=clock,
        listener=events.append,
        lease=lease,
        jitter=0,
        inline=inline,
    )

    def handler(run: Run) -> None:
        if hold is not None:
            clock.wait(hold, 3600)

    for n in range(jobs):
        scheduler.add_job(handler, name=f"job{n:04d}", every=60)
    return scheduler, store, clock, events


def test_claims_go_in_chunks_and_the_runs_upkeep_runs_between_them() -> None:
    hold = threading.Event()
    # A 7 s lease: renewals every 2.33 s, one due 0.67 s into the next slot's claims.
    scheduler, store, clock, _ = fleet_of_one(1, lease=7.0, hold=hold)
    store.per_item = 0.0008  # each item costs 0.8 ms of the instance's time
    scheduler.run_pending()
    clock.advance(60 - (START % 60))  # the first slot: job0000's run begins and holds
    scheduler.run_pending()
    assert [r.job for r in scheduler.running()] == ["job0000"]
    # 1,500 more jobs, due at the next slot.
    for n in range(1, 1500):
        scheduler.add_job(lambda: None, name=f"job{n:04d}", every=60)
    scheduler.run_pending()
    store.claim_batches.clear()
    store.claim_times.clear()
    run_for(scheduler, clock, 61)  # through the next slot, stepping when due
    # Chunks of about 0.25 s of work each, not one batch of 1,500.
    assert len(store.claim_batches) > 3
    assert max(store.claim_batches) <= 1000
    # The held run's renewal went out between two chunks, not after the last one.
    first, last = store.claim_times[0], store.claim_times[-1]
    assert any(first < at < last for size, at in store.change_batches if size == 1)
    hold.set()


@pytest.mark.parametrize("lease", [4.0, 30.0])
def test_between_chunks_the_ends_wait_a_tenth_of_their_lease_at_most(lease: float) -> None:
    """The ends of runs that returned go to the store in few calls: between two chunks of
    claims only once the oldest has waited a tenth of its lease, else after the last."""
    scheduler, store, clock, _ = fleet_of_one(1500, lease=lease, inline=True)
    scheduler.run_pending()
    store.per_item = 0.0008  # 1.2 s for every claim, in chunks of about 0.25 s
    clock.advance(60 - (START % 60))
    run_for(scheduler, clock, 5)  # a step may claim only a quarter of the lease's worth
    assert len(store.claim_batches) > 3 and len(store.ended_at) == 1500
    waited = [store.ended_at[job] - store.claimed_at[job] for job in store.ended_at]
    hold = 0.1 * lease  # pacing.END_HOLD_SHARE of the lease
    # Each end waited at most the hold and the chunk of claims that was under way.
    assert max(waited) <= hold + 2 * pacing.chunk_time(lease)
    last_claim = store.claim_times[-1]
    ends_amid_claims = [at for _, at in store.change_batches if at < last_claim]
    if hold > 1.2:
        assert ends_amid_claims == []  # all after the claims
    else:
        assert ends_amid_claims  # the oldest could not wait for the last chunk


@pytest.mark.parametrize(("lease", "seconds"), [(2.0, 0.25), (5.0, 0.5), (20.0, 1.0)])
def test_a_chunk_takes_a_tenth_of_the_shortest_lease(lease: float, seconds: float) -> None:
    """Longer leases leave more time between renewals: fewer, larger chunks."""
    scheduler, store, clock, _ = fleet_of_one(4000, lease=lease)
    scheduler.run_pending()
    store.per_item = 0.0004  # 1.6 s for every claim
    clock.advance(60 - (START % 60))
    run_for(scheduler, clock, 5)
    assert sum(store.claim_batches) == 4000
    # Grown to about that many seconds' worth, never more; the ends of the runs alike.
    largest = max(store.claim_batches) * store.per_item
    assert seconds * 0.8 <= largest <= seconds * 1.05
    assert sum(size for size, _ in store.change_batches) == 4000
    largest = max(size for size, _ in store.change_batches) * store.per_item
    assert seconds * 0.8 <= largest <= seconds * 1.05


def test_one_step_spends_at_most_a_quarter_of_the_lease_on_claims() -> None:
    scheduler, store, clock, _ = fleet_of_one(2000, lease=4.0)
    scheduler.run_pending()
    store.per_item = 0.0025  # 5 s for every claim: longer than the lease
    clock.advance(60 - (START % 60))
    began = clock.monotonic()
    scheduler.run_pending()
    # One step claimed about a quarter of the lease's worth (1 s), recorded the ends of the
    # runs it began (here an end costs as much as a claim), and returned.
    claimed = sum(store.claim_batches)
    assert 0 < claimed < 2000
    claims_took = store.claim_times[-1] + store.claim_batches[-1] * store.per_item - began
    assert claims_took < 4.0 * pacing.STEP_SHARE + pacing.chunk_time(4.0)
    ends = sum(size for size, at in store.change_batches if at >= began)
    assert ends <= claimed
    assert clock.monotonic() - began <= claims_took + ends * store.per_item + 1e-6
    # The next steps claim the rest; every slot runs once.
    while sum(store.claim_batches) < 2000:
        scheduler.run_pending()
    assert sum(store.claim_batches) == 2000


def run_for(scheduler: Scheduler, clock: FakeClock, seconds: float) -> None:
    """Step ``scheduler`` whenever it is due, for ``seconds``, as its loop would."""
    until = clock.monotonic() + seconds
    while clock.monotonic() < until:
        delay = scheduler.run_pending()  # a step may take time itself (its store calls)
        clock.advance(max(0.001, min(delay, until - clock.monotonic())))


def behind_instance() -> tuple[Scheduler, Counting, FakeClock, list[Event], threading.Event]:
    """An instance holding one run whose renewal it sends 4 s late (40 % of its lease)."""
    hold = threading.Event()
    scheduler, store, clock, events = fleet_of_one(2, hold=hold)
    scheduler.remove_job("job0001")
    scheduler.add_job(lambda: None, name="job0001", every=5)
    scheduler.run_pending()
    clock.advance(60 - (START % 60))
    scheduler.run_pending()
    assert [r.job for r in scheduler.running()] == ["job0000"]
    clock.advance(3.3 + 4.0)  # no step meanwhile: a starved process
    return scheduler, store, clock, events, hold


def test_an_instance_behind_on_its_renewals_defers_its_claims_and_says_so() -> None:
    scheduler, store, clock, events, hold = behind_instance()
    store.claim_batches.clear()
    scheduler.run_pending()
    deferred = [e for e in events if e.kind is EventKind.CLAIMS_DEFERRED]
    assert len(deferred) == 1
    assert "1 claims deferred" in deferred[0].detail and "4.0s late" in deferred[0].detail
    assert store.claim_batches == []  # nothing claimed at that step
    health = scheduler.health()
    assert health.behind == pytest.approx(4.0, abs=0.05) and health.deferred == 1
    # The run kept its lease: renewed at that step, it holds.
    assert [r.job for r in scheduler.running()] == ["job0000"]
    # Caught up: the next step claims what was deferred.
    clock.advance(pacing.DEFER_PAUSE)
    scheduler.run_pending()
    assert store.claim_batches == [1]
    assert scheduler.health().behind < 1.0
    hold.set()


def test_being_behind_is_shown_by_status_check_readyz_and_metrics() -> None:
    scheduler, store, clock, _, hold = behind_instance()
    metrics = Metrics(scheduler)
    server = serve(scheduler, 0, "127.0.0.1", metrics=metrics, fail_behind=1.0)
    try:
        scheduler.run_pending()  # 4 s late: defers
        assert _status(server.port, "/readyz") == 503
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics").read()
        behind = re.search(rb'anarchon_behind_seconds\{namespace="default"\} (\S+)', scraped)
        assert behind is not None and float(behind[1]) == pytest.approx(4.0, abs=0.05)
        assert b'anarchon_claims_deferred_total{namespace="default"} 1.0' in scraped
        # On time again, and announced (every 5 s): the worst since the last announcement.
        run_for(scheduler, clock, 6)
        assert _status(server.port, "/readyz") == 200
    finally:
        server.close()
        hold.set()
    (record,) = store.instances()
    assert record.info["behind"] == 4.0 and record.info["deferred"] == 1
    out = io.StringIO()
    instances(store, {}, out)
    header, row = out.getvalue().splitlines()[2:4]
    assert "behind" in header.split() and "4.0s, 1 claims deferred" in row
    failing = check(store, clock.time(), host=None, instance="a", fail_behind=1.0)
    assert [f.check for f in failing if not f.ok] == ["loop"]
    assert "runs 4.0s behind (more than 1s)" in failing[-1].detail
    assert all(f.ok for f in check(store, clock.time(), host=None, instance="a", fail_behind=5))
    assert all(f.ok for f in check(store, clock.time(), host=None, instance="a"))


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code)


def test_fail_behind_must_be_a_positive_number_of_seconds() -> None:
    scheduler, *_ = fleet_of_one(1)
    for bad in (-1, 0, "5s", True):
        with pytest.raises(ConfigurationError, match="fail_behind"):
            serve(scheduler, 0, "127.0.0.1", metrics=False, fail_behind=bad)  # type: ignore[arg-type]
