"""The dashboard's WSGI app, called in-process, on a real Redis.

Every request goes through :func:`wsgiref.validate.validator`, so an answer
that breaks the WSGI protocol fails here as it would under a strict server.
The jobs and instances it shows are written by a real :class:`Scheduler`
running in this process; its actions are checked against what the store then
holds, since that is what every instance reads.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.util import setup_testing_defaults
from wsgiref.validate import validator

import pytest

from anarchon_core import ClaimRequest, Control, Run, RunState, Scheduler, Store, open_store
from anarchon_core.control import MANUAL, RUN_NOW, RUN_NOW_LEAD, Definition
from anarchon_core.dashboard import MAX_BODY, MAX_JOBS, Dashboard
from anarchon_core.errors import ConfigurationError
from tests import servers
from tests.cleanup import drop_namespace
from tests.waiting import wait_until

TOKEN = "s3cret-dashboard-token-0123"
#: A job whose schedule is stored (so the namespace knows it), run by no instance here.
STORED = "nightly-report"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
    " img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers["Content-Type"] == "application/json", self.headers
        return json.loads(self.body)


def call(
    app: Callable[..., Any],
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    token: str | None = None,
    script_name: str = "",
    length: str | None = None,
    validate: bool = True,
) -> Answer:
    """One request to ``app``, as a WSGI server makes it."""
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ.update(REQUEST_METHOD=method, PATH_INFO=path, SCRIPT_NAME=script_name, QUERY_STRING="")
    environ["wsgi.input"] = io.BytesIO(body or b"")
    if body is not None:
        environ["CONTENT_TYPE"] = "application/json"
        environ["CONTENT_LENGTH"] = str(len(body))
    if length is not None:
        environ["CONTENT_LENGTH"] = length
    if token is not None:
        environ["HTTP_X_ANARCHON_TOKEN"] = token
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen["status"], seen["headers"] = status, headers
        return lambda data: None

    result = (validator(app) if validate else app)(environ, start_response)
    try:
        out = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close:
            close()
    names = [name.lower() for name, _ in seen["headers"]]
    assert len(names) == len(set(names)), f"a header twice: {seen['headers']}"
    return Answer(int(seen["status"].split()[0]), dict(seen["headers"]), out)


def act(app: Dashboard, verb: str, job: str, token: str | None = TOKEN) -> Answer:
    return call(app, "POST", f"/api/{verb}", body=json.dumps({"job": job}).encode(), token=token)


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    name = f"dash{uuid.uuid4().hex[:10]}"
    yield name
    drop_namespace(redis_url, name)


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[Store]:
    """The namespace's store, with one stored schedule: a job the namespace knows."""
    opened = open_store(redis_url, namespace=namespace)
    Control(opened).add(Definition(name=STORED, handler="report", every=3600))
    yield opened
    opened.close()


@pytest.fixture
def app(store: Store) -> Iterator[Dashboard]:
    made = Dashboard(store, namespace=store.namespace, action_token=TOKEN)
    yield made
    made.close()


@pytest.fixture
def read_only(store: Store) -> Iterator[Dashboard]:
    made = Dashboard(store, namespace=store.namespace)
    yield made
    made.close()


