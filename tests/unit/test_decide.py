"""The decision table of anarchon_core.decide, step by step, with no store and no clock."""

from __future__ import annotations

import pytest

from anarchon_core import decide
from anarchon_core.decide import Decision, Record
from anarchon_core.store import Change, Claim, ClaimStatus, RunState

NOW = 1_000.0
SLOT, NEXT = 60_000, 120_000


def record(
    state: RunState = RunState.RUNNING, *, left: float = 10.0, slot: int = SLOT, token: int = 4
) -> Record:
    return Record("job", slot, "a", 2, token, state, NOW + left)


def test_a_first_claim_wins_attempt_1_with_the_first_token() -> None:
    first = decide.first_token(NOW)
    assert first == int(NOW * 1000)  # the store's clock, in milliseconds
    step = decide.claim(None, "job", SLOT, "a", 30, NOW, clock_token=first)
    assert step.answer.status is ClaimStatus.WON
    assert step.record == Record("job", SLOT, "a", 1, first, RunState.RUNNING, NOW + 30)
    assert step.answer.holder == step.record.view(NOW)
    assert (step.started, step.previous, step.ended) == (True, None, None)


def test_a_token_is_the_previous_one_plus_one_or_the_clock_whichever_is_higher() -> None:
    """A record older than the tokens handed out (a failover lost the last writes)
    gets no token twice: the clock in ms is above every token handed out before."""
    clock = decide.first_token(NOW)
    assert decide.next_token(None, clock) == clock
    assert decide.next_token(clock + 7, clock) == clock + 8  # many attempts in one ms
    assert decide.next_token(4, clock) == clock
    handed_out = decide.next_token(clock, clock)  # written, then lost in a failover
    later = decide.first_token(NOW + 1)  # a failover takes seconds, not a millisecond
    rolled_back = record(RunState.DONE, left=-1, token=clock)
    claimed = decide.claim(rolled_back, "job", NEXT, "b", 30, NOW, clock_token=later)
    assert claimed.record is not None and claimed.record.token > handed_out
    taken = decide.takeover(
        record(RunState.RELEASED, token=clock), "job", SLOT, "b", 30, clock, NOW,
        clock_token=later,
    )  # fmt: skip
    assert taken.record is not None and taken.record.token > handed_out


@pytest.mark.parametrize(
    ("old", "slot", "status"),
    [
        (record(), SLOT, ClaimStatus.TAKEN),
        (record(RunState.DONE, left=-1), SLOT, ClaimStatus.TAKEN),
        (record(slot=NEXT), SLOT, ClaimStatus.STALE),
        (record(), NEXT, ClaimStatus.BUSY),
        (record(RunState.DISPATCHED), NEXT, ClaimStatus.BUSY),
    ],
)
def test_a_refused_claim_writes_nothing(old: Record, slot: int, status: ClaimStatus) -> None:
    step = decide.claim(old, "job", slot, "b", 30, NOW)
    assert (step.answer.status, step.answer.holder) == (status, old.view(NOW))
    assert not step.written and not step.started


@pytest.mark.parametrize(
    ("state", "left", "previous"),
    [
        (RunState.RUNNING, 0.0, RunState.ABANDONED),  # lapsed at this very moment
        (RunState.DISPATCHED, -5.0, RunState.ABANDONED),  # never picked up
        (RunState.DONE, -5.0, None),
        (RunState.FAILED, -5.0, None),
        (RunState.RELEASED, -5.0, None),  # stays released in the history
    ],
)
def test_a_newer_slot_supersedes_an_ended_or_lapsed_run(
    state: RunState, left: float, previous: RunState | None
) -> None:
    step = decide.claim(record(state, left=left), "job", NEXT, "b", 30, NOW)
    assert step.answer.won
    assert step.record == Record("job", NEXT, "b", 1, 5, RunState.RUNNING, NOW + 30)
    assert (step.previous, step.started) == (previous, True)


def test_a_paused_claim_answers_paused_whatever_the_record() -> None:
    assert decide.claim(None, "job", SLOT, "a", 30, NOW, paused=True) == Decision(
        Claim(ClaimStatus.PAUSED, None)
    )
    old = record(RunState.DONE, left=-1)
    step = decide.claim(old, "job", NEXT, "a", 30, NOW, paused=True)
    assert (step.answer.status, step.answer.holder, step.written) == (
        ClaimStatus.PAUSED,
        old.view(NOW),
        False,
    )


