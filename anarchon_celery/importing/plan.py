"""What importing does with each entry a source holds: create, change or skip it, and why.

:func:`plan` is pure: the entries found and the schedules stored in, one
:class:`Step` per entry out. :func:`run` prints the steps and, asked to,
writes them by compare-and-set (:meth:`Control.add
<anarchon_core.control.Control.add>`, :meth:`Control.change
<anarchon_core.control.Control.change>` with the version read), so that a
schedule edited by someone else in between is reported, never overwritten.
Nothing is ever removed: a stored schedule no source names stays as it is.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, TextIO

from anarchon_core.control import Control, Definition
from anarchon_core.durations import parse_duration
from anarchon_core.errors import ConfigurationError, Conflict, UnknownJob
from anarchon_core.schedules import moment
from anarchon_core.urls import redact

from ..schedules import Entry

#: A stored schedule's fields, in the order a change shows them.
FIELDS = (
    "handler", "every", "cron", "timezone", "anchor", "start", "end", "args", "kwargs", "options",
    "job_options",
)  # fmt: skip
#: The ``anarchon_*`` entry options that bound a job's slots, not job options.
BOUNDS = ("start", "end")


@dataclass(frozen=True)
class Found:
    """One entry of a source: the stored schedule it becomes, or why it is not imported."""

    name: str
    definition: Definition | None = None
    #: Why it is not imported: "disabled", "cannot be carried: <reason>".
    skipped: str | None = None

    def __post_init__(self) -> None:
        if (self.definition is None) == (self.skipped is None):
            raise ValueError(f"{self.name!r}: a definition or the reason for none, not both")


@dataclass(frozen=True)
class Source:
    """What a source holds: named as the output says it (no secret), and its entries."""

    what: str
    found: tuple[Found, ...]


def carried(name: str, make: Callable[..., Definition], *args: Any) -> Found:
    """``make(*args)``'s definition, or why it cannot be carried (its ConfigurationError)."""
    try:
        return Found(name, definition=make(*args))
    except ConfigurationError as exc:
        return Found(name, skipped=f"cannot be carried: {exc}")


def definition_of(
    entry: Entry, start: datetime | None = None, end: datetime | None = None
) -> Definition:
    """The stored schedule of an entry as the beat scheduler reads it: same task, grid or
    cron, arguments and send options; its ``anarchon_start`` and ``anarchon_end`` as its
    bounds (else ``start`` and ``end``), its other ``anarchon_*`` overrides as job options."""
    if entry.at is not None:
        raise ConfigurationError(
            f"a one-off (at {entry.at.isoformat()}) is no stored schedule: keep it in"
            " beat_schedule, or ask for it with `anarchon once`"
        )
    overrides = dict(entry.overrides)
    bounds = {"start": start, "end": end}
    for bound in BOUNDS:
        if bound in overrides:
            bounds[bound] = moment(f"anarchon_{bound}", overrides.pop(bound))
    job_options = {k: parse_duration(f"anarchon_{k}", v) for k, v in overrides.items()}
    return Definition(
        name=entry.name,
        handler=entry.task,
        every=entry.every,
        cron=entry.cron,
        timezone=entry.timezone,
        anchor=entry.anchor,
        start=bounds["start"],
        end=bounds["end"],
        args=tuple(entry.args),
        kwargs=dict(entry.kwargs),
        options=dict(entry.options),
        job_options=job_options,
    )


class Verb(Enum):
    """What importing an entry does."""

    CREATE = "create"
    CHANGE = "change"
    SAME = "same"
    SKIP = "skip"


@dataclass(frozen=True)
class Step:
    """One entry found, what importing it does, and the schedule stored under its name."""

    found: Found
    verb: Verb
    stored: Definition | None = None

    def differences(self) -> list[str]:
        """Each field the import changes: ``field old -> new`` (secrets in URLs hidden)."""
        if self.stored is None or self.found.definition is None:
            return []
        old, new = _fields(self.stored), _fields(self.found.definition)
        return [
            f"{name} {_shown(old.get(name))} -> {_shown(new.get(name))}"
            for name in FIELDS
            if old.get(name) != new.get(name)
        ]


