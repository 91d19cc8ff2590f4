"""The due-time index: every job comes up when its current time passes, once, and no other."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from anarchon_core.due import DueIndex

JOBS = [f"j{i}" for i in range(6)]

#: An operation: move a job's time (None: nothing due), or let time pass and pop.
operations = st.lists(
    st.one_of(
        st.tuples(st.just("move"), st.sampled_from(JOBS), st.none() | st.integers(0, 40)),
        st.tuples(st.just("pop"), st.just(""), st.integers(0, 10)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_pop_due_gives_exactly_the_jobs_whose_time_passed(ops: list[tuple[str, str, int]]) -> None:
    index, times, now = DueIndex(), dict.fromkeys(JOBS), 0
    for op, job, value in ops:
        if op == "move":
            times[job] = value
            index.schedule(job, value)
        else:
            now += value
            due = index.pop_due(now, times.get)
            expected = {j for j, t in times.items() if t is not None and t <= now}
            assert sorted(due) == sorted(expected)
            for job in due:  # dealt with: the engine moves them on (or drops them)
                times[job] = None
            next_at = index.next_at()
            pending = [t for t in times.values() if t is not None]
            if pending:
                # Never later than the earliest job: the engine wakes up in time.
                assert next_at is not None and next_at <= min(pending)


def test_a_job_moved_later_comes_up_at_its_new_time_only() -> None:
    index, times = DueIndex(), {"a": 5.0}
    index.schedule("a", 5.0)
    times["a"] = 9.0
    index.schedule("a", 9.0)  # later: the entry at 5 stays, and is put back when it comes up
    assert index.pop_due(6.0, times.get) == []
    assert index.next_at() == 9.0
    assert index.pop_due(9.0, times.get) == ["a"]
    assert index.pop_due(100.0, times.get) == [] and len(index) == 0


def test_a_job_moved_earlier_comes_up_once() -> None:
    index, times = DueIndex(), {"a": 9.0}
    index.schedule("a", 9.0)
    times["a"] = 2.0
    index.schedule("a", 2.0)
    assert index.pop_due(10.0, times.get) == ["a"]
    assert index.pop_due(10.0, times.get) == []
