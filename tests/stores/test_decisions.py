"""Every lease store decides as the decision table: a differential property test.

The claim, takeover, renew, dispatch, finish and release decisions are written
once as pure functions (:mod:`anarchon_core.decide`); the memory and NATS
stores apply them as they are, the Redis script and the SQL statements decide
on the server. Here random sequences of operations (claims, takeovers,
changes, pauses) by several owners, on a few jobs (each with a limit of claims
or none), with leases long (60 s) or short (0.4 s), run on each lease store
and on the model side by side: every answer, and then every job's record,
history and counts, must be the model's.

Leases lapse in real time. The model's clock is this process's monotonic
clock: a lease granted by a step sent at ``t0`` and answered at ``t1`` ends,
on the store's clock, between ``t0 + lease`` and ``t1 + lease``. Before a step
on a job, a short lease that may be on either side of its end (within
:data:`MARGIN`) is waited out, so that the store and the model judge it alike;
"wait" steps let short leases lapse on purpose.

Run (well under a minute per store)::

    .venv/bin/python -m pytest tests/stores/test_decisions.py -n 2 -k "memory or sqlite"

A longer hunt::

    ANARCHON_DECISION_EXAMPLES=500 .venv/bin/python -m pytest \\
        tests/stores/test_decisions.py -k redis
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from anarchon_core import decide
from anarchon_core.decide import Decision, Record
from anarchon_core.store import (
    HELD_STATES,
    Change,
    Claim,
    ClaimRequest,
    ClaimStatus,
    LeaseStore,
    RunState,
    Store,
    TakeoverRequest,
)

#: Examples per store for a longer hunt (``ANARCHON_DECISION_EXAMPLES=500``); 0: the default.
LONG = int(os.environ.get("ANARCHON_DECISION_EXAMPLES") or 0)
EXAMPLES = LONG or 30

SHORT, LONG_LEASE = 0.4, 60.0
#: How far a lease's end may be from this process's view of it and still be judged.
MARGIN = 0.15
JOBS = ("j0", "j1")
OWNERS = ("a", "b", "c")
SLOTS = (1_700_000_000_000, 1_700_000_060_000, 1_700_000_120_000)
ENDS = (RunState.DONE, RunState.FAILED, RunState.RELEASED)

pytestmark = [pytest.mark.timeout(0)] if LONG else []

# --- operations --------------------------------------------------------------------


@dataclass(frozen=True)
class Claims:
    owner: str
    #: (job, slot, lease), one job at most once.
    items: tuple[tuple[str, int, float], ...]


@dataclass(frozen=True)
class Takeovers:
    owner: str
    #: (job, slot: None for the record's, token offset from the record's, lease)
    items: tuple[tuple[str, int | None, int, float], ...]


@dataclass(frozen=True)
class Changes:
    #: (job, token offset from the record's, state, lease), in the order sent.
    items: tuple[tuple[str, int, RunState, float], ...]


@dataclass(frozen=True)
class Wait:
    """Until every short lease has surely lapsed."""


@dataclass(frozen=True)
class Pause:
    """Pause (or resume) one job: its claims are then answered paused."""

    job: str
    on: bool


leases = st.sampled_from((SHORT, SHORT, LONG_LEASE))
#: Each job's limit, sent with its every claim: none, or one a few claims reach.
limits = st.fixed_dictionaries({job: st.sampled_from((None, 1, 1, 2)) for job in JOBS})
offsets = st.sampled_from((0, 0, 0, 0, -1, 1))
#: Mostly the record's own slot (None), the one a backup read.
seen_slots = st.sampled_from((None, None, None, *SLOTS))


def _distinct(items: list[Any]) -> tuple[Any, ...]:
    return tuple({item[0]: item for item in items}.values())


claims = st.builds(
    Claims,
    st.sampled_from(OWNERS),
    st.lists(
        st.tuples(st.sampled_from(JOBS), st.sampled_from(SLOTS), leases), min_size=1, max_size=2
    ).map(_distinct),
)
takeovers = st.builds(
    Takeovers,
    st.sampled_from(OWNERS),
    st.lists(
        st.tuples(st.sampled_from(JOBS), seen_slots, offsets, leases),
        min_size=1,
        max_size=2,
    ).map(_distinct),
)
changes = st.builds(
    Changes,
    st.lists(
        st.tuples(
            st.sampled_from(JOBS),
            offsets,
            st.sampled_from((RunState.RUNNING, RunState.DISPATCHED, *ENDS)),
            leases,
        ),
        min_size=1,
        max_size=3,
    ).map(tuple),
)
operations = st.lists(
    st.one_of(
        claims,
        takeovers,
        changes,
        st.just(Wait()),
        st.builds(Pause, st.sampled_from(JOBS), st.sampled_from((True, False, False))),
    ),
    min_size=1,
    max_size=20,
)

# --- the model ---------------------------------------------------------------------


@dataclass
class Model:
    """The jobs' records, histories and counts as the decision table has them."""

    records: dict[str, Record] = field(default_factory=dict)
    #: Per job, newest first: [slot, attempt, token, owner, state, open].
    history: dict[str, list[list[Any]]] = field(default_factory=dict)
    #: Per job: runs, takeovers, done, failed.
    counts: dict[str, list[int]] = field(default_factory=dict)
    #: Per job with a held lease: the earliest moment its lease may end on the store.
    ends_from: dict[str, float] = field(default_factory=dict)
    #: The jobs paused by name.
    paused: set[str] = field(default_factory=set)
    #: Each job's limit of claims won (None: no limit).
    limits: dict[str, int | None] = field(default_factory=dict)

    def apply(
        self, job: str, step: Decision[Any], t0: float, t1: float, decided_at: float | None = None
    ) -> Any:
        """Keep ``step``, decided at ``decided_at`` (default ``t0``), of a call sent at
        ``t0`` and answered by ``t1``."""
        new = step.record
        if new is None:
            return step.answer
        runs = self.history.setdefault(job, [])
        counts = self.counts.setdefault(job, [0, 0, 0, 0])
        if step.previous is not None and runs and runs[0][5]:
            runs[0][4], runs[0][5] = step.previous, step.previous in HELD_STATES
        if step.started:
            runs.insert(0, [new.slot_ms, new.attempt, new.token, new.owner, new.state, True])
            counts[0] += 1
            counts[1] += new.attempt > 1
        if step.ended is not None:
            counts[2 if step.ended is RunState.DONE else 3] += 1
        if new.state in HELD_STATES:
            lease = new.lease_until - (t0 if decided_at is None else decided_at)
            # The latest the store may end it; the earliest is kept beside.
            new = replace(new, lease_until=t1 + lease)
            self.ends_from[job] = t0 + lease
        self.records[job] = new
        return step.answer

    def claims(self, job: str) -> int:
        """``job``'s claims won so far: runs less takeovers."""
        runs, takeovers, *_ = self.counts.get(job, [0, 0])
        return runs - takeovers

    def settle(self, jobs: set[str]) -> float:
        """Wait until no held lease of ``jobs`` is near its end; the moment after."""
        now = time.monotonic()
        for job in jobs:
            rec = self.records.get(job)
            if rec is None or rec.state not in HELD_STATES:
                continue
            if self.ends_from[job] - MARGIN <= now <= rec.lease_until + MARGIN:
                time.sleep(rec.lease_until + MARGIN - now)
                now = time.monotonic()
        return now

    def live(self, job: str, at: float) -> bool | None:
        """Whether ``job``'s lease is surely live (True), surely over (False), or either."""
        rec = self.records[job]
        if rec.state not in HELD_STATES:
            return False
        if at < self.ends_from[job] - MARGIN:
            return True
        return False if at > rec.lease_until + MARGIN else None


