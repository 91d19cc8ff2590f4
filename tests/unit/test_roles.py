"""The roles' decisions, from records and times alone: no store, no clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from anarchon_core import EventKind, Job, JobOptions, Run, RunState, make_schedule
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


def run_of(slot: Slot = SLOT, token: int = 1) -> Run:
    return Run.of(slot, attempt=1, token=token, instance="me")


def handed_off(lease: float, now_mono: float) -> Backup:
    """The backup of this instance's own run, handed off with ``lease`` at ``now_mono``."""
    runner = Runner.start(SLOT, run_of(), now_mono=now_mono, options=OPTIONS)
    runner.run.hand_off(lease)
    return Backup.of_hand_off(runner, now_mono, OPTIONS)


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


def test_a_hand_off_never_picked_up_is_missed_and_a_picked_up_one_taken_over() -> None:
    never = handed_off(20, now_mono=100)
    assert never.handed_off and not never.picked_up
    assert never.verdict(record(lease=0), 121, OPTIONS) is Verdict.MISSED
    picked = handed_off(20, now_mono=100)
    assert picked.verdict(record(lease=3), 102, OPTIONS) is Verdict.WATCH  # renewed by executor
    assert picked.picked_up
    assert picked.verdict(record(lease=0), 106, OPTIONS) is Verdict.TAKE_OVER


def test_a_hand_off_no_longer_than_the_lease_and_its_margin_is_not_one() -> None:
    assert not handed_off(4, now_mono=0).handed_off


def test_a_new_token_starts_the_observations_afresh() -> None:
    backup = handed_off(20, now_mono=100)
    assert backup.verdict(record(token=2, lease=3), 101, OPTIONS) is Verdict.WATCH
    assert (backup.token, backup.handed_off, backup.furthest) == (2, False, 104)


def test_a_runner_renews_on_time_and_gives_up_after_a_lease_without_renewal() -> None:
    runner = Runner.start(SLOT, run_of(), now_mono=10, options=OPTIONS)
    assert not runner.renewal_due(10.9)
    assert runner.renewal_due(11)
    runner.renewed(11, OPTIONS)
    assert runner.next_renew == 12
    assert not runner.out_of_lease(13.9, OPTIONS)
    assert runner.out_of_lease(14, OPTIONS)


def test_a_job_backs_up_runs_that_go_on_and_are_not_its_own() -> None:
    rt = runtime()
    assert rt.backs_up(record(token=1))
    assert not rt.backs_up(record(state=RunState.DONE))
    rt.runner = Runner.start(SLOT, run_of(token=1), now_mono=0, options=rt.options)
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
    assert not rt.too_late(SLOT, lateness=2.0)  # within jitter (1 s) plus one second
    assert rt.too_late(SLOT, lateness=2.1)
    assert rt.won_kind(2.0) is EventKind.WON
    assert rt.won_kind(2.1) is EventKind.CATCH_UP
    assert not runtime(catch_up=30).too_late(SLOT, lateness=30)


def test_a_job_places_its_claim_within_its_jitter_and_lists_what_is_due() -> None:
    rt = runtime()
    rt.next_slot = SLOT
    rt.place(0.5)
    assert rt.claim_at == AT.timestamp() + 0.5
    assert list(rt.deadlines(AT.timestamp(), 0)) == [0.5]
    rt.runner = Runner.start(SLOT, run_of(), now_mono=0, options=rt.options)
    rt.backup = Backup.of(SLOT, record(token=9), now_mono=0, options=rt.options)
    assert list(rt.deadlines(AT.timestamp(), 0)) == [0.5, 0.5, 10 / 3]


def test_a_completion_is_reported_by_how_the_run_ended() -> None:
    rt = runtime()
    runner = Runner.start(SLOT, run_of(), now_mono=0, options=rt.options)
    assert Completion(rt, runner, RunState.DONE).kind is EventKind.FINISHED
    assert Completion(rt, runner, RunState.FAILED).kind is EventKind.FAILED
    runner.run.hand_off(20)
    assert runner.run.handed_off_lease == 20
    assert Completion(rt, runner, RunState.DONE).handed_off
    assert Completion(rt, runner, RunState.DONE).kind is EventKind.DISPATCHED
    assert Completion(rt, runner, RunState.FAILED).kind is EventKind.FAILED
