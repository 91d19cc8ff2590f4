"""The worker's side of a hand-off survives any store error, not only "unavailable"."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from anarchon_core import Change, DispatchFailed, RunState, handoff
from anarchon_core.decide import END_STATES
from anarchon_core.handoff import ExecutionLease, Executions, HandOff, SkipWork, dispatch
from anarchon_core.jobs import Rules
from anarchon_core.stores.memory import MemoryStore
from tests.waiting import wait_until


class Refusing(MemoryStore):
    """A store whose server answers some writes with an error (Redis MISCONF, say)."""

    failures = 0
    #: Renewals the store accepted since its last error.
    renewed = 0

    def renew(self, job: str, token: int, lease: float) -> bool:
        if self.failures:
            self.failures -= 1
            self.renewed = 0
            raise RuntimeError("MISCONF Redis is configured to save RDB snapshots")
        accepted = super().renew(job, token, lease)
        self.renewed += accepted
        return accepted

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
    # Renewals every 0.1 s: two fail, the next ones succeed.
    wait_until(lambda: not store.failures and store.renewed, 10, "a renewal after the errors")
    state = store.state("job")
    assert state is not None and state.state is RunState.RUNNING
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


# -- the one dispatch path -----------------------------------------------------


class Sent:
    """What a dispatch did, in order."""

    def __init__(self) -> None:
        self.steps: list[str] = []


def _engine_and_run(sent: Sent, lease: float = 5.0) -> tuple[Any, Any]:
    engine = SimpleNamespace(
        namespace="ns",
        instance="beat:1",
        job_named={
            "job": SimpleNamespace(options=SimpleNamespace(lease=lease), rules=Rules())
        }.__getitem__,
    )
    run = SimpleNamespace(
        job="job",
        key="job",
        slot_id="job@1000",
        attempt=2,
        token=7,
        hand_off=lambda pickup: sent.steps.append(f"hand_off {pickup:g}"),
    )
    return engine, run


class Unreachable(OSError):
    """The broker's connection error."""


@pytest.mark.parametrize("tracked", [True, False])
def test_dispatch_prepares_then_hands_off_then_sends(tracked: bool) -> None:
    sent = Sent()
    engine, run = _engine_and_run(sent)

    def prepare(ticket: HandOff) -> dict[str, Any]:
        sent.steps.append("prepare")
        return ticket.to_message()

    dispatch(
        engine,
        run,
        pickup=60,
        tracked=tracked,
        prepare=prepare,
        send=lambda message: sent.steps.append(f"send {message['slot_id']}"),
        broker_errors=(Unreachable,),
    )
    handed = ["hand_off 60"] if tracked else []
    assert sent.steps == ["prepare", *handed, "send job@1000"]


def test_a_broker_unreachable_before_the_hand_off_fails_the_dispatch_only() -> None:
    sent = Sent()
    engine, run = _engine_and_run(sent)

    def prepare(ticket: HandOff) -> None:
        raise Unreachable("connection refused")

    with pytest.raises(DispatchFailed, match="the broker is unreachable: connection refused"):
        dispatch(
            engine,
            run,
            pickup=60,
            tracked=True,
            prepare=prepare,
            send=lambda _: sent.steps.append("send"),
            broker_errors=(Unreachable,),
        )
    assert sent.steps == []  # not handed off, nothing sent


def test_a_send_error_caused_by_the_broker_is_a_dispatch_failure() -> None:
    sent = Sent()
    engine, run = _engine_and_run(sent)

    class Wrapped(Exception):
        pass

    def send(_: object) -> None:
        try:
            raise Unreachable("reset by peer")
        except Unreachable as exc:
            raise Wrapped("could not apply") from exc

    with pytest.raises(DispatchFailed, match="unreachable: reset by peer") as info:
        dispatch(
            engine,
            run,
            pickup=60,
            tracked=True,
            prepare=lambda ticket: None,
            send=send,
            broker_errors=(Unreachable,),
            cause=lambda exc: exc.__cause__ or exc,
        )
    assert isinstance(info.value.__cause__, Wrapped)
    assert sent.steps == ["hand_off 60"]


def test_any_other_send_error_propagates_as_it_is() -> None:
    sent = Sent()
    engine, run = _engine_and_run(sent)

    def send(_: object) -> None:
        raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        dispatch(
            engine,
            run,
            pickup=60,
            tracked=False,
            prepare=lambda ticket: None,
            send=send,
            broker_errors=(Unreachable,),
        )


