"""A live dashboard of one namespace: a WSGI app (``anarchon dashboard`` serves it).

The page (``page.html``, ``page.js``, ``page.css``) reads ``api/state``
every second and draws it with DOM text nodes only: every name and value
that comes from the store is shown as text, never as markup. It shows each
job's last slot, owner, attempt, state, lease left, last success, pause
flag and its next slots (from its schedule, as the live instances declare it
or as stored; else estimated), or that it ended; a timeline of its recent
slots (who ran each, takeovers,
runs on request, slots that did not run); the live instances with the runs
they hold; and, if the workers counted any, the jobs that a scheduler that
is not anarchon's also sent (a stock beat left running).

Read-only unless built with an ``action_token``: then ``api/pause``,
``api/resume`` and ``api/trigger`` accept a POST carrying the token in the
``X-Anarchon-Token`` header (compared in constant time). A header, not a
cookie: another site's page cannot make a browser send it. Mount it in any
WSGI project (Django, Flask) under a prefix of your choice: the page's links
are relative.
"""

from __future__ import annotations

import hmac
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import resources
from typing import Any

from ..control import MANUAL, Control, JobStatus, Records
from ..errors import ConfigurationError, JobPaused, UnknownJob
from ..handoff import stray_sends
from ..pauses import reasons as pause_reasons
from ..schedules import NEVER, ended, preview, zone_of
from ..store import HELD_STATES, ControlStore, RegistryStore, RunRecord, Store, holders
from ..urls import scrub, secrets_in

StartResponse = Callable[[str, list[tuple[str, str]]], Any]

#: How many jobs the page shows at most (sorted by name; the rest are counted).
MAX_JOBS = 200
#: How many recent attempts each job's timeline shows.
TIMELINE = 12
#: How many slots to come each job shows, once its schedule is known.
UPCOMING = 3
#: The largest request body an action accepts, in bytes.
MAX_BODY = 4096

_FILES = {
    "/": ("page.html", "text/html; charset=utf-8"),
    "/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/page.css": ("page.css", "text/css; charset=utf-8"),
}
_SECURITY = [
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]