def plan(found: Sequence[Found], stored: Mapping[str, Definition]) -> list[Step]:
    """One step per entry found, in the source's order, against the ``stored`` schedules."""
    steps = []
    for item in found:
        old = stored.get(item.name)
        if item.definition is None:
            steps.append(Step(item, Verb.SKIP, old))
        elif old is None:
            steps.append(Step(item, Verb.CREATE))
        elif _fields(old) == _fields(item.definition):
            steps.append(Step(item, Verb.SAME, old))
        else:
            steps.append(Step(item, Verb.CHANGE, old))
    return steps


def run(source: Source, control: Control, *, apply: bool, out: TextIO, store: str = "") -> int:
    """Print what importing ``source`` does (and, with ``apply``, do it); how many schedules
    it created or changed, or would have. ``store`` names the store (no secret) to say so."""
    steps = plan(source.found, control.definitions())
    into = f"into {store + ', ' if store else ''}namespace {control.store.namespace!r}"
    print(f"from {source.what}: {len(source.found)} entries", file=out)
    print(into + ("" if apply else " (dry run: nothing is written; --apply writes)"), file=out)
    counts: Counter[str] = Counter()
    for step in steps:
        said, outcome = _apply(step, control) if apply else _preview(step)
        counts[outcome] += 1
        print(said, file=out)
    _summary(counts, apply, out)
    return counts["create"] + counts["change"]


def _preview(step: Step) -> tuple[str, str]:
    """The line a dry run prints for ``step``, and its outcome."""
    name = step.found.name
    if step.verb is Verb.CREATE:
        assert step.found.definition is not None
        return f"create   {name}: {_described(step.found.definition)}", "create"
    if step.verb is Verb.CHANGE:
        assert step.stored is not None
        return f"change   {name} v{step.stored.version}: {'; '.join(step.differences())}", "change"
    return _skip(step)


def _apply(step: Step, control: Control) -> tuple[str, str]:
    """Write ``step`` by compare-and-set; the line printed, and its outcome."""
    name, new = step.found.name, step.found.definition
    try:
        if step.verb is Verb.CREATE:
            assert new is not None
            added = control.add(new)
            return f"created  {name} v{added.version}: {_described(added)}", "create"
        if step.verb is Verb.CHANGE:
            assert new is not None and step.stored is not None
            fields = {field: getattr(new, field) for field in FIELDS}
            before, after = control.change(name, step.stored.version, **fields)
            changes = "; ".join(step.differences())
            return f"changed  {name} v{before.version} -> v{after.version}: {changes}", "change"
    except (Conflict, UnknownJob) as exc:  # edited, added or removed by someone meanwhile
        return f"conflict {name}: {exc}: left as it is; run the import again", "conflict"
    return _skip(step)


def _skip(step: Step) -> tuple[str, str]:
    name = step.found.name
    if step.verb is Verb.SAME:
        assert step.stored is not None
        return f"skip     {name}: already the same (v{step.stored.version})", "same"
    kept = "" if step.stored is None else f" (its stored v{step.stored.version} is left as it is)"
    return f"skip     {name}: {step.found.skipped}{kept}", "skip"


def _summary(counts: Counter[str], apply: bool, out: TextIO) -> None:
    rest = f"{counts['same']} already the same, {counts['skip']} not imported"
    if counts["create"] + counts["change"] == 0:
        print(f"nothing to create or change: {rest}", file=out)
    elif apply:
        print(f"done: created {counts['create']}, changed {counts['change']}; {rest}", file=out)
    else:
        print(
            f"would create {counts['create']}, change {counts['change']}; {rest}"
            " (dry run: --apply writes them)",
            file=out,
        )
    if counts["conflict"]:
        print(
            f"{counts['conflict']} changed by someone else meanwhile, left as they are:"
            " run the import again to see them",
            file=out,
        )


def _fields(definition: Definition) -> dict[str, Any]:
    """The fields as stored (JSON), so that ``60`` and ``60.0``, a tuple and a list agree."""
    data: dict[str, Any] = json.loads(definition.to_json())
    return data


def _described(definition: Definition) -> str:
    """The schedule and handler, and each argument or option set (secrets in URLs hidden)."""
    said = definition.describe()
    data = _fields(definition)
    for name in ("anchor", "args", "kwargs", "options", "job_options"):
        if data.get(name):
            said += f"; {name} {_shown(data[name])}"
    return said


def _shown(value: Any) -> str:
    return json.dumps(_redacted(value), sort_keys=True, ensure_ascii=False)


def _redacted(value: Any) -> Any:
    """``value`` with a URL's password (or a ``password=`` pair) in any string hidden."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    return value
