"""Pausing jobs and namespaces (Store.pause, resume, paused), run against every store.

A claim of a paused job, or of any job of a paused namespace, answers
**paused** and writes nothing; a run already going is not interrupted. The
pause marks are shared by every store object of the namespace.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from anarchon_core import (
    Change,
    Claim,
    ClaimRequest,
    ClaimStatus,
    ConfigurationError,
    JobState,
    Paused,
    RunState,
    Store,
    open_store,
)
from anarchon_core.store import ControlStore, LeaseStore
from tests.stores.conftest import StoreFactory

SLOT = 1_700_000_000_000
NEXT = SLOT + 10_000
LATER = NEXT + 10_000
#: A job name a store must keep as it is (space, non-ASCII, slash, colon).
ODD = "nightly report: é/1"


def _claimed(store: Store, job: str = "job", lease: float = 10, slot: int = SLOT) -> JobState:
    """``job``'s ``slot``, claimed by ``a`` with a ``lease``: its holder (the claim won)."""
    claim = store.claim(job, slot, "a", lease)
    assert claim.status is ClaimStatus.WON, claim
    assert claim.holder is not None
    return claim.holder


def _fields(state: JobState | None) -> tuple[Any, ...] | None:
    """What a record says, less its lease left (which moves with the clock)."""
    if state is None:
        return None
    return (state.job, state.slot_ms, state.owner, state.attempt, state.token, state.state)


def _snapshot(store: Store, job: str) -> tuple[Any, ...]:
    """Everything the store keeps of ``job``: its record and its history."""
    return _fields(store.state(job)), store.history(job, limit=100)


def _pause(store: Store, target: str, *jobs: str) -> None:
    """Pause ``jobs`` by name, or the whole namespace."""
    if target == "namespace":
        assert store.pause()
    else:
        for job in jobs:
            assert store.pause(job)


def _resume(store: Store, target: str, *jobs: str) -> None:
    if target == "namespace":
        assert store.resume()
    else:
        for job in jobs:
            assert store.resume(job)


@pytest.fixture
def lease_store(make_store: StoreFactory) -> Store:
    """A store that keeps leases (and pause marks); claim-only stores skip."""
    store = make_store()
    if not isinstance(store, LeaseStore):
        pytest.skip(f"{type(store).__name__} is claim-only: no lease, no pause")
    assert isinstance(store, ControlStore)
    return store


TARGETS = pytest.mark.parametrize("target", ["job", "namespace"])


# -- 1. a paused job's claim --------------------------------------------------


def test_a_paused_jobs_claim_answers_paused_and_writes_nothing(lease_store: Store) -> None:
    store = lease_store
    first = _claimed(store)
    assert store.finish("job", first.token, RunState.DONE)
    assert store.pause("job") is True
    before = _snapshot(store, "job")

    for slot in (NEXT, LATER, SLOT, SLOT - 1):  # newer, same and older slots alike
        claim = store.claim("job", slot, "b", 10)
        assert claim.status is ClaimStatus.PAUSED, (slot, claim)
        assert not claim.won
        # The holder is the current record, untouched.
        assert _fields(claim.holder) == before[0]
    assert _snapshot(store, "job") == before
    assert store.jobs() == ["job"]

    # Another job of the namespace is not paused: it wins.
    other = store.claim("other", NEXT, "b", 10)
    assert other.status is ClaimStatus.WON
    assert store.paused() == Paused(False, ("job",))

    # The refused claims used no token: the next claim after the resume takes
    # the very next one.
    assert store.resume("job") is True
    won = _claimed(store, slot=NEXT)
    assert won.token > first.token and won.attempt == 1


