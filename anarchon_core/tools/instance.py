"""One demo instance: a scheduler with one job that reports what it does.

``anarchon demo`` starts several of these as processes sharing one store, and
the failure-scenario tests start them too, then send them real signals. Each
instance appends one JSON object per line to a shared report file: the
handler's ``start`` / ``end`` / ``abort`` (it saw ``run.lost``), ``up`` (its jobs declared)
and ``ready`` (its first step done: every job placed, the store answered), and the engine's
events (takeover, hand-over, lost lease, refused finish, ...). Lines are written with a single
``os.write`` on a file opened with ``O_APPEND``, so concurrent writers never
interleave.

Under ``anarchon demo`` an instance starts with SIGINT blocked (the demo
starts it so), so the terminal's Ctrl-C, sent to the whole process group,
leaves the instance to the demo, which stops it with one SIGTERM.

``--jobs N`` declares N jobs on the same schedule instead of one: thousands
of them due every second make a fleet that cannot keep up (the overload
scenario starts such a fleet).

Run it as ``python -m anarchon_core.tools.instance --store URL --name a --report FILE``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from datetime import datetime, timezone
from typing import Any

from ..clock import SkewedClock, SystemClock
from ..events import Event
from ..jobs import Run
from ..scheduler import Scheduler


class Reporter:
    """Appends JSON lines to the report file."""

    def __init__(self, path: str, instance: str) -> None:
        self.instance = instance
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, kind: str, **fields: Any) -> None:
        line = {"t": time.time(), "kind": kind, "instance": self.instance, **fields}
        os.write(self._fd, (json.dumps(line) + "\n").encode())

    def event(self, event: Event) -> None:
        if event.kind in ("taken", "finished"):
            return  # routine; the handler's own lines say as much
        self.write(
            event.kind,
            job=event.job,
            slot_id=event.slot_id,
            attempt=event.attempt,
            detail=event.detail,
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m anarchon_core.tools.instance")
    parser.add_argument("--store", required=True, help="store URL shared by the instances")
    parser.add_argument("--namespace", default="demo")
    parser.add_argument("--name", required=True, help="instance name shown in reports")
    parser.add_argument("--report", required=True, help="file to append JSON lines to")
    parser.add_argument("--job", default="tick")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="how many jobs on the one schedule (more than one: named JOB00000, JOB00001, ...)",
    )
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--anchor", type=float, default=None, help="grid anchor, Unix seconds")
    parser.add_argument("--cron", default=None)
    parser.add_argument("--work", type=float, default=0.5, help="seconds each run works")
    parser.add_argument("--lease", type=float, default=None)
    parser.add_argument("--jitter", type=float, default=None)
    parser.add_argument("--catch-up", type=float, default=None)
    parser.add_argument("--watch", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--skew", type=float, default=0.0, help="shift this instance's wall clock (seconds)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve metrics and probes (0: any port)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    report = Reporter(args.report, args.name)
    scheduler = Scheduler(
        args.store,
        namespace=args.namespace,
        instance=args.name,
        lease=args.lease,
        jitter=args.jitter,
        catch_up=args.catch_up,
        watch=args.watch,
        seed=args.seed,
        listener=report.event,
        clock=SkewedClock(SystemClock(), args.skew) if args.skew else None,
    )

    def work(run: Run) -> None:
        fields = {"job": run.job, "slot_id": run.slot_id, "attempt": run.attempt}
        report.write("start", token=run.token, **fields)
        deadline = time.monotonic() + args.work
        while time.monotonic() < deadline and not run.lost:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        report.write("abort" if run.lost else "end", reason=run.lost_reason, **fields)

    # The handler that schedules stored at run time name (anarchon add JOB --handler work).
    scheduler.handler("work")(work)
    names = [args.job] if args.jobs == 1 else [f"{args.job}{k:05d}" for k in range(args.jobs)]
    for name in names:
        if args.cron:
            scheduler.add_job(work, name=name, cron=args.cron)
        else:
            anchor = None
            if args.anchor is not None:
                anchor = datetime.fromtimestamp(args.anchor, timezone.utc)
            scheduler.add_job(work, name=name, every=args.every, anchor=anchor)
    probes = None
    if args.metrics_port is not None:
        from ..probes import serve

        probes = serve(scheduler, args.metrics_port, "127.0.0.1")
    report.write("up", pid=os.getpid(), metrics_port=probes.port if probes else None)

    def await_ready() -> None:
        # "ready": the first step placed every job and the store answered it (health's
        # readiness), which a loaded machine may take seconds after "up" to reach.
        while not scheduler.health().ready:
            time.sleep(0.05)
        report.write("ready", pid=os.getpid())

    threading.Thread(target=await_ready, name="anarchon-instance-ready", daemon=True).start()
    scheduler.run_forever()
    report.write("down", pid=os.getpid())


if __name__ == "__main__":
    main()