def _agree(
    model: Model,
    op: Any,
    items: list[tuple[str, Callable[[float], Decision[Any]]]],
    answers: list[Any],
    t0: float,
    t1: float,
    key: Callable[[Any], Any] = lambda a: _fields(a),
) -> None:
    """Each answer is the decision of the tables for its job, taken at the moment the call
    was sent (``t0``) or at the latest the store may have decided it (``t1`` and the clocks'
    margin): a call that spans the end of a lease may see it live or over, as a store
    under load decides after the model's ``t0``. The model keeps the decision answered."""
    late = t1 + MARGIN
    for (job, decided), answer in zip(items, answers, strict=True):
        early = decided(t0)
        if key(answer) == key(early.answer):
            model.apply(job, early, t0, t1)
            continue
        later = decided(late)
        assert key(answer) == key(later.answer), (op, job, key(answer), key(early.answer))
        model.apply(job, later, t0, t1, decided_at=late)


def _fields(claim: Claim) -> tuple[Any, ...]:
    holder = claim.holder
    if holder is None:
        return (claim.status, None)
    return (claim.status, holder.slot_ms, holder.owner, holder.attempt, holder.token, holder.state)


def _clock_tokens(items: Sequence[tuple[Any, ...]], answers: Sequence[Any]) -> dict[str, int]:
    """The token each won step carried, by job, as the model's ``clock_token``.

    A new attempt's token is the previous + 1 or the store's clock in ms, whichever is
    higher (decide.next_token); the model cannot read the store's clock, so it takes
    the token from the store's answer. A store that gave a token at or below the
    previous one still disagrees with the model (which then wants the previous + 1);
    tests/stores/test_tokens.py checks the clock's part.
    """
    return {
        item[0]: answer.holder.token
        for item, answer in zip(items, answers, strict=True)
        if answer.status is ClaimStatus.WON and answer.holder is not None
    }