def test_a_paused_job_is_refused_whatever_its_record(lease_store: Store) -> None:
    """Running, lapsed or never recorded: paused, never taken, busy, stale or won."""
    store = lease_store
    running = _claimed(store, "running", lease=60)
    lapsed = _claimed(store, "lapsed", lease=0.2)
    for job in ("running", "lapsed", "never"):
        assert store.pause(job)
    time.sleep(0.3)  # "lapsed" would be superseded by a newer slot, unpaused
    before = {job: _snapshot(store, job) for job in ("running", "lapsed", "never")}

    for job, slot in [("running", SLOT), ("running", NEXT), ("running", SLOT - 1)]:
        claim = store.claim(job, slot, "b", 10)
        assert claim.status is ClaimStatus.PAUSED, (job, slot, claim)
        assert claim.holder is not None and claim.holder.token == running.token
    claim = store.claim("lapsed", NEXT, "b", 10)
    assert claim.status is ClaimStatus.PAUSED
    assert claim.holder is not None and claim.holder.token == lapsed.token
    assert claim.holder.state is RunState.RUNNING  # not superseded as abandoned
    claim = store.claim("never", SLOT, "b", 10)
    assert claim == Claim(ClaimStatus.PAUSED, None)

    assert {job: _snapshot(store, job) for job in before} == before
    assert before["never"] == (None, [])
    assert store.jobs() == ["lapsed", "running"]  # a pause alone is no job record


# -- 2. a batch mixing paused and unpaused jobs --------------------------------


def test_claim_many_answers_paused_for_the_paused_jobs_only(lease_store: Store) -> None:
    store = lease_store
    done = _claimed(store, "recorded-paused")
    assert store.finish("recorded-paused", done.token, RunState.DONE)
    free = _claimed(store, "recorded-free")
    assert store.finish("recorded-free", free.token, RunState.DONE)
    assert store.pause("new-paused") and store.pause("recorded-paused")
    before = {job: _snapshot(store, job) for job in ("new-paused", "recorded-paused")}

    requests = [
        ClaimRequest("new-paused", NEXT, 10),
        ClaimRequest("new-free", NEXT, 10),
        ClaimRequest("recorded-paused", NEXT, 10),
        ClaimRequest("recorded-free", NEXT, 10),
    ]
    claims = store.claim_many(requests, "b")
    assert [c.status for c in claims] == [
        ClaimStatus.PAUSED,
        ClaimStatus.WON,
        ClaimStatus.PAUSED,
        ClaimStatus.WON,
    ]
    assert claims[0].holder is None
    assert _fields(claims[2].holder) == before["recorded-paused"][0]
    for claim, job in [(claims[1], "new-free"), (claims[3], "recorded-free")]:
        assert claim.holder is not None
        assert (claim.holder.job, claim.holder.owner, claim.holder.slot_ms) == (job, "b", NEXT)
    assert {job: _snapshot(store, job) for job in before} == before
    assert store.jobs() == ["new-free", "recorded-free", "recorded-paused"]

    # Once resumed, the same batch wins the paused jobs (the others are taken).
    assert store.resume("new-paused") and store.resume("recorded-paused")
    again = store.claim_many(requests, "c")
    assert [c.status for c in again] == [
        ClaimStatus.WON,
        ClaimStatus.TAKEN,
        ClaimStatus.WON,
        ClaimStatus.TAKEN,
    ]
    assert again[2].holder is not None and again[2].holder.token > done.token


# -- 3. the namespace's pause ---------------------------------------------------


def test_a_paused_namespace_refuses_every_job_until_resumed(lease_store: Store) -> None:
    store = lease_store
    done = _claimed(store, "recorded")
    assert store.finish("recorded", done.token, RunState.DONE)
    assert store.pause() is True
    before = {job: _snapshot(store, job) for job in ("recorded", "never", ODD)}

    claim = store.claim("recorded", NEXT, "b", 10)
    assert claim.status is ClaimStatus.PAUSED
    assert _fields(claim.holder) == before["recorded"][0]
    # A job the namespace never saw before is refused too.
    assert store.claim("never", SLOT, "b", 10) == Claim(ClaimStatus.PAUSED, None)
    assert store.claim(ODD, SLOT, "b", 10) == Claim(ClaimStatus.PAUSED, None)
    batch = store.claim_many(
        [ClaimRequest("recorded", LATER, 10), ClaimRequest("never", SLOT, 10)], "b"
    )
    assert [c.status for c in batch] == [ClaimStatus.PAUSED, ClaimStatus.PAUSED]
    assert {job: _snapshot(store, job) for job in before} == before
    assert store.jobs() == ["recorded"]
    assert store.paused() == Paused(True, ())

    assert store.resume() is True
    assert store.paused() == Paused(False, ())
    won = store.claim("recorded", NEXT, "b", 10)
    assert won.status is ClaimStatus.WON
    assert won.holder is not None and won.holder.token > done.token
    assert store.claim("never", SLOT, "b", 10).status is ClaimStatus.WON
    assert store.claim(ODD, SLOT, "b", 10).status is ClaimStatus.WON


