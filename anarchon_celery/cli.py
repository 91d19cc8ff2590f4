"""``celery anarchon status``: the schedule's state in the store.

This command is registered as a ``celery.commands`` entry point, so the
``celery`` command imports this module in every process it starts, before the
app loads: that import is what connects the worker-side execution tracking
(:mod:`anarchon_celery.tracking`) with no configuration.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from anarchon_core import AnarchonError
from anarchon_core.cli import EXIT_CONFIG, run_status

from . import tracking  # noqa: F401 - connects the worker hooks
from .settings import namespace_of, store_url


@click.group(name="anarchon", help="anarchon: the shared schedule of beat_schedule entries.")
def anarchon() -> None:
    """The ``celery anarchon`` command group."""


@anarchon.command(
    help="Each entry's last slot, owner, attempt, state and lease time left. Exit status: 0"
    " entries shown, 1 none recorded, 2 bad settings, 3 the store cannot be reached."
)
@click.pass_context
def status(ctx: click.Context) -> None:
    app: Any = ctx.obj.app
    try:
        url, namespace = store_url(app), namespace_of(app)
    except AnarchonError as exc:
        click.echo(f"celery anarchon: {exc}", err=True)
        ctx.exit(EXIT_CONFIG)
    ctx.exit(run_status(url, namespace, sys.stdout, sys.stderr, prog="celery anarchon"))
