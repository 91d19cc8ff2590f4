"""anarchon_core.testing: users' own tests of which slots their jobs run, in virtual time."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from anarchon_core import ConfigurationError, Run, Scheduler
from anarchon_core.testing import Ran, Simulation

NEW_YORK = "America/New_York"
#: The days of 2024 whose clocks change in New York, midnight to midnight.
SPRING = ("2024-03-10T00:00:00-05:00", "2024-03-11T00:00:00-04:00")
FALL = ("2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00")
ROOT = Path(__file__).resolve().parents[2]


def declare(**schedule: Any) -> Callable[[Scheduler], None]:
    """Declarations as an application writes them: a function given the scheduler."""

    def declare_jobs(cron: Scheduler) -> None:
        cron.add_job(lambda: None, name="job", **schedule)

    return declare_jobs


def local(ran: list[Ran]) -> list[str]:
    return [r.local.isoformat() for r in ran]


def once_each(ran: list[Ran]) -> bool:
    """Every slot ran once, as its first attempt, to its end."""
    return len({r.slot for r in ran}) == len(ran) and all(
        r.attempt == 1 and r.outcome == "done" for r in ran
    )


# -- daylight saving time ----------------------------------------------------------


@pytest.mark.parametrize(
    ("day", "cron", "expected"),
    [
        # 02:30 does not exist: the slot fires at the gap's end.
        (SPRING, "30 2 * * *", ["2024-03-10T03:00:00-04:00"]),
        # 01:30 happens twice: the slot fires at the first only.
        (FALL, "30 1 * * *", ["2024-11-03T01:30:00-04:00"]),
    ],
    ids=["spring-forward", "fall-back"],
)
def test_a_fixed_time_job_runs_once_on_a_day_the_clocks_change(
    day: tuple[str, str], cron: str, expected: list[str]
) -> None:
    sim = Simulation(declare(cron=cron, timezone=NEW_YORK), start=day[0], instances=2)
    ran = sim.run(until=day[1])
    assert local(ran) == expected
    assert once_each(ran)


@pytest.mark.parametrize(("day", "hours"), [(SPRING, 23), (FALL, 25)], ids=["spring", "fall"])
def test_an_hourly_job_runs_in_every_real_hour_of_a_day_the_clocks_change(
    day: tuple[str, str], hours: int
) -> None:
    sim = Simulation(declare(cron="30 * * * *", timezone=NEW_YORK), start=day[0], instances=2)
    ran = sim.run(until=day[1])
    assert len(ran) == hours
    assert once_each(ran)
    gaps = {later.slot - earlier.slot for earlier, later in itertools.pairwise(ran)}
    assert gaps == {timedelta(hours=1)}
    walls = [r.local.strftime("%H:%M %Z") for r in ran]
    if hours == 23:
        assert "02:30 EST" not in walls and "02:30 EDT" not in walls
    else:
        assert walls[1:3] == ["01:30 EDT", "01:30 EST"]


# -- start= and end= ---------------------------------------------------------------------


def test_start_and_end_bound_the_slots_both_included() -> None:
    sim = Simulation(start="2024-05-01T00:00:00+00:00")
    sim.add_job(
        lambda: None,
        name="campaign",
        every=900,
        start="2024-05-01T10:05:00+00:00",  # off the grid: the grid does not move
        end="2024-05-01T11:00:00+00:00",
    )
    sim.add_job(
        lambda: None,
        name="reminder",
        cron="0 9 * * *",
        timezone=NEW_YORK,
        start="2024-05-02T00:00:00-04:00",
        end="2024-05-04T09:00:00-04:00",
    )
    ran = sim.run(until="2024-05-08T00:00:00+00:00")
    assert [r.local.strftime("%H:%M") for r in ran if r.job == "campaign"] == [
        "10:15",
        "10:30",
        "10:45",
        "11:00",
    ]
    assert local([r for r in ran if r.job == "reminder"]) == [
        "2024-05-02T09:00:00-04:00",
        "2024-05-03T09:00:00-04:00",
        "2024-05-04T09:00:00-04:00",
    ]
    assert once_each(ran)
    assert sim.run(until="2024-05-09T00:00:00+00:00") == []  # both have ended


# -- several instances ---------------------------------------------------------------------


def test_a_killed_instance_s_run_is_taken_over_as_attempt_2() -> None:
    seen: list[tuple[str, int]] = []
    sim: Simulation

    def export(run: Run) -> None:
        seen.append((run.instance, run.attempt))
        sim.clock.sleep(60)

    def declare_jobs(cron: Scheduler) -> None:
        cron.add_job(export, name="export", cron="0 3 * * *", lease=10)

    sim = Simulation(declare_jobs, start="2024-05-01T00:00:00+00:00", instances=3)
    assert set(sim.schedulers) == {"i1", "i2", "i3"}
    [first] = sim.run(until="2024-05-01T03:00:05+00:00")
    assert (first.attempt, first.outcome) == (1, "running")
    sim.kill(first.instance)
    sim.run(until="2024-05-02T04:00:00+00:00")

    taken_over, done = sim.runs()[:2]
    assert (taken_over.slot, taken_over.attempt, taken_over.outcome) == (first.slot, 1, "lost")
    assert (done.slot, done.attempt, done.outcome) == (first.slot, 2, "done")
    assert done.instance != first.instance
    # Once its lease, renewed until the kill, lapsed: within a lease or two of the slot.
    assert timedelta(seconds=10) < done.began - first.slot < timedelta(seconds=20)
    assert seen[:2] == [(first.instance, 1), (done.instance, 2)]
    # The next day's slot runs once, on a live instance.
    [next_day] = sim.runs()[2:]
    assert next_day.slot == first.slot + timedelta(days=1)
    assert (next_day.attempt, next_day.outcome) == (1, "done")
    assert next_day.instance != first.instance


def test_a_stopped_instance_hands_its_run_over_at_once() -> None:
    sim = Simulation(start="2024-05-01T00:00:00+00:00", instances=2)
    sim.add_job(lambda: sim.clock.sleep(60), name="export", every=3600, lease=30)
    [first] = sim.run(until="2024-05-01T01:00:05+00:00")
    sim.stop(first.instance)
    stopped_at = sim.now
    sim.run(until="2024-05-01T01:30:00+00:00")

    released, done = sim.runs()
    assert (released.attempt, released.outcome) == (1, "released")
    assert (done.attempt, done.outcome, done.slot) == (2, "done", first.slot)
    assert done.began - stopped_at < timedelta(seconds=2)  # not after its 30 s lease


def test_a_handler_that_raises_fails_and_the_next_slots_run() -> None:
    def broken() -> None:
        raise RuntimeError("the report's database is down")

    sim = Simulation(start="2024-05-01T00:00:00+00:00", instances=2)
    sim.add_job(broken, name="report", every=600)
    ran = sim.run(until="2024-05-01T01:00:00.500+00:00")
    assert len(ran) == 6
    assert [(r.attempt, r.outcome) for r in ran] == [(1, "failed")] * 6  # not retried
    assert sum(e.kind == "failed" for e in sim.events) == 6


def test_a_run_not_ended_by_until_is_running_until_it_ends() -> None:
    sim = Simulation(start="2024-05-01T00:00:00+00:00")
    sim.add_job(lambda: sim.clock.sleep(120), name="slow", every=3600)
    [started] = sim.run(until="2024-05-01T01:01:00+00:00")
    assert started.outcome == "running"
    assert sim.run(seconds="5m") == []
    [ended] = sim.runs("slow")
    assert (ended.slot, ended.outcome) == (started.slot, "done")


def test_an_hour_of_a_job_due_every_second_runs_each_slot_once() -> None:
    sim = Simulation(start="2024-01-01T00:00:00+00:00")
    sim.add_job(lambda: None, name="tick", every=1)
    ran = sim.run(until="2024-01-01T01:00:00.500+00:00")
    assert len(ran) == 3600
    assert once_each(ran)
    assert ran[0].slot == datetime(2024, 1, 1, 0, 0, 1, tzinfo=timezone.utc)


def test_skipping_the_stretches_in_which_nothing_is_due_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same runs, instances and times as when every instance steps every second."""

    def simulate() -> list[tuple[object, ...]]:
        sim = Simulation(start="2024-03-10T00:50:00-05:00", instances=3)
        sim.add_job(lambda: sim.clock.sleep(20), name="a", cron="30 * * * *", timezone=NEW_YORK)
        sim.add_job(lambda: None, name="b", every=300)
        sim.add_job(lambda: 1 / 0, name="c", cron="*/7 * * * *")
        sim.run(until="2024-03-10T01:30:05-05:00")
        sim.kill(sim.runs("a")[-1].instance)  # in the middle of its run
        sim.run(until="2024-03-10T03:40:00-04:00")  # across the spring-forward gap
        return [(r.job, r.slot, r.instance, r.attempt, r.outcome, r.began) for r in sim.runs()]

    skipping = simulate()
    monkeypatch.setattr(Simulation, "_idle_for", lambda self, now, end: 0.0)
    assert simulate() == skipping
    assert {(job, outcome) for job, _, _, _, outcome, _ in skipping} == {
        ("a", "done"),
        ("a", "lost"),
        ("b", "done"),
        ("c", "failed"),
    }