def test_a_jobs_pause_and_the_namespaces_are_independent(lease_store: Store) -> None:
    store = lease_store
    for job in ("a", "b"):
        holder = _claimed(store, job)
        assert store.finish(job, holder.token, RunState.DONE)

    # Resuming the namespace leaves a job paused by name paused.
    assert store.pause("a") and store.pause()
    assert store.paused() == Paused(True, ("a",))
    assert store.claim("b", NEXT, "x", 10).status is ClaimStatus.PAUSED
    assert store.resume()
    assert store.paused() == Paused(False, ("a",))
    assert store.claim("a", NEXT, "x", 10).status is ClaimStatus.PAUSED
    assert store.claim("b", NEXT, "x", 10).status is ClaimStatus.WON

    # Resuming the job leaves the namespace paused.
    assert store.pause()
    assert store.resume("a")
    assert store.paused() == Paused(True, ())
    assert store.claim("a", NEXT, "x", 10).status is ClaimStatus.PAUSED
    assert store.claim("b", LATER, "x", 10).status is ClaimStatus.PAUSED
    assert store.resume()
    assert store.claim("a", NEXT, "x", 10).status is ClaimStatus.WON
    assert store.paused() == Paused(False, ())


# -- 4. return values, listing, sharing ---------------------------------------


def test_pause_and_resume_say_whether_they_changed_anything(lease_store: Store) -> None:
    store = lease_store
    assert store.paused() == Paused(False, ())
    assert store.resume("job") is False  # never paused
    assert store.resume() is False

    assert store.pause("job") is True
    assert store.pause("job") is False
    assert store.pause() is True
    assert store.pause() is False
    assert store.pause(None) is False  # None is the namespace
    assert store.paused() == Paused(True, ("job",))

    assert store.resume("job") is True
    assert store.resume("job") is False
    assert store.resume() is True
    assert store.resume() is False
    assert store.paused() == Paused(False, ())

    # Paused again after a resume: a change again.
    assert store.pause("job") is True
    assert store.pause() is True
    assert store.paused() == Paused(True, ("job",))
    assert store.resume("job") is True and store.resume() is True
    assert store.paused() == Paused(False, ())
    assert store.claim("job", SLOT, "a", 10).won


def test_paused_lists_the_marks_sorted(lease_store: Store) -> None:
    store = lease_store
    _claimed(store, "recorded")
    for job in ("zeta", ODD, "alpha", "recorded"):
        assert store.pause(job)
    expected = tuple(sorted(["zeta", ODD, "alpha", "recorded"]))
    paused = store.paused()
    assert paused == Paused(False, expected)
    assert paused.covers("alpha") and paused.covers(ODD) and not paused.covers("beta")
    assert store.claim(ODD, SLOT, "a", 10).status is ClaimStatus.PAUSED
    assert store.resume("alpha")
    assert store.paused().jobs == tuple(sorted(["zeta", ODD, "recorded"]))
    assert store.jobs() == ["recorded"]  # pause marks are not jobs


def test_job_names_are_checked(lease_store: Store) -> None:
    store = lease_store
    for bad in ("", "   ", "bad\nname"):
        with pytest.raises(ConfigurationError):
            store.pause(bad)
        with pytest.raises(ConfigurationError):
            store.resume(bad)
    assert store.paused() == Paused(False, ())  # above all, not a namespace pause
    assert store.claim("job", SLOT, "a", 10).won


