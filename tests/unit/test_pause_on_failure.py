"""pause_on_failure: a run that ends failed pauses its job on every instance, with the reason."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from anarchon_core import ConfigurationError, Control, Run, Scheduler, slot_id
from anarchon_core.events import EventKind
from anarchon_core.handoff import ExecutionLease, HandOff
from anarchon_core.pauses import reasons
from anarchon_core.store import RunState
from tests.sim import START, Cluster


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(START + seconds, timezone.utc)


def fleet(pause_on_failure: bool, fail_at: float) -> tuple[Cluster, list[str]]:
    cluster = Cluster()
    ran: list[str] = []

    def handler(run: Run) -> None:
        ran.append(run.slot_id)
        if run.slot == at(fail_at):
            raise RuntimeError("the report's database is gone")

    for name in "abc":
        cluster.add(
            name,
            lambda s: s.add_job(
                handler, name="report", every=10, pause_on_failure=pause_on_failure
            ),
        )
    return cluster, ran


def test_a_failed_run_pauses_its_job_on_every_instance_with_the_reason() -> None:
    cluster, ran = fleet(True, fail_at=30)
    cluster.run(75)
    # Slots 10, 20 and 30 ran; 30 failed; none after, on any instance.
    assert ran == [slot_id("report", at(k)) for k in (10, 20, 30)]
    assert cluster.store.paused().jobs == ("report",)
    why = reasons(cluster.store)["report"]
    assert why.slot_id == slot_id("report", at(30))
    assert why.reason == f"paused on failure: {why.slot_id} attempt 1 ended failed"
    assert why.by in "abc"
    paused = [e for e in cluster.events if e.kind is EventKind.PAUSED_ON_FAILURE]
    assert len(paused) == 1 and paused[0].job == "report"
    refused = {e.slot_id for e in cluster.events if e.kind is EventKind.PAUSED}
    assert slot_id("report", at(40)) in refused


def test_resume_clears_the_reason_and_the_job_runs_again() -> None:
    cluster, ran = fleet(True, fail_at=30)
    cluster.run(45)
    assert Control(cluster.store).resume("report")
    assert reasons(cluster.store) == {}
    cluster.run(30)
    assert ran[-2:] == [slot_id("report", at(60)), slot_id("report", at(70))]


def test_without_the_rule_a_failure_pauses_nothing() -> None:
    cluster, ran = fleet(False, fail_at=30)
    cluster.run(55)
    assert ran == [slot_id("report", at(k)) for k in (10, 20, 30, 40, 50)]
    assert cluster.store.paused().jobs == ()


def test_a_manual_pause_has_no_reason() -> None:
    cluster, _ = fleet(True, fail_at=1000)
    cluster.run(15)
    Control(cluster.store).pause("report")
    assert cluster.store.paused().jobs == ("report",)
    assert reasons(cluster.store) == {}


@pytest.mark.parametrize("value", [1, "yes", None.__class__])
def test_pause_on_failure_takes_true_or_false(value: object) -> None:
    scheduler = Scheduler("memory://", namespace="t")
    with pytest.raises(ConfigurationError, match="pause_on_failure="):
        scheduler.add_job(lambda: None, name="job", every=10, pause_on_failure=value)  # type: ignore[arg-type]
    assert scheduler.jobs == {}


def test_work_handed_off_that_ends_failed_pauses_the_job_from_the_worker() -> None:
    cluster = Cluster()
    tickets: list[HandOff] = []

    def dispatch(run: Run) -> None:
        run.hand_off(30)
        tickets.append(HandOff.for_run(cluster.live["a"], run, pickup=30, tracked=True))

    cluster.add("a", lambda s: s.add_job(dispatch, name="send", every=10, pause_on_failure=True))
    cluster.run(11)
    assert len(tickets) == 1
    # The ticket, as a message carries it, tells the worker the rule.
    ticket = HandOff.from_message(tickets[0].to_message())
    assert ticket.pause_on_failure
    lease = ExecutionLease(cluster.store, ticket)
    assert lease.pick_up()
    lease.finish(RunState.FAILED)
    assert cluster.store.paused().jobs == ("send",)
    assert reasons(cluster.store)["send"].slot_id == ticket.slot_id
    assert ticket.to_message()["pause_on_failure"] is True
    # A ticket without the rule is sent as every release sends it (no such key), and one
    # sent by a release that did not know the rule pauses nothing.
    assert (
        "pause_on_failure"
        not in HandOff.from_message(
            {**tickets[0].to_message(), "pause_on_failure": False}
        ).to_message()
    )
    assert not HandOff.from_message(
        {**tickets[0].to_message(), "pause_on_failure": None}
    ).pause_on_failure


def test_status_jobs_and_the_dashboard_say_why_a_job_was_paused_and_its_limit() -> None:
    import argparse
    import io

    from anarchon_core.cli import control_verb, status
    from anarchon_core.dashboard import Dashboard

    cluster, _ = fleet(True, fail_at=30)
    for name in "xy":
        cluster.add(name, lambda s: s.add_job(lambda: None, name="capped", every=10, limit=2))
    cluster.run(45)
    why = reasons(cluster.store)["report"].reason
    shown = io.StringIO()
    status(cluster.store, shown)
    assert f"paused: report: {why} by " in shown.getvalue()
    assert "limit: capped: limit reached (2 of 2)" in shown.getvalue()
    assert "limit reached (2 of 2)" in next(
        line for line in shown.getvalue().splitlines() if line.startswith("capped ")
    )
    listed = io.StringIO()
    control_verb(argparse.Namespace(verb="jobs"), Control(cluster.store), listed)
    row = next(line for line in listed.getvalue().splitlines() if line.startswith("report "))
    assert row.split()[1:3] == ["on", "failure"]
    assert f"paused: report: {why}" in listed.getvalue()
    state = Dashboard(cluster.store, namespace=cluster.store.namespace).state()
    jobs = {job["name"]: job for job in state["jobs"]}
    assert jobs["report"]["paused_why"] == why
    assert jobs["capped"]["limit"] == "limit reached (2 of 2)"
    assert jobs["report"]["limit"] is None
