"""The ``anarchon`` command: ``demo``, ``status``, and the control verbs.

``status`` (here, and ``celery anarchon status``) exits with
:data:`EXIT_OK` when it showed jobs, :data:`EXIT_EMPTY` when the store was
reached but knows no job in the namespace (none recorded, stored or declared
by a live instance), :data:`EXIT_CONFIG` for a bad URL
or a missing driver, and :data:`EXIT_UNREACHABLE` when the store cannot be
reached or refuses the connection (credentials, TLS, a missing database).

The control verbs (``jobs``, ``pause``, ``resume``, ``trigger``, ``backfill``,
``history``, ``next``, ``add``, ``change``, ``remove``, ``once``; the same in
``celery anarchon`` and ``dramatiq-anarchon``) exit with :data:`EXIT_OK`
when they changed (or showed) something, :data:`EXIT_EMPTY` when they
changed nothing (already paused, not paused, an unknown job, a run-now
request for a paused job, no slot to come), and the two
codes above for a bad URL (or a store that keeps no controls) and an
unreachable store.

``import`` (:func:`run_import`) copies the schedules of a ``beat_schedule``,
celery-redbeat or django-celery-beat into stored schedules, a dry run unless
``--apply``; it exits with :data:`EXIT_OK` when it created or changed
schedules (or would have), :data:`EXIT_EMPTY` when there was nothing to
create or change, :data:`EXIT_CONFIG` for bad arguments, a bad URL or a
source it cannot read, and :data:`EXIT_UNREACHABLE` when the store or the
source cannot be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .control import OPTIONS, Control, Definition, JobStatus, Records
from .declarations import DeclaredJobs
from .durations import parse_duration
from .errors import (
    AnarchonError,
    ConfigurationError,
    Conflict,
    JobPaused,
    StoreUnavailable,
    UnknownJob,
    is_bug,
)
from .handoff import stray_sends
from .once import who_asked
from .pauses import PauseReason
from .pauses import reasons as pause_reasons
from .schedules import NEVER, Bounded, Schedule, ended, from_ms, from_spec, zone_of
from .slots import record_job
from .store import (
    HISTORY,
    ControlStore,
    JobState,
    LeaseStore,
    RegistryStore,
    RunState,
    Store,
    holders,
)
from .urls import open_store, redact, scrub, secrets_in
from .version import __version__

if TYPE_CHECKING:
    from anarchon_celery.importing.plan import Source

T = TypeVar("T")

EXIT_OK = 0
EXIT_EMPTY = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3


def status(store: Store, out: TextIO) -> int:
    """Print, per job: its last slot, owner, attempt, state and lease time left, and its
    next slot once its schedule is known (declared by a live instance, or stored):
    ``ended`` past its end. Jobs declared or stored whose first slot has not come
    are listed too, with ``-`` for what they have not done yet.

    Returns how many jobs it showed.
    """
    records = Records.of(store)
    names = records.jobs
    control = Control(store)
    declared = control.declarations()
    defined = control.definitions() if isinstance(store, ControlStore) else {}
    every = sorted(set(names) | set(declared.jobs) | set(defined))
    if not every:
        if isinstance(store, LeaseStore):
            print(f"no jobs recorded in namespace {store.namespace!r}", file=out)
            if store.namespace == "default":
                # The usual reason: the jobs live in the namespace an integration chose.
                print(
                    "  the jobs may be in another namespace: --namespace NS (Celery's is the"
                    " app's name unless anarchon_namespace is set; Dramatiq's the middleware's"
                    " namespace; a Scheduler's its namespace=)",
                    file=out,
                )
        else:
            print(f"{type(store).__name__} records no jobs (it only takes claims)", file=out)
        if isinstance(store, RegistryStore):  # instances up before their first slot
            instances(store, {}, out, declared)
        return 0
    read = records.read(store, every)  # the lanes' records too: each run held is shown
    states = records.states(store, every, read)
    jobs = [
        JobStatus(name, states.get(name), False, defined.get(name), None, declared.jobs.get(name))
        for name in every
    ]
    limited = [job.job for job in jobs if job.limit is not None]
    if limited and isinstance(store, LeaseStore):  # the counts a limit is judged by
        counted = records.stats(store, limited)
        jobs = [replace(job, stats=counted.get(job.job)) for job in jobs]
    now = datetime.now(timezone.utc)
    nexts = {
        job.job: note if (note := job.limit_note()).startswith("limit reached")
        else next_slot(job.schedule(), now)
        for job in jobs
    }  # fmt: skip
    header = ("job", "last slot (UTC)", "owner", "attempt", "state", "lease left")
    shows_next = any(cell != "-" for cell in nexts.values())
    rows = [(*header, "next slot (UTC)") if shows_next else header]
    for job in jobs:
        state = job.state
        if state is None:
            row = (job.job, "-", "-", "-", "-", "-")
        else:
            slot = from_ms(state.slot_ms).strftime("%Y-%m-%d %H:%M:%S")
            lease = "-"
            if state.state is RunState.RUNNING:
                lease = f"{state.lease_remaining:.1f}s" if state.lease_remaining > 0 else "lapsed"
            row = (job.job, slot, state.owner, str(state.attempt), state.state.value, lease)
        rows.append((*row, nexts[job.job]) if shows_next else row)
    _table(rows, out)
    reasons(pause_reasons(store), out)
    limits(jobs, out)
    disagreements(declared, out)
    if isinstance(store, RegistryStore):
        instances(store, read, out, declared)
    strays(store, out)
    return len(rows) - 1


def reasons(why: dict[str, PauseReason], out: TextIO) -> None:
    """Print why each job paused by anarchon itself was paused (``pause_on_failure``)."""
    for job, reason in sorted(why.items()):
        by = f" by {reason.by}" if reason.by else ""
        print(f"paused: {job}: {reason.reason}{by} at {_when(reason.at)} UTC", file=out)


def limits(jobs: Sequence[JobStatus], out: TextIO) -> None:
    """Print the run limit of each job that has one: how many of its slots have run."""
    for job in jobs:
        note = job.limit_note()
        if note:
            print(f"limit: {job.job}: {note}", file=out)


def next_slot(schedule: Schedule | None, now: datetime) -> str:
    """A job's next slot as the tables show it: its UTC time, ``ended`` past its end,
    ``-`` when its schedule is not known."""
    if schedule is None:
        return "-"
    if ended(schedule, now):
        return "ended"
    nxt = schedule.next_after(now)
    return "ended" if nxt == NEVER else nxt.strftime("%Y-%m-%d %H:%M:%S")


def disagreements(declared: DeclaredJobs, out: TextIO) -> None:
    """Print the jobs the live instances declare with different schedules (a deploy under way)."""
    for job in declared.jobs.values():
        if len(job.forms) > 1:
            said = "; ".join(f"{_written(spec)} ({n} instance(s))" for spec, n in job.forms)
            print(f"instances disagree on the schedule of {job.job!r}: {said}", file=out)


def _written(spec: Any) -> str:
    """A schedule's written form, as a person reads it."""
    if spec is None:
        return "a schedule that cannot be written down"
    try:
        return from_spec(spec).describe()
    except AnarchonError:
        return json.dumps(spec, sort_keys=True)