def test_pause_marks_are_shared_by_the_namespace_and_no_other(make_store: StoreFactory) -> None:
    store = make_store("billing")
    if not isinstance(store, LeaseStore):
        pytest.skip(f"{type(store).__name__} is claim-only: no pause")
    peer = make_store("billing")  # another instance of the same namespace
    other = make_store("mail")

    assert store.pause("job") and store.pause()
    assert peer.paused() == Paused(True, ("job",))
    assert other.paused() == Paused(False, ())
    assert peer.pause("job") is False and peer.pause() is False  # seen as set already
    assert other.resume("job") is False and other.resume() is False

    assert peer.claim("job", SLOT, "b", 10).status is ClaimStatus.PAUSED
    assert peer.claim("else", SLOT, "b", 10).status is ClaimStatus.PAUSED
    assert other.claim("job", SLOT, "c", 10).status is ClaimStatus.WON
    assert other.claim_many([ClaimRequest("else", SLOT, 10)], "c")[0].won

    # The peer resumes the namespace: both objects see it; the job stays paused.
    assert peer.resume() is True
    assert store.paused() == Paused(False, ("job",))
    assert store.claim("else", SLOT, "a", 10).status is ClaimStatus.WON
    assert store.claim("job", SLOT, "a", 10).status is ClaimStatus.PAUSED
    assert store.resume("job") is True
    assert peer.resume("job") is False
    assert peer.claim("job", SLOT, "b", 10).status is ClaimStatus.WON

    # And the other way round: a pause in the other namespace leaves this one.
    assert other.pause() and other.pause("job")
    assert store.paused() == Paused(False, ())
    assert store.claim("job", NEXT, "a", 10).status is ClaimStatus.BUSY  # b's lease is live
    assert store.claim("third", SLOT, "a", 10).won


# -- 5. a run already going -----------------------------------------------------


@TARGETS
def test_a_run_started_before_the_pause_goes_on(lease_store: Store, target: str) -> None:
    store = lease_store
    jobs = ("renewed", "dispatched", "released", "lapsing", "batched")
    renewed = _claimed(store, "renewed")
    dispatched = _claimed(store, "dispatched")
    released = _claimed(store, "released")
    lapsing = _claimed(store, "lapsing", lease=0.3)
    batched = _claimed(store, "batched")
    _pause(store, target, *jobs)

    # Renewed, dispatched and picked up, finished.
    assert store.renew("renewed", renewed.token, 20)
    state = store.state("renewed")
    assert state is not None and state.state is RunState.RUNNING
    assert 19 < state.lease_remaining <= 20
    assert store.dispatch("dispatched", dispatched.token, 10)
    state = store.state("dispatched")
    assert state is not None and state.state is RunState.DISPATCHED
    assert store.renew("dispatched", dispatched.token, 10)
    assert store.finish("dispatched", dispatched.token, RunState.FAILED)
    assert store.finish("renewed", renewed.token, RunState.DONE)
    state = store.state("renewed")
    assert state is not None and state.state is RunState.DONE

    # Handed over, then taken over by a backup.
    assert store.release("released", released.token)
    takeover = store.takeover("released", SLOT, "b", 10, released.token)
    assert takeover.status is ClaimStatus.WON
    assert takeover.holder is not None and takeover.holder.token > released.token

    # A batch of changes goes through as well.
    changes = [Change("batched", batched.token, RunState.RUNNING, 10)]
    changes.append(Change("batched", batched.token, RunState.DONE))
    assert store.change_many(changes) == [True, True]

    # A lapsed run is taken over.
    time.sleep(0.4)
    state = store.state("lapsing")
    assert state is not None and state.lapsed
    takeover = store.takeover("lapsing", SLOT, "b", 10, lapsing.token)
    assert takeover.status is ClaimStatus.WON
    assert takeover.holder is not None
    assert (takeover.holder.owner, takeover.holder.attempt) == ("b", 2)
    assert takeover.holder.token > lapsing.token
    assert [(r.attempt, r.state) for r in store.history("lapsing")] == [
        (2, RunState.RUNNING),
        (1, RunState.LOST),
    ]
    assert store.finish("lapsing", takeover.holder.token, RunState.DONE)

    # Yet no new slot of any of them starts.
    for job in jobs:
        assert store.claim(job, NEXT, "c", 10).status is ClaimStatus.PAUSED, job
    assert store.jobs() == sorted(jobs)


# -- 6. after the resume ------------------------------------------------------------


