"""Runtime pause and resume as the engine obeys them: memory store, fake clock, instances.

A pause lives in the shared store and is read inside each claim's atomic step,
so every instance obeys it from its next claim on, whichever instance (or
admin script) set it. The engine answers a paused claim with a ``paused``
event and moves on to the job's next slot: nothing runs, and nothing is
owed once the job resumes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone

import pytest

import anarchon_core
from anarchon_core import (
    ClaimStatus,
    Control,
    EventKind,
    Paused,
    RunState,
    Scheduler,
    UnknownJob,
    slot_id,
)
from tests.sim import START, Cluster


def _sid(job: str, seconds: float) -> str:
    """The slot id of ``job`` at ``START + seconds``."""
    return slot_id(job, datetime.fromtimestamp(START + seconds, timezone.utc))


def _every(
    cluster: Cluster, seconds: float, duration: float, *names: str, **options: object
) -> Callable[[Scheduler], None]:
    def setup(s: Scheduler) -> None:
        for name in names or ("job",):
            s.add_job(cluster.handler(duration), name=name, every=seconds, **options)  # type: ignore[arg-type]

    return setup


def _runs_per_slot(cluster: Cluster, job: str) -> Counter[str]:
    return Counter(span.slot_id for span in cluster.spans if span.job == job)


def _paused_slots(cluster: Cluster, instance: str, job: str = "job") -> set[str | None]:
    return {
        e.slot_id
        for e in cluster.events
        if e.kind is EventKind.PAUSED and e.instance == instance and e.job == job
    }


def test_pause_on_one_instance_stops_every_instance_and_resume_runs_the_next_slot_once() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, _every(cluster, 1, 0.2))
    cluster.run(3.5)
    before = _runs_per_slot(cluster, "job")
    assert before == Counter({_sid("job", k): 1 for k in (1, 2, 3)})
    assert cluster.kinds("paused") == []

    assert cluster.all["a"].pause("job") is True
    # Every instance sees the same pause, through the store.
    for scheduler in cluster.all.values():
        assert scheduler.paused() == Paused(namespace=False, jobs=("job",))
    cluster.run(4)  # slots 4, 5, 6 and 7 come while paused

    # From the next slot on, no handler ran on any instance...
    assert _runs_per_slot(cluster, "job") == before
    assert len(cluster.spans) == 3
    # ...and each instance reported each of those slots as paused.
    paused = {_sid("job", k) for k in (4, 5, 6, 7)}
    for name in "abc":
        assert _paused_slots(cluster, name) == paused, name
        assert cluster.all[name].stats.get("paused") == 4
    assert not {e.slot_id for e in cluster.kinds("won")} & paused
    assert cluster.store.state("job").slot_ms == int((START + 3) * 1000)  # type: ignore[union-attr]

    # Resumed from another instance, half a second before slot 8.
    assert cluster.all["b"].resume("job") is True
    assert cluster.all["c"].paused() == Paused(namespace=False, jobs=())
    cluster.run(1)
    # Right after resume: slot 8 alone ran, once; no burst of the slots passed meanwhile.
    assert [span.slot_id for span in cluster.spans[3:]] == [_sid("job", 8)]
    cluster.run(3)
    runs = _runs_per_slot(cluster, "job")
    assert runs == Counter({_sid("job", k): 1 for k in (1, 2, 3, 8, 9, 10, 11)})
    assert not paused & set(runs)
    # No instance reported a paused slot after the resume.
    assert {e.slot_id for e in cluster.kinds("paused")} == paused
    assert [r.state for r in cluster.store.history("job")] == [RunState.DONE] * 7


def test_pause_is_answered_by_the_instances_own_claims_not_by_a_local_flag() -> None:
    """A pause set in the store by anyone (an admin script) is obeyed by every instance."""
    cluster = Cluster()
    for name in "ab":
        cluster.add(name, _every(cluster, 1, 0.1))
    cluster.run(1.5)
    assert Control(cluster.store).pause("job") is True
    cluster.run(2)
    assert len(cluster.spans) == 1
    assert {e.instance for e in cluster.kinds("paused")} == {"a", "b"}
    # A claim of the store answers paused, with the last record as its holder.
    claim = cluster.store.claim("job", int((START + 60) * 1000), "admin", 5)
    assert claim.status is ClaimStatus.PAUSED
    assert claim.holder is not None and claim.holder.slot_ms == int((START + 1) * 1000)
    assert Control(cluster.store).resume("job") is True
    cluster.run(1)
    assert [span.slot_id for span in cluster.spans] == [_sid("job", 1), _sid("job", 4)]


def test_namespace_pause_stops_every_job_and_keeps_the_jobs_paused_by_name() -> None:
    cluster = Cluster()
    for name in "ab":
        cluster.add(name, _every(cluster, 1, 0.1, "one", "two"))
    a, b = cluster.all["a"], cluster.all["b"]
    cluster.run(2.5)
    assert _runs_per_slot(cluster, "one") == Counter({_sid("one", 1): 1, _sid("one", 2): 1})
    assert _runs_per_slot(cluster, "two") == Counter({_sid("two", 1): 1, _sid("two", 2): 1})

    # The whole namespace: both jobs stop.
    assert a.pause() is True
    assert a.pause() is False  # already paused
    assert b.paused() == Paused(namespace=True, jobs=())
    assert b.paused().covers("one") and b.paused().covers("two")
    cluster.run(3)  # slots 3, 4, 5
    assert len(cluster.spans) == 4
    stopped = {e.slot_id for e in cluster.kinds("paused")}
    assert stopped == {_sid(job, k) for job in ("one", "two") for k in (3, 4, 5)}

    # Resumed: both run again from the next slot.
    assert b.resume() is True
    assert b.resume() is False  # not paused any more
    cluster.run(2)  # slots 6 and 7
    assert _runs_per_slot(cluster, "one") == Counter({_sid("one", k): 1 for k in (1, 2, 6, 7)})
    assert _runs_per_slot(cluster, "two") == Counter({_sid("two", k): 1 for k in (1, 2, 6, 7)})

    # A job paused by name stays paused when the namespace is paused and resumed.
    assert a.pause("one") is True
    assert a.pause() is True
    assert a.paused() == Paused(namespace=True, jobs=("one",))
    cluster.run(2)  # slots 8 and 9: nothing
    assert b.resume() is True
    assert b.paused() == Paused(namespace=False, jobs=("one",))
    assert not b.paused().covers("two")
    cluster.run(3)  # slots 10, 11, 12: "two" runs, "one" does not
    assert _runs_per_slot(cluster, "one") == Counter({_sid("one", k): 1 for k in (1, 2, 6, 7)})
    two = _runs_per_slot(cluster, "two")
    assert two == Counter({_sid("two", k): 1 for k in (1, 2, 6, 7, 10, 11, 12)})
    assert {_sid("one", k) for k in (10, 11, 12)} <= {e.slot_id for e in cluster.kinds("paused")}

    # Resuming the job itself lets it run again.
    assert a.resume("one") is True
    assert a.paused() == Paused(namespace=False, jobs=())
    cluster.run(1)
    assert _runs_per_slot(cluster, "one")[_sid("one", 13)] == 1
    assert _runs_per_slot(cluster, "two")[_sid("two", 13)] == 1


def test_a_slot_running_when_the_pause_lands_finishes_normally() -> None:
    cluster = Cluster()
    for name in "abc":
        # The run lasts longer than its lease: it must keep renewing while paused.
        cluster.add(name, _every(cluster, 10, 5), lease=3, jitter=0.5)
    cluster.run(11)
    (running,) = cluster.spans
    assert running.slot_id == _sid("job", 10) and running.end is None
    assert cluster.all[running.instance].pause("job") is True
    cluster.run(14)  # the run ends at about 15; slot 20 comes while paused
    assert running.end is not None
    assert running.end - running.start == pytest.approx(5, abs=0.01)
    assert not running.lost
    assert len(cluster.spans) == 1  # slot 20 did not run
    assert {e.slot_id for e in cluster.kinds("paused")} == {_sid("job", 20)}
    assert cluster.kinds("takeover") == []
    assert cluster.kinds("lost") == []
    assert cluster.kinds("finish_refused") == []
    finished = cluster.kinds("finished")
    assert [(e.slot_id, e.instance) for e in finished] == [(running.slot_id, running.instance)]
    history = cluster.store.history("job")
    assert [(r.slot_ms, r.attempt, r.state) for r in history] == [
        (int((START + 10) * 1000), 1, RunState.DONE)
    ]
    assert history[0].ended_at is not None


def test_a_run_in_progress_when_paused_is_still_taken_over_if_its_runner_dies() -> None:
    """The pause refuses slots not yet started; the one going on keeps its backups."""
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, _every(cluster, 10, 6), lease=3, jitter=0.5)
    cluster.run(11)
    (first,) = cluster.spans
    cluster.all[first.instance].pause("job")
    cluster.kill(first.instance)
    cluster.run(8)
    attempts = [(s.slot_id, s.attempt) for s in cluster.spans if not s.killed]
    assert attempts[-1] == (first.slot_id, 2)
    second = cluster.spans[-1]
    assert second.instance != first.instance
    cluster.run(12)  # attempt 2 ends; slot 20 and 30 come while paused
    assert second.end is not None and not second.lost
    assert {s.slot_id for s in cluster.spans} == {first.slot_id}
    assert [(r.attempt, r.state) for r in cluster.store.history("job")] == [
        (2, RunState.DONE),
        (1, RunState.LOST),
    ]
    assert _sid("job", 20) in {e.slot_id for e in cluster.kinds("paused")}


def test_pausing_an_unknown_name_raises_and_a_declared_job_can_be_paused_before_its_first_run() -> (
    None
):
    cluster = Cluster()
    a = cluster.add("a", _every(cluster, 10, 0.1, "fresh"))
    b = cluster.add("b", lambda s: None)  # declares nothing

    with pytest.raises(UnknownJob, match="nope") as raised:
        a.pause("nope")
    assert isinstance(raised.value, anarchon_core.AnarchonError)
    assert isinstance(raised.value, LookupError)
    with pytest.raises(UnknownJob):
        b.pause("fresh")  # neither declared on b nor recorded yet
    assert a.paused() == Paused(namespace=False, jobs=())

    # Declared here, never run: it can be paused before its first slot.
    assert cluster.store.state("fresh") is None
    assert a.pause("fresh") is True
    assert a.pause("fresh") is False
    assert b.paused() == Paused(namespace=False, jobs=("fresh",))
    cluster.run(25)  # slots 10 and 20
    assert cluster.spans == []
    assert {e.slot_id for e in cluster.kinds("paused")} == {_sid("fresh", 10), _sid("fresh", 20)}
    assert cluster.store.state("fresh") is None  # a paused claim writes nothing

    # Its pause mark makes it known to every instance, declared or not.
    assert b.resume("fresh") is True
    cluster.run(10)
    assert [s.slot_id for s in cluster.spans] == [_sid("fresh", 30)]
    assert b.pause("fresh") is True  # recorded now, so b may pause it too
    with pytest.raises(UnknownJob):
        b.pause("nope")
    assert b.paused() == Paused(namespace=False, jobs=("fresh",))
