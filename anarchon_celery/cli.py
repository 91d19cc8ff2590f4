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

from anarchon_core import AnarchonError, open_store
from anarchon_core.cli import status as print_status
from anarchon_core.urls import redact

from . import tracking  # noqa: F401 - connects the worker hooks
from .settings import namespace_of, store_url


@click.group(name="anarchon", help="anarchon: the shared schedule of beat_schedule entries.")
def anarchon() -> None:
    """The ``celery anarchon`` command group."""


@anarchon.command(help="Each entry's last slot, owner, attempt, state and lease time left.")
@click.pass_context
def status(ctx: click.Context) -> None:
    app: Any = ctx.obj.app
    try:
        url = store_url(app)
        store = open_store(url, namespace=namespace_of(app))
        try:
            click.echo(f"store {redact(url)}  namespace {store.namespace}")
            print_status(store, sys.stdout)
        finally:
            store.close()
    except AnarchonError as exc:
        raise click.ClickException(str(exc)) from exc
