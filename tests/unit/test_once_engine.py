"""One-off runs as the engine runs them: memory store, fake clock, several instances.

A one-off is a store entry (job, due time) until a claim of its slot on the
job's own record settles it: it runs once across the instances, late within
its catch-up window after every instance was down, is reported missed past
that window, and is never run again by an instance that declares it anew.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from anarchon_core import ConfigurationError, Control, EventKind, Scheduler, UnknownJob, slot_id
from anarchon_core.store import ClaimOnlyStore, ClaimRequest, OnceEntry, OnceStore
from anarchon_core.stores.memory import MemoryStore
from tests.sim import START, Cluster


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(START + seconds, timezone.utc)


def _ms(seconds: float) -> int:
    return round((START + seconds) * 1000)


def _once(
    cluster: Cluster, name: str, seconds: float, duration: float = 0.2, **options: object
) -> Callable[[Scheduler], None]:
    def setup(s: Scheduler) -> None:
        s.once(name, _at(seconds), cluster.handler(duration), **options)  # type: ignore[arg-type]

    return setup


def _ran(cluster: Cluster, job: str) -> list[str]:
    return [span.slot_id for span in cluster.spans if span.job == job]


def test_a_one_off_runs_once_at_its_time_on_one_of_three_instances() -> None:
    cluster = Cluster()
    ids = {cluster.add(name, _once(cluster, "report", 30)).jobs["report"].name for name in "abc"}
    assert ids == {"report"}
    cluster.run(5)
    # Declared on three instances, kept once in the store until its time.
    assert cluster.store.pending_once() == [OnceEntry(_ms(30), "report")]
    assert _ran(cluster, "report") == []
    cluster.run(60)
    assert _ran(cluster, "report") == [slot_id("report", _at(30))]
    span = cluster.spans[0]
    assert START + 30 <= span.start <= START + 32  # at its time (plus jitter and the peers' wait)
    assert cluster.store.pending_once() == []
    won = [e for e in cluster.events if e.job == "report" and e.kind is EventKind.WON]
    assert len(won) == 1
    assert cluster.kinds("missed") == []


def test_scheduler_once_returns_the_slot_id_and_the_job_ends_after_it() -> None:
    cluster = Cluster()
    scheduler = cluster.add("a", lambda s: None)
    sid = scheduler.once("report", "2023-11-14T22:00:30+00:00", cluster.handler(0.1))
    assert sid == f"report@{_ms(30)}"
    assert scheduler.next_slots("report") == [_at(30)]
    cluster.run(40)
    assert scheduler.next_slots("report") == []
    assert _ran(cluster, "report") == [sid]


def test_every_instance_down_at_its_time_runs_it_once_late_within_the_window() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, _once(cluster, "report", 30, catch_up=600))
    cluster.run(5)
    for name in "abc":
        cluster.kill(name)
    cluster.run(295)  # every instance down at its time, and long after
    assert cluster.store.pending_once() == [OnceEntry(_ms(30), "report")]
    assert _ran(cluster, "report") == []
    for name in ("a2", "b2", "c2"):  # restarted, declaring the same one-off
        cluster.add(name, _once(cluster, "report", 30, catch_up=600))
    cluster.run(30)
    assert _ran(cluster, "report") == [slot_id("report", _at(30))]
    assert cluster.spans[0].start >= START + 300
    late = [e for e in cluster.events if e.job == "report" and e.kind is EventKind.CATCH_UP]
    assert [(e.instance in ("a2", "b2", "c2"), e.detail) for e in late] == [(True, "one-off")]
    assert cluster.store.pending_once() == []
    cluster.run(60)
    assert len(_ran(cluster, "report")) == 1


def test_past_its_catch_up_window_it_is_reported_missed_and_removed_never_run() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, _once(cluster, "report", 30, catch_up=60))
    cluster.run(5)
    for name in "abc":
        cluster.kill(name)
    cluster.run(295)
    for name in ("a2", "b2", "c2"):
        cluster.add(name, _once(cluster, "report", 30, catch_up=60))
    cluster.run(30)
    assert _ran(cluster, "report") == []
    missed = [e for e in cluster.events if e.job == "report" and e.kind is EventKind.MISSED]
    assert len(missed) == 1
    assert missed[0].slot_id == slot_id("report", _at(30))
    assert "past its catch-up" in missed[0].detail
    assert cluster.store.pending_once() == []
    # Declared again later: still past its window, not asked for again, nothing reported.
    cluster.add("d", _once(cluster, "report", 30, catch_up=60))
    cluster.run(10)
    assert cluster.store.pending_once() == []
    assert _ran(cluster, "report") == []
    assert len([e for e in cluster.events if e.kind is EventKind.MISSED]) == 1


def test_declaring_it_again_after_it_ran_does_not_run_it_again() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, _once(cluster, "report", 30, catch_up=3600))
    cluster.run(40)
    assert len(_ran(cluster, "report")) == 1
    for name in "abc":
        cluster.kill(name)
    cluster.run(10)
    # Restarted well within the window: the job's record says the one-off ran.
    for name in ("a2", "b2"):
        cluster.add(name, _once(cluster, "report", 30, catch_up=3600))
    cluster.run(30)
    assert len(_ran(cluster, "report")) == 1
    assert cluster.store.pending_once() == []
    # Even an entry written again by hand is settled by the record, not run.
    cluster.store.add_once([OnceEntry(_ms(30), "report")])
    cluster.run(5)
    assert len(_ran(cluster, "report")) == 1
    assert cluster.store.pending_once() == []


def test_the_scheduled_slot_right_after_a_one_off_does_not_supersede_it() -> None:
    """The job's slot at 60 s runs until 119.95 s; the one-off at 119.9 s must wait for it
    (busy), and the scheduled slot at 120 s must wait for the one-off: otherwise the record
    would move to 120 s first and the one-off would never run."""
    cluster = Cluster()

    def setup(s: Scheduler) -> None:
        s.add_job(cluster.handler(59.95), name="tick", every=60, jitter=0)

    for name in "abc":
        cluster.add(name, setup)
    cluster.store.add_once([OnceEntry(_ms(119.9), "tick", '{"by":"test"}')])
    cluster.run(200)
    ran = _ran(cluster, "tick")
    assert ran.count(f"tick@{_ms(119.9)}") == 1
    assert ran[:2] == [slot_id("tick", _at(60)), f"tick@{_ms(119.9)}"]
    assert len(ran) == len(set(ran))
    assert not [e for e in cluster.events if e.kind is EventKind.MISSED and "one-off" in e.detail]
    assert cluster.store.pending_once() == []


def test_entries_of_jobs_declared_elsewhere_are_left_and_do_not_starve_the_read() -> None:
    cluster = Cluster()
    others = [OnceEntry(_ms(1) + i, "elsewhere") for i in range(700)]
    cluster.store.add_once(others)
    for name in "ab":
        cluster.add(name, _once(cluster, "mine", 3))
    cluster.run(8)
    # Behind 700 entries due before it (more than one read holds), it ran on time.
    assert _ran(cluster, "mine") == [slot_id("mine", _at(3))]
    assert cluster.runner_of(slot_id("mine", _at(3))).start <= START + 5
    # The others are left to the instances that declare their job.
    assert len(cluster.store.pending_once(limit=1000)) == 700


def test_a_one_off_of_a_paused_job_waits_for_the_resume() -> None:
    cluster = Cluster()
    for name in "ab":
        cluster.add(name, _once(cluster, "report", 10, catch_up=600))
    cluster.run(2)
    cluster.all["a"].pause("report")
    cluster.run(20)
    assert _ran(cluster, "report") == []
    assert cluster.store.pending_once() == [OnceEntry(_ms(10), "report")]
    cluster.all["b"].resume("report")
    cluster.run(5)
    assert _ran(cluster, "report") == [slot_id("report", _at(10))]
    assert cluster.store.pending_once() == []


class _ClaimsOnly(ClaimOnlyStore):
    def claim_many(self, requests: object, owner: str) -> list:  # type: ignore[override,type-arg]
        return []


def test_a_store_that_keeps_no_one_offs_refuses_them_before_anything_is_declared() -> None:
    scheduler = Scheduler(_ClaimsOnly(namespace="x"))
    with pytest.raises(ConfigurationError, match="keeps no one-off runs"):
        scheduler.once("report", _at(30), lambda: None)
    assert scheduler.jobs == {}
    assert not isinstance(scheduler.store, OnceStore)
    assert ClaimRequest  # the claim-only store's contract, unchanged


def test_bad_input_is_refused_before_anything_is_declared() -> None:
    scheduler = Scheduler(MemoryStore())
    for at, said in (
        ("2027-01-01T00:00:00", "time zone"),
        ("tomorrow", "ISO 8601"),
        (datetime(2027, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=5), "millisecond"),
    ):
        with pytest.raises(ConfigurationError, match=said):
            scheduler.once("report", at, lambda: None)
    with pytest.raises(ConfigurationError):
        scheduler.once("", _at(30), lambda: None)
    assert scheduler.jobs == {}


def test_control_once_asks_lists_and_cancels_a_one_off() -> None:
    store = MemoryStore()
    control = Control(store)
    at = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    with pytest.raises(UnknownJob):
        control.once("report", at)
    sid = control.once("report", at, unrecorded=True, by="ops")
    assert sid == slot_id("report", at)
    assert control.once("report", at.isoformat(), unrecorded=True) == sid  # idempotent
    [entry] = control.pending_once()
    assert (entry.job, entry.due_ms) == ("report", int(at.timestamp() * 1000))
    assert control.pending_once("other") == []
    with pytest.raises(ConfigurationError, match="in the past"):
        control.once("report", at - timedelta(hours=2), unrecorded=True)
    with pytest.raises(ConfigurationError, match="time zone"):
        control.once("report", "2030-01-01T00:00:00", unrecorded=True)
    assert control.cancel_once("report", at) is True
    assert control.cancel_once("report", at) is False
    assert control.pending_once() == []
    # A job whose record is at that slot or later already: refused.
    store.claim("report", int(at.timestamp() * 1000), "x", 10)
    with pytest.raises(ConfigurationError, match="never run"):
        control.once("report", at)