def strays(store: Store, out: TextIO) -> None:
    """Print the jobs whose work a scheduler that is not anarchon's also sent, if any.

    The workers count them (:func:`anarchon_core.handoff.note_stray`): a
    stock Celery beat left running sends every slot a second time.
    """
    found = stray_sends(store)
    if not found:
        return
    print(
        f"\n{len(found)} job(s) also sent by a scheduler that is not anarchon's"
        " (a stock beat still running?)",
        file=out,
    )
    rows: list[Sequence[str]] = [("job", "sends", "last (UTC)", "from")]
    for sent in found:
        rows.append((sent.job, str(sent.count), _when(sent.last_at), sent.sender or "-"))
    _table(rows, out)


def instances(
    store: Store,
    states: dict[str, JobState],
    out: TextIO,
    declared: DeclaredJobs | None = None,
) -> None:
    """Print the live instances of the store's registry, and the runs each holds; and
    those that say nothing of the jobs they declare (``declared.silent``)."""
    live = sorted(store.instances(), key=lambda r: r.instance)
    # By record: an instance holding runs in the lanes of an allow_all job holds that job.
    holds = {
        owner: sorted({record_job(name) for name in names})
        for owner, names in holders(states).items()
    }
    print(f"\n{len(live)} live instance(s)", file=out)
    if not live:
        return
    rows: list[Sequence[str]] = [
        ("instance", "host", "pid", "version", "jobs", "seen", "behind", "holds")
    ]
    for r in live:
        info = r.info
        row = (r.instance, str(info.get("host", "-")), str(info.get("pid", "-")),
               str(info.get("version", "-")), str(info.get("jobs", "-")), f"{r.age:.1f}s ago",
               behind(info), ", ".join(holds.get(r.instance, [])) or "-")  # fmt: skip
        rows.append(row)
    _table(rows, out)
    silent(declared, out)


def silent(declared: DeclaredJobs | None, out: TextIO) -> None:
    """Say which live instances do not say which jobs they declare, if any."""
    if declared is not None and declared.silent:
        print(
            f"{len(declared.silent)} live instance(s) do not say which jobs they declare"
            f" ({', '.join(declared.silent)}: an older anarchon, or just started): their"
            " jobs show once recorded or stored",
            file=out,
        )


def behind(info: dict[str, Any]) -> str:
    """How far behind an instance said it runs, and the claims it deferred: "-" if on time."""
    late, deferred = info.get("behind"), info.get("deferred")
    if not late and not deferred:
        return "-"
    return f"{float(late or 0):.1f}s, {int(deferred or 0)} claims deferred"


def _opened(open_it: Callable[[], T], url: str, err: TextIO, prog: str) -> T | int:
    """``open_it()``, or the exit code once its error is said: a bad URL or a missing
    driver, or a store that connects when opened (SQLite) and cannot."""
    try:
        return open_it()
    except StoreUnavailable as exc:
        print(f"{prog}: cannot reach the store {redact(url)}: {exc}", file=err)
        return EXIT_UNREACHABLE
    except AnarchonError as exc:
        print(f"{prog}: {exc}", file=err)
        return EXIT_CONFIG