@TARGETS
def test_after_resume_the_next_slot_is_claimed_as_usual(lease_store: Store, target: str) -> None:
    store = lease_store
    first = _claimed(store)
    assert store.finish("job", first.token, RunState.DONE)
    _pause(store, target, "job")
    for slot in (NEXT, NEXT, LATER):
        assert store.claim("job", slot, "b", 10).status is ClaimStatus.PAUSED
    _resume(store, target, "job")

    claim = store.claim("job", NEXT, "b", 10)
    assert claim.status is ClaimStatus.WON
    assert claim.holder is not None
    assert (claim.holder.slot_ms, claim.holder.owner, claim.holder.attempt) == (NEXT, "b", 1)
    assert claim.holder.token > first.token  # the history below: the paused claims wrote none
    assert [(r.slot_ms, r.state) for r in store.history("job")] == [
        (NEXT, RunState.RUNNING),
        (SLOT, RunState.DONE),
    ]
    # The usual answers are back: taken, stale, busy.
    assert store.claim("job", NEXT, "c", 10).status is ClaimStatus.TAKEN
    assert store.claim("job", SLOT, "c", 10).status is ClaimStatus.STALE
    assert store.claim("job", LATER, "c", 10).status is ClaimStatus.BUSY
    assert store.finish("job", claim.holder.token, RunState.DONE)
    assert store.claim("job", LATER, "c", 10).status is ClaimStatus.WON


# -- 7. claim-only stores ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["rabbitmq"])
def test_a_claim_only_store_refuses_to_pause(make_store: StoreFactory) -> None:
    store = make_store()
    assert not isinstance(store, LeaseStore) and not isinstance(store, ControlStore)
    for call in (
        store.pause,
        lambda: store.pause("job"),
        store.resume,
        lambda: store.resume("job"),
        store.paused,
    ):
        with pytest.raises(ConfigurationError, match="needs a lease store"):
            call()
    with pytest.raises(ConfigurationError, match="needs a lease store"):
        store.pause("")
    # Claims go on as before.
    assert store.claim("job", SLOT, "a", 10).won


# -- 8. PostgreSQL: a database of the previous version --------------------------------


@pytest.mark.parametrize("kind", ["postgres", "postgres18"])
def test_postgres_gives_a_previous_versions_database_its_pause_table(
    make_store: StoreFactory, store_url: str
) -> None:
    from anarchon_core.stores.postgres import table_prefix

    old = make_store("upgrade")
    holder = _claimed(old)
    assert old.finish("job", holder.token, RunState.DONE)
    before = _snapshot(old, "job")
    paused_table = f"{table_prefix(old.namespace)}_paused"

    def exists() -> bool:
        with psycopg.connect(store_url, autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{paused_table}"',))
            found = row.fetchone()
            return bool(found and found[0])

    assert exists()
    # What the previous version made: the same tables and trigger, no pause table.
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(paused_table)))
    assert not exists()

    new = make_store("upgrade")  # an instance of this version starts
    assert new is not old
    assert new.paused() == Paused(False, ())
    assert exists()
    assert _snapshot(new, "job") == before  # the records survive the upgrade
    assert new.pause("job") is True
    assert new.pause() is True
    assert new.paused() == Paused(True, ("job",))
    assert new.claim("job", NEXT, "b", 10).status is ClaimStatus.PAUSED
    assert new.claim("fresh", SLOT, "b", 10).status is ClaimStatus.PAUSED
    assert _snapshot(new, "job") == before
    assert new.resume() and new.resume("job")
    won = new.claim("job", NEXT, "b", 10)
    assert won.status is ClaimStatus.WON
    assert won.holder is not None and won.holder.token > holder.token


# -- 9. Redis Cluster: records on every primary ------------------------------------