# -- the worker side: one owner, one lock; stores closed ---------------------


class Closing(MemoryStore):
    closed = 0

    def close(self) -> None:
        self.closed += 1
        super().close()


def test_running_leases_change_from_many_threads_under_one_lock() -> None:
    executions = Executions()
    store = MemoryStore()
    tickets = []
    for n in range(40):
        holder = store.claim(f"job{n}", 1_000, "beat", 30).holder
        assert holder is not None and store.dispatch(f"job{n}", holder.token, 30)
        tickets.append(HandOff("default", f"job{n}", f"job{n}@1000", 1, holder.token, True, 30, 60))
    leases = [ExecutionLease(store, t, executions) for t in tickets]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(leases) + 1)

    def work(lease: ExecutionLease) -> None:
        try:
            barrier.wait()
            assert lease.pick_up()
            lease.stop_renewing()
            assert lease.pick_up()
        except BaseException as exc:  # reported below
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(lease,)) for lease in leases]
        for thread in threads:
            thread.start()
        barrier.wait()
        while any(t.is_alive() for t in threads):
            executions.running()  # read while the others change it
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert set(executions.running()) == set(leases)
    executions.release_all()
    assert executions.running() == []


def test_close_stores_closes_each_cached_store_once_and_forgets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[Closing] = []

    def open_store(url: str, *, namespace: str) -> Closing:
        store = Closing(namespace=namespace)
        opened.append(store)
        return store

    monkeypatch.setattr(handoff, "open_store", open_store)
    executions = Executions()
    first = executions.store_for("memory://", "a")
    assert executions.store_for("memory://", "a") is first
    executions.store_for("memory://", "b")
    executions.close_stores()
    assert [s.closed for s in opened] == [1, 1]
    executions.close_stores()  # nothing left to close
    assert [s.closed for s in opened] == [1, 1]
    assert executions.store_for("memory://", "a") is not first  # opened again


def test_the_process_stores_are_closed_by_close_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Closing()
    monkeypatch.setattr(handoff, "EXECUTIONS", Executions())
    monkeypatch.setattr(handoff, "open_store", lambda url, *, namespace: store)
    assert handoff.store_for("memory://", "default") is store
    handoff.close_stores()
    assert store.closed == 1


# -- a bug in a store call shows as a bug, not as an outage ------------------


class Buggy(MemoryStore):
    """A store whose renew has a bug."""

    bugs = 1
    #: Renewals the store accepted since its last error.
    renewed = 0

    def renew(self, job: str, token: int, lease: float) -> bool:
        if self.bugs:
            self.bugs -= 1
            self.renewed = 0
            raise TypeError("renew() got an unexpected keyword argument 'ttl'")
        accepted = super().renew(job, token, lease)
        self.renewed += accepted
        return accepted


def test_a_bug_in_taking_the_lease_skips_the_work_and_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Buggy()
    ticket = ticket_for(store, lease=5)
    monkeypatch.setattr(handoff, "EXECUTIONS", Executions())
    monkeypatch.setattr(handoff, "open_store", lambda _, *, namespace: store)
    with pytest.raises(SkipWork) as info:
        handoff.take("memory://", ticket)
    assert not info.value.stale
    (record,) = [r for r in caplog.records if "skipping job@1000" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "unavailable" not in record.getMessage()


def test_an_outage_in_taking_the_lease_is_still_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Refusing()
    ticket = ticket_for(store, lease=5)
    store.failures = 1
    monkeypatch.setattr(handoff, "EXECUTIONS", Executions())
    monkeypatch.setattr(handoff, "open_store", lambda _, *, namespace: store)
    with pytest.raises(SkipWork):
        handoff.take("memory://", ticket)
    (record,) = [r for r in caplog.records if "skipping job@1000" in r.getMessage()]
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "the store is unavailable: MISCONF" in record.getMessage()


def test_a_bug_in_a_renewal_is_logged_with_its_traceback_and_renewing_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Buggy()
    store.bugs = 0
    lease = ExecutionLease(store, ticket_for(store, lease=0.3), Executions())
    assert lease.pick_up()
    store.bugs = 1
    # Renewals every 0.1 s: one fails, the next ones succeed.
    wait_until(lambda: not store.bugs and store.renewed, 10, "a renewal after the bug")
    state = store.state("job")
    assert state is not None and state.state is RunState.RUNNING
    lease.stop_renewing()
    (record,) = [r for r in caplog.records if "could not renew" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info is not None