def _store_error(exc: Exception, url: str, err: TextIO, prog: str) -> int:
    """Say that the store at ``url`` could not be reached or answered an error, scrubbed
    of the URL's secrets; :data:`EXIT_UNREACHABLE`."""
    said = str(exc) or type(exc).__name__
    for secret in secrets_in(url):
        said = scrub(said, secret)
    reason = "cannot reach" if isinstance(exc, StoreUnavailable) else "error from"
    print(f"{prog}: {reason} the store {redact(url)}: {said}", file=err)
    return EXIT_UNREACHABLE


def run_status(
    url: str,
    namespace: str,
    out: TextIO,
    err: TextIO,
    *,
    prog: str,
    list_namespaces: bool = False,
) -> int:
    """Open ``url``, reach it, print the status of ``namespace``; return the exit code.

    With ``list_namespaces`` (no namespace was asked for), the namespaces the
    store holds are named first. Every message names the store by its
    redacted URL; a driver's message is scrubbed of the URL's secrets.
    """
    store = _opened(lambda: open_store(url, namespace=namespace), url, err, prog)
    if isinstance(store, int):
        return store
    try:
        store.ping()
        print(
            f"store {redact(url)}  namespace {namespace}  "
            f"at {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
            file=out,
        )
        if list_namespaces and isinstance(store, LeaseStore):
            found = store.namespaces()
            print(
                f"namespaces in this store: {', '.join(found) or 'none recorded yet'}"
                "  (--namespace NS shows another)",
                file=out,
            )
        shown = status(store, out)
    except Exception as exc:  # unreachable, refused, or an error the server answered
        return _store_error(exc, url, err, prog)
    finally:
        with contextlib.suppress(Exception):  # the outcome above is what is reported
            store.close()
    return EXIT_OK if shown else EXIT_EMPTY


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def control_verb(args: argparse.Namespace, control: Control, out: TextIO) -> int:
    """Run one control verb (``args.verb``) on ``control``; the exit code.

    Each prints what it changed, or why it changed nothing.
    """
    namespace = control.store.namespace
    verb = args.verb
    if verb == "jobs":
        paused = control.paused()
        declared = control.declarations()
        jobs = control.listing(paused=paused, declared=declared)[0]
        if paused.namespace:
            print(f"namespace {namespace!r} is paused: no job's slot starts", file=out)
        if not jobs:
            print(f"no jobs recorded in namespace {namespace!r}", file=out)
            silent(declared, out)
            return EXIT_EMPTY
        now = datetime.now(timezone.utc)
        nexts = [
            note if (note := job.limit_note()).startswith("limit reached")
            else next_slot(job.schedule(), now)
            for job in jobs
        ]  # fmt: skip
        why = pause_reasons(control.store)
        shows_next = any(cell != "-" for cell in nexts)
        rows: list[tuple[str, ...]] = [
            ("job", "paused", "last slot (UTC)", "owner", "attempt", "state", "runs",
             "takeovers", "last success", "last failure")
        ]  # fmt: skip
        for job in jobs:
            flag = "yes" if job.paused else "namespace" if paused.namespace else "no"
            if job.paused and job.job in why:
                flag = "on failure"
            st, n = job.state, job.stats
            counts = ("-", "-", "-", "-")
            if n is not None:
                counts = (str(n.runs), str(n.takeovers), _when(n.last_success),
                          _when(n.last_failure))  # fmt: skip
            if st is None:
                rows.append((job.job, flag, "-", "-", "-", "-", *counts))
            else:
                slot = from_ms(st.slot_ms).strftime("%Y-%m-%d %H:%M:%S")
                row = (job.job, flag, slot, st.owner, str(st.attempt), st.state.value)
                rows.append((*row, *counts))
        if shows_next:  # a column of its own once a schedule is known
            rows = [
                (*row, cell) for row, cell in zip(rows, ["next slot (UTC)", *nexts], strict=True)
            ]
        _table(rows, out)
        reasons(why, out)
        limits(jobs, out)
        disagreements(declared, out)
        silent(declared, out)
        for job in jobs:
            if job.defined is not None:
                d = job.defined
                print(f"stored schedule: {job.job} v{d.version} {d.describe()}", file=out)
        for _, slot_id in control.pending():
            print(f"run-now request waiting: {slot_id}", file=out)
        for job_name, start, end in control.backfills():
            print(f"backfill waiting or running: {job_name} {start:%Y-%m-%d %H:%M:%S}"
                  f" to {end:%Y-%m-%d %H:%M:%S}", file=out)  # fmt: skip
        return EXIT_OK
    if verb in ("add", "change"):
        fields = _definition_fields(args)
        if verb == "add":
            if fields.get("handler") is None:
                raise ConfigurationError("add: --handler names the code the job runs")
            added = control.add(Definition(name=args.job, **fields))
            print(f"added job {args.job!r} v{added.version}: {added.describe()}", file=out)
            return EXIT_OK
        if not fields:
            raise ConfigurationError("change: name at least one field to change")
        before, after = control.change(args.job, args.version, **fields)
        print(
            f"changed job {args.job!r} v{before.version} -> v{after.version}:"
            f" {before.describe()} => {after.describe()}",
            file=out,
        )
        return EXIT_OK
    if verb == "remove":
        gone = control.remove(args.job, args.version)
        print(f"removed job {args.job!r} v{gone.version}: {gone.describe()}", file=out)
        return EXIT_OK
    if verb == "backfill":
        control.backfill(args.job, args.start, args.end, unrecorded=args.unrecorded)
        print(
            f"asked to run each slot of {args.job!r} from {args.start:%Y-%m-%d %H:%M:%S}"
            f" to {args.end:%Y-%m-%d %H:%M:%S} UTC (excluded), in order, once each",
            file=out,
        )
        return EXIT_OK
    if verb == "next":
        return _next_slots(args, control, out)
    if verb == "once":
        return _once(args, control, out)
    if verb == "trigger":
        slot_id = control.trigger(args.job, unrecorded=args.unrecorded)
        print(f"asked to run {slot_id} now: the first instance that claims it runs it", file=out)
        return EXIT_OK
    if verb == "history":
        runs = control.history(args.job, args.limit)
        filled = control.backfill_history(args.job, args.limit)
        backfilled = {(run.slot_ms, run.token) for run in filled}
        runs = sorted(runs + filled, key=lambda r: r.started_at, reverse=True)[: args.limit]
        if not runs:
            print(f"no run of {args.job!r} recorded", file=out)
            return EXIT_EMPTY
        manual = control.manual(args.job)
        table: list[tuple[str, ...]] = [
            ("slot (UTC)", "how", "attempt", "token", "owner", "state", "started", "ended")
        ]
        for run in runs:
            slot = from_ms(run.slot_ms).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
            how = "manual" if run.slot_ms in manual else "scheduled"
            if (run.slot_ms, run.token) in backfilled:
                how = "backfill"
            table.append(
                (slot, how, str(run.attempt), str(run.token), run.owner, run.state.value,
                 _when(run.started_at), _when(run.ended_at))
            )  # fmt: skip
        _table(table, out)
        return EXIT_OK
    targets: list[str | None] = [None] if args.all else list(args.jobs)
    if verb == "pause" and not args.unrecorded:
        # Every name is checked before any is paused: all or nothing.
        unknown = [job for job in args.jobs if not control.known(job)]
        if unknown:
            names = ", ".join(map(repr, unknown))
            raise UnknownJob(
                f"no job named {names} is recorded, stored or declared by a live instance"
                f" in namespace {namespace!r}"
            )
    changed = 0
    for target in targets:
        what = f"namespace {namespace!r}" if target is None else f"job {target!r}"
        if verb == "pause":
            done = control.pause(target, unrecorded=args.unrecorded)
            print(f"paused {what}" if done else f"{what} was paused already", file=out)
        else:
            done = control.resume(target, catch_up=args.catch_up)
            print(f"resumed {what}" if done else f"{what} was not paused", file=out)
        changed += done
    return EXIT_OK if changed else EXIT_EMPTY