@pytest.mark.parametrize("kind", ["redis-cluster"])
def test_redis_cluster_namespace_pause_refuses_recorded_jobs(make_store: StoreFactory) -> None:
    """Jobs spread over the three primaries, each with a record, one still running."""
    store = make_store()
    peer = make_store()
    jobs = [f"job{k:02}" for k in range(24)]  # enough to land on every primary
    for job in jobs:
        holder = _claimed(store, job)
        if job != "job00":  # job00 stays running
            assert store.finish(job, holder.token, RunState.DONE)
    assert store.pause("job01")
    before = {job: _snapshot(store, job) for job in jobs}

    assert peer.pause() is True
    for job in jobs:
        claim = peer.claim(job, NEXT, "b", 10)
        assert claim.status is ClaimStatus.PAUSED, (job, claim)
        assert _fields(claim.holder) == before[job][0]
    claims = store.claim_many([ClaimRequest(job, LATER, 10) for job in jobs], "c")
    assert [c.status for c in claims] == [ClaimStatus.PAUSED] * len(jobs)
    assert {job: _snapshot(store, job) for job in jobs} == before
    assert store.paused() == Paused(True, ("job01",))
    # The running one still renews and finishes.
    running = before["job00"][0]
    assert running is not None
    assert store.renew("job00", running[4], 10)
    assert store.finish("job00", running[4], RunState.DONE)

    assert store.resume() is True
    claims = peer.claim_many([ClaimRequest(job, NEXT, 10) for job in jobs], "b")
    expected = [ClaimStatus.PAUSED if job == "job01" else ClaimStatus.WON for job in jobs]
    assert [c.status for c in claims] == expected
    assert store.resume("job01")
    assert store.claim("job01", NEXT, "a", 10).won


# -- 10. a pause racing claims ------------------------------------------------------

#: One claim of a claimer: (job, begun, status, token won or 0).
Seen = tuple[str, float, str, int]
#: Claims each claimer makes after the pause returned, before it stops.
AFTER_PAUSE = 20


def _claim_in_a_loop(store: Store, i: int, job: str, shared: Any) -> list[Seen]:
    """Claim new slots of ``job`` until ``shared`` says stop; each claim as (job, begun,
    status, token won or 0).

    Each won run is finished at once. ``shared["won<i>"]`` tells the pauser
    that this claimer has won; once ``shared["paused_at"]`` is set, the loop
    stops after :data:`AFTER_PAUSE` claims begun after it.
    """
    seen: list[Seen] = []
    after = 0
    while not shared.get("stop"):
        # A new slot at every claim, rising across claimers (which may share the job).
        slot = SLOT + (time.monotonic_ns() // 1000) * 8 + i
        begun = time.monotonic()
        claim = store.claim(job, slot, f"i{i}", 10)
        seen.append((job, begun, claim.status.value, claim.holder.token if claim.won else 0))  # type: ignore[union-attr]
        if claim.won:
            assert claim.holder is not None
            assert store.finish(job, claim.holder.token, RunState.DONE)
            if not shared.get(f"won{i}"):
                shared[f"won{i}"] = True
        paused_at = shared.get("paused_at")
        if paused_at is not None and begun > paused_at:
            after += 1
            if after >= AFTER_PAUSE:
                break
    return seen


def _claimer_process(url: str, namespace: str, i: int, job: str, shared: Any) -> list[Seen]:
    """:func:`_claim_in_a_loop` in a process of its own, with a store object of its own."""
    store = open_store(url, namespace=namespace)
    try:
        return _claim_in_a_loop(store, i, job, shared)
    finally:
        store.close()


@TARGETS
def test_no_claim_begun_after_pause_returned_wins(
    kind: str, store_url: str, lease_store: Store, make_store: StoreFactory, target: str
) -> None:
    """Three instances claim new slots in a loop while a fourth pauses.

    Every claim begun after ``pause()`` returned answers paused; those begun
    before may still win. Nothing a paused claim did shows: each job's token
    counts its wins exactly. Each claimer is a process with its own store
    object (threads for the memory store, which lives in one process).
    """
    pauser, claimers = lease_store, 3
    jobs = [f"job{i}" if target == "namespace" else "hot" for i in range(claimers)]

    def pause_when_all_won(shared: Any, failed: Callable[[], bool]) -> float:
        """Pause once every claimer has won; when pause() returned."""
        deadline = time.monotonic() + 60
        while not all(shared.get(f"won{i}") for i in range(claimers)):
            assert time.monotonic() < deadline and not failed(), "the claimers never all won"
            time.sleep(0.01)
        assert (pauser.pause() if target == "namespace" else pauser.pause("hot")) is True
        paused_at = time.monotonic()
        shared["paused_at"] = paused_at
        return paused_at

    seen: list[list[Seen]]
    if kind == "memory":
        shared: dict[str, Any] = {}
        stores = [make_store() for _ in range(claimers)]
        seen = [[] for _ in range(claimers)]
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                seen[i] = _claim_in_a_loop(stores[i], i, jobs[i], shared)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(claimers)]
        for thread in threads:
            thread.start()
        try:
            paused_at = pause_when_all_won(shared, lambda: bool(errors))
        except BaseException:
            shared["stop"] = True
            raise
        finally:
            for thread in threads:
                thread.join(60)
        assert not errors and not any(thread.is_alive() for thread in threads)
    else:
        namespace = pauser.namespace
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, context.Pool(claimers) as pool:
            proxy = manager.dict()
            args = [(store_url, namespace, i, jobs[i], proxy) for i in range(claimers)]
            running = pool.starmap_async(_claimer_process, args)
            try:
                paused_at = pause_when_all_won(proxy, running.ready)
            except BaseException:
                proxy["stop"] = True
                raise
            seen = running.get(120)

    after = [status for mine in seen for _, begun, status, _ in mine if begun > paused_at]
    assert len(after) >= AFTER_PAUSE * claimers
    assert set(after) == {ClaimStatus.PAUSED.value}
    # Attempts: one per win, none for the refused claims (the history holds the tokens
    # the wins were given, newest first), and the runs counted are the wins.
    wins: dict[str, int] = {}
    won: dict[str, list[int]] = {}
    for mine in seen:
        for job, _, status, token in mine:
            wins[job] = wins.get(job, 0) + (status == ClaimStatus.WON.value)
            if token:
                won.setdefault(job, []).append(token)
    assert all(count > 0 for count in wins.values())
    states = pauser.states(wins)
    assert {job: counted.runs for job, counted in pauser.stats(wins).items()} == wins
    for job, state in states.items():
        tokens = [run.token for run in pauser.history(job, 50)]
        assert len(tokens) == min(50, wins[job])
        assert tokens == sorted(won[job], reverse=True)[:50] and tokens[0] == state.token, job
    assert all(state.state is RunState.DONE for state in states.values())