def _token(model: Model, job: str, offset: int) -> int:
    rec = model.records.get(job)
    return max(1, (rec.token if rec else 1) + offset)


def step(store: LeaseStore, model: Model, op: Any, names: dict[str, str]) -> None:
    """Run ``op`` on the store and on the model; their answers must agree."""
    if isinstance(op, Wait):
        short = [r.lease_until for r in model.records.values() if r.state in HELD_STATES]
        short = [end for end in short if end < time.monotonic() + 2 * SHORT]
        if short:
            time.sleep(max(0.0, max(short) + MARGIN - time.monotonic()))
        return
    if isinstance(op, Pause):
        changed = (store.pause if op.on else store.resume)(names[op.job])
        assert changed == ((op.job in model.paused) != op.on), op
        (model.paused.add if op.on else model.paused.discard)(op.job)
        return
    jobs = {item[0] for item in op.items}
    t0 = model.settle(jobs)
    if isinstance(op, Claims):
        requests = [
            ClaimRequest(names[job], slot, lease, model.limits.get(job))
            for job, slot, lease in op.items
        ]
        answers: list[Any] = store.claim_many(requests, op.owner)
        t1 = time.monotonic()
        clocks = _clock_tokens(op.items, answers)

        def claimed(item: tuple[str, int, float], now: float) -> Decision[Any]:
            job, slot, lease = item
            return decide.claim(
                model.records.get(job),
                names[job],
                slot,
                op.owner,
                lease,
                now,
                paused=job in model.paused,
                limit=model.limits.get(job),
                claims=model.claims(job),
                clock_token=clocks.get(job, 1),
            )

        _agree(model, op, [(i[0], partial(claimed, i)) for i in op.items], answers, t0, t1)
    elif isinstance(op, Takeovers):
        sent = []
        for job, slot, offset, lease in op.items:
            rec = model.records.get(job)
            slot = slot if slot is not None else (rec.slot_ms if rec else SLOTS[0])
            sent.append((job, slot, _token(model, job, offset), lease))
        takeover = [TakeoverRequest(names[j], slot, lease, token) for j, slot, token, lease in sent]
        answers = store.takeover_many(takeover, op.owner)
        t1 = time.monotonic()
        clocks = _clock_tokens(sent, answers)

        def taken(item: tuple[str, int, int, float], now: float) -> Decision[Any]:
            job, slot, token, lease = item
            return decide.takeover(
                model.records.get(job),
                names[job],
                slot,
                op.owner,
                lease,
                token,
                now,
                clock_token=clocks.get(job, 1),
            )

        _agree(model, op, [(i[0], partial(taken, i)) for i in sent], answers, t0, t1)
    else:
        sent_changes = [
            (job, Change(names[job], _token(model, job, offset), state, lease))
            for job, offset, state, lease in op.items
        ]
        answers = store.change_many([change for _, change in sent_changes])
        t1 = time.monotonic()
        # One job's changes apply in the order listed: each decided once the one before
        # it is applied.
        for (job, change), answer in zip(sent_changes, answers, strict=True):

            def changed(now: float, job: str = job, change: Change = change) -> Decision[Any]:
                return decide.change(model.records.get(job), change, now)

            _agree(model, op, [(job, changed)], [answer], t0, t1, key=lambda a: a)
    check_records(store, model, jobs, names, op)