class Dashboard:
    """The WSGI app of the dashboard of ``store``'s namespace (a Store or a URL)."""

    def __init__(
        self,
        store: Store | str,
        *,
        namespace: str = "default",
        action_token: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if action_token is not None and (
            len(action_token) < 16 or not all("!" <= c <= "~" for c in action_token)
        ):
            raise ConfigurationError(
                "the dashboard's action token: at least 16 characters, printable ASCII"
                " without spaces (a header carries it)"
            )
        self.control = Control(store, namespace=namespace)
        #: The URL's secrets, scrubbed from any error the page shows.
        self._secrets = secrets_in(store) if isinstance(store, str) else []
        self.store = self.control.store
        self._token = action_token
        self._clock = clock
        self._lock = threading.Lock()  # one store call at a time, whatever the server's threads
        self._files = {
            path: (resources.files(__name__).joinpath(name).read_bytes(), kind)
            for path, (name, kind) in _FILES.items()
        }

    def close(self) -> None:
        self.control.close()

    # -- WSGI -----------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or ""
        method = environ.get("REQUEST_METHOD", "GET")
        if path == "":  # mounted under a prefix and asked without the slash
            where = (environ.get("SCRIPT_NAME") or "") + "/"
            headers = [("Location", where), ("Content-Type", "text/plain"), *_SECURITY]
            start_response("308 Permanent Redirect", headers)
            return [b""]
        if path in self._files:
            if method not in ("GET", "HEAD"):
                return _json(start_response, "405 Method Not Allowed", {"error": "GET only"})
            body, kind = self._files[path]
            start_response("200 OK", [("Content-Type", kind), *_SECURITY])
            return [body]
        if path == "/api/state":
            if method not in ("GET", "HEAD"):
                return _json(start_response, "405 Method Not Allowed", {"error": "GET only"})
            try:
                with self._lock:
                    state = self.state()
            except Exception as exc:
                return _json(start_response, "503 Service Unavailable", {"error": self._said(exc)})
            return _json(start_response, "200 OK", state)
        verb = path.removeprefix("/api/")
        if verb in ("pause", "resume", "trigger"):
            if method != "POST":
                return _json(start_response, "405 Method Not Allowed", {"error": "POST only"})
            return self._act(verb, environ, start_response)
        return _json(start_response, "404 Not Found", {"error": "not found"})

    def _act(
        self, verb: str, environ: dict[str, Any], start_response: StartResponse
    ) -> Iterable[bytes]:
        if self._token is None:
            return _json(start_response, "403 Forbidden", {"error": "the dashboard is read-only"})
        given = environ.get("HTTP_X_ANARCHON_TOKEN", "")
        if not hmac.compare_digest(given.encode(), self._token.encode()):
            return _json(start_response, "403 Forbidden", {"error": "wrong action token"})
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            return _json(start_response, "400 Bad Request", {"error": "expected a small JSON body"})
        try:
            job = json.loads(environ["wsgi.input"].read(length))["job"]
        except (ValueError, KeyError, TypeError):
            job = None
        if not isinstance(job, str) or not job:
            return _json(start_response, "400 Bad Request", {"error": 'expected {"job": NAME}'})
        try:
            with self._lock:
                if verb == "pause":
                    changed = self.control.pause(job)
                    said = "paused" if changed else "already paused"
                elif verb == "resume":
                    changed = self.control.resume(job)
                    said = "resumed" if changed else "not paused"
                else:
                    said = f"asked to run {self.control.trigger(job)} now"
        except (UnknownJob, JobPaused, ConfigurationError) as exc:
            return _json(start_response, "409 Conflict", {"error": str(exc)})
        except Exception as exc:
            return _json(start_response, "503 Service Unavailable", {"error": self._said(exc)})
        return _json(start_response, "200 OK", {"job": job, "done": said})

    def _said(self, exc: Exception) -> str:
        """An error as the page may show it: the store's secrets scrubbed out."""
        said = f"{type(exc).__name__}: {exc}"
        for secret in self._secrets:
            said = scrub(said, secret)
        return said

    # -- what the page shows ----------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything the page shows, as JSON-ready values (times in Unix seconds)."""
        now = self._clock()
        paused = self.control.paused()
        instances = self.store.instances() if isinstance(self.store, RegistryStore) else []
        declared = self.control.declarations(instances)
        records = Records.of(self.store)
        jobs, total = self.control.listing(MAX_JOBS, paused, declared, records)
        holds = holders({status.job: status.state for status in jobs})
        manual = self._manual_slots()
        why = pause_reasons(self.store)
        shown_jobs = []
        for status in jobs:
            st, counts = status.state, status.stats
            history = records.history(self.store, status.job, TIMELINE) if st is not None else []
            ran_now = manual.get(status.job, set())
            row: dict[str, Any] = {
                "name": status.job,
                "paused": status.paused,
                "stored": status.defined is not None,
                "slot": st.slot_ms / 1000 if st else None,
                "owner": st.owner if st else None,
                "attempt": st.attempt if st else None,
                "state": st.state.value if st else None,
                "lease_left": st.lease_remaining if st and st.state in HELD_STATES else None,
                "last_success": counts.last_success if counts else None,
                "last_failure": counts.last_failure if counts else None,
                "runs": counts.runs if counts else 0,
                "takeovers": counts.takeovers if counts else 0,
                "declared": status.declared.instances if status.declared else 0,
                "paused_why": why[status.job].reason if status.job in why else None,
                "limit": status.limit_note() or None,
                **_to_come(status, history, now, ran_now),
                "timeline": _timeline(history, ran_now),
            }
            shown_jobs.append(row)
        return {
            "namespace": self.store.namespace,
            "now": now,
            "paused_namespace": paused.namespace,
            "actions": self._token is not None,
            "registry": isinstance(self.store, RegistryStore),
            "jobs": shown_jobs,
            "more_jobs": total - len(jobs),
            "strays": [asdict(sent) for sent in stray_sends(self.store)],
            "instances": [
                {
                    "name": r.instance,
                    "host": r.info.get("host"),
                    "pid": r.info.get("pid"),
                    "version": r.info.get("version"),
                    "jobs": r.info.get("jobs"),
                    "seen": r.age,
                    "behind": r.info.get("behind") or 0,
                    "deferred": r.info.get("deferred") or 0,
                    "holds": holds.get(r.instance, []),
                    "declares": r.instance not in declared.silent,
                }
                for r in sorted(instances, key=lambda r: r.instance)
            ],
        }

    def _manual_slots(self) -> dict[str, set[int]]:
        """Per job, the slots (ms) that ran on request (run now), in one read.

        They are slots of their own, off the job's schedule: neither a gap
        between scheduled slots nor a step of the schedule.
        """
        if not isinstance(self.store, ControlStore):
            return {}
        found: dict[str, set[int]] = {}
        for key in self.store.controls(MANUAL):
            job, _, ms = key[len(MANUAL) :].rpartition("/")
            if ms.isdigit():
                found.setdefault(job, set()).add(int(ms))
        return found


def _to_come(
    status: JobStatus, history: list[RunRecord], now: float, manual: AbstractSet[int]
) -> dict[str, Any]:
    """What the page shows of a job's slots to come: from its schedule, as the live
    instances declare it or as stored; else its next slot estimated (see :func:`_next_slot`).

    The slots to come are those after ``now`` and after the slot the job's record holds
    (read after ``now`` was, it may be a slot due since)."""
    schedule = status.schedule()
    if schedule is None:
        estimate = _next_slot(status, history, now, manual) if status.declared is None else None
        return {"schedule": None, "zone": None, "ended": False, "next": estimate, "upcoming": []}
    held = status.state.slot_ms / 1000 if status.state is not None else now
    at = datetime.fromtimestamp(max(now, held), timezone.utc)
    slots = preview(schedule, UPCOMING, at)
    return {
        "schedule": schedule.describe(),
        "zone": zone_of(schedule),
        "ended": ended(schedule, at),
        "next": {"at": slots[0].slot.timestamp(), "estimated": False} if slots else None,
        "upcoming": [
            {"at": slot.slot.timestamp(), "local": slot.local.isoformat(), "note": slot.note}
            for slot in slots
        ],
    }


def _next_slot(
    status: Any, history: list[RunRecord], now: float, manual: AbstractSet[int] = frozenset()
) -> dict[str, Any] | None:
    """The job's next slot: from its stored schedule, else estimated from its recent slots.

    The estimate steps on from the last scheduled slot by the smallest gap
    between scheduled slots, to the first one after ``now`` and after the
    slot the job's record holds (read after ``now`` was, it may be newer);
    slots run on request are no part of it.
    """
    if status.defined is not None:
        nxt = status.defined.schedule().next_after(datetime.fromtimestamp(now, timezone.utc))
        if nxt == NEVER:  # past its end: no slot comes
            return None
        return {"at": nxt.timestamp(), "estimated": False}
    slots = sorted({r.slot_ms for r in history} - manual, reverse=True)
    if len(slots) < 2:
        return None
    gap = min(a - b for a, b in itertools.pairwise(slots))
    if gap <= 0:
        return None
    at = slots[0]
    current = status.state.slot_ms if status.state is not None else 0
    while at / 1000 <= now or at <= current:
        at += gap
    return {"at": at / 1000, "estimated": True}


def _timeline(
    history: list[RunRecord], manual: AbstractSet[int] = frozenset()
) -> list[dict[str, Any]]:
    """Recent attempts, newest first, with a marker where slots did not run.

    Slots that did not run (missed, skipped as overlaps, paused) show as a
    gap wider than the smallest gap between the recent scheduled slots. A
    slot run on request (``manual``) is off the schedule: it is shown, marked
    as such, and neither makes nor splits a gap.
    """
    slots = sorted({r.slot_ms for r in history} - manual, reverse=True)
    gaps = [a - b for a, b in itertools.pairwise(slots)]
    step = min(gaps) if gaps else 0
    items: list[dict[str, Any]] = []
    previous: int | None = None
    for record in history:
        if record.slot_ms in manual:
            items.append(_run_item(record, manual=True))
            continue
        if previous is not None and step > 0 and previous != record.slot_ms:
            skipped = round((previous - record.slot_ms) / step) - 1
            if skipped > 0:
                items.append({"kind": "gap", "slots": skipped})
        items.append(_run_item(record, manual=False))
        previous = record.slot_ms
    return items


def _run_item(record: RunRecord, *, manual: bool) -> dict[str, Any]:
    """One attempt as the timeline shows it."""
    return {
        "kind": "run",
        "slot": record.slot_ms / 1000,
        "attempt": record.attempt,
        "owner": record.owner,
        "state": record.state.value,
        "takeover": record.attempt > 1,
        "manual": manual,
    }


def _json(start_response: StartResponse, status: str, value: Any) -> list[bytes]:
    body = json.dumps(value, separators=(",", ":")).encode()
    start_response(status, [("Content-Type", "application/json"), *_SECURITY])
    return [body]


def serve(app: Dashboard, host: str = "127.0.0.1", port: int = 8787) -> None:
    """Serve ``app`` with waitress (the ``dashboard`` extra) until interrupted."""
    try:
        import waitress
    except ImportError as exc:
        from ..errors import MissingDependency

        raise MissingDependency(
            "the dashboard's server needs waitress: pip install 'anarchon[dashboard]'"
        ) from exc
    waitress.serve(app, host=host, port=port, threads=4, ident="anarchon", _quiet=True)