# -- input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Simulation(start="2024-05-01T00:00:00"), "start"),
        (lambda: Simulation(start="tomorrow"), "start"),
        (lambda: Simulation(start="2024-05-01T00:00:00Z", instances=0), "instances"),
        (lambda: Simulation("not a function", start="2024-05-01T00:00:00Z"), "declarations"),  # type: ignore[arg-type]
    ],
    ids=["naive start", "no date", "no instance", "not a declaration"],
)
def test_bad_input_is_refused_naming_the_field(make: Callable[[], object], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        make()


def test_bad_run_and_kill_arguments_are_refused_naming_the_field() -> None:
    sim = Simulation(start="2024-05-01T00:00:00+00:00", instances=2)
    with pytest.raises(ConfigurationError, match="until"):
        sim.run()
    with pytest.raises(ConfigurationError, match="until"):
        sim.run(until="2024-04-30T00:00:00+00:00")
    with pytest.raises(ConfigurationError, match="seconds"):
        sim.run(seconds=-1)
    with pytest.raises(ConfigurationError, match="every"):
        sim.add_job(lambda: None, name="job", every=0)
    with pytest.raises(ConfigurationError, match="instance"):
        sim.kill("i3")
    sim.kill("i2")
    with pytest.raises(ConfigurationError, match="instance"):
        sim.stop("i2")
    assert sim.runs() == []


# -- the documentation ---------------------------------------------------------------------


def test_the_examples_of_the_docs_pass() -> None:
    """The test functions of docs/concepts.md's "Testing your schedules" run and pass."""
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    part = text.split("\n## Testing your schedules\n", 1)[1].split("\n## ", 1)[0]
    called = []
    for code in re.findall(r"^```python\n(.*?)^```", part, re.M | re.S):
        if "class Simulation" in code:
            continue  # the signatures
        namespace: dict[str, Any] = {"__name__": "docs_example"}
        exec(compile(code, "docs/concepts.md", "exec"), namespace)
        for name, test in namespace.items():
            if name.startswith("test_") and callable(test):
                test()
                called.append(name)
    assert len(called) == 3


def test_importing_anarchon_core_does_not_import_the_helper() -> None:
    code = "import sys, anarchon_core; print('anarchon_core.testing' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