@pytest.mark.parametrize(
    ("old", "slot", "seen"),
    [
        (None, SLOT, 4),
        (record(left=5), SLOT, 4),  # live
        (record(left=-1), SLOT, 3),  # another token
        (record(left=-1), NEXT, 4),  # another slot
        (record(RunState.DISPATCHED, left=-1), SLOT, 4),  # unpicked: never taken over
        (record(RunState.DONE, left=-1), SLOT, 4),
    ],
)
def test_a_takeover_is_taken_unless_the_seen_run_lapsed_or_was_released(
    old: Record | None, slot: int, seen: int
) -> None:
    step = decide.takeover(old, "job", slot, "b", 30, seen, NOW)
    assert step.answer.status is ClaimStatus.TAKEN
    assert step.answer.holder == (old.view(NOW) if old else None)
    assert not step.written


@pytest.mark.parametrize(
    ("state", "previous"), [(RunState.RUNNING, RunState.LOST), (RunState.RELEASED, None)]
)
def test_a_takeover_is_the_next_attempt(state: RunState, previous: RunState | None) -> None:
    step = decide.takeover(record(state, left=-1), "job", SLOT, "b", 30, 4, NOW)
    assert step.answer.won
    assert step.record == Record("job", SLOT, "b", 3, 5, RunState.RUNNING, NOW + 30)
    assert (step.previous, step.started) == (previous, True)


def test_renew_and_dispatch_need_the_token_and_a_held_run() -> None:
    old = record(left=-3)  # lapsed, not yet taken over: still its holder's
    assert decide.renew(old, 4, 20, NOW).record == record(left=20)
    assert decide.renew(old, 4, 20, NOW).previous is None
    handed = decide.dispatch(old, 4, 7, NOW)
    assert (handed.answer, handed.record, handed.previous) == (
        True,
        record(RunState.DISPATCHED, left=7),
        RunState.DISPATCHED,
    )
    picked = decide.renew(handed.record, 4, 20, NOW)
    assert (picked.record, picked.previous) == (record(left=20), RunState.RUNNING)
    for refused in (
        decide.renew(old, 5, 20, NOW),
        decide.renew(None, 4, 20, NOW),
        decide.dispatch(record(RunState.DONE), 4, 7, NOW),
        decide.renew(record(RunState.RELEASED), 4, 7, NOW),
    ):
        assert refused == Decision(False)


def test_an_end_is_written_once_and_answered_again_when_re_sent() -> None:
    done = decide.finish(record(), 4, RunState.DONE, NOW)
    assert (done.answer, done.record, done.previous, done.ended) == (
        True,
        record(RunState.DONE, left=0),
        RunState.DONE,
        RunState.DONE,
    )
    assert decide.finish(done.record, 4, RunState.DONE, NOW + 5) == Decision(True)
    assert decide.finish(done.record, 4, RunState.FAILED, NOW) == Decision(False)
    assert decide.release(done.record, 4, NOW) == Decision(False)
    assert decide.finish(record(), 3, RunState.DONE, NOW) == Decision(False)
    released = decide.release(record(RunState.DISPATCHED), 4, NOW)
    assert (released.record, released.previous, released.ended) == (
        record(RunState.RELEASED, left=0),
        RunState.RELEASED,
        None,
    )


def test_only_ends_end_a_run() -> None:
    with pytest.raises(ValueError, match="done or failed"):
        decide.finish(record(), 4, RunState.RELEASED, NOW)
    with pytest.raises(ValueError, match="done, failed or released"):
        decide.end(record(), 4, RunState.RUNNING, NOW)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (Change("job", 4, RunState.RUNNING, 20), decide.renew(record(), 4, 20, NOW)),
        (Change("job", 4, RunState.DISPATCHED, 9), decide.dispatch(record(), 4, 9, NOW)),
        (Change("job", 4, RunState.FAILED), decide.finish(record(), 4, RunState.FAILED, NOW)),
        (Change("job", 4, RunState.RELEASED), decide.release(record(), 4, NOW)),
    ],
)
def test_a_change_is_the_step_it_stands_for(change: Change, expected: Decision[bool]) -> None:
    assert decide.change(record(), change, NOW) == expected


def test_a_record_and_its_view_agree() -> None:
    old = record(left=2.5)
    assert Record.of(old.view(NOW), NOW) == old
    assert old.view(NOW).lease_remaining == 2.5
    assert old.view(NOW + 3).lapsed
