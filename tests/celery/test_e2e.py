"""End to end: real ``celery worker -B`` and ``celery beat`` processes, real brokers and signals."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anarchon_core import open_store
from tests.celery.harness import CELERY, CeleryFleet, Line, per_slot, slot_seconds
from tests.cleanup import drop_namespace
from tests.fleet import assert_each_second_once
from tests.servers import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

FAST = {"every": 1, "work": 0.2}
MINUTELY = {"cron": "* * * * *", "work": 0.2}


def test_a_worker_killed_mid_task_is_followed_by_attempt_2(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    pods = fleet(celery_redis, {"long": {"every": 20, "work": 12}})
    for name in ("w1", "w2", "w3"):
        pods.worker(name, concurrency=1)
    wait_until(
        lambda: pods.tracking("w1", "w2", "w3"),
        60,
        "execution tracking in w1, w2, w3",
        seen=pods.tail,
    )
    tracked_since = time.time()
    first = wait_until(
        pods.watch(
            lambda ls: [
                x for x in ls if x["kind"] == "start" and slot_seconds(x["slot_id"]) > tracked_since
            ]
        ),
        75,
        "a tracked run of the long task",
        seen=pods.tail,
    )[0]
    time.sleep(1)
    killed_at = pods.kill(pods.pod_of_worker(first["worker"]))
    again = wait_until(
        pods.watch(lambda ls: [x for x in ls if x["kind"] == "start" and x["attempt"] == 2]),
        15,
        "attempt 2",
        seen=pods.tail,
    )[0]
    assert again["slot_id"] == first["slot_id"]
    assert again["worker"] != first["worker"]
    # Taken over once the 3 s lease lapsed, well before the 12 s the dead attempt
    # would have run (the margin: a beat's next step, the send and the pick-up on
    # a machine loaded by the rest of the suite).
    assert again["t"] - killed_at <= 3 + 5
    assert again["task_id"].endswith(":2")


def test_a_superseded_attempt_delivered_late_is_skipped(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    pods = fleet(celery_redis, {"long": {"every": 20, "work": 12}})
    for name in ("w1", "w2"):
        pods.worker(name, concurrency=2)
    wait_until(
        lambda: pods.tracking("w1", "w2"), 60, "execution tracking in w1, w2", seen=pods.tail
    )
    tracked_since = time.time()
    first = wait_until(
        pods.watch(
            lambda ls: [
                x for x in ls if x["kind"] == "start" and slot_seconds(x["slot_id"]) > tracked_since
            ]
        ),
        75,
        "a tracked run of the long task",
        seen=pods.tail,
    )[0]
    time.sleep(1)
    pods.kill(pods.pod_of_worker(first["worker"]))
    wait_until(
        pods.watch(lambda ls: [x for x in ls if x["kind"] == "start" and x["attempt"] == 2]),
        15,
        "attempt 2",
        seen=pods.tail,
    )
    # Attempt 1's message comes back (a redelivery, a visibility timeout...).
    pods.resend(first)
    wait_until(
        lambda: "skipping" in pods.log("w1") + pods.log("w2"),
        20,
        "a worker to skip the late attempt",
        interval=0.2,
        seen=pods.tail,
    )
    assert "a later attempt of this slot was sent" in pods.log("w1") + pods.log("w2")
    time.sleep(1)
    runs = [x for x in pods.starts() if x["slot_id"] == first["slot_id"]]
    assert [x["attempt"] for x in runs] == [1, 2]


@pytest.mark.timeout(300)
def test_all_workers_down_across_a_crontab_slot_then_caught_up_once(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    pods = fleet(celery_redis, {"minutely": MINUTELY})
    # Start so that the first minute boundary is 20-50 s away.
    now = time.time()
    if 60 - now % 60 < 20:
        time.sleep(60 - now % 60 + 1)
    for name in ("w1", "w2", "w3"):
        pods.worker(name)
    first = wait_until(
        pods.watch(lambda ls: pods.starts("minutely")), 70, "the first minute slot", seen=pods.tail
    )[0]
    for name in ("w1", "w2", "w3"):
        pods.stop(name)
    missed = slot_seconds(first["slot_id"]) + 60
    time.sleep(max(0.0, missed + 5 - time.time()))
    assert [x for x in pods.starts("minutely") if slot_seconds(x["slot_id"]) == missed] == []
    for name in ("w4", "w5", "w6"):
        pods.worker(name)
    wait_until(
        pods.watch(
            lambda ls: [x for x in pods.starts("minutely") if slot_seconds(x["slot_id"]) == missed]
        ),
        30,
        "the catch-up",
        seen=pods.tail,
    )
    time.sleep(3)
    runs = [x for x in pods.starts("minutely") if slot_seconds(x["slot_id"]) == missed]
    assert len(runs) == 1


def test_two_standalone_beats_next_to_plain_workers(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    pods = fleet(celery_redis, {"fast": FAST})
    pods.worker("w1", beat=False)
    pods.worker("w2", beat=False)
    pods.beat("b1")
    pods.beat("b2")

    def both_sent(lines: list[Line]) -> bool:
        fast = pods.starts("fast")
        return len(per_slot(fast)) >= 10 and len({x["sent_by"] for x in fast}) == 2

    wait_until(pods.watch(both_sent), 60, "10 slots, sent by both beats", seen=pods.tail)
    pods.stop_all()
    fast = pods.starts("fast")
    assert_each_second_once(fast, time.time() - 2, pods)
    assert len({x["sent_by"] for x in fast}) == 2  # both beats sent some


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"E2E_BROKER": "memory://"}, "anarchon_store is not set and the broker"),
        ({"E2E_STORE": "bogus://x"}, "unsupported store URL"),
        ({"E2E_SCHEDULE": '{"bad": {"every": 0.5}}'}, "under 1 second"),
    ],
)
def test_misconfiguration_stops_beat_with_one_clear_message(
    tmp_path: Path, celery_redis: str, env: dict[str, str], message: str
) -> None:
    pods = CeleryFleet(tmp_path, celery_redis, {"fast": FAST})
    done = subprocess.run(
        [CELERY, "-A", "tests.celery.e2e_app", "beat", "--scheduler", "anarchon_celery:Scheduler"],
        env={**pods.env, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert output.count(message) == 1, output


@pytest.mark.timeout(120)
def test_a_store_on_a_wrong_port_is_waited_out_and_said_at_error(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    pods = fleet(celery_redis, {"fast": FAST})
    port = free_port()
    pods.spawn(
        "b1",
        [CELERY, "-A", "tests.celery.e2e_app", "beat", "--scheduler", "anarchon_celery:Scheduler"],
        env={"E2E_STORE": f"redis://:hunter2@127.0.0.1:{port}/0?socket_connect_timeout=1"},
    )
    said = f"anarchon: the store redis://:***@127.0.0.1:{port}/0?socket_connect_timeout=1 has"
    wait_until(lambda: said in pods.log("b1"), 60, "the outage said", seen=lambda: pods.log("b1"))
    log = pods.log("b1")
    assert re.search(r"ERROR.*" + re.escape(said) + r" not answered for \d+s, since this", log), log
    assert pods.procs["b1"].poll() is None, log  # beat waits for its store: it runs on
    assert "CRITICAL" not in log and "hunter2" not in log
    pods.stop_all()


def test_celery_anarchon_status(tmp_path: Path, celery_redis: str) -> None:
    pods = CeleryFleet(tmp_path, celery_redis, {"fast": FAST})

    def status() -> subprocess.CompletedProcess[str]:
        argv = [CELERY, "-A", "tests.celery.e2e_app", "anarchon", "status"]
        return subprocess.run(argv, env=pods.env, capture_output=True, text=True, timeout=60)

    empty = status()
    assert empty.returncode == 1, empty.stderr  # reached, nothing recorded yet
    assert f"no jobs recorded in namespace '{pods.namespace}'" in empty.stdout
    store = open_store(celery_redis, namespace=pods.namespace)
    try:
        store.claim("fast", 1_700_000_000_000, "pod-1:beat", 30)
    finally:
        store.close()
    try:
        shown = status()
    finally:
        drop_namespace(celery_redis, pods.namespace)
    assert shown.returncode == 0, shown.stderr
    assert f"namespace {pods.namespace}" in shown.stdout
    assert re.search(r"^fast\s+2023-11-14 22:13:20\s+pod-1:beat\s+1\s+running", shown.stdout, re.M)


@pytest.mark.timeout(240)
def test_a_stock_beat_left_running_is_said_by_the_worker_and_shown_by_status(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    # Mid-migration: a pod with anarchon's beat, and one still on stock beat.
    pods = fleet(celery_redis, {"fast": FAST})
    pods.worker("w1", concurrency=1)
    wait_until(lambda: pods.tracking("w1"), 60, "execution tracking in w1", seen=pods.tail)
    wait_until(
        pods.watch(lambda ls: any(x.get("slot_id") for x in pods.starts("fast"))),
        60,
        "a slot",
        seen=pods.tail,
    )
    pods.stock_beat("old")
    wait_until(
        pods.watch(lambda ls: len([x for x in pods.starts("fast") if not x.get("slot_id")]) >= 3),
        60,
        "three sends of the stock beat",
        seen=pods.tail,
    )
    said = [
        line
        for line in pods.log("w1").splitlines()
        if "was sent by a beat that is not anarchon's" in line
    ]
    assert len(said) == 1, pods.log("w1")
    assert "WARNING" in said[0] and "anarchon: entry fast was sent" in said[0]
    assert re.search(r"\(from gen\d+@", said[0]), said[0]  # the stock beat's host
    argv = [CELERY, "-A", "tests.celery.e2e_app", "anarchon", "status"]
    shown = subprocess.run(argv, env=pods.env, capture_output=True, text=True, timeout=60)
    pods.stop_all()
    assert shown.returncode == 0, shown.stderr
    assert "1 job(s) also sent by a scheduler that is not anarchon's" in shown.stdout
    assert re.search(r"^fast\s+\d+\s+\S+ \S+\s+gen\d+@", shown.stdout, re.M), shown.stdout


def test_a_cold_shutdown_hands_the_running_slot_over_at_once(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    pods = fleet(celery_redis, {"long": {"every": 30, "work": 20}}, lease=10)
    for name in ("w1", "w2"):
        pods.worker(name, concurrency=1)
    wait_until(
        lambda: pods.tracking("w1", "w2"), 60, "execution tracking in w1, w2", seen=pods.tail
    )
    tracked_since = time.time()
    first = wait_until(
        pods.watch(
            lambda ls: [
                x for x in ls if x["kind"] == "start" and slot_seconds(x["slot_id"]) > tracked_since
            ]
        ),
        75,
        "a tracked run of the long task",
        seen=pods.tail,
    )[0]
    time.sleep(1)
    victim = pods.pod_of_worker(first["worker"])
    stopped_at = time.time()
    pods.procs[victim].send_signal(signal.SIGQUIT)  # cold shutdown of that worker
    again = wait_until(
        pods.watch(lambda ls: [x for x in ls if x["kind"] == "start" and x["attempt"] == 2]),
        20,
        "attempt 2",
        seen=pods.tail,
    )[0]
    assert again["slot_id"] == first["slot_id"]
    assert again["t"] - stopped_at < 5  # far less than the 10 s lease: handed over, not lapsed


def test_a_celery_retry_keeps_the_slot_without_a_second_run(
    fleet: Callable[..., CeleryFleet], celery_redis: str
) -> None:
    pods = fleet(celery_redis, {"retrying": {"every": 20, "work": 1, "task": "e2e.flaky"}})
    for name in ("w1", "w2"):
        pods.worker(name)
    wait_until(
        lambda: pods.tracking("w1", "w2"), 60, "execution tracking in w1, w2", seen=pods.tail
    )
    tracked_since = time.time()
    wait_until(
        pods.watch(
            lambda ls: [
                x
                for x in ls
                if x["kind"] == "end"
                and x["retries"] == 1
                and slot_seconds(x["slot_id"]) > tracked_since
            ]
        ),
        80,
        "the retried run to end",
        seen=pods.tail,
    )
    time.sleep(5)  # longer than the lease: nothing is taken over
    runs = [x for x in pods.starts() if slot_seconds(x["slot_id"]) > tracked_since]
    assert [(x["attempt"], x["retries"]) for x in runs] == [(1, 0), (1, 1)]
    assert runs[1]["t"] >= next(x for x in pods.lines() if x["kind"] == "end")["t"]


def test_a_worker_without_the_hooks_makes_beat_fall_back_with_a_warning(
    fleet: Callable[..., CeleryFleet], redis_url: str
) -> None:
    # A database of its own: its hookless worker would turn tracking off for others.
    pods = fleet(f"{redis_url.rsplit('/', 1)[0]}/12", {"fast": FAST})
    # w1's beat sends; the hookless worker alone consumes the test's queue, so
    # every slot runs where nothing can track it.
    pods.worker("w1", queue=f"{pods.namespace}-elsewhere")
    pods.worker_without_anarchon("plain")
    wait_until(
        lambda: "without execution tracking" in pods.log("w1"),
        30,
        "beat to fall back to sending without execution tracking",
        interval=0.2,
        seen=pods.tail,
    )
    since = time.time() + 1
    wait_until(
        pods.watch(
            lambda ls: (
                len(
                    per_slot([x for x in pods.starts("fast") if slot_seconds(x["slot_id"]) > since])
                )
                >= 10
            )
        ),
        40,
        "10 slots run by the hookless worker",
        seen=pods.tail,
    )
    pods.stop_all()
    fast = [x for x in pods.starts("fast") if slot_seconds(x["slot_id"]) > since]
    assert_each_second_once(fast, time.time() - 2, pods)
    assert {x["info"]["tracked"] for x in fast} == {False}
    assert {x["worker"].split(".", 1)[0] for x in fast} == {"plain"}
