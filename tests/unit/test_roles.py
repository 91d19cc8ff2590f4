"""The roles' decisions, from records and times alone: no store, no clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from anarchon_core import EventKind, Job, JobOptions, Run, RunState, make_schedule
from anarchon_core.jobs import LEASE_MARGIN
from anarchon_core.roles import Backup, Completion, JobRuntime, Runner, Verdict
from anarchon_core.slots import Slot
from anarchon_core.store import JobState

AT = datetime(2024, 1, 1, tzinfo=timezone.utc)
SLOT = Slot("job", AT)
OPTIONS = JobOptions(lease=3, watch=0.5)


def record(
    *, token: int = 1, state: RunState = RunState.RUNNING, lease: float = 3.0, slot: Slot = SLOT
) -> JobState:
    return JobState("job", slot.ms, "other", 1, token, state, lease)


def runtime(**options: float) -> JobRuntime:
    schedule = make_schedule(every=60)
    return JobRuntime(Job("job", lambda: None, schedule, JobOptions(**options)))


class Mono:
    """A monotonic clock a test sets by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run_of(slot: Slot = SLOT, token: int = 1, clock: Mono | None = None) -> Run:
    return Run.of(slot, attempt=1, token=token, instance="me", monotonic=clock or Mono())


def test_a_backup_watches_a_live_lease_and_takes_over_a_lapsed_or_released_one() -> None:
    backup = Backup.of(SLOT, record(), now_mono=100, options=OPTIONS)
    assert backup.next_check == 100.5
    assert backup.verdict(record(lease=2), 101, OPTIONS) is Verdict.WATCH
    assert backup.next_check == 101.5
    assert backup.verdict(record(lease=0), 104, OPTIONS) is Verdict.TAKE_OVER
    assert backup.verdict(record(state=RunState.RELEASED, lease=0), 104, OPTIONS) is (
        Verdict.TAKE_OVER
    )


def test_a_lapsed_lease_is_checked_at_once() -> None:
    assert Backup.of(SLOT, record(lease=0), now_mono=100, options=OPTIONS).next_check == 100


@pytest.mark.parametrize(
    "seen",
    [
        None,
        record(state=RunState.DONE),
        record(state=RunState.FAILED),
        record(slot=Slot("job", AT + timedelta(minutes=1))),
    ],
)
def test_a_backup_drops_a_run_that_ended_or_a_record_that_moved_on(seen: JobState | None) -> None:
    backup = Backup.of(SLOT, record(), now_mono=100, options=OPTIONS)
    assert backup.verdict(seen, 101, OPTIONS) is Verdict.DROP


@pytest.mark.parametrize("lease", [0.5, 3, 20, 300])
def test_a_dispatched_run_is_read_from_the_record_whatever_the_lease_lengths(
    lease: float,
) -> None:
    """Every instance decides alike from the record's state: no inference from its lease."""
    backup = Backup.of(SLOT, record(state=RunState.DISPATCHED, lease=lease), 100, OPTIONS)
    assert backup.next_check == 100.5
    assert backup.verdict(record(state=RunState.DISPATCHED, lease=lease), 101, OPTIONS) is (
        Verdict.WATCH
    )
    assert backup.verdict(record(state=RunState.DISPATCHED, lease=0), 101, OPTIONS) is (
        Verdict.MISSED
    )
    # Picked up (running again) and then silent: taken over like any lapsed run.
    assert backup.verdict(record(state=RunState.RUNNING, lease=lease), 102, OPTIONS) is (
        Verdict.WATCH
    )
    assert backup.verdict(record(state=RunState.RUNNING, lease=0), 102, OPTIONS) is (
        Verdict.TAKE_OVER
    )


def test_a_backup_started_after_a_pickup_lease_lapsed_sees_it_missed_at_once() -> None:
    backup = Backup.of(SLOT, record(state=RunState.DISPATCHED, lease=-5), 100, OPTIONS)
    assert backup.next_check == 100
    assert backup.verdict(record(state=RunState.DISPATCHED, lease=-5), 100, OPTIONS) is (
        Verdict.MISSED
    )


