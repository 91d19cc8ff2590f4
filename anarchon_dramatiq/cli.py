"""``dramatiq-anarchon BROKER [MODULES...]``: the scheduler alone, safe to run in every pod.

``dramatiq-anarchon jobs|pause|resume|trigger|history|next BROKER ...`` are the
control verbs of the ``anarchon`` command (same arguments and exit codes),
on the store and namespace of the broker's middleware; a job is an actor's
name.

Imports the broker like the ``dramatiq`` command does (``package.module`` with
a ``broker`` attribute, or ``package.module:name``) and the modules declaring
actors, then runs the engine of the broker's :class:`~anarchon_dramatiq.Anarchon`
middleware until SIGTERM or SIGINT, when it hands its slots over. Every copy
takes part in the same claims, so running one per pod sends each slot once.
Workers next to it should use ``Anarchon(scheduler=False)``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import socket
import sys

from dramatiq.cli import import_broker

from anarchon_core import AnarchonError
from anarchon_core.cli import (
    CONTROL_VERBS,
    EXIT_CONFIG,
    add_control_verbs,
    check_control_args,
    run_control,
)
from anarchon_core.probes import serve_beside
from anarchon_core.urls import redact
from anarchon_core.version import __version__

from .middleware import Anarchon


def control(argv: list[str]) -> int:
    """``dramatiq-anarchon VERB BROKER ...``: a control verb on the middleware's store."""
    parser = argparse.ArgumentParser(prog="dramatiq-anarchon", description=__doc__.splitlines()[2])
    verbs = parser.add_subparsers(dest="command", required=True)

    def broker_argument(verb: argparse.ArgumentParser) -> None:
        verb.add_argument("broker", help="the broker: package.module or package.module:name")

    add_control_verbs(verbs, store_option=False, extra=broker_argument)
    args = parser.parse_args(argv)
    check_control_args(parser, args)
    sys.path.insert(0, os.getcwd())
    try:
        _, broker = import_broker(args.broker)  # type: ignore[no-untyped-call]
        middleware = next((m for m in broker.middleware if isinstance(m, Anarchon)), None)
        if middleware is None:
            parser.error(f"{args.broker}: the broker has no anarchon_dramatiq.Anarchon middleware")
        url = middleware.store_url(broker)
    except AnarchonError as exc:
        print(f"dramatiq-anarchon: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return run_control(
        args, url, middleware.namespace, sys.stdout, sys.stderr, prog="dramatiq-anarchon"
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in CONTROL_VERBS:
        sys.exit(control(argv))
    parser = argparse.ArgumentParser(prog="dramatiq-anarchon", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dramatiq-anarchon {__version__}")
    parser.add_argument("broker", help="the broker: package.module or package.module:name")
    parser.add_argument("modules", nargs="*", help="modules declaring actors")
    parser.add_argument("--verbose", "-v", action="count", default=0)
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics, /healthz and /readyz on this port"
        " (default: the middleware's metrics_port, else none)",
    )
    parser.add_argument("--metrics-host", default=None, help="their address (default 0.0.0.0)")
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sys.path.insert(0, os.getcwd())
    try:
        _, broker = import_broker(args.broker)  # type: ignore[no-untyped-call]
        for module in args.modules:
            importlib.import_module(module)
        middleware = next((m for m in broker.middleware if isinstance(m, Anarchon)), None)
        if middleware is None:
            parser.error(f"{args.broker}: the broker has no anarchon_dramatiq.Anarchon middleware")
        if not middleware.periodic:
            # Schedules stored at run time may still name this broker's actors.
            logging.getLogger(__name__).warning(
                "anarchon: no periodic actor declared (did you name the modules declaring"
                " them?); following the schedules stored at run time only"
            )
        engine = middleware.build_engine(broker, f"{socket.gethostname()}:{os.getpid()}:dqa")
        port = args.metrics_port if args.metrics_port is not None else middleware.metrics_port
        if port is not None:
            serve_beside(engine, port, args.metrics_host or middleware.metrics_host)
    except AnarchonError as exc:
        parser.exit(2, f"dramatiq-anarchon: {exc}\n")
    logging.getLogger(__name__).info(
        "anarchon: %d periodic actors, store %s, namespace %s",
        len(middleware.periodic),
        redact(middleware.store_url(broker)),
        engine.namespace,
    )
    engine.run_forever()


if __name__ == "__main__":
    main()
