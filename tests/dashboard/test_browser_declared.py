"""In a real browser: a job that never ran, declared by live instances, listed and run now.

Two instance processes on the test's Redis declare ``daily``, whose slots
are a day apart, the next about twelve hours away: no slot of it runs
during the test, and the store holds no record of it. ``anarchon dashboard``
serves the namespace (a subprocess, its action token in a file) and headless
Chromium opens it: the page lists ``daily`` at once, from the registry, with
its next three slots, and its Run now button runs it on one of the instances.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests import servers
from tests.cleanup import drop_namespace
from tests.dashboard import test_browser as page
from tests.dashboard.test_browser import ROOT, click, no_alert, row, showing, tables
from tests.fleet import Fleet
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

JOB = "daily"
DAY = 86_400
NAMES = ("a", "b")

#: Headless Chromium, as the dashboard's other browser tests drive it.
browser = page.browser


@pytest.fixture
def anchor() -> int:
    """The grid's anchor: half a day from now, so the last slot was half a day ago."""
    return int(time.time()) + DAY // 2


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str, anchor: int) -> Iterator[Fleet]:
    namespace = f"dash{uuid.uuid4().hex[:10]}"
    made = Fleet(tmp_path, redis_url, namespace=namespace, job=JOB, every=DAY, anchor=anchor,
                 work=0.2)  # fmt: skip
    try:
        yield made
    finally:
        made.stop_all()
        drop_namespace(redis_url, namespace)


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_a_declared_job_that_never_ran_is_listed_with_its_next_slots_and_runs_now(
    fleet: Fleet, anchor: int, browser: WebDriver, tmp_path: Path
) -> None:
    fleet.start(*NAMES)
    port = servers.free_port()
    token = f"dashboard-{uuid.uuid4().hex}"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    argv = [sys.executable, "-m", "anarchon_core.cli", "dashboard", "--store", fleet.store]
    argv += ["--namespace", fleet.namespace, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--token-file", str(token_file)]
    env = {k: v for k, v in os.environ.items() if k != "ANARCHON_DASHBOARD_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    server = servers.ServerProcess(argv, port, name="dashboard", workdir=ROOT, env=env).start()
    try:
        browser.get(f"http://127.0.0.1:{port}/")
        shown = wait_until(
            showing(browser, lambda s: s if row(s, JOB) and len(s["instances"]) == 2 else None),
            15,
            f"{JOB} and both instances",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        daily = row(shown, JOB)
        assert daily is not None
        # Never ran: nothing recorded; its next slots from the schedule the instances declare.
        assert [daily["cells"][c] for c in ("slot", "owner", "attempt", "state")] == ["-"] * 4
        assert daily["regular"] == 0 and daily["manual"] == 0
        expected = [utc(anchor + k * DAY) for k in range(3)]
        assert re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", daily["cells"]["next"]) == (
            expected
        ), daily["cells"]
        assert "≈" not in daily["cells"]["next"]
        assert {i["name"] for i in shown["instances"]} == set(NAMES)
        assert "1 job(s), 2 live instance(s)" in shown["summary"], shown["summary"]
        assert daily["buttons"] == ["pause", "trigger"]
        assert fleet.starts(JOB) == []

        # Run now: one instance runs it, as a slot of its own; the page then shows that run.
        browser.find_element(By.ID, "token").send_keys(token)
        click(browser, f'#jobs tbody tr[data-job="{JOB}"] button.trigger')
        said = wait_until(
            showing(browser, lambda s: s["message"] if "asked to run" in s["message"] else None),
            10,
            "the page to say the run was asked for",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        found = re.fullmatch(rf"{JOB}: asked to run ({JOB}@\d+) now", said)
        assert found, said
        slot_id = found.group(1)
        [run] = wait_until(
            lambda: fleet.starts(JOB, slot_id=slot_id), 15, f"{slot_id} to run", seen=fleet.tail
        )
        assert run["instance"] in NAMES
        ran = wait_until(
            showing(
                browser,
                lambda s: (r := row(s, JOB)) is not None and r["manual"] == 1 and r,
            ),
            10,
            "the run-now slot among the recent slots of daily",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        assert ran["cells"]["owner"] == run["instance"]
        assert re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", ran["cells"]["next"]) == expected
        assert [x["slot_id"] for x in fleet.starts(JOB)] == [slot_id], "it ran once, and only so"
        no_alert(browser)
    finally:
        server.stop()