def test_a_runner_holds_its_run_until_the_lease_less_the_margin_from_when_it_was_sent() -> None:
    clock = Mono(10)
    runner = Runner.start(SLOT, run_of(clock=clock), 10, OPTIONS)
    assert not runner.renewal_due(10.9)
    assert runner.renewal_due(11)
    deadline = 10 + 3 * (1 - LEASE_MARGIN)
    clock.now = deadline - 0.001
    assert not runner.run.lost
    assert runner.renewed(11, OPTIONS)  # sent at 11: held until 11 + 3 x (1 - margin)
    assert runner.next_renew == 12
    clock.now = 11 + 3 * (1 - LEASE_MARGIN) - 0.001
    assert not runner.run.lost
    clock.now += 0.001
    assert runner.run.lost  # with no call made: the deadline alone
    assert "ran out" in runner.run.lost_reason
    # A renewal accepted after the deadline does not revive it.
    assert not runner.renewed(clock.now, OPTIONS)
    assert runner.run.lost


def test_a_job_backs_up_runs_that_go_on_and_are_not_its_own() -> None:
    rt = runtime()
    assert rt.backs_up(record(token=1))
    assert not rt.backs_up(record(state=RunState.DONE))
    rt.runner = Runner.start(SLOT, run_of(token=1), 0, rt.options)
    assert not rt.backs_up(record(token=1))  # its own run, whatever the owner's name
    assert rt.backs_up(record(token=2))


def test_catching_up_a_missed_slot_but_not_one_skipped_as_an_overlap() -> None:
    rt = runtime()
    older = Slot("job", AT - timedelta(minutes=1))
    # The older run's lease ended 40 s ago, before the slot came 30 s ago: it was missed.
    assert rt.catches_up(SLOT, record(slot=older, lease=-40), lateness=30)
    assert not rt.catches_up(SLOT, record(slot=older, lease=-70), lateness=61)  # past one interval
    # Its lease ended 10 s ago, after the slot came: the slot was skipped as an overlap.
    assert not rt.catches_up(SLOT, record(slot=older, lease=-10), lateness=30)
    assert not rt.catches_up(SLOT, record(slot=SLOT, lease=-40), lateness=30)  # not older


def test_how_late_a_slot_may_be_claimed_and_when_a_win_is_a_catch_up() -> None:
    rt = runtime(catch_up=0)
    # Within jitter (1 s), the wait for a preferred peer (jitter + 1 s) and one second.
    assert rt.deferral == 2.0
    assert not rt.too_late(SLOT, lateness=4.0)
    assert rt.too_late(SLOT, lateness=4.1)
    assert rt.won_kind(2.0) is EventKind.WON
    assert rt.won_kind(2.1) is EventKind.CATCH_UP
    # A claim that waited for a preferred peer is on time that much later.
    assert rt.won_kind(4.0, deferred=2.0) is EventKind.WON
    assert rt.won_kind(4.1, deferred=2.0) is EventKind.CATCH_UP
    # The wait is at most a tenth of the interval.
    short = JobRuntime(Job("job", lambda: None, make_schedule(every=2), JobOptions(jitter=0)))
    assert short.deferral == 0.2
    assert not runtime(catch_up=30).too_late(SLOT, lateness=30)


def test_a_job_places_its_claim_within_its_jitter_and_knows_what_is_due() -> None:
    rt = runtime()
    rt.next_slot = SLOT
    rt.place(0.5)
    assert rt.claim_at == AT.timestamp() + 0.5
    rt.runner = Runner.start(SLOT, run_of(), 0, rt.options)
    rt.backup = Backup.of(SLOT, record(token=9), now_mono=0, options=rt.options)
    assert rt.backup.next_check == 0.5  # type: ignore[union-attr]
    assert rt.runner.next_renew == 10 / 3  # type: ignore[union-attr]


def test_a_completion_is_reported_by_how_the_run_ended() -> None:
    rt = runtime()
    runner = Runner.start(SLOT, run_of(), 0, rt.options)
    assert Completion(rt, runner, RunState.DONE).kind is EventKind.FINISHED
    assert Completion(rt, runner, RunState.FAILED).kind is EventKind.FAILED
    assert Completion(rt, runner, RunState.FAILED, True).kind is EventKind.DISPATCH_FAILED
    runner.run.hand_off(20)
    assert runner.run.handed_off_lease == 20
    assert Completion(rt, runner, RunState.DONE).handed_off
    assert Completion(rt, runner, RunState.DONE).kind is EventKind.DISPATCHED
    assert Completion(rt, runner, RunState.FAILED).kind is EventKind.FAILED
