"""The ``anarchon`` command: ``anarchon demo`` and ``anarchon status``.

``status`` (here, and ``celery anarchon status``) exits with
:data:`EXIT_OK` when it showed jobs, :data:`EXIT_EMPTY` when the store was
reached but holds no job in the namespace, :data:`EXIT_CONFIG` for a bad URL
or a missing driver, and :data:`EXIT_UNREACHABLE` when the store cannot be
reached or refuses the connection (credentials, TLS, a missing database).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from datetime import datetime, timezone
from typing import TextIO

from .errors import AnarchonError, StoreUnavailable
from .schedules import from_ms
from .store import RunState, Store
from .urls import open_store, redact, scrub, secrets_in

EXIT_OK = 0
EXIT_EMPTY = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3


def status(store: Store, out: TextIO) -> int:
    """Print, per job: its last slot, owner, attempt, state and lease time left.

    Returns how many jobs it showed.
    """
    names = store.jobs()
    if not names:
        if store.supports_lease:
            print(f"no jobs recorded in namespace {store.namespace!r}", file=out)
        else:
            print(f"{type(store).__name__} records no jobs (it only takes claims)", file=out)
        return 0
    states = store.states(names)
    header = ("job", "last slot (UTC)", "owner", "attempt", "state", "lease left")
    rows = [header]
    for name in names:
        state = states.get(name)
        if state is None:
            continue
        slot = from_ms(state.slot_ms).strftime("%Y-%m-%d %H:%M:%S")
        lease = "-"
        if state.state is RunState.RUNNING:
            lease = f"{state.lease_remaining:.1f}s" if state.lease_remaining > 0 else "lapsed"
        row = (name, slot, state.owner, str(state.attempt), state.state.value, lease)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out
        )
    return len(rows) - 1


def run_status(url: str, namespace: str, out: TextIO, err: TextIO, *, prog: str) -> int:
    """Open ``url``, reach it, print the status of ``namespace``; return the exit code.

    Every message names the store by its redacted URL; a driver's message is
    scrubbed of the URL's secrets.
    """
    try:
        store = open_store(url, namespace=namespace)
    except StoreUnavailable as exc:  # a store that connects when opened (SQLite)
        print(f"{prog}: cannot reach the store {redact(url)}: {exc}", file=err)
        return EXIT_UNREACHABLE
    except AnarchonError as exc:
        print(f"{prog}: {exc}", file=err)
        return EXIT_CONFIG
    try:
        store.ping()
        print(
            f"store {redact(url)}  namespace {namespace}  "
            f"at {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
            file=out,
        )
        shown = status(store, out)
    except Exception as exc:  # unreachable, refused, or an error the server answered
        said = str(exc) or type(exc).__name__
        for secret in secrets_in(url):
            said = scrub(said, secret)
        reason = "cannot reach" if isinstance(exc, StoreUnavailable) else "error from"
        print(f"{prog}: {reason} the store {redact(url)}: {said}", file=err)
        return EXIT_UNREACHABLE
    finally:
        with contextlib.suppress(Exception):  # the outcome above is what is reported
            store.close()
    return EXIT_OK if shown else EXIT_EMPTY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="anarchon", description="Scheduled jobs that run once per slot across instances."
    )
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
        description="Exit status: 0 jobs shown, 1 none recorded in the namespace, 2 bad URL"
        " or missing driver, 3 the store cannot be reached or refused the connection.",
    )
    show.add_argument("--store", required=True, help="store URL, e.g. sqlite:///jobs.db")
    show.add_argument("--namespace", default="default")
    args = parser.parse_args(argv)

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
    return run_status(args.store, args.namespace, sys.stdout, sys.stderr, prog="anarchon")


if __name__ == "__main__":
    sys.exit(main())
