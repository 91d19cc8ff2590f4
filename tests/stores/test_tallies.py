"""Tallies on every store that keeps control entries: written, read back and matched by
the instances that waited, removed on stop, and swept once stale.

The engine's tallies (``anarchon_core.engine.tallies``) are control entries
(``tally/<instance>``) written by compare-and-set: these tests drive two schedulers'
tallies on the real store (the schedulers are not started: their claims and ends are
told to the tallies directly), so that each store's handling of the entry (its JSON
value, its versions, its removal) is what is checked. How the engine uses them, with
real claims, is in ``tests/unit/test_tallies.py``.
"""

from __future__ import annotations

import json

import pytest

from anarchon_core import Run, Scheduler, Store
from anarchon_core.engine.tallies import STALE_AFTER, TALLIES, Tallies, group_key
from tests.stores.conftest import StoreFactory

JOBS = 12
SLOT_MS = 1_800_000_000_000


def _noop(run: Run) -> None:
    return None


def _scheduler(store: Store, name: str, jobs: int = JOBS) -> Scheduler:
    scheduler = Scheduler(store, instance=name, jitter=0)
    for k in range(jobs):
        scheduler.add_job(_noop, name=f"job{k:02d}", every=10)
    return scheduler


def _tallies(scheduler: Scheduler) -> Tallies:
    return scheduler._loop._ctx.tallies  # type: ignore[attr-defined,no-any-return]


def _runtimes(scheduler: Scheduler):  # type: ignore[no-untyped-def]
    return sorted(scheduler._table.runtimes(), key=lambda rt: rt.job.name)  # type: ignore[attr-defined]


@pytest.fixture
def tally_store(kind: str, make_store: StoreFactory) -> Store:
    if kind == "rabbitmq":
        pytest.skip("RabbitMQ is claim-only: it keeps no control entries, so no tallies")
    return make_store()


def test_a_tally_written_on_the_store_settles_exactly_the_jobs_it_names(
    tally_store: Store,
) -> None:
    a, b = _scheduler(tally_store, "a"), _scheduler(tally_store, "b")
    writer = _tallies(a)
    assert writer.kept
    # a claimed every job's slot first; it won them all, and all but one ended.
    for token, rt in enumerate(_runtimes(a), start=1):
        writer.claimed(rt, token, True, group_key(SLOT_MS, rt, 0.0))
        if rt.job.name != "job00":
            writer.ended(rt.job.name, token, True)
    writer._groups[group_key(SLOT_MS, _runtimes(a)[0], 0.0)].early_at = 0.0  # its time came
    writer.write()
    entries = tally_store.controls(TALLIES)
    assert set(entries) == {TALLIES + "a"}
    groups = json.loads(entries[TALLIES + "a"][1])["groups"]
    assert list(groups.values()) == [[JOBS - 1, groups[next(iter(groups))][1], [], ["job00"]]]

    # b waited for a for every job: all but the one still going are settled, and that
    # one is waited for (a little) before its record is read.
    waited = _runtimes(b)
    for rt in waited:
        rt.preferred = "a"
    told = _tallies(b).read([(rt, group_key(SLOT_MS, rt, 0.0)) for rt in waited])
    assert sorted(rt.job.name for rt in waited if id(rt) in told.settled) == [
        f"job{k:02d}" for k in range(1, JOBS)
    ]
    assert set(told.settled.values()) == {"a"}
    assert [rt.job.name for rt in waited if id(rt) in told.going] == ["job00"]
    # One job a did not claim among those b waited for: nothing of the group is settled.
    c = _scheduler(tally_store, "c", JOBS + 1)
    more = _runtimes(c)
    for rt in more:
        rt.preferred = "a"
    told = _tallies(c).read([(rt, group_key(SLOT_MS, rt, 0.0)) for rt in more])
    assert told.settled == {} and told.going == {}

    # a stops: its tally goes.
    writer.withdraw()
    assert TALLIES + "a" not in tally_store.controls(TALLIES)


def test_a_stale_tally_is_swept_and_a_fresh_one_kept(tally_store: Store) -> None:
    b = _scheduler(tally_store, "b")
    now = b.clock.time()
    tally_store.set_control(TALLIES + "gone", json.dumps({"at": now - STALE_AFTER - 5}), 0)
    tally_store.set_control(TALLIES + "here", json.dumps({"at": now, "groups": {}}), 0)
    rt = _runtimes(b)[0]
    rt.preferred = "here"
    assert _tallies(b).read([(rt, group_key(SLOT_MS, rt, 0.0))]).settled == {}
    assert set(tally_store.controls(TALLIES)) == {TALLIES + "here"}
