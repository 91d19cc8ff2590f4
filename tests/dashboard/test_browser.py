"""The dashboard in a real browser, over real instances sharing a real Redis.

Three instance processes run the job ``tick`` every second; a second job,
stored in the namespace, runs every second too, under a name that is markup
(``<script>alert(1)</script>``). ``anarchon dashboard`` serves the namespace as
a user starts it (a subprocess, its action token in a file), and headless
Chromium opens it: the page shows both jobs (the markup as text, never run)
and every live instance, follows the slots as they pass, and its Pause button
pauses ``tick`` on every instance (their report shows no run of it) while the
other job goes on, until its Resume button brings the runs back. A read-only
dashboard of the same namespace shows no buttons and no token field.

With ``ANARCHON_SCREENSHOT`` set, the page is saved to ``docs/dashboard.png``.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from anarchon_core import Control
from anarchon_core.control import Definition
from tests import servers
from tests.cleanup import drop_namespace
from tests.fleet import Fleet, Line, slot_seconds
from tests.waiting import wait_until

T = TypeVar("T")

pytestmark = pytest.mark.scenario

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOT = ROOT / "docs" / "dashboard.png"
#: The instances' own job (``anarchon_core.tools.instance``'s default name).
TICK = "tick"
#: The job stored in the namespace, named as markup: the page must show it as text.
MARKUP = "<script>alert(1)</script>"
NAMES = ("a", "b", "c")
#: A slot due this long after the page showed the pause may not start: a claim
#: sent just before the pause reached the store is well within it.
PAUSE_MARGIN = 1.5
#: How long the paused job is watched for a run that should not happen.
PAUSED_FOR = 4.0

#: Everything the page shows of its two tables, read at once (the page redraws them
#: every second: elements found one by one may belong to different drawings).
TABLES = """
const cells = (tr) => Object.fromEntries(
  Array.from(tr.cells).map((td, i) => [td.className.split(" ")[0] || String(i), td.textContent]));
return {
  jobs: Array.from(document.querySelectorAll("#jobs tbody tr")).map((tr) => ({
    job: tr.dataset.job,
    cells: cells(tr),
    nameHtml: tr.querySelector("td.name").innerHTML,
    buttons: Array.from(tr.querySelectorAll("td.controls button")).map((b) => b.className),
    gaps: tr.querySelectorAll("td.recent span.gap").length,
    manual: tr.querySelectorAll("td.recent span.manual").length,
    regular: tr.querySelectorAll("td.recent span:not(.gap):not(.manual)").length,
  })),
  instances: Array.from(document.querySelectorAll("#instances tbody tr")).map((tr) => ({
    name: tr.dataset.instance,
    cells: cells(tr),
  })),
  summary: document.getElementById("summary").textContent,
  message: document.getElementById("message").textContent,
  error: ((e) => (e.hidden ? "" : e.textContent))(document.getElementById("error")),
};
"""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """Headless Debian Chromium, driven by its chromedriver, with a fresh profile."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        servers.unavailable(
            f"Chromium with chromedriver ({CHROMIUM}, {CHROMEDRIVER};"
            " install: apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,900",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    # An alert stays open for the test to find, instead of being dismissed unseen.
    options.unhandled_prompt_behavior = "ignore"
    try:
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    except WebDriverException as exc:
        servers.not_started("headless Chromium", exc)
        raise AssertionError("unreachable") from exc
    try:
        driver.set_window_size(1400, 900)
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str) -> Iterator[Fleet]:
    """Instances (not started) of a namespace of their own, running tick every second."""
    namespace = f"dash{uuid.uuid4().hex[:10]}"
    made = Fleet(tmp_path, redis_url, namespace=namespace, every=1, work=0.2)
    try:
        yield made
    finally:
        made.stop_all()
        drop_namespace(redis_url, namespace)


