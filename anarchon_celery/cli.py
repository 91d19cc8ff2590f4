"""``celery anarchon status|jobs|pause|resume|trigger|history|next|add|change|remove|once``.

The control verbs are those of the ``anarchon`` command (see
:mod:`anarchon_core.cli`, same arguments and exit codes), on the store and
namespace the app's settings name; a job is a ``beat_schedule`` entry's name.

This command is registered as a ``celery.commands`` entry point, so the
``celery`` command imports this module in every process it starts, before the
app loads: that import is what connects the worker-side execution tracking
(:mod:`anarchon_celery.tracking`) with no configuration.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import click

from anarchon_core import AnarchonError
from anarchon_core.cli import EXIT_CONFIG, MAX_NEXT, moment, run_control, run_status
from anarchon_core.control import OPTIONS
from anarchon_core.version import __version__

from . import tracking  # noqa: F401 - connects the worker hooks
from .settings import namespace_of, store_url


@click.group(name="anarchon", help="anarchon: the shared schedule of beat_schedule entries.")
@click.version_option(__version__, prog_name="celery anarchon", message="%(prog)s %(version)s")
def anarchon() -> None:
    """The ``celery anarchon`` command group."""


@anarchon.command(
    help="Each entry's last slot, owner, attempt, state and lease time left. Exit status: 0"
    " entries shown, 1 none recorded or declared, 2 bad settings, 3 the store cannot be reached."
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


def _control(ctx: click.Context, verb: str, **args: Any) -> None:
    app: Any = ctx.obj.app
    try:
        url, namespace = store_url(app), namespace_of(app)
    except AnarchonError as exc:
        click.echo(f"celery anarchon: {exc}", err=True)
        ctx.exit(EXIT_CONFIG)
    namespace_args = argparse.Namespace(verb=verb, **args)
    ctx.exit(run_control(namespace_args, url, namespace, sys.stdout, sys.stderr,
                         prog="celery anarchon"))  # fmt: skip


_EXITS = (
    " Exit status: 0 changed or shown, 1 nothing changed (already so, or an unknown entry),"
    " 2 bad settings, 3 the store cannot be reached."
)


@anarchon.command(
    help="Every entry recorded, stored or declared by a live beat: paused or not, its last"
    " run, its next slot." + _EXITS
)
@click.pass_context
def jobs(ctx: click.Context) -> None:
    _control(ctx, "jobs")


def _targets(verb: str, names: tuple[str, ...], all_: bool) -> dict[str, Any]:
    if bool(names) == all_:
        raise click.UsageError(f"{verb}: name the entries, or give --all")
    return {"jobs": list(names), "all": all_}


@anarchon.command(help="Pause entries by name, or every entry with --all." + _EXITS)
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="pause the whole namespace")
@click.option("--unrecorded", is_flag=True, help="an entry that has not run yet")
@click.pass_context
def pause(ctx: click.Context, names: tuple[str, ...], all_: bool, unrecorded: bool) -> None:
    _control(ctx, "pause", unrecorded=unrecorded, **_targets("pause", names, all_))


@anarchon.command(help="Resume entries by name, or the whole namespace with --all." + _EXITS)
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="resume the whole namespace")
@click.option("--catch-up", is_flag=True, help="send the most recent slot missed while paused")
@click.pass_context
def resume(ctx: click.Context, names: tuple[str, ...], all_: bool, catch_up: bool) -> None:
    _control(ctx, "resume", catch_up=catch_up, **_targets("resume", names, all_))


@anarchon.command(help="Send an entry once now, as a slot of its own, from one beat." + _EXITS)
@click.argument("name")
@click.option("--unrecorded", is_flag=True, help="an entry that has not run yet")
@click.pass_context
def trigger(ctx: click.Context, name: str, unrecorded: bool) -> None:
    _control(ctx, "trigger", job=name, unrecorded=unrecorded)


@anarchon.command(help="The most recent attempts of an entry, newest first." + _EXITS)
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 50), default=20, show_default=True)
@click.pass_context
def history(ctx: click.Context, name: str, limit: int) -> None:
    _control(ctx, "history", job=name, limit=limit)


@anarchon.command(
    name="next",
    help="The next slots of an entry, in its time zone and in UTC, DST gaps and folds marked"
    " (its schedule as the live beats declare it, or as stored)." + _EXITS,
)
@click.argument("name")
@click.option("-n", "count", type=click.IntRange(1, MAX_NEXT), default=10, show_default=True)
@click.pass_context
def next_slots(ctx: click.Context, name: str, count: int) -> None:
    _control(ctx, "next", job=name, n=count)


def _schedule_options(command: Any) -> Any:
    """The options of ``add`` and ``change``: those of ``anarchon add``."""
    for option in reversed(
        [
            click.option("--handler", help="the task it sends, by name"),
            click.option("--every", type=float, help="seconds between slots"),
            click.option("--cron", help="a cron expression"),
            click.option("--timezone", help="the cron expression's timezone (default UTC)"),
            click.option("--anchor", type=float, help="every= grid anchor, Unix seconds"),
            click.option(
                "--start",
                metavar="TIME",
                help="no slot before this time, included: ISO 8601 with its offset"
                " (change: 'none' clears it)",
            ),
            click.option(
                "--end",
                metavar="TIME",
                help="no slot after this time, included: ISO 8601 with its offset"
                " (change: 'none' clears it)",
            ),
            click.option("--args", help="a JSON list of positional arguments"),
            click.option("--kwargs", help="a JSON object of keyword arguments"),
            click.option("--options", help="a JSON object of apply_async options"),
            *(
                click.option("--" + name.replace("_", "-"), name, type=float, metavar="SECONDS")
                for name in OPTIONS
            ),
            click.option(
                "--overlap",
                metavar="POLICY",
                help="skip (the default), buffer_one, buffer_all, cancel_other or allow_all",
            ),
            click.option(
                "--limit", metavar="N", help="the slots it sends in all ('none': no limit)"
            ),
            click.option(
                "--pause-on-failure",
                type=click.Choice(["true", "false"]),
                help="pause the entry on every beat after its task fails for good",
            ),
        ]
    ):
        command = option(command)
    return command


@anarchon.command(
    help="Store a new entry's schedule: every beat sends it within a second." + _EXITS
)
@click.argument("name")
@_schedule_options
@click.pass_context
def add(ctx: click.Context, /, name: str, **fields: Any) -> None:
    _control(ctx, "add", job=name, version=None, **fields)


@anarchon.command(help="Change a stored entry (compare-and-set: --version as read)." + _EXITS)
@click.argument("name")
@_schedule_options
@click.option("--version", type=int, help="fail unless the stored one is this")
@click.pass_context
def change(ctx: click.Context, /, name: str, **fields: Any) -> None:
    _control(ctx, "change", job=name, **fields)


@anarchon.command(help="Remove a stored entry: every beat stops it within a second." + _EXITS)
@click.argument("name")
@click.option("--version", type=int, help="fail unless the stored one is this")
@click.pass_context
def remove(ctx: click.Context, name: str, version: int | None) -> None:
    _control(ctx, "remove", job=name, version=version)


@anarchon.command(help="Send each slot of a past range once, in order, one at a time." + _EXITS)
@click.argument("name")
@click.option("--from", "start", required=True, help="the range's start, included: ISO 8601")
@click.option("--to", "end", required=True, help="the range's end, excluded: ISO 8601")
@click.option("--unrecorded", is_flag=True, help="an entry that has not run yet")
@click.pass_context
def backfill(ctx: click.Context, name: str, start: str, end: str, unrecorded: bool) -> None:
    try:
        moments = moment(start), moment(end)
    except argparse.ArgumentTypeError as exc:
        raise click.BadParameter(str(exc)) from None
    _control(ctx, "backfill", job=name, start=moments[0], end=moments[1], unrecorded=unrecorded)


@anarchon.command(
    help="Send an entry once at a given time (ISO 8601, UTC if no offset), from one beat;"
    " --cancel removes it, --pending lists those not yet sent." + _EXITS
)
@click.argument("name", required=False)
@click.option("--at", "at", metavar="TIME", help="when: ISO 8601 (UTC if no offset)")
@click.option("--cancel", is_flag=True, help="remove the one-off at --at")
@click.option("--pending", is_flag=True, help="list the one-offs not yet sent (of NAME, or all)")
@click.option("--unrecorded", is_flag=True, help="an entry that has not run yet")
@click.pass_context
def once(
    ctx: click.Context,
    name: str | None,
    at: str | None,
    cancel: bool,
    pending: bool,
    unrecorded: bool,
) -> None:
    if cancel and pending:
        raise click.UsageError("once: --cancel or --pending, not both")
    try:
        when = None if at is None else moment(at)
    except argparse.ArgumentTypeError as exc:
        raise click.BadParameter(str(exc), param_hint="--at") from None
    _control(ctx, "once", job=name, at=when, cancel=cancel, pending=pending, unrecorded=unrecorded)