def _next_slots(args: argparse.Namespace, control: Control, out: TextIO) -> int:
    """``next JOB [-n N]``: the job's next slots in its time zone and in UTC, DST gaps
    and folds marked; :data:`EXIT_EMPTY` if it has ended."""
    now = datetime.now(timezone.utc)
    upcoming, schedule, source = control.next_slots(args.job, args.n, now)
    zone = zone_of(schedule)
    print(f"{args.job}: {schedule.describe()} ({source})", file=out)
    if not upcoming:
        end = schedule.end if isinstance(schedule, Bounded) else None
        when = f" at {end.isoformat()}" if end is not None else ""
        print(f"no slot to come: {args.job!r} ended{when}", file=out)
        return EXIT_EMPTY
    # In the job's zone and in UTC: one column when they are the same.
    local = zone != "UTC"
    rows: list[tuple[str, ...]] = [(*([f"slot ({zone})"] if local else []), "slot (UTC)", "note")]
    for slot in upcoming:
        wall = [slot.local.strftime("%Y-%m-%d %H:%M:%S %Z %z")] if local else []
        rows.append((*wall, slot.slot.strftime("%Y-%m-%d %H:%M:%S"), slot.note or "-"))
    _table(rows, out)
    if len(upcoming) < args.n:
        print(f"no slot after these: {args.job!r} ends then", file=out)
    return EXIT_OK