@pytest.fixture
def dashboard(fleet: Fleet, tmp_path: Path) -> Iterator[Callable[[str | None], str]]:
    """Starts ``anarchon dashboard`` on the fleet's namespace; gives its URL."""
    started: list[servers.ServerProcess] = []

    def start(token: str | None) -> str:
        port = servers.free_port()
        argv = [sys.executable, "-m", "anarchon_core.cli", "dashboard"]
        argv += ["--store", fleet.store, "--namespace", fleet.namespace]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        if token is not None:
            token_file = tmp_path / f"token-{port}"
            token_file.write_text(token + "\n")
            token_file.chmod(0o600)
            argv += ["--token-file", str(token_file)]
        env = {k: v for k, v in os.environ.items() if k != "ANARCHON_DASHBOARD_TOKEN"}
        env["PYTHONPATH"] = str(ROOT)
        server = servers.ServerProcess(argv, port, name="dashboard", workdir=ROOT, env=env)
        started.append(server.start())
        return f"http://127.0.0.1:{port}/"

    yield start
    for server in started:
        server.stop()


def tables(driver: WebDriver) -> dict[str, Any]:
    found: dict[str, Any] = driver.execute_script(TABLES)
    return found


def row(shown: dict[str, Any], job: str) -> dict[str, Any] | None:
    return next((r for r in shown["jobs"] if r["job"] == job), None)


def showing(driver: WebDriver, check: Callable[[dict[str, Any]], T]) -> Callable[[], T]:
    """A condition for ``wait_until``: ``check`` of the tables the page shows now."""
    return lambda: check(tables(driver))


def click(driver: WebDriver, selector: str) -> float:
    """Click the element (found afresh if the page redrew it meanwhile); when, Unix seconds."""
    for _ in range(20):
        try:
            target = driver.find_element(By.CSS_SELECTOR, selector)
            at = time.time()
            target.click()
            return at
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} kept being redrawn under the click")


def shown_of(driver: WebDriver, selector: str, attribute: str | None = None) -> str | None:
    """The text (or ``attribute``) of the element at ``selector``, read in one script: the
    page redraws its tables every second, so an element found first and read after may
    be gone by then."""
    found = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "if (e === null) return null;"
        "return arguments[1] === null ? e.innerText : e.getAttribute(arguments[1]);",
        selector,
        attribute,
    )
    return None if found is None else str(found)


def starts(lines: list[Line], job: str, after: float) -> list[Line]:
    """Runs of ``job`` begun for a slot due after ``after``."""
    return [
        line
        for line in lines
        if line["kind"] == "start" and line["job"] == job and slot_seconds(line["slot_id"]) > after
    ]


def no_alert(driver: WebDriver) -> None:
    try:
        alert = driver.switch_to.alert
    except NoAlertPresentException:
        return
    raise AssertionError(f"the page opened an alert: {alert.text!r}")


