"""Overlap policies: a slot that comes while the job's previous run still holds its lease.

Deterministic: the memory store, a fake clock and three instances (tests/sim.py's
Cluster). The job runs every 10 s and its handler takes 23 s, so every run
outlasts two slots: ``skip`` skips them, ``buffer_one`` runs the first one that
came during each run right after it, ``buffer_all`` runs every one in turn,
``cancel_other`` tells the running handler and starts the new slot once it
returned.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import pytest

from anarchon_core import (
    Cancelled,
    ConfigurationError,
    EventKind,
    Run,
    RunState,
    Scheduler,
    slot_id,
)
from anarchon_core.jobs import MAX_BUFFERED, Job, Rules
from anarchon_core.roles import JobRuntime
from anarchon_core.schedules import make_schedule
from anarchon_core.slots import Slot
from anarchon_core.store import Claim, ClaimOnlyStore, ClaimRequest, ClaimStatus
from tests.sim import START, Cluster, Span

EVERY, LONG = 10, 23.0


def at(seconds: float) -> str:
    """The id of the job's slot ``seconds`` after the cluster's start."""
    return slot_id("job", datetime.fromtimestamp(START + seconds, timezone.utc))


def fleet(
    overlap: str,
    handler: Callable[[Cluster], Callable[[Run], None]] | None = None,
    names: str = "abc",
    **options: object,
) -> Cluster:
    cluster = Cluster()
    work = handler(cluster) if handler else cluster.handler(LONG)

    def setup(s: Scheduler) -> None:
        s.add_job(work, name="job", every=EVERY, overlap=overlap, lease=3, **options)  # type: ignore[arg-type]

    for name in names:
        cluster.add(name, setup)
    return cluster


def started(cluster: Cluster) -> list[str]:
    """The slots whose attempt 1 began, in the order they began."""
    return [s.slot_id for s in sorted(cluster.spans, key=lambda s: s.start) if s.attempt == 1]


def skipped(cluster: Cluster) -> Counter[str]:
    """Per slot skipped as an overlap, how many instances reported it."""
    return Counter(e.slot_id for e in cluster.kinds(EventKind.OVERLAP) if e.slot_id)


def one_at_a_time(spans: Sequence[Span]) -> None:
    """No two executions holding their lease overlap, and none started twice."""
    live = sorted((s for s in spans if not s.lost and not s.killed), key=lambda s: s.start)
    for before, after in itertools.pairwise(live):
        assert before.end is not None and before.end <= after.start + 1e-6, (before, after)
    firsts = Counter(s.slot_id for s in spans if s.attempt == 1)
    assert [slot for slot, n in firsts.items() if n > 1] == []


def first_runs_long(overlap: str, seconds: float) -> Cluster:
    """Two instances of a job every second whose first slot (at 1 s) runs ``seconds``,
    the others 0.2 s."""
    cluster = Cluster()

    def work(run: Run) -> None:
        first = run.slot == datetime.fromtimestamp(START + 1, timezone.utc)
        cluster.handler(seconds if first else 0.2)(run)

    def setup(s: Scheduler) -> None:
        s.add_job(work, name="job", every=1, overlap=overlap, lease=3)  # type: ignore[arg-type]

    for name in "ab":
        cluster.add(name, setup)
    return cluster


def test_skip_skips_every_slot_that_comes_while_the_run_holds_its_lease() -> None:
    cluster = fleet("skip")
    cluster.run(75)
    assert started(cluster) == [at(10), at(40), at(70)]
    assert skipped(cluster) == {at(20): 3, at(30): 3, at(50): 3, at(60): 3}
    one_at_a_time(cluster.spans)


def test_buffer_one_runs_the_first_slot_that_came_during_each_run_right_after_it() -> None:
    cluster = fleet("buffer_one")
    cluster.run(108)
    # 10 runs 10-33; 20 came during it and runs 33-56; 40 came during that one (30
    # came before it began, while 20 waited) and runs 56-79; and so on.
    assert started(cluster) == [at(10), at(20), at(40), at(60), at(80)]
    assert skipped(cluster) == {at(30): 3, at(50): 3, at(70): 3, at(90): 3, at(100): 3}
    one_at_a_time(cluster.spans)
    runs = sorted(cluster.spans, key=lambda s: s.start)
    for before, after in itertools.pairwise(runs):
        assert before.end is not None and after.start - before.end < 0.5  # at once
    late = [e for e in cluster.kinds(EventKind.CATCH_UP) if e.slot_id == at(20)]
    assert [e.detail for e in late] == [f"waited for {at(10)} to end"]


@pytest.mark.parametrize("victim", ["a", "b", "c"])
def test_a_buffered_slot_runs_even_when_the_instance_that_queued_it_first_is_killed(
    victim: str,
) -> None:
    # Without jitter the slot's preferred instance claims at its very time, the others
    # a second later: killed half a second after the slot, one of the three victims is
    # the only instance that has seen it come, and one is the runner of slot 10.
    cluster = fleet("buffer_one", jitter=0)
    cluster.run(20.5)
    cluster.kill(victim)
    cluster.run(60)
    ran = cluster.slots("job")
    assert [(s.attempt, s.instance != victim) for s in ran[at(20)]] == [(1, True)]
    assert all(s.end is not None and s.end <= ran[at(20)][0].start for s in ran[at(10)])
    assert ran[at(10)][-1].completed
    one_at_a_time(cluster.spans)


def test_an_instance_that_starts_meanwhile_works_out_the_waiting_slot_from_the_record() -> None:
    cluster = fleet("buffer_one", names="ab")
    cluster.run(22.5)  # both have seen 20 come while 10 runs

    def setup(s: Scheduler) -> None:
        s.add_job(cluster.handler(LONG), name="job", every=EVERY, overlap="buffer_one", lease=3)

    cluster.add("c", setup)
    cluster.run(0.5)
    cluster.kill("a")
    cluster.kill("b")
    cluster.run(40)
    ran = cluster.slots("job")
    # c took slot 10 over, then ran the slot that waited for it.
    assert [(s.instance, s.attempt) for s in ran[at(10)]][-1] == ("c", 2)
    assert [(s.instance, s.attempt) for s in ran[at(20)]] == [("c", 1)]
    assert ran[at(20)][0].start >= ran[at(10)][-1].end  # type: ignore[operator]
    assert {at(30), at(40)} <= {e.slot_id for e in cluster.kinds(EventKind.OVERLAP)}


def test_buffer_all_runs_every_slot_in_order_once() -> None:
    cluster = fleet("buffer_all")
    cluster.run(108)
    assert started(cluster) == [at(10), at(20), at(30), at(40), at(50)]
    assert skipped(cluster) == {}
    one_at_a_time(cluster.spans)


def test_buffer_all_keeps_at_most_max_buffered_slots_waiting() -> None:
    cluster = first_runs_long("buffer_all", 130.5)
    cluster.run(190)
    ran = started(cluster)
    # 2-101 waited for slot 1 (which ran until 131.5), 102-131 found 100 waiting.
    assert ran[: MAX_BUFFERED + 1] == [at(k) for k in range(1, MAX_BUFFERED + 2)]
    assert skipped(cluster) == {at(k): 2 for k in range(MAX_BUFFERED + 2, 132)}
    later = ran[MAX_BUFFERED + 1 :]
    assert later == sorted(later, key=lambda s: int(s.rpartition("@")[2]))
    assert at(132) in later and at(185) in later  # the queue drained
    one_at_a_time(cluster.spans)


def polite(seen: dict[str, float]) -> Callable[[Cluster], Callable[[Run], None]]:
    """A handler that works 23 s unless asked to stop; when it is asked is noted."""

    def handler(cluster: Cluster) -> Callable[[Run], None]:
        def work(run: Run) -> None:
            span = Span(run.instance, run.job, run.slot_id, run.attempt, run.token, cluster.now())
            cluster.spans.append(span)
            while cluster.now() < span.start + LONG and not run.cancelled:
                cluster.clock.sleep(0.1)
            if run.cancelled:
                seen[run.slot_id] = cluster.now()
            span.end = cluster.now()

        return work

    return handler


def test_cancel_other_tells_the_running_handler_and_starts_the_new_slot_once_it_returned() -> None:
    seen: dict[str, float] = {}
    cluster = fleet("cancel_other", polite(seen), jitter=0.2)
    cluster.run(45)
    ran = cluster.slots("job")
    # The handler of 10 hears it within about a second of slot 20 (a control entry the
    # instance running it reads every second); 20 starts once it returned; and so on.
    assert 0 <= seen[at(10)] - (START + 20) <= 1.5
    assert 0 <= seen[at(20)] - (START + 30) <= 1.5
    assert ran[at(10)][0].end <= ran[at(20)][0].start <= ran[at(10)][0].end + 0.6  # type: ignore[operator]
    assert [len(ran[at(k)]) for k in (10, 20, 30, 40)] == [1, 1, 1, 1]
    assert skipped(cluster) == {}
    assert not cluster.kinds(EventKind.TAKEOVER)
    states = {r.slot_ms: r.state for r in cluster.store.history("job")}
    assert states[int((START + 10) * 1000)] is RunState.DONE  # ended done, not failed
    finished = [e for e in cluster.kinds(EventKind.FINISHED) if e.slot_id == at(10)]
    assert [e.detail for e in finished] == [
        f"cancelled: {at(20)} waits for it to end (overlap=cancel_other)"
    ]
    assert cluster.store.controls("cancel/") == {}  # the requests are gone


def test_cancel_other_a_handler_stopped_by_run_check_ends_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped: list[str] = []

    def handler(cluster: Cluster) -> Callable[[Run], None]:
        def work(run: Run) -> None:
            try:
                while True:
                    run.check()
                    cluster.clock.sleep(0.1)
            except Cancelled as exc:
                stopped.append(str(exc))
                raise

        return work

    with caplog.at_level(logging.WARNING):
        cluster = fleet("cancel_other", handler)
        cluster.run(25)
    assert stopped and stopped[0].startswith(f"{at(10)} attempt 1: {at(20)} waits")
    assert [e.slot_id for e in cluster.kinds(EventKind.FINISHED)] == [at(10)]
    assert not cluster.kinds(EventKind.FAILED)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    states = {r.slot_ms: r.state for r in cluster.store.history("job")}
    assert states[int((START + 10) * 1000)] is RunState.DONE
    assert states[int((START + 20) * 1000)] is RunState.RUNNING


def test_cancel_other_a_handler_that_ignores_it_keeps_the_new_slot_waiting() -> None:
    told: dict[str, bool] = {}

    def handler(cluster: Cluster) -> Callable[[Run], None]:
        work = cluster.handler(LONG)

        def deaf(run: Run) -> None:
            work(run)
            told[run.slot_id] = run.cancelled

        return deaf

    cluster = fleet("cancel_other", handler)
    cluster.run(50)
    ran = cluster.slots("job")
    assert told[at(10)] is True
    assert ran[at(10)][0].completed
    assert ran[at(10)][0].end <= ran[at(20)][0].start  # type: ignore[operator]
    assert skipped(cluster)[at(30)] == 3  # 20 waits already


def test_cancel_other_supersedes_a_crashed_run_instead_of_taking_it_over() -> None:
    cluster = fleet("cancel_other", jitter=0)
    cluster.run(21.5)  # 20 waits on every instance
    runner = cluster.spans[0].instance
    cluster.kill(runner)
    cluster.run(10)
    ran = cluster.slots("job")
    assert [s.attempt for s in ran[at(10)]] == [1]  # not taken over
    (new,) = ran[at(20)]
    assert new.attempt == 1 and new.instance != runner
    assert new.start - (START + 21.5) < 3 + 1  # once the lease lapsed
    states = {r.slot_ms: r.state for r in cluster.store.history("job")}
    assert states[int((START + 10) * 1000)] is RunState.ABANDONED


def test_buffer_one_waits_for_the_worker_holding_a_handed_off_run() -> None:
    """A dispatcher hands its slot off; the worker renews the lease while it works:
    the slot that comes meanwhile waits for the worker to finish, not for the send."""
    cluster = Cluster()
    sent: list[tuple[str, float]] = []
    done: list[tuple[str, float]] = []

    def dispatch(run: Run) -> None:
        run.hand_off(20)
        sent.append((run.slot_id, cluster.now()))
        token = run.token

        def worker() -> None:
            store, end = cluster.store, cluster.now() + LONG
            while cluster.now() < end and store.renew("job", token, 3):
                cluster.clock.sleep(1)
            store.finish("job", token, RunState.DONE)
            done.append((run.slot_id, cluster.now()))

        cluster.clock.spawn(worker, f"worker:{run.slot_id}")

    def setup(s: Scheduler) -> None:
        s.add_job(dispatch, name="job", every=EVERY, overlap="buffer_one", lease=3)

    for name in "abc":
        cluster.add(name, setup)
    cluster.run(45)
    assert [slot for slot, _ in sent] == [at(10), at(20)]
    assert done[0][0] == at(10) and done[0][1] <= sent[1][1] <= done[0][1] + 0.6
    assert skipped(cluster)[at(30)] == 3


def test_a_run_now_request_comes_after_the_slot_waiting_before_it() -> None:
    cluster = fleet("buffer_one")
    cluster.run(25)  # 10 runs, 20 waits
    requested = int(START + 27) * 1000 + 1  # a request made at 25 (anarchon trigger)
    cluster.store.set_control("run/job/r1", json.dumps({"slot_ms": requested}), 0)
    cluster.run(60)
    # The request's slot runs after 20, which came before it, and before the slots
    # that came after it; each slot once.
    assert started(cluster)[:4] == [at(10), at(20), f"job@{requested}", at(60)]
    assert [e.slot_id for e in cluster.kinds(EventKind.MANUAL)] == [f"job@{requested}"]
    one_at_a_time(cluster.spans)


class Winners(ClaimOnlyStore):
    """Picks the first claimer of each slot, as RabbitMQ does."""

    def __init__(self) -> None:
        super().__init__(namespace="n")

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        return [Claim(ClaimStatus.TAKEN, None) for _ in requests]


@pytest.mark.parametrize("policy", ["buffer_one", "buffer_all", "cancel_other"])
def test_a_claim_only_store_refuses_the_policies_that_wait_for_a_run_to_end(policy: str) -> None:
    s = Scheduler(Winners(), instance="a")
    with pytest.raises(ConfigurationError, match=f"job 'q': overlap='{policy}' needs a store"):
        s.add_job(print, name="q", every=10, overlap=policy)
    assert s.jobs == {}
    s.add_job(print, name="q", every=10, overlap="skip")
    assert list(s.jobs) == ["q"]


def test_an_unknown_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="overlap='queue': not a policy"):
        Scheduler("memory://").add_job(print, name="q", every=10, overlap="queue")


# -- the rule every instance applies, from the record ---------------------------


def runtime(policy: str) -> JobRuntime:
    return JobRuntime(Job("job", print, make_schedule(every=EVERY), rules=Rules(policy)))  # type: ignore[arg-type]


def slot(seconds: float) -> Slot:
    return Slot("job", datetime.fromtimestamp(START + seconds, timezone.utc))


def test_buffer_one_queues_the_first_slot_after_the_run_began() -> None:
    rt = runtime("buffer_one")
    # A run of slot 10 that began on time: slot 20 waits, 30 does not.
    assert rt.enqueue(slot(20), slot(10).ms, START + 10.3)
    assert not rt.enqueue(slot(30), slot(10).ms, START + 10.3)
    assert [s.id for s in rt.waiting] == [at(20)]
    # Slot 20 ran late, from 33 (it had waited): 30 came before it began, 40 waits.
    rt = runtime("buffer_one")
    assert not rt.enqueue(slot(30), slot(20).ms, START + 33.1)
    assert rt.enqueue(slot(40), slot(20).ms, START + 33.1)
    # An instance that sees only 50 come works out that 40 waits.
    rt = runtime("buffer_one")
    assert not rt.enqueue(slot(50), slot(20).ms, START + 33.1)
    assert [s.id for s in rt.waiting] == [at(40)]


def test_buffer_all_queues_every_slot_after_the_run_up_to_the_bound() -> None:
    rt = runtime("buffer_all")
    assert rt.enqueue(slot(30), slot(10).ms, None)
    assert [s.id for s in rt.waiting] == [at(20), at(30)]
    far = EVERY * (MAX_BUFFERED + 5)
    assert not rt.enqueue(slot(far), slot(10).ms, None)
    assert len(rt.waiting) == MAX_BUFFERED
    assert rt.waiting[-1].id == at(10 + EVERY * MAX_BUFFERED)
    rt.prune(slot(40).ms)  # the record reached 40: started, or superseded
    assert rt.waiting[0].id == at(50)


def test_skip_queues_nothing() -> None:
    rt = runtime("skip")
    assert not rt.enqueue(slot(20), slot(10).ms, START + 10)
    assert not rt.waiting


# -- allow_all: slots side by side, each with a lease of its own -------------------


def concurrent_at_most(spans: Sequence[Span], n: int) -> int:
    """The most runs of the job going on at once (each started once per slot)."""
    firsts = Counter(s.slot_id for s in spans if s.attempt == 1)
    assert [slot for slot, count in firsts.items() if count > 1] == []
    edges = sorted(
        [(s.start, 1) for s in spans] + [(s.end, -1) for s in spans if s.end is not None]
    )
    most = live = 0
    for _, step in edges:
        live += step
        most = max(most, live)
    assert most <= n
    return most


def test_allow_all_runs_every_slot_beside_the_runs_still_going_each_with_its_own_lease() -> None:
    cluster = fleet("allow_all")
    cluster.run(108)
    # Every slot starts at its time; each run takes 23 s, so three go on at once.
    assert started(cluster) == [at(k) for k in range(10, 101, 10)]
    assert skipped(cluster) == {}
    assert concurrent_at_most(cluster.spans, 3) == 3
    for span in cluster.spans:
        assert span.start - int(span.slot_id.rpartition("@")[2]) / 1000 < 2.5  # on time
    # Each run renewed a lease of its own: none was lost, none taken over.
    assert all(s.attempt == 1 and not s.lost for s in cluster.spans)
    assert cluster.kinds(EventKind.TAKEOVER) == []
    # Runs, events and the registry name the job, never a lane's record.
    assert {i.info["jobs"] for i in cluster.store.instances()} == {1}
    assert {s.job for s in cluster.spans} == {"job"}
    assert {e.job for e in cluster.events} == {"job"}


def test_allow_all_takes_over_the_run_of_a_killed_instance_while_the_others_go_on() -> None:
    cluster = fleet("allow_all", jitter=0)
    cluster.run(31.5)  # runs of 10, 20 and 30 go on
    victim = cluster.runner_of(at(20)).instance
    cluster.kill(victim)
    cluster.run(40)
    ran = cluster.slots("job")
    # The victim's runs are taken over (attempt 2, elsewhere), the others go on untouched.
    for slot, spans in ran.items():
        firsts = [s for s in spans if s.attempt == 1]
        assert len(firsts) == 1, slot
        if firsts[0].instance == victim:
            assert [(s.attempt, s.instance != victim) for s in spans[1:]] == [(2, True)], slot
        else:
            assert len(spans) == 1, slot
    assert started(cluster) == [at(k) for k in range(10, 71, 10)]
    concurrent_at_most([s for s in cluster.spans if not s.killed], 4)


def test_allow_all_skips_a_slot_only_when_its_lane_still_holds_a_run_sixteen_slots_older() -> None:
    from anarchon_core.slots import LANES

    cluster = first_runs_long("allow_all", LANES + 4.5)
    cluster.run(30)
    ran = started(cluster)
    # Slot 1's lane comes back with slot 17 (and 1 still runs): 17 alone is skipped.
    assert skipped(cluster) == {at(1 + LANES): 2}
    assert ran == [at(k) for k in range(1, 30) if k != 1 + LANES]


def test_allow_all_pause_covers_every_lane_and_resume_clears_them() -> None:
    cluster = fleet("allow_all")
    cluster.run(25)
    assert cluster.store.pause("job") is True
    assert cluster.store.paused().jobs == ("job",)
    cluster.run(30)
    assert started(cluster) == [at(10), at(20)]  # nothing after the pause
    assert cluster.store.resume("job") is True
    assert cluster.store.paused().jobs == ()
    cluster.run(20)
    assert at(60) in started(cluster) and at(70) in started(cluster)


def test_allow_all_with_a_limit_is_refused_naming_both() -> None:
    with pytest.raises(ConfigurationError, match="limit=3 with overlap='allow_all'"):
        Rules("allow_all", 3)  # type: ignore[arg-type]