def _once_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``once``: ``JOB --at TIME``, ``--cancel``, or ``--pending [JOB]``."""
    parser.add_argument("job", metavar="JOB", nargs="?")
    parser.add_argument(
        "--at", type=moment, metavar="TIME", help="when: ISO 8601 (UTC if no offset)"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--cancel", action="store_true", help="remove the one-off at --at")
    what.add_argument(
        "--pending", action="store_true", help="list the one-offs not yet run (of JOB, or all)"
    )
    parser.add_argument(
        "--unrecorded", action="store_true", help="a job the store has no record of yet"
    )


def _once(args: argparse.Namespace, control: Control, out: TextIO) -> int:
    """``once JOB --at TIME`` (``--cancel``), or ``once --pending [JOB]``."""
    if args.pending:
        pending = control.pending_once(args.job, MAX_NEXT)
        if not pending:
            print("no one-off waiting" + (f" for {args.job!r}" if args.job else ""), file=out)
            return EXIT_EMPTY
        rows = [("slot (UTC)", "job", "asked by")]
        for entry in pending:
            when = from_ms(entry.due_ms).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
            rows.append((when, entry.job, who_asked(entry.value)))
        _table(rows, out)
        return EXIT_OK
    if args.job is None or args.at is None:
        raise ConfigurationError("once: name the job and give --at TIME (or --pending)")
    when = f"{args.at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    if args.cancel:
        if control.cancel_once(args.job, args.at):
            print(f"cancelled the one-off of {args.job!r} at {when}", file=out)
            return EXIT_OK
        print(f"no one-off of {args.job!r} waiting at {when}", file=out)
        return EXIT_EMPTY
    slot_id = control.once(args.job, args.at, unrecorded=args.unrecorded)
    print(f"asked to run {slot_id} once at {when}: the first instance that claims it runs it",
          file=out)  # fmt: skip
    return EXIT_OK


def moment(text: str) -> datetime:
    """A command line's time: ISO 8601, UTC unless it says otherwise."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        example = "2026-12-01T10:00:00Z"
        raise argparse.ArgumentTypeError(f"{text!r}: expected ISO 8601, e.g. {example}") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _json_argument(what: str, text: str | None, kind: type) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"--{what}: not JSON: {exc}") from None
    if not isinstance(value, kind):
        raise ConfigurationError(f"--{what}: expected a JSON {kind.__name__}")
    return value


def _definition_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The fields of a stored schedule given on the command line (those given only)."""
    fields: dict[str, Any] = {
        "handler": args.handler,
        "every": args.every,
        "cron": args.cron,
        "timezone": args.timezone,
        "anchor": args.anchor,
        "args": _json_argument("args", args.args, list),
        "kwargs": _json_argument("kwargs", args.kwargs, dict),
        "options": _json_argument("options", args.options, dict),
    }
    given = {k: v for k, v in fields.items() if v is not None}
    if "args" in given:
        given["args"] = tuple(given["args"])
    options = {name: getattr(args, name) for name in OPTIONS if getattr(args, name) is not None}
    if options:
        given["job_options"] = options
    rules: dict[str, Any] = {}
    if args.overlap is not None:
        rules["overlap"] = args.overlap
    if args.limit is not None:
        rules["limit"] = _limit(args.limit)
    if args.pause_on_failure is not None:
        rules["pause_on_failure"] = args.pause_on_failure == "true"
    if rules:
        given["rules"] = rules
    for bound in ("start", "end"):
        text = getattr(args, bound, None)
        if text is None:
            continue
        text = text.strip()
        if text.lower() == CLEAR:
            if args.verb == "change":
                given[bound] = None  # cleared: the stored schedule no longer has one
            continue
        # ISO 8601's "Z" for UTC, read alike by every Python version.
        given[bound] = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
    return given


#: The value of ``--start`` and ``--end`` that clears a stored schedule's bound (``change``).
CLEAR = "none"


def _limit(text: str) -> int | None:
    """``--limit``: a whole number of slots, or ``none`` (no limit)."""
    if text.strip().lower() == CLEAR:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(
            f"--limit {text!r}: a whole number of slots, or {CLEAR!r} for no limit"
        ) from None


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help="store URL, e.g. redis://host")
    parser.add_argument("--namespace", default="default")


def add_control_verbs(
    commands: Any,
    *,
    store_option: bool,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Add the control verbs (:data:`CONTROL_VERBS`) to an argparse subparsers object.

    With ``store_option``, each takes ``--store`` and ``--namespace`` (the
    ``anarchon`` command); otherwise the caller knows its store, and adds
    its own arguments to each verb with ``extra``.
    """

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(
            name, help=help, description=help + ". " + _EXITS
        )
        parser.set_defaults(verb=name)
        if store_option:
            _store_arguments(parser)
        if extra is not None:
            extra(parser)
        return parser

    verb(
        "jobs",
        "every job recorded, stored or declared by a live instance: paused or not, its last"
        " slot and run, its next slot",
    )
    for name, what in (("pause", "pause"), ("resume", "resume")):
        parser = verb(name, f"{what} jobs by name, or the whole namespace with --all")
        parser.add_argument("jobs", nargs="*", metavar="JOB")
        parser.add_argument("--all", action="store_true", help=f"{what} the whole namespace")
        if name == "resume":
            parser.add_argument(
                "--catch-up",
                action="store_true",
                help="run the most recent slot missed while paused, if within its catch-up window",
            )
        if name == "pause":
            parser.add_argument(
                "--unrecorded",
                action="store_true",
                help="pause a job the store has no record of yet (before its first slot)",
            )
    for name, what in (
        ("add", "store a new job's schedule: every instance runs it within a second"),
        ("change", "change a stored schedule (compare-and-set: --version as read)"),
    ):
        parser = verb(name, what)
        parser.add_argument("job", metavar="JOB")
        parser.add_argument("--handler", help="the code it runs: a handler, task or actor name")
        parser.add_argument("--every", type=float, help="seconds between slots")
        parser.add_argument("--cron", help="a cron expression")
        parser.add_argument("--timezone", help="the cron expression's timezone (default UTC)")
        parser.add_argument("--anchor", type=float, help="every= grid anchor, Unix seconds")
        for bound, what in (("start", "no slot before"), ("end", "no slot after")):
            parser.add_argument(
                "--" + bound,
                metavar="TIME",
                help=f"{what} this time, included: ISO 8601 with its offset, e.g."
                " 2027-01-01T00:00:00+00:00"
                + (f" ({CLEAR!r} clears it)" if name == "change" else ""),
            )
        parser.add_argument("--args", help="a JSON list of positional arguments")
        parser.add_argument("--kwargs", help="a JSON object of keyword arguments")
        parser.add_argument("--options", help="a JSON object: Celery/Dramatiq send options")
        for option in OPTIONS:
            parser.add_argument("--" + option.replace("_", "-"), type=float, metavar="SECONDS")
        parser.add_argument(
            "--overlap",
            metavar="POLICY",
            help="skip (the default), buffer_one, buffer_all, cancel_other or allow_all",
        )
        parser.add_argument(
            "--limit", metavar="N", help=f"the slots it runs in all ({CLEAR!r}: no limit)"
        )
        parser.add_argument(
            "--pause-on-failure",
            choices=("true", "false"),
            help="pause the job on every instance after a run ends failed",
        )
        if name == "change":
            parser.add_argument("--version", type=int, help="fail unless the stored one is this")
    parser = verb("remove", "remove a stored schedule: every instance stops it within a second")
    parser.add_argument("job", metavar="JOB")
    parser.add_argument("--version", type=int, help="fail unless the stored one is this")
    parser = verb("backfill", "run each slot of a past range once, in order, one at a time")
    parser.add_argument("job", metavar="JOB")
    parser.add_argument(
        "--from",
        dest="start",
        required=True,
        type=moment,
        metavar="TIME",
        help="the range's start, included: ISO 8601 (UTC if no offset)",
    )
    parser.add_argument("--to", dest="end", required=True, type=moment, metavar="TIME",
                        help="the range's end, excluded")  # fmt: skip
    parser.add_argument(
        "--unrecorded", action="store_true", help="a job the store has no record of yet"
    )
    parser = verb("trigger", "run a job once now, as a slot of its own, on one instance")
    parser.add_argument("job", metavar="JOB")
    parser.add_argument(
        "--unrecorded", action="store_true", help="a job the store has no record of yet"
    )
    _once_arguments(verb("once", "run a job once at a given time, on one instance"))
    parser = verb("history", "the most recent attempts of a job, newest first")
    parser.add_argument("job", metavar="JOB")
    parser.add_argument("--limit", type=int, default=20, help="attempts to show (default 20)")
    parser = verb(
        "next",
        "the next slots of a job, in its time zone and in UTC, DST gaps and folds marked"
        " (its schedule as the live instances declare it, or as stored)",
    )
    parser.add_argument("job", metavar="JOB")
    parser.add_argument(
        "-n", type=int, default=10, help=f"slots to show (default 10, at most {MAX_NEXT})"
    )