def test_the_dashboard_shows_the_fleet_and_pauses_a_job_on_every_instance(
    fleet: Fleet, dashboard: Callable[[str | None], str], browser: WebDriver
) -> None:
    with Control(fleet.store, namespace=fleet.namespace) as control:
        control.add(Definition(name=MARKUP, handler="work", every=1))
        fleet.start(*NAMES)
        token = f"dashboard-{uuid.uuid4().hex}"
        actions_url = dashboard(token)
        read_only_url = dashboard(None)

        # 1. The page loads and shows both jobs, the markup one as its literal name.
        browser.get(actions_url)
        assert browser.title == "anarchon"
        shown = wait_until(
            showing(browser, lambda s: s if row(s, TICK) and row(s, MARKUP) else None),
            15,
            f"the jobs {TICK!r} and {MARKUP!r}",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        assert shown["error"] == ""
        assert [r["job"] for r in shown["jobs"]] == sorted([MARKUP, TICK])
        markup = row(shown, MARKUP)
        assert markup is not None
        assert markup["cells"]["name"] == MARKUP
        assert markup["nameHtml"] == "&lt;script&gt;alert(1)&lt;/script&gt;"
        assert shown_of(browser, "#jobs tbody td.name") == MARKUP  # sorted: "<" before "t"
        no_alert(browser)
        scripts = browser.find_elements(By.TAG_NAME, "script")
        assert [s.get_attribute("src") for s in scripts] == [actions_url + "page.js"]
        assert browser.execute_script("return document.scripts.length") == 1
        tick = row(shown, TICK)
        assert tick is not None
        assert tick["cells"]["paused"] == "no"
        assert tick["buttons"] == ["pause", "trigger"]
        assert browser.find_element(By.ID, "token").is_displayed()

        # 2. Every live instance, by name.
        shown = wait_until(
            showing(
                browser, lambda s: s if {i["name"] for i in s["instances"]} == set(NAMES) else None
            ),
            10,
            f"the instances {NAMES}",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        assert "2 job(s), 3 live instance(s)" in shown["summary"], shown["summary"]
        # None of them is behind on its runs: the column says so.
        assert [i["cells"]["behind"] for i in shown["instances"]] == ["-"] * 3, shown

        # 3. It follows the slots as they pass: the last slot and the update time move.
        before = row(shown, TICK)
        assert before is not None
        wait_until(
            showing(
                browser,
                lambda s: (
                    (now := row(s, TICK)) is not None
                    and now["cells"]["slot"] != before["cells"]["slot"]
                    and s["summary"] != shown["summary"]
                ),
            ),
            5,
            "a later slot of tick and a later update",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        now = row(tables(browser), TICK)
        assert now is not None and now["cells"]["owner"] in NAMES, now

        # 4. Pause tick with the token: no slot of it starts on any instance.
        browser.find_element(By.ID, "token").send_keys(token)
        clicked = click(browser, f'#jobs tbody tr[data-job="{TICK}"] button.pause')
        paused = wait_until(
            showing(
                browser,
                lambda s: (r := row(s, TICK)) is not None and r["cells"]["paused"] == "yes" and s,
            ),
            5,
            "tick paused",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        assert paused["message"] == f"{TICK}: paused"
        assert row(paused, TICK)["buttons"] == ["resume", "trigger"]  # type: ignore[index]
        assert row(paused, MARKUP)["cells"]["paused"] == "no"  # type: ignore[index]
        assert control.paused().jobs == (TICK,)
        # The page said so once the store had it (a loaded machine may take a while
        # from the click to there): from then on, no slot of tick starts anywhere.
        confirmed = time.time()
        time.sleep(max(0.0, confirmed + PAUSE_MARGIN + PAUSED_FOR - time.time()))
        lines = fleet.lines()
        assert starts(lines, TICK, confirmed + PAUSE_MARGIN) == [], (
            f"tick ran after the pause clicked at {clicked:.3f}, shown by {confirmed:.3f}"
        )
        other = {x["slot_id"] for x in starts(lines, MARKUP, confirmed + PAUSE_MARGIN)}
        assert len(other) >= 3, f"the other job stopped too: {other}"

        # 5. Resume: its runs come back, and the page shows the slots it did not run.
        resumed = click(browser, f'#jobs tbody tr[data-job="{TICK}"] button.resume')
        shown = wait_until(
            showing(
                browser,
                lambda s: (r := row(s, TICK)) is not None and r["cells"]["paused"] == "no" and s,
            ),
            5,
            "tick resumed",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        assert shown["message"] == f"{TICK}: resumed"
        assert control.paused().jobs == ()
        back = wait_until(
            fleet.watch(lambda ls: starts(ls, TICK, resumed)),
            5,
            "tick to run again",
            seen=fleet.tail,
        )
        assert back[0]["instance"] in NAMES
        wait_until(
            showing(browser, lambda s: (r := row(s, TICK)) is not None and r["gaps"] >= 1),
            5,
            "the slots tick did not run while paused, in its recent slots",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        no_alert(browser)
        if os.environ.get("ANARCHON_SCREENSHOT"):
            assert browser.save_screenshot(str(SCREENSHOT)), "no screenshot saved"

        # 6. Read-only: the same tables, no buttons, no token field.
        browser.get(read_only_url)
        shown = wait_until(
            showing(
                browser, lambda s: s if row(s, TICK) and len(s["instances"]) == len(NAMES) else None
            ),
            10,
            "the read-only dashboard's tables",
            interval=0.1,
            seen=lambda: tables(browser),
        )
        assert row(shown, MARKUP)["cells"]["name"] == MARKUP  # type: ignore[index]
        assert all(r["buttons"] == [] for r in shown["jobs"]), shown["jobs"]
        assert browser.find_elements(By.TAG_NAME, "button") == []
        assert not browser.find_element(By.ID, "token").is_displayed()
        assert not browser.find_element(By.ID, "actions").is_displayed()
        no_alert(browser)


#: A cron job in seconds (croniter's sixth field): slots every 3 s, at :00, :03, :06...
CRON_EVERY = 3


@pytest.fixture
def cron_fleet(tmp_path: Path, redis_url: str) -> Iterator[Fleet]:
    """Instances (not started) running ``tick`` on a crontab, every 3 seconds."""
    namespace = f"dash{uuid.uuid4().hex[:10]}"
    made = Fleet(
        tmp_path, redis_url, namespace=namespace, cron=f"* * * * * */{CRON_EVERY}", work=0.2
    )
    try:
        yield made
    finally:
        made.stop_all()
        drop_namespace(redis_url, namespace)


def test_a_run_now_of_a_crontab_job_is_no_gap_and_no_step_of_its_schedule(
    cron_fleet: Fleet, browser: WebDriver, tmp_path: Path
) -> None:
    """A run-now slot between two scheduled ones: marked as such, the schedule unchanged.

    The job is declared by its instances only (not stored): the page shows
    its next slots from the schedule they declare, unmoved by the run-now
    slot, a second off the schedule; and no gap (a gap mark: slots that did
    not run) may appear, since none was missed.
    """
    fleet = cron_fleet
    fleet.start("a", "b")
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
        wait_until(
            showing(browser, lambda s: (r := row(s, TICK)) is not None and r["regular"] >= 2),
            20,
            "two scheduled runs of tick",
        )
        browser.find_element(By.ID, "token").send_keys(token)
        click(browser, f'#jobs tbody tr[data-job="{TICK}"] button.trigger')
        # The run-now slot, then two scheduled slots after it: the gap check
        # spans the run-now slot, and the estimate has scheduled slots to go on.
        wait_until(
            fleet.watch(
                lambda ls: (
                    (
                        manual := [
                            x
                            for x in ls
                            if x["kind"] == "start" and slot_seconds(x["slot_id"]) % CRON_EVERY
                        ]
                    )
                    and len(starts(ls, TICK, slot_seconds(manual[0]["slot_id"]))) >= 2
                )
            ),
            20,
            "the run-now slot, then two scheduled slots",
            seen=fleet.tail,
        )
        shown = wait_until(
            showing(
                browser,
                lambda s: (
                    (r := row(s, TICK)) is not None and r["manual"] == 1 and r["regular"] >= 4 and r
                ),
            ),
            10,
            "the run-now slot among the recent slots of tick",
        )
        assert shown["gaps"] == 0, f"a gap where no slot was missed: {shown}"
        # Three slots to come, from the declared schedule (not estimated: no "≈").
        nexts = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:(\d\d) UTC", shown["cells"]["next"])
        assert len(nexts) == 3 and "≈" not in shown["cells"]["next"], shown["cells"]
        assert all(int(second) % CRON_EVERY == 0 for second in nexts), (
            f"a next slot is off the schedule: {shown}"
        )
        no_alert(browser)
    finally:
        server.stop()


def test_the_page_says_why_a_job_was_paused_and_that_its_limit_was_reached(
    fleet: Fleet, dashboard: Callable[[str | None], str], browser: WebDriver
) -> None:
    from anarchon_core import open_store
    from anarchon_core.pauses import PauseReason, failed_reason, pause_for
    from anarchon_core.store import ClaimRequest, RunState

    store = open_store(fleet.store, namespace=fleet.namespace)
    try:
        control = Control(store)
        control.add(Definition("report", "report", every=3600))
        control.add(Definition("capped", "capped", every=3600, rules={"limit": 1}))
        slot_ms = int(time.time()) // 3600 * 3600 * 1000
        ran = store.claim("report", slot_ms, "i1", 30).holder
        assert ran is not None and store.finish("report", ran.token, RunState.FAILED)
        why = failed_reason(f"report@{slot_ms}", 1)
        pause_for(store, PauseReason("report", why, "i1", time.time(), f"report@{slot_ms}"))
        capped = store.claim_many([ClaimRequest("capped", slot_ms, 30, limit=1)], "i1")[0]
        assert capped.won and capped.holder is not None
        assert store.finish("capped", capped.holder.token, RunState.DONE)
    finally:
        store.close()
    browser.get(dashboard(None))

    def shown(tables: dict[str, Any]) -> tuple[str, str] | None:
        report, limited = row(tables, "report"), row(tables, "capped")
        if report is None or limited is None:
            return None
        return report["cells"]["paused"], limited["cells"]["next"]

    found = wait_until(showing(browser, shown), 15, "both jobs on the page")
    assert found == ("on failure", "limit reached (1 of 1)")
    assert shown_of(browser, 'tr[data-job="report"] td.paused', "title") == why