def test_a_jobs_pause_covers_its_lanes_and_resume_clears_every_one(lease_store: Store) -> None:
    """A job with overlap="allow_all" claims each slot in its lane's record: pausing the
    job refuses those claims too, in the claim's atomic step, and the job (not its lanes)
    is listed as paused until every mark is gone."""
    from anarchon_core.slots import LANES, lane_record

    store = lease_store
    lanes = [lane_record(ODD, lane) for lane in range(LANES)]
    assert store.claim(lanes[3], SLOT, "a", 10).won  # a run going on in lane 3
    assert store.pause(ODD) is True
    assert store.paused() == Paused(False, (ODD,))
    answers = store.claim_many([ClaimRequest(lane, NEXT, 10) for lane in lanes], "b")
    assert [a.status for a in answers] == [ClaimStatus.PAUSED] * LANES
    assert store.states([lanes[3]])[lanes[3]].slot_ms == SLOT  # nothing written
    assert store.pause(ODD) is False  # paused already, every lane with it
    assert sorted(store.jobs()) == [lanes[3]]  # the marks are not records

    assert store.resume(ODD) is True
    assert store.paused() == Paused(False, ())
    answers = store.claim_many([ClaimRequest(lane, NEXT, 10) for lane in lanes], "b")
    expected = [ClaimStatus.WON] * LANES
    expected[3] = ClaimStatus.BUSY  # the run going on in lane 3 still holds its lease
    assert [a.status for a in answers] == expected


def test_a_resume_cut_short_leaves_the_job_listed_as_paused(lease_store: Store) -> None:
    from anarchon_core.slots import lane_record

    store = lease_store
    assert store.pause("job")
    assert isinstance(store, ControlStore)
    store._set_pause("job", False)  # the job's own mark gone, its lanes' not yet
    assert store.paused().jobs == ("job",)
    assert store.claim(lane_record("job", 5), SLOT, "a", 10).status is ClaimStatus.PAUSED
    assert store.resume("job") is True
    assert store.paused().jobs == ()