def check_control_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse contradictory control arguments early, naming them."""
    if args.verb in ("pause", "resume") and bool(args.jobs) == bool(args.all):
        parser.error(f"{args.verb}: name the jobs, or give --all for the whole namespace")
    if args.verb == "history" and not 1 <= args.limit <= HISTORY:
        parser.error(f"history: --limit {args.limit}: 1 to {HISTORY}")
    if args.verb == "next" and not 1 <= args.n <= MAX_NEXT:
        parser.error(f"next: -n {args.n}: 1 to {MAX_NEXT}")


def run_control(
    args: argparse.Namespace, url: str, namespace: str, out: TextIO, err: TextIO, *, prog: str
) -> int:
    """Open ``url`` and run the control verb of ``args``; the exit code (see the module)."""
    control = _opened(lambda: Control(url, namespace=namespace), url, err, prog)
    if isinstance(control, int):
        return control
    try:
        return control_verb(args, control, out)
    except (UnknownJob, JobPaused, Conflict) as exc:
        print(f"{prog}: {exc}", file=err)
        return EXIT_EMPTY
    except ConfigurationError as exc:
        print(f"{prog}: {exc}", file=err)
        return EXIT_CONFIG
    except Exception as exc:
        return _store_error(exc, url, err, prog)
    finally:
        with contextlib.suppress(Exception):
            control.close()


#: The control verbs, as the commands name them.
CONTROL_VERBS = (
    "jobs", "pause", "resume", "trigger", "backfill", "history", "next", "add", "change",
    "remove", "once"
)  # fmt: skip
#: The most slots ``next`` shows.
MAX_NEXT = 1000

_EXITS = (
    "Exit status: 0 changed or shown, 1 nothing changed (already so, or an unknown job),"
    " 2 bad URL or a store without controls, 3 the store cannot be reached."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="anarchon", description="Scheduled jobs that run once per slot across instances."
    )
    parser.add_argument("--version", action="version", version=f"anarchon {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="several local instances sharing one SQLite file, with a takeover"
    )
    demo.add_argument("--instances", type=int, default=3, help="instances to start (default 3)")
    demo.add_argument("--interval", type=float, default=2.0, help="seconds between slots")
    demo.add_argument("--duration", type=float, default=30.0, help="seconds the demo runs")
    show = commands.add_parser(
        "status",
        help="jobs, slots and leases recorded in a store",
        description="Exit status: 0 jobs shown, 1 none recorded, stored or declared by a live"
        " instance in the namespace, 2 bad URL"
        " or missing driver, 3 the store cannot be reached or refused the connection.",
    )
    show.add_argument("--store", required=True, help="store URL, e.g. sqlite:///jobs.db")
    show.add_argument(
        "--namespace", help="the namespace to show (default: 'default', after a list of all)"
    )
    probe = commands.add_parser(
        "check",
        help="health probe: the store answers, this host's instance steps, jobs succeed",
        description="Exit status: 0 every check passed, 1 a check failed (the store does not"
        " answer, no instance of this host recorded itself lately, a job overdue), 2 bad"
        " arguments or URL.",
    )
    _store_arguments(probe)
    probe.add_argument("--job", action="append", default=[], metavar="NAME",
                       help="a job whose last success must be recent (repeatable)")  # fmt: skip
    probe.add_argument(
        "--max-late",
        type=_duration_argument("--max-late"),
        metavar="DURATION",
        help="how old a job's last success may be (default: twice its interval)",
    )
    probe.add_argument(
        "--fail-behind",
        type=_duration_argument("--fail-behind"),
        metavar="DURATION",
        help="fail while the instance's own renewals and finishes run later than this"
        " (it defers its claims then); default: never",
    )
    who = probe.add_mutually_exclusive_group()
    who.add_argument("--instance", help="the instance to look for (default: any on this host)")
    who.add_argument(
        "--no-loop", action="store_true", help="skip the loop check (a probe off the pods)"
    )
    board = commands.add_parser(
        "dashboard",
        help="serve a live dashboard of a namespace (read-only without an action token)",
        description="Serves the dashboard until interrupted. Actions (pause, resume, run now)"
        " need a token of 16 characters or more, read from the ANARCHON_DASHBOARD_TOKEN"
        " environment variable or --token-file, never from the command line.",
    )
    _store_arguments(board)
    board.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    board.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    board.add_argument("--token-file", help="a file holding the action token")
    add_control_verbs(commands, store_option=True)
    _import_arguments(commands)
    args = parser.parse_args(argv)
    if getattr(args, "verb", None):
        check_control_args(parser, args)
        return run_control(
            args, args.store, args.namespace, sys.stdout, sys.stderr, prog="anarchon"
        )

    if args.command == "demo":
        from .tools.demo import run_demo

        if args.instances < 2:
            parser.error("--instances: at least 2, or there is nobody to take over")
        if args.interval < 1:
            parser.error("--interval: at least 1 second")
        return run_demo(
            instances=args.instances,
            interval=args.interval,
            duration=args.duration,
            out=sys.stdout,
        )
    if args.command == "check":
        return run_check(args, sys.stdout, sys.stderr)
    if args.command == "import":
        if args.timezone is not None and not (args.beat_schedule or args.redbeat):
            parser.error("import: --timezone is for --beat-schedule and --redbeat (a"
                         " django-celery-beat crontab row has a time zone of its own)")  # fmt: skip
        if args.redbeat_prefix is not None and not args.redbeat:
            parser.error("import: --redbeat-prefix is for --redbeat")
        return run_import(args, sys.stdout, sys.stderr)
    if args.command == "dashboard":
        return run_dashboard(args, sys.stderr)
    return run_status(
        args.store,
        args.namespace or "default",
        sys.stdout,
        sys.stderr,
        prog="anarchon",
        list_namespaces=args.namespace is None,
    )


def _duration_argument(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return parse_duration(name, text)
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def run_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``anarchon check``: print each finding; 0 all passed, 1 one failed, 2 bad usage."""
    from .check import check

    store = _opened(lambda: open_store(args.store, namespace=args.namespace), args.store, err,
                    "anarchon check")  # fmt: skip
    if isinstance(store, int):
        return EXIT_CONFIG if store == EXIT_CONFIG else EXIT_EMPTY
    host = None if args.no_loop or args.instance else socket.gethostname()
    try:
        findings = check(
            store,
            time.time(),
            host=host,
            instance=args.instance,
            jobs=tuple(args.job),
            max_late=args.max_late,
            fail_behind=args.fail_behind,
        )
    except Exception as exc:  # the store does not answer (or answered an error)
        said = str(exc) or type(exc).__name__
        for secret in secrets_in(args.store):
            said = scrub(said, secret)
        print(f"FAIL  store: {redact(args.store)}: {said}", file=out)
        return EXIT_EMPTY
    finally:
        with contextlib.suppress(Exception):
            store.close()
    for finding in findings:
        print(finding, file=out)
    return EXIT_OK if all(f.ok for f in findings) else EXIT_EMPTY