def job_row(state: dict[str, Any], name: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [row for row in state["jobs"] if row["name"] == name]
    assert len(rows) == 1, state["jobs"]
    return rows[0]


# -- what the page shows ---------------------------------------------------


def test_state_shows_the_jobs_and_instances_of_a_running_scheduler(
    redis_url: str, namespace: str, app: Dashboard
) -> None:
    release = threading.Event()
    started: list[str] = []

    def tick(run: Run) -> None:
        started.append(run.slot_id)
        if len(started) == 2:  # the second run holds its lease until released
            release.wait(10)

    cron = Scheduler(redis_url, namespace=namespace, instance="web-1")
    cron.add_job(tick, name="tick", every=1, jitter=0)
    cron.start()
    try:
        # While a run holds its lease: shown running, owned, with lease left, held by web-1.
        wait_until(lambda: len(started) >= 2, 10, "a second run of tick")
        answer = call(app, "GET", "/api/state")
        assert answer.status == 200
        state = answer.json()
        running = job_row(state, "tick")
        assert running["state"] == "running", running
        assert running["owner"] == "web-1"
        assert running["attempt"] == 1
        assert running["lease_left"] is not None and running["lease_left"] > 0
        assert running["slot"] == int(started[1].rsplit("@", 1)[1]) / 1000
        [instance] = state["instances"]
        assert instance["name"] == "web-1"
        assert instance["host"] == socket.gethostname()
        assert instance["pid"] == os.getpid()
        assert instance["jobs"] == 1
        assert 0 <= instance["seen"] < 10
        assert instance["holds"] == ["tick"]
        assert instance["behind"] == 0 and instance["deferred"] == 0  # it keeps up
        release.set()

        # Once it finished: done, a last success, no lease held, a timeline of its runs.
        def finished() -> dict[str, Any] | None:
            row = job_row(call(app, "GET", "/api/state").json(), "tick")
            return row if row["state"] == "done" and len(row["timeline"]) >= 3 else None

        done = wait_until(finished, 10, "tick to finish a third run")
    finally:
        release.set()
        cron.stop()
    state = call(app, "GET", "/api/state").json()
    assert state["namespace"] == namespace
    assert state["actions"] is True
    assert state["registry"] is True
    assert state["paused_namespace"] is False
    assert abs(state["now"] - time.time()) < 5
    assert done["lease_left"] is None
    assert done["last_success"] is not None and abs(done["last_success"] - time.time()) < 10
    assert done["paused"] is False and done["stored"] is False
    runs = [item for item in done["timeline"] if item["kind"] == "run"]
    assert {item["owner"] for item in runs} == {"web-1"}
    slots = [item["slot"] for item in runs]
    assert slots == sorted(slots, reverse=True), "the timeline is not newest first"
    assert started[0] in {f"tick@{round(s * 1000)}" for s in slots}
    # Declared by the live instance: its next slots come from its schedule, after the last.
    assert done["declared"] == 1 and done["schedule"] == "every 1s"
    assert done["next"]["estimated"] is False
    assert done["next"]["at"] > done["slot"] and done["next"]["at"] % 1 == 0
    assert [slot["at"] - done["next"]["at"] for slot in done["upcoming"]] == [0, 1, 2]
    # The stored schedule shows too, with its next slot from the schedule itself.
    stored = job_row(state, STORED)
    assert stored["stored"] is True and stored["slot"] is None and stored["timeline"] == []
    assert stored["next"]["estimated"] is False
    assert stored["next"]["at"] % 3600 == 0 and stored["next"]["at"] > time.time() - 5
    assert [row["name"] for row in state["jobs"]] == sorted([STORED, "tick"])


def test_a_run_now_slot_is_neither_a_gap_nor_a_step_of_the_schedule(
    app: Dashboard, store: Store
) -> None:
    # A crontab job run by its instances every minute, and once on request
    # between two of its minutes, as the engine records them.
    minute = (int(time.time()) // 60 - 3) * 60_000
    manual = minute + 115_002  # 5 s before the third minute, as a run now is due
    for slot_ms in (minute, minute + 60_000, manual, minute + 120_000):
        holder = store.claim("digest", slot_ms, "beat-1", 10).holder
        assert holder is not None
        store.finish("digest", holder.token, RunState.DONE)
    store.set_control(f"{MANUAL}digest/{manual}", "{}", 0)
    row = job_row(call(app, "GET", "/api/state").json(), "digest")
    timeline = row["timeline"]
    assert [item["kind"] for item in timeline] == ["run"] * 4, timeline
    assert [item["manual"] for item in timeline] == [False, True, False, False]
    # Estimated from the scheduled slots alone: on the minute, after the last one.
    assert row["next"]["estimated"] is True
    assert row["next"]["at"] * 1000 % 60_000 == 0, row["next"]
    assert row["next"]["at"] > time.time() - 1


def test_the_page_and_its_files_are_served(app: Dashboard) -> None:
    page = call(app, "GET", "/")
    assert page.status == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    html = page.body.decode()
    # Relative links: the page works under whatever prefix it is mounted.
    assert '<script src="page.js" defer></script>' in html
    assert 'href="page.css"' in html
    assert 'id="jobs"' in html and 'id="instances"' in html
    script = call(app, "GET", "/page.js")
    assert script.status == 200
    assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert b'fetch("api/state"' in script.body
    style = call(app, "GET", "/page.css")
    assert style.status == 200 and style.headers["Content-Type"] == "text/css; charset=utf-8"
    assert call(app, "HEAD", "/").status == 200
    missing = call(app, "GET", "/etc/passwd")
    assert missing.status == 404 and missing.json() == {"error": "not found"}


def test_mounted_under_a_prefix_without_its_slash_redirects_to_it(app: Dashboard) -> None:
    # No body, hence no Content-Type, which wsgiref's validator insists on.
    answer = call(app, "GET", "", script_name="/ops", validate=False)
    assert answer.status == 308
    assert answer.headers["Location"] == "/ops/"
    page = call(app, "GET", "/", script_name="/ops")
    assert page.status == 200 and b"page.js" in page.body


def test_every_answer_carries_the_security_headers(app: Dashboard, read_only: Dashboard) -> None:
    body = json.dumps({"job": STORED}).encode()
    answers = {
        "page": call(app, "GET", "/"),
        "script": call(app, "GET", "/page.js"),
        "style": call(app, "GET", "/page.css"),
        "state": call(app, "GET", "/api/state"),
        "redirect": call(app, "GET", "", script_name="/ops", validate=False),
        "not found": call(app, "GET", "/nope"),
        "wrong method": call(app, "GET", "/api/pause"),
        "read-only": call(read_only, "POST", "/api/pause", body=body, token=TOKEN),
        "wrong token": call(app, "POST", "/api/pause", body=body, token="x" * 20),
        "bad body": call(app, "POST", "/api/pause", body=b"{", token=TOKEN),
        "unknown job": act(app, "pause", "no-such-job"),
        "done": act(app, "resume", STORED),
    }
    statuses = {what: answer.status for what, answer in answers.items()}
    assert statuses == {
        "page": 200,
        "script": 200,
        "style": 200,
        "state": 200,
        "redirect": 308,
        "not found": 404,
        "wrong method": 405,
        "read-only": 403,
        "wrong token": 403,
        "bad body": 400,
        "unknown job": 409,
        "done": 200,
    }
    for what, answer in answers.items():
        assert answer.headers.get("Content-Security-Policy") == CSP, what
        assert answer.headers.get("X-Content-Type-Options") == "nosniff", what
        assert answer.headers.get("Referrer-Policy") == "no-referrer", what
        assert answer.headers.get("Cache-Control") == "no-store", what


# -- actions ---------------------------------------------------------------


def test_a_read_only_dashboard_refuses_every_action(read_only: Dashboard, store: Store) -> None:
    assert call(read_only, "GET", "/api/state").json()["actions"] is False
    for verb in ("pause", "resume", "trigger"):
        answer = act(read_only, verb, STORED, token=TOKEN)
        assert answer.status == 403, verb
        assert answer.json() == {"error": "the dashboard is read-only"}
    assert store.paused().jobs == ()
    assert store.controls(RUN_NOW) == {}, "a run-now request was stored"


def test_a_wrong_or_missing_token_is_refused(app: Dashboard, store: Store) -> None:
    for token in (None, "", TOKEN[:-1], TOKEN + "x", TOKEN.upper()):
        answer = act(app, "pause", STORED, token=token)
        assert answer.status == 403, token
        assert answer.json() == {"error": "wrong action token"}
    assert act(app, "trigger", STORED, token="nope").status == 403
    assert store.paused().jobs == ()
    assert store.controls(RUN_NOW) == {}


def test_the_token_pauses_resumes_and_triggers_a_job(app: Dashboard, store: Store) -> None:
    answer = act(app, "pause", STORED)
    assert answer.status == 200
    assert answer.json() == {"job": STORED, "done": "paused"}
    assert store.paused().jobs == (STORED,)
    assert store.paused().namespace is False
    assert job_row(call(app, "GET", "/api/state").json(), STORED)["paused"] is True
    assert act(app, "pause", STORED).json()["done"] == "already paused"

    # Run now is refused while paused, and nothing is asked of the instances.
    refused = act(app, "trigger", STORED)
    assert refused.status == 409 and "paused" in refused.json()["error"]
    assert store.controls(RUN_NOW) == {}

    answer = act(app, "resume", STORED)
    assert answer.status == 200 and answer.json()["done"] == "resumed"
    assert store.paused().jobs == ()
    assert job_row(call(app, "GET", "/api/state").json(), STORED)["paused"] is False
    assert act(app, "resume", STORED).json()["done"] == "not paused"

    asked = time.time()
    answer = act(app, "trigger", STORED)
    assert answer.status == 200
    said = answer.json()
    match = re.fullmatch(r"asked to run (\S+) now", said["done"])
    assert said["job"] == STORED and match, said
    slot_id = match.group(1)
    assert slot_id.startswith(f"{STORED}@")
    due = int(slot_id.rsplit("@", 1)[1]) / 1000
    assert asked < due <= time.time() + RUN_NOW_LEAD + 1
    # The request is in the store, for that very slot: what every instance reads.
    [request] = store.controls(RUN_NOW + STORED).values()
    assert json.loads(request[1]) == {"slot_ms": int(slot_id.rsplit("@", 1)[1])}


def test_an_unknown_job_is_a_conflict_and_changes_nothing(app: Dashboard, store: Store) -> None:
    for verb in ("pause", "trigger"):
        answer = act(app, verb, "typo-job")
        assert answer.status == 409, verb
        assert "typo-job" in answer.json()["error"]
    # A resume, as ``anarchon resume`` does, only says there was nothing to resume.
    assert act(app, "resume", "typo-job").json() == {"job": "typo-job", "done": "not paused"}
    assert store.paused().jobs == ()
    assert "typo-job" not in [row["name"] for row in call(app, "GET", "/api/state").json()["jobs"]]
    assert store.controls(RUN_NOW) == {}


@pytest.mark.parametrize(
    ("body", "length"),
    [
        (None, None),  # no body at all
        (b"", "0"),
        (b"{", None),
        (b"not json", None),
        (b"[1, 2]", None),
        (b'"job"', None),
        (b'{"name": "nightly-report"}', None),
        (b'{"job": 5}', None),
        (b'{"job": ""}', None),
        (b'{"job": null}', None),
        (json.dumps({"job": STORED, "pad": "x" * MAX_BODY}).encode(), None),
        (b'{"job": "nightly-report"}', "abc"),
        (b'{"job": "nightly-report"}', "-1"),
    ],
)
def test_a_bad_body_is_refused(
    app: Dashboard, store: Store, body: bytes | None, length: str | None
) -> None:
    # A Content-Length that is not a count is what the validator refuses itself.
    answer = call(
        app, "POST", "/api/pause", body=body, token=TOKEN, length=length, validate=length is None
    )
    assert answer.status == 400, answer.body
    assert "expected" in answer.json()["error"]
    assert store.paused().jobs == ()


def test_actions_answer_post_only(app: Dashboard, store: Store) -> None:
    for verb in ("pause", "resume", "trigger"):
        for method in ("GET", "HEAD", "PUT", "DELETE"):
            answer = call(app, method, f"/api/{verb}", token=TOKEN)
            assert answer.status == 405, (method, verb)
            assert answer.json() == {"error": "POST only"}
    assert call(app, "POST", "/", body=b"{}", token=TOKEN).status == 405
    assert call(app, "POST", "/api/state", body=b"{}", token=TOKEN).status == 405
    assert store.paused().jobs == ()


# -- configuration and failures ---------------------------------------------


def test_a_short_action_token_is_refused(store: Store) -> None:
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        Dashboard(store, namespace=store.namespace, action_token="x" * 15)
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        Dashboard(store, namespace=store.namespace, action_token="")
    Dashboard(store, namespace=store.namespace, action_token="x" * 16).close()


@pytest.mark.parametrize("token", ["pässwörd-0123456789", "a token with spaces in it"])
def test_a_token_a_header_cannot_carry_as_written_is_refused(store: Store, token: str) -> None:
    # A browser cannot send it, and a server hands other bytes to the app: it could never match.
    with pytest.raises(ConfigurationError, match="printable ASCII"):
        Dashboard(store, namespace=store.namespace, action_token=token)


def test_a_store_that_does_not_answer_is_a_503_without_its_password() -> None:
    port = servers.free_port()  # nothing listens there
    url = f"redis://:secretpw@127.0.0.1:{port}/0"
    app = Dashboard(url, namespace="dash-down", action_token=TOKEN)
    try:
        state = call(app, "GET", "/api/state")
        assert state.status == 503
        error = state.json()["error"]
        assert "StoreUnavailable" in error and str(port) in error, error
        assert b"secretpw" not in state.body
        action = act(app, "pause", "tick")
        assert action.status == 503
        assert b"secretpw" not in action.body
        # The page itself is still served: it shows the error.
        assert call(app, "GET", "/").status == 200
    finally:
        app.close()


def test_past_the_first_jobs_the_page_counts_the_others(app: Dashboard, store: Store) -> None:
    names = [f"job{i:04d}" for i in range(MAX_JOBS + 5)]
    slot_ms = int(time.time()) * 1000
    claims = store.claim_many([ClaimRequest(name, slot_ms, 10) for name in names], "web-1")
    assert all(c.won for c in claims)
    state = call(app, "GET", "/api/state").json()
    assert [job["name"] for job in state["jobs"]] == names[:MAX_JOBS]
    assert state["more_jobs"] == 5 + 1  # and the fixture's stored schedule
    assert STORED not in [job["name"] for job in state["jobs"]]


def test_the_estimated_next_slot_is_after_the_slot_the_record_holds() -> None:
    """The clock is read before the record: a record already at the slot due just after
    that moment must not show that very slot as the next one."""
    from types import SimpleNamespace

    from anarchon_core.dashboard import _next_slot

    record = SimpleNamespace(slot_ms=378_000)
    status = SimpleNamespace(defined=None, state=record)
    history = [SimpleNamespace(slot_ms=ms) for ms in (378_000, 377_000, 376_000)]
    shown = _next_slot(status, history, now=377.9)
    assert shown == {"at": 379.0, "estimated": True}
