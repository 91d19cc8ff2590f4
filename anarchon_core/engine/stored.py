"""Schedules defined in the store (:meth:`Control.add <anarchon_core.Control.add>`), run here.

A stored schedule names its handler; ``resolve`` makes that handler here
(by default, from the functions registered with ``@scheduler.handler``), or
says this instance has none, and then leaves the schedule to the instances
that have it. A job declared in code keeps its code schedule. A stored
``start`` and ``end`` bound its slots as ``add_job``'s do.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from ..control import DEFINED, Definition
from ..errors import ConfigurationError
from ..jobs import Job, Run
from .gateway import describe
from .table import JobTable

log = logging.getLogger(__name__)

#: What makes a stored schedule's handler here (None: this instance has none).
Resolve = Callable[[Definition], Callable[..., Any] | None]


class Handlers:
    """The functions that stored schedules may name, by name (``@scheduler.handler``)."""

    def __init__(self, table: JobTable) -> None:
        self._lock = table.lock
        self._functions: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, function: Callable[..., Any]) -> None:
        with self._lock:
            self._functions[name] = function

    def resolve(self, definition: Definition) -> Callable[..., Any] | None:
        """The handler registered under the definition's handler name, given its args."""
        with self._lock:
            function = self._functions.get(definition.handler)
        if function is None:
            return None
        if not definition.args and not definition.kwargs:
            return function
        args, kwargs = tuple(definition.args), dict(definition.kwargs)

        def call(run: Run) -> Any:  # with arguments, the run comes first
            return function(run, *args, **kwargs)

        call.__name__ = getattr(function, "__name__", definition.handler)
        return call


class StoredSchedules:
    """Adds, changes and removes the jobs whose schedule is stored.

    ``add_job`` and ``remove_job`` are the scheduler's own; ``resolve`` makes
    a stored schedule's handler.
    """

    def __init__(
        self,
        table: JobTable,
        resolve: Resolve,
        add_job: Callable[..., Job],
        remove_job: Callable[[str], None],
    ) -> None:
        self._table = table
        self.resolve = resolve
        self._add_job = add_job
        self._remove_job = remove_job
        #: The stored schedules applied here: name -> the definition's version.
        self._applied: dict[str, int] = {}
        #: Stored schedules not applied here, and why (reported once per version).
        self._skipped: dict[str, int] = {}

    def apply(self, entries: dict[str, tuple[int, str]]) -> None:
        """Apply the stored schedules' control entries (``def/<name>``), as read now.

        A job declared in code keeps its code schedule: a stored one of the
        same name is ignored here (reported once). A stored schedule whose
        handler this instance lacks is left to the instances that have it.
        """
        seen: set[str] = set()
        for key, (version, text) in entries.items():
            name = key[len(DEFINED) :]
            seen.add(name)
            if self._applied.get(name) == version or self._skipped.get(name) == version:
                continue
            self._skipped.pop(name, None)
            self._apply(name, version, text)
        for name in [name for name in self._applied if name not in seen]:
            self._drop(name)
            log.info("anarchon: stored schedule %s removed", name)
        for name in [name for name in self._skipped if name not in seen]:
            del self._skipped[name]

    def _apply(self, name: str, version: int, text: str) -> None:
        """Apply one new or changed stored schedule."""
        rt = self._table.get(name)
        if rt is not None and not rt.removed and name not in self._applied:
            self._skip(name, version, "a job of that name is declared in code here")
            return
        try:
            definition = Definition.from_json(name, text, version)
            handler = self.resolve(definition)
        except Exception as exc:
            self._skip(name, version, describe(exc))
            return
        if handler is None:
            self._skip(name, version, f"no handler named {definition.handler!r} here")
            if name in self._applied:
                self._drop(name)
            return
        if name in self._applied:
            self._drop(name)
        try:
            self._add_job(
                handler,
                name=name,
                every=definition.every,
                cron=definition.cron,
                timezone=definition.timezone,
                anchor=None
                if definition.anchor is None
                else datetime.fromtimestamp(definition.anchor, timezone.utc),
                start=definition.start,
                end=definition.end,
                **definition.job_options,
                **definition.rules,
            )
        except ConfigurationError as exc:
            self._skip(name, version, str(exc))
            return
        self._applied[name] = version
        log.info("anarchon: stored schedule %s v%d: %s", name, version, definition.describe())

    def _drop(self, name: str) -> None:
        del self._applied[name]
        with contextlib.suppress(KeyError):
            self._remove_job(name)

    def _skip(self, name: str, version: int, why: str) -> None:
        self._skipped[name] = version
        log.warning("anarchon: stored schedule %s v%d not run here: %s", name, version, why)