def _import_arguments(commands: Any) -> None:
    """Add ``import`` and its arguments to the ``anarchon`` command's subparsers."""
    parser = commands.add_parser(
        "import",
        help="copy the schedules of a beat_schedule, celery-redbeat or django-celery-beat"
        " into stored schedules (a dry run unless --apply)",
        description="Prints, for each entry of the source, whether it creates, changes or"
        " skips (and why) a stored schedule of the same name; writes only with --apply."
        " Exit status: 0 created or changed (in a dry run: would create or change) a"
        " schedule, 1 nothing to create or change, 2 bad arguments, URL or source,"
        " 3 the store or the source cannot be reached.",
    )
    _store_arguments(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    for flag, metavar, what in (
        ("--beat-schedule", "MODULE:ATTRIBUTE",
         "a beat_schedule dict, or a Celery app (its conf.beat_schedule)"),
        ("--redbeat", "URL", "celery-redbeat's Redis, e.g. redis://host:6379/0"),
        ("--django-db", "URL", "django-celery-beat's database: postgresql://... or mysql://..."),
        ("--django-settings", "MODULE",
         "django-celery-beat's models, through Django with this settings module"),
    ):  # fmt: skip
        source.add_argument(flag, metavar=metavar, help=what)
    parser.add_argument(
        "--redbeat-prefix", metavar="PREFIX", help="redbeat's redbeat_key_prefix (default redbeat:)"
    )
    parser.add_argument(
        "--timezone",
        type=_zone_argument,
        help="the time zone of crontab entries of --beat-schedule and --redbeat (the app's"
        " timezone setting; default: a Celery app's own, else UTC)",
    )
    parser.add_argument(
        "--apply", action="store_true", help="write the changes (without it: print, write nothing)"
    )


def _zone_argument(text: str) -> str:
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: not an IANA time zone ({exc})") from None
    return text


def run_import(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``anarchon import``: read the source, then print (and with ``--apply``, write) the
    stored schedules it makes; the exit code (see the module)."""
    prog = "anarchon import"
    if (args.beat_schedule or args.django_settings) and os.getcwd() not in sys.path:
        # The modules named are the project's, imported as `celery -A` does: from here.
        sys.path.insert(0, os.getcwd())
    try:
        from anarchon_celery.importing.plan import run

        source = _import_source(args, datetime.now(timezone.utc))
    except StoreUnavailable as exc:
        print(f"{prog}: cannot reach {exc}", file=err)
        return EXIT_UNREACHABLE
    except AnarchonError as exc:  # a bad source, or its missing driver
        print(f"{prog}: {exc}", file=err)
        return EXIT_CONFIG
    except ImportError as exc:
        print(f"{prog}: needs Celery: pip install 'anarchon[celery]' ({exc})", file=err)
        return EXIT_CONFIG
    control = _opened(lambda: Control(args.store, namespace=args.namespace), args.store, err,
                      prog)  # fmt: skip
    if isinstance(control, int):
        return control
    try:
        written = run(source, control, apply=args.apply, out=out, store=redact(args.store))
    except ConfigurationError as exc:  # a store that keeps no controls
        print(f"{prog}: {exc}", file=err)
        return EXIT_CONFIG
    except Exception as exc:
        if is_bug(exc):
            raise
        return _store_error(exc, args.store, err, prog)
    finally:
        with contextlib.suppress(Exception):
            control.close()
    return EXIT_OK if written else EXIT_EMPTY


def _import_source(args: argparse.Namespace, now: datetime) -> Source:
    """The source ``args`` names, read."""
    if args.beat_schedule:
        from anarchon_celery.importing.beat import read_beat_schedule

        return read_beat_schedule(args.beat_schedule, args.timezone)
    if args.redbeat:
        from anarchon_celery.importing.redbeat import PREFIX, read_redbeat

        return read_redbeat(args.redbeat, args.redbeat_prefix or PREFIX, args.timezone or "UTC")
    from anarchon_celery.importing.djangobeat import read_models, read_tables

    if args.django_db:
        return read_tables(args.django_db, now)
    return read_models(args.django_settings, now)


def run_dashboard(args: argparse.Namespace, err: TextIO) -> int:
    """``anarchon dashboard``: serve until interrupted; 2 for bad arguments."""
    from .dashboard import Dashboard, serve

    token = os.environ.get("ANARCHON_DASHBOARD_TOKEN") or None
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as handle:
                token = handle.read().strip() or None
        except OSError as exc:
            print(f"anarchon dashboard: --token-file: {exc.strerror}", file=err)
            return EXIT_CONFIG
    app = _opened(
        lambda: Dashboard(args.store, namespace=args.namespace, action_token=token),
        args.store,
        err,
        "anarchon dashboard",
    )
    if isinstance(app, int):
        return app
    mode = "actions on" if token else "read-only"
    print(f"anarchon dashboard: http://{args.host}:{args.port}/ ({mode})", file=err, flush=True)
    try:
        serve(app, args.host, args.port)
    except OSError as exc:
        print(f"anarchon dashboard: cannot serve on {args.host}:{args.port}: {exc.strerror}",
              file=err)  # fmt: skip
        return EXIT_CONFIG
    except AnarchonError as exc:
        print(f"anarchon dashboard: {exc}", file=err)
        return EXIT_CONFIG
    finally:
        app.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
