"""Tallies: the instances that waited for a slot's preferred instance take its word that the
slot was won and its run ended, instead of reading the record, and only then.

Each test runs real schedulers on one shared memory store in virtual time, and counts
the records the instances read (``states``) besides what ran.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

import pytest

from anarchon_core import EventKind, JobState, Run, RunState, Scheduler
from anarchon_core.engine import tallies
from anarchon_core.engine.tallies import (
    MAX_OPEN,
    STALE_AFTER,
    TALLIES,
    _Group,
    decode_key,
    digest,
    encode_key,
)
from anarchon_core.stores.memory import MemoryStore
from tests.sim import START, Cluster

JOBS = 30
NAMES = ("i0", "i1", "i2")


class _ReadCounted(MemoryStore):
    """The shared store, counting the records read by job."""

    def __init__(self, clock: object) -> None:
        super().__init__(clock=clock)  # type: ignore[arg-type]
        self.read: Counter[str] = Counter()

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        jobs = list(jobs)
        self.read.update(jobs)
        return super().states(jobs)


def _cluster() -> tuple[Cluster, _ReadCounted]:
    cluster = Cluster()
    store = _ReadCounted(cluster.clock)
    cluster.store = store
    return cluster, store


def _fleet(
    cluster: Cluster,
    ran: Counter[tuple[str, float]],
    names: Iterable[str] = NAMES,
    long: dict[str, float] | None = None,
    extra: dict[str, list[str]] | None = None,
) -> None:
    """``JOBS`` jobs every 10 s on each instance; ``long``: jobs whose handler works that
    many seconds; ``extra``: jobs only some instances declare."""

    def handler(run: Run) -> None:
        ran[(run.job, run.slot.timestamp())] += 1
        seconds = (long or {}).get(run.job)
        if seconds:
            cluster.handler(seconds)(run)

    for name in names:

        def setup(scheduler: Scheduler, name: str = name) -> None:
            jobs = [f"job{k:02d}" for k in range(JOBS)] + (extra or {}).get(name, [])
            for job in jobs:
                scheduler.add_job(handler, name=job, every=10, jitter=0)

        cluster.add(name, setup)


def _ticks(ran: Counter[tuple[str, float]], after: float) -> list[float]:
    return sorted({at for _, at in ran if at > after})


@pytest.mark.parametrize("work", [0.0, 1.4], ids=["at-once", "past-the-deferral"])
def test_the_instances_that_waited_read_no_record_of_a_slot_won_and_ended(work: float) -> None:
    """Handlers that return at once, or still run when the instances that waited come to
    their slots (1.4 s of a 1 s deferral): those are waited for a little, and settled
    once they end."""
    cluster, store = _cluster()
    ran: Counter[tuple[str, float]] = Counter()
    _fleet(cluster, ran, long={f"job{k:02d}": work for k in range(JOBS)})
    cluster.run(25)  # the first ticks, while they learn of each other
    store.read.clear()
    settled = len(cluster.events)
    cluster.run(30)  # three more ticks
    ticks = _ticks(ran, START + 25)
    assert len(ticks) == 3
    assert all(ran[(f"job{k:02d}", t)] == 1 for k in range(JOBS) for t in ticks)
    # Without the tallies, each slot's record is read by the two instances that waited.
    assert sum(store.read.values()) == 0, store.read.most_common(5)
    told = [
        e
        for e in cluster.events[settled:]
        if e.kind == EventKind.TAKEN and "won and ended by" in e.detail
    ]
    assert len(told) == 2 * JOBS * len(ticks)
    assert not cluster.kinds(EventKind.MISSED) and not cluster.kinds(EventKind.CATCH_UP)
    # Each instance keeps one tally, the slot times it claimed first.
    tallies = store.controls(TALLIES)
    assert set(tallies) == {TALLIES + name for name in NAMES}
    for _, text in tallies.values():
        groups = json.loads(text)["groups"]
        assert groups and all(
            (opened, going) == ([], []) for _, _, opened, going in groups.values()
        )


def test_a_job_the_preferred_instance_does_not_declare_is_read_and_runs() -> None:
    """A tally that does not cover every job waited for settles none of its group: a job
    only the waiting instances declare is claimed by them, as without tallies."""
    cluster, store = _cluster()
    ran: Counter[tuple[str, float]] = Counter()
    extras = [f"only{k}" for k in range(6)]
    _fleet(cluster, ran, extra={"i1": extras, "i2": extras})
    cluster.run(25)
    store.read.clear()
    cluster.run(40)
    ticks = _ticks(ran, START + 25)
    assert len(ticks) == 4
    for job in [f"job{k:02d}" for k in range(JOBS)] + extras:
        assert [ran[(job, t)] for t in ticks] == [1] * len(ticks), job
    # i0 is preferred for some of the extra jobs' slots and never claims them: the
    # groups those fall in are read and claimed.
    assert any(store.read[job] for job in extras)
    assert not cluster.kinds(EventKind.MISSED)


def test_a_run_still_going_is_named_open_read_and_backed_up() -> None:
    """A tally is written once half the deferral passed, the run still going named open:
    the instances that waited read that record alone, back the run up, and take it
    over when its instance dies."""
    cluster, store = _cluster()
    ran: Counter[tuple[str, float]] = Counter()
    _fleet(cluster, ran, long={"job00": 4.0})
    cluster.run(25)
    store.read.clear()
    cluster.run(20)
    # The short runs' records are not read; the long one's is, by the instances that
    # waited (and then by their backups' checks).
    assert store.read["job00"] >= 2
    assert sum(n for job, n in store.read.items() if job != "job00") == 0, store.read
    # The instance that runs job00's slot of :50 dies in the middle: a backup takes over.
    cluster.run(max(0.0, START + 50.5 - cluster.now()))
    (span,) = [s for s in cluster.spans if s.job == "job00" and s.start >= START + 50]
    cluster.kill(span.instance)
    cluster.run(25)
    again = [s for s in cluster.slots("job00")[span.slot_id] if s.attempt == 2]
    assert again and again[0].instance != span.instance, cluster.slots("job00")[span.slot_id]
    assert any(e.slot_id == span.slot_id for e in cluster.kinds(EventKind.TAKEOVER))


def test_runs_too_many_to_name_are_waited_for_and_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group with more runs still going than a tally names says only that: the instances
    that waited wait for the end of them all, then settle them without a read."""
    monkeypatch.setattr(tallies, "MAX_OPEN", 3)  # each instance is preferred for about 10
    cluster, store = _cluster()
    ran: Counter[tuple[str, float]] = Counter()
    _fleet(cluster, ran, long={f"job{k:02d}": 1.4 for k in range(JOBS)})
    cluster.run(25)
    store.read.clear()
    cluster.run(30)
    ticks = _ticks(ran, START + 25)
    assert all(ran[(f"job{k:02d}", t)] == 1 for k in range(JOBS) for t in ticks)
    assert sum(store.read.values()) == 0, store.read.most_common(5)
    written = [json.loads(text)["groups"] for _, text in store.controls(TALLIES).values()]
    assert all(going == [] for groups in written for *_, going in groups.values())


