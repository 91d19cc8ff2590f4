"""Stores that refuse writes, and a link that goes silent, against real servers.

Two schedulers run in this process (threads), so the handlers of both share
one monotonic clock and the order of what they saw can be compared.

- Writes refused for a few seconds while reads work (Redis ``NOREPLICAS``
  and ``MISCONF``, PostgreSQL read-only sessions): a run that finished
  meanwhile is recorded ``done`` once writes work again, not renewed for
  ever and run again; a run whose lease ran out meanwhile is told so before
  any backup runs the slot again; the engine goes on with later slots.
- One instance's link to Redis, PostgreSQL, MySQL, NATS or libSQL goes silent
  (a TCP proxy stops forwarding, closing nothing): its handler sees
  ``run.lost`` before the backup starts attempt 2 of the slot, however long
  the driver waits. The MySQL store bounds every call by its timeout: each
  fails within about that long while the link is silent.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from anarchon_core import (
    Event,
    EventKind,
    LeaseStore,
    Run,
    RunState,
    Scheduler,
    StoreUnavailable,
    open_store,
)
from anarchon_core.slots import Slot
from tests import servers
from tests.cleanup import drop_namespace
from tests.conftest import _wheel_server
from tests.scenarios.faults import (
    Attempt,
    Attempts,
    PostgresReadOnly,
    RedisMisconf,
    RedisNoReplicas,
    TcpProxy,
    WriteFault,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

#: How long writes are refused: longer than the ``long`` job's lease, so its
#: runner loses the run meanwhile, and far shorter than the ``tick`` job's.
FAULT = 3.0
#: The ``tick`` job's lease outlives the fault: its run that finished during
#: the fault can only be recorded, never taken over, once writes work again.
#: (A run whose end cannot be recorded before its lease lapses is run again by
#: design: at least once.)
TICK_LEASE = 8.0
#: The ``long`` job's lease, shorter than the fault.
LONG_LEASE = 2.0
#: The most a handler waits for the test (a gate, a lost lease).
HANDLER_WAIT = 10.0


# -- fixtures: servers this test may reconfigure --------------------------


@pytest.fixture
def scratch_redis_url() -> Iterator[str]:
    """A Redis of this test's own, no replica, which it reconfigures (CONFIG SET).

    ``ANARCHON_TEST_SCRATCH_REDIS_URL`` may name one instead: on this machine
    (the MISCONF fault points its snapshots at a local folder), and one that
    the tests may reconfigure.
    """
    datadir = Path(tempfile.mkdtemp(prefix="redis-faults-"))

    def start() -> servers.ServerProcess | None:
        binary = servers.redis_binary()
        return servers.start_redis_like(binary, "redis-faults", datadir) if binary else None

    try:
        yield from _wheel_server(
            "ANARCHON_TEST_SCRATCH_REDIS_URL",
            "a redis-server or valkey-server binary",
            start,
            "redis://127.0.0.1:{port}/0",
        )
    finally:
        shutil.rmtree(datadir, ignore_errors=True)


@pytest.fixture
def scratch_database(postgres_url: str) -> Iterator[tuple[str, str]]:
    """A database of this test's own on the PostgreSQL server: (its URL, its name)."""
    import psycopg
    from psycopg import sql

    name = f"anarchon_ro_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlsplit(postgres_url)._replace(path=f"/{name}").geturl(), name
    finally:
        with psycopg.connect(postgres_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# -- helpers ----------------------------------------------------------------


class Events:
    """Every event of the test's schedulers, with ``time.monotonic()`` when it came."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[tuple[float, Event]] = []

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.items.append((time.monotonic(), event))

    def kinds(self) -> set[EventKind]:
        with self._lock:
            return {event.kind for _, event in self.items}


def stop_all(*schedulers: Scheduler, timeout: float = 2.0) -> None:
    """Stop ``schedulers`` at once, each in a thread; wait at most 10 s in all."""
    threads = [
        threading.Thread(target=s.stop, kwargs={"timeout": timeout}, daemon=True)
        for s in schedulers
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def stop_between_runs(schedulers: list[Scheduler]) -> None:
    """Stop every scheduler while none holds a run, early in the gap between two slots.

    Both jobs run every second for 0.3 s from their slot (plus up to 0.1 s of
    jitter): stopping then hands nothing over.
    """
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if 0.55 <= time.time() % 1 <= 0.75 and not any(s.running() for s in schedulers):
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"no moment without runs: {[s.running() for s in schedulers]}")
    stop_all(*schedulers)


def by_slot(attempts: list[Attempt]) -> dict[str, list[Attempt]]:
    slots: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        slots[attempt.slot_id].append(attempt)
    return slots


# -- writes refused ---------------------------------------------------------


def refused_writes_scenario(url: str, fault: WriteFault) -> None:
    """Two instances, two jobs every second; writes are refused for ``FAULT`` seconds.

    ``tick`` (lease 8 s): the run in progress when the fault begins returns
    during it, so its end can only be recorded afterwards. ``long`` (lease
    2 s): the run in progress works until it sees ``run.lost``, then stops
    (``run.check()``): a backup may run attempt 2 once writes work again.
    """
    namespace = f"f{uuid.uuid4().hex[:10]}"
    attempts, events = Attempts(), Events()
    armed = {"tick": threading.Event(), "long": threading.Event()}
    targets: dict[str, Attempt] = {}
    started = {"tick": threading.Event(), "long": threading.Event()}
    fault_on = threading.Event()
    targets_lock = threading.Lock()

    def target(run: Run, entry: Attempt) -> bool:
        """Whether ``entry`` is the first run of its job begun after the test armed it."""
        with targets_lock:
            if not armed[run.job].is_set() or run.job in targets:
                return False
            targets[run.job] = entry
        started[run.job].set()
        return True

    def tick(run: Run) -> None:
        entry = attempts.begin(run)
        if target(run, entry):
            fault_on.wait(HANDLER_WAIT)
        time.sleep(0.3)
        entry.ended = time.monotonic()

    def long(run: Run) -> None:
        entry = attempts.begin(run)
        if not target(run, entry):
            time.sleep(0.3)
            entry.ended = time.monotonic()
            return
        deadline = time.monotonic() + HANDLER_WAIT
        while not run.lost and time.monotonic() < deadline:
            time.sleep(0.01)
        if run.lost:
            entry.lost_at = time.monotonic()
        entry.ended = time.monotonic()
        run.check()  # stops on LeaseLost: the slot goes to a backup

    schedulers = []
    for name in ("a", "b"):
        scheduler = Scheduler(url, namespace=namespace, instance=name, watch=0.25, listener=events)
        scheduler.add_job(tick, name="tick", every=1, lease=TICK_LEASE)
        scheduler.add_job(long, name="long", every=1, lease=LONG_LEASE)
        schedulers.append(scheduler)
    try:
        for scheduler in schedulers:
            scheduler.start()
        wait_until(
            attempts.watch(lambda xs: sum(x.ended is not None for x in xs if x.job == "tick") >= 2),
            10,
            "two runs of tick before the fault",
            seen=attempts.all,
        )
        for event in armed.values():
            event.set()
        for job, event in started.items():
            assert event.wait(5), f"no run of {job} began after arming"
        fault.refuse()
        fault_at = time.monotonic()
        fault_on.set()
        time.sleep(FAULT)
        fault.allow()
        allowed_at = time.monotonic()
        # Both jobs run again, on slots that begin after the fault ended.
        for job in ("tick", "long"):

            def ran_after(xs: list[Attempt], job: str = job) -> list[Attempt]:
                return [
                    x
                    for x in xs
                    if x.job == job and x.started > allowed_at + 1.5 and x.ended is not None
                ]

            wait_until(
                attempts.watch(ran_after), 8, f"a run of {job} after the fault", seen=attempts.all
            )
        alive = {s.instance: s._thread is not None and s._thread.is_alive() for s in schedulers}
        stop_between_runs(schedulers)
        stopped_at = time.monotonic()
        after_stop = len(attempts.all())
        time.sleep(2)
        final = attempts.all()
        store = open_store(url, namespace=namespace)
        try:
            history = {job: store.history(job, limit=50) for job in ("tick", "long")}
        finally:
            store.close()
    finally:
        stop_all(*schedulers)
        fault.allow()
        drop_namespace(url, namespace)

    slots = by_slot(final)
    tick_run, long_run = targets["tick"], targets["long"]
    # The fault hit both instances, and they went on afterwards.
    assert {EventKind.STORE_UNAVAILABLE, EventKind.STORE_RECOVERED} <= events.kinds()
    assert alive == {"a": True, "b": True}
    # The tick run returned while writes were refused ...
    assert tick_run.ended is not None and fault_at < tick_run.ended < allowed_at
    # ... and ran once: no attempt 2 after it finished; the store says it is done.
    assert [x.attempt for x in slots[tick_run.slot_id]] == [1]
    tick_history = [r for r in history["tick"] if r.slot_ms == Slot.from_id(tick_run.slot_id).ms]
    assert [(r.attempt, r.state) for r in tick_history] == [(1, RunState.DONE)]
    # The long run's runner saw its lease run out during the fault, before any
    # backup began attempt 2 of the slot (which it may do once writes work).
    assert long_run.lost_at is not None, "the runner never saw run.lost"
    assert fault_at < long_run.lost_at < fault_at + LONG_LEASE + 0.5
    assert long_run.lost_at < allowed_at
    # (Whether one does is a race with the job's next slot, which supersedes a
    # slot released or lapsed.) Its handler had returned by then: no overlap.
    # At most one later attempt runs its handler. A takeover whose answer came
    # too late to rely on its lease (the pools reconnecting once writes work
    # again, on a loaded machine) starts no handler and gives the slot back:
    # the next attempt runs it, and the store shows the one between as ended.
    again = [x for x in slots[long_run.slot_id] if x is not long_run]
    assert len(again) <= 1 and all(x.attempt >= 2 for x in again), again
    assert long_run.ended is not None
    assert all(long_run.lost_at < long_run.ended < x.started for x in again)
    long_history = {
        r.attempt: r.state
        for r in history["long"]
        if r.slot_ms == Slot.from_id(long_run.slot_id).ms
    }
    unstarted = {
        n: s for n, s in long_history.items() if n > 1 and n not in {x.attempt for x in again}
    }
    assert set(unstarted.values()) <= {RunState.RELEASED, RunState.LOST, RunState.ABANDONED}, (
        long_history
    )
    # Every other slot ran exactly once, as attempt 1.
    others = {sid: xs for sid, xs in slots.items() if sid != long_run.slot_id}
    assert {sid: [x.attempt for x in xs] for sid, xs in others.items() if len(xs) > 1} == {}
    assert [x for xs in others.values() for x in xs if x.attempt != 1] == []
    # Once stopped, nothing runs again (no finished slot handed over).
    assert len(final) == after_stop, [x for x in final if x.started > stopped_at]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fault_kind", ["noreplicas", "misconf"])
def test_redis_refusing_writes_neither_drops_a_finished_run_nor_runs_it_again(
    scratch_redis_url: str, fault_kind: str
) -> None:
    """Redis refuses writes for 3 s (NOREPLICAS: no replica; MISCONF: a snapshot failed).

    A user sees each slot run once: the run that finished meanwhile is
    recorded done afterwards and never runs a second time (not even when the
    instances stop); the run whose lease ran out is told so (``run.lost``)
    before another instance runs the slot again; later slots run as usual.
    """
    fault: RedisNoReplicas | RedisMisconf
    if fault_kind == "noreplicas":
        fault = RedisNoReplicas(scratch_redis_url)
    else:
        fault = RedisMisconf(scratch_redis_url)
    try:
        refused_writes_scenario(scratch_redis_url, fault)
    finally:
        fault.close()


@pytest.mark.timeout(90)
def test_postgres_read_only_neither_drops_a_finished_run_nor_runs_it_again(
    postgres_url: str, scratch_database: tuple[str, str]
) -> None:
    """PostgreSQL sessions turn read-only for 3 s (``default_transaction_read_only``).

    As with Redis: every slot runs once, the run finished meanwhile is
    recorded done, the runner whose lease ran out sees ``run.lost`` before a
    backup runs attempt 2, and the scheduling threads live on and schedule
    later slots once the database is writable again.
    """
    url, database = scratch_database
    fault = PostgresReadOnly(postgres_url, url, database)
    try:
        refused_writes_scenario(url, fault)
    finally:
        fault.close()


# -- a link that goes silent ---------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["redis", "postgres", "mysql", "nats", "libsql"])
def test_runner_behind_a_silent_link_sees_run_lost_before_the_takeover(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The runner's link to the store goes silent (nothing answers, nothing closes).

    A user sees the backup run the slot again after the lease, and the old
    runner's handler told ``run.lost`` before that, not seconds later when
    the driver gives up (Redis 3 s, NATS up to 8 s, PostgreSQL never).
    """
    url = str(request.getfixturevalue(f"{kind}_url"))
    target = urlsplit(url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 0)
    namespace = f"p{uuid.uuid4().hex[:10]}"
    attempts = Attempts()
    finish = threading.Event()

    def work(run: Run) -> None:
        entry = attempts.begin(run)
        deadline = time.monotonic() + 20
        while not run.lost and not finish.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        if run.lost:
            entry.lost_at = time.monotonic()
        entry.ended = time.monotonic()

    # One slot only, three seconds from now (time for a busy machine to start the
    # instance): the next is a minute later, so no newer slot can supersede the
    # lapsed one before the backup takes it over.
    anchor = datetime.fromtimestamp(round(time.time() + 3.0, 3), timezone.utc)

    def scheduler(store_url: str, instance: str) -> Scheduler:
        made = Scheduler(store_url, namespace=namespace, instance=instance)
        made.add_job(work, name="work", every=60, anchor=anchor, lease=3, jitter=0)
        return made

    proxied = scheduler(proxy.url(url), "proxied")
    direct = scheduler(url, "direct")
    try:
        proxied.start()
        first: Attempt = wait_until(
            attempts.watch(lambda xs: next(iter(xs), None)),
            30,
            "the proxied instance's run",
            seen=attempts.all,
        )
        assert (first.instance, first.attempt) == ("proxied", 1)
        direct.start()
        time.sleep(1.5)  # the runner renews through the proxy; the backup watches
        assert first.lost_at is None
        blackholed_at = time.monotonic()
        proxy.blackhole()
        second: Attempt = wait_until(
            attempts.watch(
                lambda xs: next(
                    (x for x in xs if x.slot_id == first.slot_id and x.attempt == 2), None
                )
            ),
            3 + 0.5 + 4,
            "the backup's attempt 2",
            seen=attempts.all,
        )
        first_lost_at = first.lost_at
    finally:
        finish.set()
        proxy.close()
        # The proxied instance's calls end with the proxy's sockets.
        stop_all(proxied, timeout=1)
        stop_all(direct, timeout=1)
        drop_namespace(url, namespace)
    assert second.instance == "direct"
    assert first_lost_at is not None, "the runner never saw run.lost"
    assert blackholed_at < first_lost_at < second.started
    assert [x.slot_id for x in attempts.all()] == [first.slot_id] * 2


#: The MySQL store's ``timeout`` in the test below: every call's bound.
MYSQL_TIMEOUT = 1.0


@pytest.mark.timeout(60)
def test_mysql_calls_behind_a_silent_link_fail_within_the_timeout_then_recover(
    mysql_url: str,
) -> None:
    """A MySQL store whose link goes silent: each call raises StoreUnavailable within
    about its ``timeout`` (PyMySQL's read and connect timeouts), however the call
    meets the silence (a pooled connection's read, a new connection's handshake);
    once the link is back the store answers again, and the lease it took is intact."""
    target = urlsplit(mysql_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 3306)
    namespace = f"p{uuid.uuid4().hex[:10]}"
    url = proxy.url(mysql_url) + f"?timeout={MYSQL_TIMEOUT:g}"
    store = open_store(url, namespace=namespace)
    assert isinstance(store, LeaseStore)
    try:
        took = _silent_then_back(store, proxy, StoreUnavailable, with_claim_and_ping=True)
        assert all(t < MYSQL_TIMEOUT + 1.5 for t in took.values()), took
    finally:
        store.close()
        proxy.close()
        drop_namespace(mysql_url, namespace)


def _silent_then_back(
    store: LeaseStore,
    proxy: TcpProxy,
    expected: type[Exception] | tuple[type[Exception], ...],
    *,
    match: str | None = None,
    with_claim_and_ping: bool = False,
) -> dict[str, float]:
    """A lease taken, the link made silent, calls failing (how long each took to fail,
    returned), the link back: the store answers again and the lease is intact."""
    slot_ms = int(time.time()) * 1000

    def took_to_fail(call: Callable[[], object]) -> float:
        began = time.monotonic()
        with pytest.raises(expected, match=match):
            call()
        return time.monotonic() - began

    won = store.claim("job", slot_ms, "a", 30)
    assert won.won and won.holder is not None
    token = won.holder.token
    proxy.blackhole()
    took = {
        "renew": took_to_fail(lambda: store.renew("job", token, 30)),
        "state": took_to_fail(lambda: store.state("job")),
    }
    if with_claim_and_ping:
        took["claim"] = took_to_fail(lambda: store.claim("other", slot_ms, "a", 30))
        took["ping"] = took_to_fail(store.ping)
    proxy.restore()

    def answers() -> bool:
        try:
            store.ping()
        except StoreUnavailable:
            return False  # a connection cut mid-answer may fail once
        return True

    wait_until(answers, 15, "the store to answer once the link is back")
    state = store.state("job")
    assert state is not None and state.token == token
    assert store.renew("job", token, 30)
    return took


#: The PostgreSQL store's ``timeout`` in the test below; a call is cut after two.
PG_TIMEOUT = 1.0


@pytest.mark.timeout(60)
def test_postgres_calls_behind_a_silent_link_are_cut_then_recover(postgres_url: str) -> None:
    """libpq waits for an answer without a bound, and a link that goes silent while TCP
    is still acknowledged (a hung proxy, a stalled middlebox) leaves nothing for the
    kernel to time out: each call is cut after twice the store's ``timeout`` (its
    socket shut down) and raises StoreUnavailable; once the link is back the store
    answers again, with the lease it took intact."""
    target = urlsplit(postgres_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    namespace = f"p{uuid.uuid4().hex[:10]}"
    joiner = "&" if "?" in postgres_url else "?"
    store = open_store(
        proxy.url(postgres_url) + f"{joiner}timeout={PG_TIMEOUT:g}", namespace=namespace
    )
    assert isinstance(store, LeaseStore)
    try:
        took = _silent_then_back(
            store, proxy, StoreUnavailable, match=r"no answer within 2 s|cannot connect|timeout"
        )
        assert all(t < 2 * PG_TIMEOUT + 1.5 for t in took.values()), took
    finally:
        store.close()
        proxy.close()
        drop_namespace(postgres_url, namespace)
