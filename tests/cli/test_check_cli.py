"""``anarchon check`` (an exec probe) and ``anarchon status``'s live instances, run as a user runs
them: a subprocess, against the machine's Redis, beside a scheduler running in this process.

The scheduler runs on this host, so the subprocess's host name is its host
name: the loop check finds it. Each test works in a namespace of its own,
whose keys are dropped afterwards. Exit status: 0 every check passed, 1 one
failed (the store unreachable too), 2 bad arguments or URL.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from anarchon_core import Scheduler, Store, open_store
from tests.cleanup import drop_namespace
from tests.cli.command import anarchon, shown
from tests.servers import free_port
from tests.waiting import wait_until

HOST = socket.gethostname()

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


@dataclass
class Target:
    """A namespace of the machine's Redis, the test's own handle on it, and its scheduler."""

    url: str
    namespace: str
    store: Store

    def check(self, *args: str) -> subprocess.CompletedProcess[str]:
        return anarchon("check", "--store", self.url, "--namespace", self.namespace, *args)

    def registered(self, instance: str) -> bool:
        return any(r.instance == instance for r in self.store.instances())

    def succeeded(self, job: str, times: int) -> bool:
        counts = self.store.stats([job]).get(job)
        return counts is not None and counts.done >= times


@pytest.fixture
def target(redis_url: str) -> Iterator[Target]:
    namespace = f"check-{uuid.uuid4().hex[:10]}"
    store = open_store(redis_url, namespace=namespace)
    try:
        yield Target(redis_url, namespace, store)
    finally:
        store.close()
        drop_namespace(redis_url, namespace)


@pytest.fixture
def scheduler(target: Target) -> Iterator[Scheduler]:
    """A scheduler of this host running ``tick`` every second, once it recorded itself."""
    cron = Scheduler(target.url, namespace=target.namespace)
    cron.add_job(lambda: None, name="tick", every=1)
    cron.start()
    try:
        wait_until(lambda: target.registered(cron.instance), 10, "the scheduler's registry record")
        yield cron
    finally:
        cron.stop(timeout=5)


def test_check_passes_beside_a_running_scheduler_of_this_host(
    target: Target, scheduler: Scheduler
) -> None:
    done = target.check()
    assert done.returncode == EXIT_OK, shown(done)
    lines = done.stdout.splitlines()
    assert lines[0] == "ok  store: answers"
    assert re.fullmatch(
        rf"ok  loop: {re.escape(scheduler.instance)} recorded itself \d+\.\ds ago", lines[1]
    ), shown(done)
    assert len(lines) == 2
    assert done.stderr == ""


def test_check_of_a_job_that_succeeds_on_schedule(target: Target, scheduler: Scheduler) -> None:
    # Two slots recorded: the default bound is twice their gap (2 s, unless a slot was
    # skipped on a loaded machine).
    wait_until(lambda: target.succeeded("tick", 2), 15, "two successes of tick")
    done = target.check("--job", "tick")
    assert done.returncode == EXIT_OK, shown(done)
    assert re.search(
        r"^ok  job 'tick': last success \d+\.\ds ago \(bound [2468]s\)$", done.stdout, re.M
    ), shown(done)
    assert "FAIL" not in done.stdout
    # A bound given: judged by it instead.
    done = target.check("--job", "tick", "--max-late", "1m")
    assert done.returncode == EXIT_OK, shown(done)
    assert re.search(
        r"^ok  job 'tick': last success \d+\.\ds ago \(bound 60s\)$", done.stdout, re.M
    )


def test_check_names_an_instance_that_is_not_recorded(target: Target, scheduler: Scheduler) -> None:
    done = target.check("--instance", "nosuch")
    assert done.returncode == EXIT_FAILED, shown(done)
    assert "ok  store: answers" in done.stdout
    assert (
        "FAIL  loop: no record of instance 'nosuch' in the registry (it expires 15s after the last)"
        in done.stdout.splitlines()
    ), shown(done)
    # The instance that runs, named: found.
    done = target.check("--instance", scheduler.instance)
    assert done.returncode == EXIT_OK, shown(done)
    assert f"ok  loop: {scheduler.instance} recorded itself" in done.stdout


def test_no_loop_skips_the_loop_check(target: Target) -> None:
    # Nothing runs in this namespace: only --no-loop lets the probe pass.
    assert target.check().returncode == EXIT_FAILED
    done = target.check("--no-loop")
    assert done.returncode == EXIT_OK, shown(done)
    assert done.stdout == "ok  store: answers\n"


def test_check_fails_once_the_scheduler_stopped(target: Target, scheduler: Scheduler) -> None:
    wait_until(lambda: target.succeeded("tick", 1), 10, "a success of tick")
    assert target.check().returncode == EXIT_OK
    scheduler.stop(timeout=5)  # withdraws from the registry at once
    assert not target.registered(scheduler.instance)
    done = target.check()
    assert done.returncode == EXIT_FAILED, shown(done)
    assert done.stdout.splitlines() == [
        "ok  store: answers",
        f"FAIL  loop: no record of an instance on host {HOST!r} in the registry"
        " (it expires 15s after the last)",
    ]
    # Its job no longer succeeds: a tight bound fails it, naming how late it is.
    time.sleep(0.3)
    done = target.check("--no-loop", "--job", "tick", "--max-late", "0.1")
    assert done.returncode == EXIT_FAILED, shown(done)
    assert re.search(
        r"^FAIL  job 'tick': last success \d+\.\ds ago, more than 0\.1s$", done.stdout, re.M
    ), shown(done)


def test_check_of_a_job_never_recorded_fails(target: Target, scheduler: Scheduler) -> None:
    done = target.check("--job", "tick", "--job", "nosuch", "--max-late", "1h")
    assert done.returncode == EXIT_FAILED, shown(done)
    assert "FAIL  job 'nosuch': not recorded in the store" in done.stdout.splitlines()
    assert "ok  store: answers" in done.stdout


def test_an_unreachable_store_fails_the_check_without_its_password() -> None:
    port = free_port()
    url = f"redis://:s3cret@127.0.0.1:{port}/0?socket_connect_timeout=1&socket_timeout=1"
    done = anarchon("check", "--store", url, "--job", "tick")
    assert done.returncode == EXIT_FAILED, shown(done)
    assert done.stdout.startswith(f"FAIL  store: redis://:***@127.0.0.1:{port}/0"), shown(done)
    assert len(done.stdout.splitlines()) == 1  # nothing else judged without a store
    assert "s3cret" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--store", "bogus://admin:s3cret@db.internal/x"], "bogus://admin:***@db.internal/x"),
        (["--store", "redis://127.0.0.1/0?foo=1"], "foo"),
        (["--store", "redis://127.0.0.1/0", "--max-late", "soon"], "--max-late"),
        (["--store", "redis://127.0.0.1/0", "--max-late", "-5s"], "--max-late"),
        (["--store", "redis://127.0.0.1/0", "--instance", "x", "--no-loop"], "not allowed"),
        (["--namespace", "x"], "--store"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], said: str) -> None:
    done = anarchon("check", *args)
    assert done.returncode == EXIT_CONFIG, shown(done)
    assert said in done.stderr, shown(done)
    assert done.stdout == ""
    assert "s3cret" not in done.stderr


def test_status_lists_the_live_instances_and_what_each_holds(target: Target) -> None:
    release = threading.Event()
    cron = Scheduler(target.url, namespace=target.namespace)
    cron.add_job(lambda: release.wait(20), name="hold", every=1, lease=3)
    cron.start()
    try:
        wait_until(lambda: target.registered(cron.instance), 10, "the scheduler's registry record")
        wait_until(lambda: "hold" in target.store.jobs(), 10, "a run of hold")
        done = anarchon("status", "--store", target.url, "--namespace", target.namespace)
        assert done.returncode == EXIT_OK, shown(done)
        lines = done.stdout.splitlines()
        at = lines.index("1 live instance(s)")
        assert lines[at + 1].split() == [
            "instance", "host", "pid", "version", "jobs", "seen", "behind", "holds"
        ]  # fmt: skip
        row = lines[at + 2].split()
        assert row[:3] == [cron.instance, HOST, str(os.getpid())]
        assert row[4] == "1"  # one job declared
        assert re.fullmatch(r"\d+\.\d", row[5].removesuffix("s")) and row[6] == "ago"
        assert row[7] == "-"  # it keeps up: not behind, no claim deferred
        assert row[8] == "hold"  # the run it holds now
        assert len(lines) == at + 3
    finally:
        release.set()
        cron.stop(timeout=5)
    done = anarchon("status", "--store", target.url, "--namespace", target.namespace)
    assert done.returncode == EXIT_OK, shown(done)
    assert "0 live instance(s)" in done.stdout.splitlines()  # withdrawn on stopping


def test_status_lists_live_instances_before_any_slot_is_recorded(target: Target) -> None:
    cron = Scheduler(target.url, namespace=target.namespace)
    later = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    cron.add_job(lambda: None, name="hourly", every=3600, anchor=later)
    cron.start()
    try:
        wait_until(lambda: target.registered(cron.instance), 10, "the scheduler's registry record")
        done = anarchon("status", "--store", target.url, "--namespace", target.namespace)
    finally:
        cron.stop(timeout=5)
    # No job recorded yet: the one the instance declares is shown, with its next slot.
    assert done.returncode == 0, shown(done)
    lines = done.stdout.splitlines()
    assert lines[2].split() == ["hourly", *["-"] * 5, *f"{later:%Y-%m-%d %H:%M:%S}".split()]
    at = lines.index("1 live instance(s)")
    assert lines[at + 2].split()[:2] == [cron.instance, HOST], shown(done)