def test_an_instance_that_dies_with_its_runs_going_is_waited_for_no_longer_than_a_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its tally, written with its runs going, is its last: the instances that waited read
    its share's records one peer margin past their time, back those runs up and take
    them over once their leases lapse. None missed."""
    monkeypatch.setattr(tallies, "MAX_OPEN", 3)  # its runs too many to name: all waited for
    cluster, store = _cluster()
    ran: Counter[tuple[str, float]] = Counter()
    _fleet(cluster, ran, long={f"job{k:02d}": 3.0 for k in range(JOBS)})
    cluster.run(25)
    cluster.run(max(0.0, START + 30.7 - cluster.now()))  # i2's tally says its runs go
    store.read.clear()
    (_, text) = store.controls(TALLIES)[TALLIES + "i2"]
    groups = json.loads(text)["groups"]
    assert any(going is None for *_, going in groups.values())
    cluster.kill("i2")
    cluster.run(max(0.0, START + 31.9 - cluster.now()))
    assert sum(store.read.values()) == 0, "read before the margin passed"
    cluster.run(max(0.0, START + 32.3 - cluster.now()))
    assert store.read, "still waiting past the margin"
    cluster.run(30)
    slot = START + 30
    share = [s for s in cluster.spans if s.instance == "i2" and slot <= s.start < slot + 1]
    assert share
    for span in share:
        again = [s for s in cluster.slots(span.job)[span.slot_id] if s.attempt == 2]
        assert again and again[0].instance != "i2", span
    assert all(ran[(f"job{k:02d}", slot)] >= 1 for k in range(JOBS))
    assert not cluster.kinds(EventKind.MISSED)


def test_a_preferred_instance_that_dies_before_its_runs_end_leaves_no_mark() -> None:
    """Its slots are read, backed up and taken over as without tallies: none missed."""
    cluster, store = _cluster()
    ran: Counter[tuple[str, float]] = Counter()
    _fleet(cluster, ran, long={f"job{k:02d}": 3.0 for k in range(JOBS)})
    cluster.run(25)
    cluster.run(max(0.0, START + 30.2 - cluster.now()))  # i2 claimed its share of :30
    store.read.clear()
    cluster.kill("i2")
    cluster.run(30)
    slot = START + 30
    assert all(ran[(f"job{k:02d}", slot)] >= 1 for k in range(JOBS))
    lost = [job for job in (f"job{k:02d}" for k in range(JOBS)) if store.read[job]]
    assert lost, "the dead instance's share was never read"
    assert not cluster.kinds(EventKind.MISSED)


def test_a_stopped_instance_removes_its_mark_and_a_stale_one_is_swept() -> None:
    cluster, store = _cluster()
    ran: Counter[tuple[str, float]] = Counter()
    _fleet(cluster, ran)
    cluster.run(25)
    assert TALLIES + "i2" in store.controls(TALLIES)
    cluster.terminate("i2")
    assert TALLIES + "i2" not in store.controls(TALLIES)
    # A tally left by an instance gone long ago (killed) is swept by a reader.
    old = json.dumps({"at": cluster.now() - STALE_AFTER - 1, "groups": {}})
    store.set_control(TALLIES + "gone", old, 0)
    cluster.run(30)
    assert TALLIES + "gone" not in store.controls(TALLIES)


def test_a_groups_digest_is_its_names_in_any_order_and_too_many_open_say_nothing() -> None:
    names = [f"job{k}" for k in range(10)]
    assert digest(names) == digest(reversed(names)) != digest(names[1:])
    group = _Group(first=0.0, early_at=0.5, settled=2, sum=digest(["a", "b"]))
    group.open.add("c")
    group.pending.add((7, "d"))
    assert group.encoded() == [2, format(digest(["a", "b"]), "x"), ["c"], ["d"]]
    group.pending.update((k, f"y{k}") for k in range(MAX_OPEN))
    assert group.encoded()[3] is None  # too many going: the readers wait for them all
    group.open.update(f"x{k}" for k in range(MAX_OPEN))
    assert group.encoded()[2] is None  # too many open: the readers read the whole group


def test_slots_handed_off_are_settled_once_their_instance_sees_them_ended() -> None:
    """A dispatcher hands each slot off and a worker picks it up and ends it: the instance
    that handed it off reads its record once (its backup of the hand-off, as always), and
    its tally then says so; the instances that waited read nothing."""
    cluster, store = _cluster()
    sent: Counter[tuple[str, float]] = Counter()

    def dispatch(run: Run) -> None:
        run.hand_off(5)
        sent[(run.job, run.slot.timestamp())] += 1
        # The worker: picks the work up with the ticket's token, and ends it.
        assert store.renew(run.job, run.token, 10)
        assert store.finish(run.job, run.token, RunState.DONE)

    def setup(scheduler: Scheduler) -> None:
        for k in range(JOBS):
            scheduler.add_job(dispatch, name=f"job{k:02d}", every=10, jitter=0)

    for name in NAMES:  # dispatchers run inline, as beat's and Dramatiq's hosts do
        cluster.add(name, setup, inline=True)
    cluster.run(25)
    store.read.clear()
    cluster.run(30)
    ticks = _ticks(sent, START + 25)
    assert len(ticks) == 3
    assert all(sent[(f"job{k:02d}", t)] == 1 for k in range(JOBS) for t in ticks)
    # One read per slot: its own instance's check of the hand-off (without the tallies,
    # the two instances that waited read it too).
    assert sum(store.read.values()) == JOBS * len(ticks), store.read.most_common(3)


def test_a_groups_key_reads_back_exactly_as_written() -> None:
    for key in [(1_700_000_000_000, 0.0, 1.0, 0.0), (5, 0.1, 0.30000000000000004, 0.5)]:
        assert decode_key(encode_key(key)) == key
    assert decode_key("1/2/3") is None and decode_key("a/0/1/0") is None
