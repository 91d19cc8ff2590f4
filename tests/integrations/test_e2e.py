"""End to end, alike for Celery and Dramatiq: real worker pods with the scheduler in them.

Each pod is ``celery worker -B`` or ``dramatiq`` with the Anarchon middleware,
in its own process group; brokers and stores are real servers; pods are
killed and frozen with real signals.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable

import pytest

from anarchon_core import RunState, Store, open_store
from tests.cleanup import drop_namespace
from tests.fleet import Line, assert_each_second_once, per_slot, slot_seconds
from tests.integrations.conftest import Pods
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

FAST = {"every": 1, "work": 0.2}
#: With Celery, a slot's record is held until a worker picks its message up and
#: finishes it: on a machine loaded by the whole suite that can take over a second,
#: and the next slot is then skipped as an overlap (as it must be). Every 2 s leaves
#: the workers that time; the slots are still claimed, sent and run once each.
FAST_CELERY = {"every": 2, "work": 0.2}
MINUTELY = {"cron": "* * * * *", "work": 0.2}


def run_until(pods: Pods, job: str, slots: int) -> None:
    """Until ``job`` ran ``slots`` slots and a minute boundary has passed (for crontab).

    The boundary counts from ``job``'s first run: a scheduler is up by then, so
    the crontab slot at that boundary is due while one runs (a slow start on a
    loaded machine must not miss it: a first deploy does not catch up).
    """
    wait_until(pods.watch(lambda ls: pods.starts(job)), 60, "a first slot", seen=pods.tail)
    started = time.time()
    wait_until(
        pods.watch(lambda ls: len(per_slot(pods.starts(job))) >= slots),
        120,
        f"{slots} slots",
        seen=pods.tail,
    )
    boundary = math.ceil(started / 60) * 60
    wait_until(lambda: time.time() >= boundary + 3, 60, "the minute boundary and 3 s")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("framework", "setup"),
    [
        ("celery", "redis-broker"),
        ("celery", "rabbitmq-broker-postgres-store"),
        ("dramatiq", "redis"),
        # RabbitMQ's claim-only store (the broker itself): each slot sent once, no tracking.
        ("dramatiq", "rabbitmq"),
    ],
)
def test_three_pods_run_every_slot_once(
    fleet: Callable[..., Pods], framework: str, setup: str, request: pytest.FixtureRequest
) -> None:
    every = 2 if framework == "celery" else 1
    schedule = {"fast": FAST_CELERY if framework == "celery" else FAST, "minutely": MINUTELY}
    if setup in ("redis-broker", "redis"):
        pods = fleet(request.getfixturevalue("redis_broker"), schedule)
    elif framework == "celery":
        amqp = request.getfixturevalue("amqp_url").split("?", 1)[0]
        pods = fleet(amqp, schedule, store=request.getfixturevalue("postgres_url"))
    else:
        url = request.getfixturevalue("amqp_url").split("?", 1)[0]
        url = url[:-2] + "/%2F" if url.endswith("//") else url  # pika spells vhost "/" so
        pods = fleet(url, schedule)
    for name in ("w1", "w2", "w3"):
        pods.worker(name)
    run_until(pods, "fast", 32 // every)
    pods.stop_all()
    fast = pods.starts("fast")
    assert_each_second_once(fast, time.time() - 3, pods, every)
    assert len(per_slot(fast)) >= 30 // every
    assert {x["attempt"] for x in fast} == {1}
    if framework == "celery":
        assert len({x["task_id"] for x in fast}) == len(fast)
        # The pods' beats share the sending (which worker runs a task is the broker's
        # prefetch: on a loaded machine one worker may take them all).
        assert len({x["sent_by"] for x in fast}) >= 2, "one pod sent every slot"
    else:
        assert len({x["pid"] for x in fast}) >= 3, "messages are spread over worker processes"
        # One scheduler per pod: slots were sent by at most one process of each pod.
        assert len({x["sent_by"] for x in fast}) <= 3
    minutely = per_slot(pods.starts("minutely"))
    assert len(minutely) >= 1
    assert set(minutely.values()) == {1}
    assert all(slot_seconds(s) % 60 == 0 for s in minutely)


def test_killing_the_pod_that_sent_the_last_slot_misses_no_slot(
    fleet: Callable[..., Pods], redis_broker: str
) -> None:
    # Slots 6 s apart, longer than the 3 s lease plus a run: if a run dies with the
    # pod it is taken over before the next slot is due, so every slot runs.
    pods = fleet(redis_broker, {"tick": {"every": 6, "work": 0.3}})
    for name in ("w1", "w2", "w3"):
        pods.worker(name)
    first = wait_until(
        pods.watch(lambda ls: pods.starts("tick")), 30, "a first slot", seen=pods.tail
    )[0]
    # Two seconds after a slot: its pod sent it, no message of it is in flight.
    time.sleep(max(0.0, slot_seconds(first["slot_id"]) + 6 + 2 - time.time()))
    killed_at = pods.kill(pods.pod_of(pods.starts("tick")[-1]["sent_by"]))

    def two_slots_after_the_kill(lines: list[Line]) -> bool:
        # Two slots due after the kill ran, the second over 6 s ago (none in flight).
        due = sorted({slot_seconds(x["slot_id"]) for x in pods.starts("tick")})
        after = [s for s in due if s > killed_at]
        return len(after) >= 2 and time.time() - 6 > after[1]

    wait_until(pods.watch(two_slots_after_the_kill), 40, "2 slots after the kill", seen=pods.tail)
    pods.stop_all()
    runs = pods.starts("tick")
    seconds = sorted({int(slot_seconds(x["slot_id"])) for x in runs})
    expected = list(range(seconds[0], int(time.time() - 5), 6))
    assert [s for s in expected if s not in seconds] == [], "a slot was missed"
    assert len([s for s in expected if s > killed_at]) >= 2
    attempts = [(x["slot_id"], x["attempt"]) for x in runs]
    assert len(attempts) == len(set(attempts)), "an attempt ran twice"


def done_after(pods: Pods, store: Store, job: str, since: float, timeout: float = 30) -> Line:
    """The start of ``job``'s newest slot due after ``since`` whose end the store has recorded.

    Recorded, not only reported by the handler: a pod stopped before its run's end is
    recorded leaves the run holding its lease, and the next slot would be an overlap.
    """

    def check() -> list[Line]:
        record = store.state(job)
        if record is None or record.state is not RunState.DONE or record.slot_ms <= since * 1000:
            return []
        return pods.starts(job, slot_id=f"{job}@{record.slot_ms}")[-1:]

    return wait_until(
        pods.watch(lambda ls: check()), timeout, f"a slot after {since:.3f} done", seen=pods.tail
    )[0]


@pytest.mark.timeout(240)
def test_a_mysql_store_sends_each_slot_once_through_sigkill_and_sigterm_of_the_sender(
    fleet: Callable[..., Pods], framework: str, redis_broker: str, mysql_url: str
) -> None:
    """The application's MySQL (or MariaDB) database as the store, Redis as the broker.

    The pod that sent the last slot is killed (SIGKILL), then the one that sent the next
    is stopped (SIGTERM: beat or the Dramatiq scheduler shuts down); the pod left sends
    the slots after, and every slot is sent once.
    """
    every = 6  # longer than the 3 s lease plus a run, as above
    pods = fleet(redis_broker, {"tick": {"every": every, "work": 0.3}}, store=mysql_url)
    try:
        with contextlib.closing(open_store(mysql_url, namespace=pods.namespace)) as store:
            for name in ("w1", "w2", "w3"):
                pods.worker(name)
            first = done_after(pods, store, "tick", 0, timeout=90)
            killed = pods.pod_of(first["sent_by"])
            killed_at = pods.kill(killed)

            after_kill = done_after(pods, store, "tick", killed_at)
            stopped = pods.pod_of(after_kill["sent_by"])
            stopped_at = pods.signal(stopped, signal.SIGTERM)
            proc = pods.procs.pop(stopped)
            wait_until(
                lambda: proc.poll() is not None, 30, f"{stopped} to exit on SIGTERM", seen=pods.tail
            )
            last = done_after(pods, store, "tick", stopped_at + every)
            (left,) = set(pods.procs)
            pods.stop_all()
    finally:
        drop_namespace(mysql_url, pods.namespace)

    runs = pods.starts("tick")
    seconds = range(int(slot_seconds(first["slot_id"])), int(slot_seconds(last["slot_id"])) + 1)
    expected = {f"tick@{s * 1000}" for s in seconds[::every]}
    counts = per_slot(runs)
    assert sorted(expected - set(counts)) == [], "a slot was missed"
    assert {s: n for s, n in counts.items() if n > 1} == {}, "a slot was sent twice"
    assert {x["attempt"] for x in runs} == {1}
    assert len({killed, stopped, left}) == 3
    assert len([s for s in expected if slot_seconds(s) > stopped_at]) >= 2


def test_freezing_the_pod_that_sent_the_last_slot_runs_nothing_twice(
    fleet: Callable[..., Pods], framework: str, redis_broker: str
) -> None:
    pods = fleet(redis_broker, {"fast": FAST})
    for name in ("w1", "w2", "w3"):
        pods.worker(name)
    wait_until(
        pods.watch(lambda ls: len(pods.starts("fast")) > 3), 30, "first slots", seen=pods.tail
    )
    frozen = pods.pod_of(pods.starts("fast")[-1]["sent_by"])
    frozen_at = pods.signal(frozen, signal.SIGSTOP)
    time.sleep(3 * 2)  # longer than the 3 s lease
    thawed_at = pods.signal(frozen, signal.SIGCONT)
    # Five slots due from 2 s after the thaw on: the first three are past their window.
    wait_until(
        pods.watch(
            lambda ls: (
                len(
                    per_slot(
                        [
                            x
                            for x in pods.starts("fast")
                            if slot_seconds(x["slot_id"]) >= int(thawed_at) + 2
                        ]
                    )
                )
                >= 5
            )
        ),
        30,
        "5 slots after the thaw",
        seen=pods.tail,
    )
    stopped_at = time.time()
    pods.stop_all()
    fast = pods.starts("fast")
    attempts = per_slot([x for x in fast if x["attempt"] == 1])
    assert {s: n for s, n in attempts.items() if n > 1} == {}, "a slot was sent twice"
    # A slot taken over from the frozen pod ran again as attempt 2: never two of one attempt.
    runs = [(x["slot_id"], x["attempt"]) for x in fast]
    assert len(runs) == len(set(runs)), "an attempt ran twice"
    if framework != "celery":
        return
    # Every slot ran, but those skipped as overlaps while a message the frozen
    # worker had already received held its slot (its pickup lease): they come
    # during the freeze only, and each beat says so (as an overlap; or, a beat
    # whose tick came after the next slot's time, as skipped for the later one).
    first = min(int(slot_seconds(x["slot_id"])) for x in fast)
    ran = {int(slot_seconds(x["slot_id"])) for x in fast}
    skipped = [s for s in range(first, int(stopped_at) - 1) if s not in ran]
    told = {
        s: pods.mentions(f"overlap fast@{s * 1000} ")
        + [m for m in pods.mentions(f"missed fast@{s * 1000} ") if m.endswith("(skipped)")]
        for s in skipped
    }
    assert [s for s in skipped if not told[s]] == [], f"slots missed: {skipped}; {told}"
    assert [s for s in skipped if not frozen_at - 1 < s < thawed_at + 2] == [], (
        f"slots skipped outside the freeze ({frozen_at:.3f} to {thawed_at:.3f}): {told}"
    )
    after = set(range(int(thawed_at) + 2, int(stopped_at) - 1))
    assert len(after) >= 3 and after <= ran, f"slots after the thaw: {sorted(after - ran)} missed"