def check_records(
    store: Store, model: Model, jobs: set[str], names: dict[str, str], op: Any
) -> None:
    """Each job's record, history and counts on the store are the model's."""
    states = store.states(names[job] for job in jobs)
    at = time.monotonic()
    stats = store.stats(names[job] for job in jobs)
    for job in sorted(jobs):
        rec, found = model.records.get(job), states.get(names[job])
        where = f"{job} after {op}"
        if rec is None:
            assert found is None, where
            continue
        assert found is not None, where
        got = (found.slot_ms, found.owner, found.attempt, found.token, found.state)
        assert got == (rec.slot_ms, rec.owner, rec.attempt, rec.token, rec.state), where
        live = model.live(job, at)
        if live is not None:
            assert (found.lease_remaining > 0) == live, (where, found.lease_remaining)
        runs = [
            [r.slot_ms, r.attempt, r.token, r.owner, r.state, r.ended_at is None]
            for r in store.history(names[job], 50)
        ]
        assert runs == model.history.get(job, []), where
        counted = stats[names[job]]
        got_counts = [counted.runs, counted.takeovers, counted.done, counted.failed]
        assert got_counts == model.counts[job], where


# --- the test ----------------------------------------------------------------------

#: A job's limit reached, in the order of the answers: paused, taken, stale, then
#: ended (before busy); a takeover is not limited, nor counted.
LIMITED = [
    Claims("a", (("j0", SLOTS[0], LONG_LEASE), ("j1", SLOTS[0], LONG_LEASE))),
    Claims("b", (("j0", SLOTS[1], LONG_LEASE), ("j1", SLOTS[0], SHORT))),  # ended; taken
    Changes((("j0", 0, RunState.RELEASED, 0.0), ("j1", 0, RunState.DONE, 0.0))),
    Takeovers("c", (("j0", None, 0, LONG_LEASE),)),  # won, as attempt 2
    Claims("b", (("j0", SLOTS[0], LONG_LEASE), ("j1", SLOTS[1], SHORT))),  # taken; won
    Claims("a", (("j1", SLOTS[0], SHORT), ("j0", SLOTS[2], SHORT))),  # stale; ended
    Changes((("j0", 0, RunState.DONE, 0.0),)),
    Wait(),
    Claims("c", (("j0", SLOTS[2], SHORT), ("j1", SLOTS[2], SHORT))),  # ended; ended
    Pause("j0", True),
    Claims("a", (("j0", SLOTS[2], SHORT),)),  # paused
]

examples = itertools.count()


# Hypothesis compares the global ``random`` state before and after drawing the
# examples; these strategies never touch it, but a thread of another test in this
# process may (a client library's own choices), which Hypothesis then blames here.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    # One store serves every example (each its own jobs), on purpose.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations, most=limits)
@example(ops=LIMITED, most={"j0": 1, "j1": 2})
def test_every_answer_and_record_is_the_decision_tables(
    lease_store: Store, ops: list[Any], most: dict[str, int | None]
) -> None:
    assert isinstance(lease_store, LeaseStore)
    n = next(examples)
    names = {job: f"x{n}-{job}" for job in JOBS}
    model = Model(limits=most)
    for op in ops:
        step(lease_store, model, op, names)
