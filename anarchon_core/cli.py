"""The ``anarchon`` command: ``anarchon demo`` and ``anarchon status``."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import TextIO

from .errors import AnarchonError
from .schedules import from_ms
from .store import RunState, Store
from .urls import open_store, redact


def status(store: Store, out: TextIO) -> None:
    """Print, per job: its last slot, owner, attempt, state and lease time left."""
    names = store.jobs()
    if not names:
        print(f"no jobs recorded in namespace {store.namespace!r}", file=out)
        return
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
    show = commands.add_parser("status", help="jobs, slots and leases recorded in a store")
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
    try:
        store = open_store(args.store, namespace=args.namespace)
        try:
            print(
                f"store {redact(args.store)}  namespace {args.namespace}  "
                f"at {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
                file=sys.stdout,
            )
            status(store, sys.stdout)
        finally:
            store.close()
    except AnarchonError as exc:
        print(f"anarchon: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
