"""The worker's side of a hand-off survives any store error, not only "unavailable"."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import pytest

from anarchon_core import Change, RunState
from anarchon_core.decide import END_STATES
from anarchon_core.handoff import ExecutionLease, HandOff
from anarchon_core.stores.memory import MemoryStore


class Refusing(MemoryStore):
    """A store whose server answers some writes with an error (Redis MISCONF, say)."""

    failures = 0

    def renew(self, job: str, token: int, lease: float) -> bool:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("MISCONF Redis is configured to save RDB snapshots")
        return super().renew(job, token, lease)

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        if any(change.state in END_STATES for change in changes):  # finish, release
            raise RuntimeError("NOREPLICAS Not enough good replicas to write.")
        return super().change_many(changes)


def ticket_for(store: MemoryStore, lease: float) -> HandOff:
    holder = store.claim("job", 1_000, "beat", 30).holder
    assert holder is not None and store.dispatch("job", holder.token, 30)
    return HandOff("default", "job", "job@1000", 1, holder.token, True, lease, 30)


def test_the_worker_keeps_renewing_after_a_server_error(caplog: pytest.LogCaptureFixture) -> None:
    store = Refusing()
    lease = ExecutionLease(store, ticket_for(store, lease=0.3))
    assert lease.pick_up()
    state = store.state("job")
    assert state is not None and state.state is RunState.RUNNING  # picked up
    store.failures = 2
    time.sleep(1.0)  # renewals every 0.1 s: two fail, the next ones succeed
    state = store.state("job")
    assert state is not None and state.lease_remaining > 0.15
    assert "could not renew job@1000: MISCONF" in caplog.text
    lease.stop_renewing()


def test_a_finish_the_server_refuses_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Refusing()
    lease = ExecutionLease(store, ticket_for(store, lease=5))
    assert lease.pick_up()
    with caplog.at_level(logging.WARNING):
        lease.finish(RunState.DONE)  # the task's own outcome is not replaced by this error
    assert "could not finish job@1000: NOREPLICAS" in caplog.text
