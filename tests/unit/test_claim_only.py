"""A claim-only store: the engine sends it claims and nothing else; its runs end by their events."""

from __future__ import annotations

from collections.abc import Sequence

from anarchon_core import Event, EventKind, Run, Scheduler
from anarchon_core.clock import FakeClock
from anarchon_core.store import (
    Change,
    Claim,
    ClaimOnlyStore,
    ClaimRequest,
    ClaimStatus,
    JobState,
    RunState,
)


class Winners(ClaimOnlyStore):
    """Picks the first claimer of each slot, as RabbitMQ does; records every call."""

    def __init__(self) -> None:
        super().__init__(namespace="n")
        self.won: set[tuple[str, int]] = set()
        self.calls: list[str] = []

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        self.calls.append("claim_many")
        claims = []
        for r in requests:
            if (r.job, r.slot_ms) in self.won:
                claims.append(Claim(ClaimStatus.TAKEN, None))
                continue
            self.won.add((r.job, r.slot_ms))
            holder = JobState(r.job, r.slot_ms, owner, 1, r.slot_ms, RunState.RUNNING, 0.0)
            claims.append(Claim(ClaimStatus.WON, holder))
        return claims

    # What a lease store would be sent: recorded here, to show that none comes.

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        self.calls.append("change_many")
        return [True] * len(changes)

    def dispatch(self, job: str, token: int, pickup: float) -> bool:
        self.calls.append("dispatch")
        return True

    def release(self, job: str, token: int) -> bool:
        self.calls.append("release")
        return True


def test_the_engine_sends_a_claim_only_store_claims_alone_and_ends_runs_by_events() -> None:
    clock = FakeClock()
    store = Winners()
    events: list[Event] = []
    s = Scheduler(store, clock=clock, instance="a", inline=True, jitter=0, listener=events.append)
    ran: list[str] = []

    @s.job("works", every=1)
    def works() -> None:
        ran.append("works")

    @s.job("breaks", every=1)
    def breaks() -> None:
        raise RuntimeError("boom")

    @s.job("dispatches", every=1)
    def dispatches(run: Run) -> None:
        run.hand_off(5)  # nothing to hand off: the run is its handler's

    for _ in range(3):
        s.run_pending()
        clock.advance(1)
    s.stop(timeout=1)
    assert ran
    assert set(store.calls) == {"claim_many"}, store.calls
    kinds = {(e.job, e.kind) for e in events}
    assert ("works", EventKind.FINISHED) in kinds
    assert ("breaks", EventKind.FAILED) in kinds
    assert ("dispatches", EventKind.DISPATCHED) in kinds
    assert not any(e.kind in (EventKind.LOST, EventKind.HANDED_OVER) for e in events)


def test_a_claim_only_store_has_no_lease_steps() -> None:
    for step in ("change_many", "dispatch", "finish", "release", "renew", "takeover"):
        assert not hasattr(ClaimOnlyStore, step), step
