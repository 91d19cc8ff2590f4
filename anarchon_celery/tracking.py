"""Execution tracking: the worker running a slot's task holds the slot's lease.

Beat sends each slot's task with a header (:data:`HEADER`) carrying the
slot's hand-off ticket (:class:`anarchon_core.handoff.HandOff`: the slot, the
attempt and its fencing token), then hands the slot's lease off to whoever
executes it (:meth:`anarchon_core.Run.hand_off`). In the worker, a wrapper
around ``Task.__call__`` is installed at ``worker_init`` (this module is
imported by the ``celery`` command in every process it starts, through the
``celery anarchon`` subcommand's entry point, before the app loads and before
the pool forks):

- renews the lease with the token before the task body runs; a stale token
  (another attempt of this slot was sent since) skips the body: the task is
  marked revoked and nothing runs;
- renews the lease in a background thread while the body runs;
- finishes the slot when the body returns (done) or raises (failed); a
  Celery retry keeps the slot, with the pickup lease, for the retried message;
- closes the stores it opened when the worker (or its pool process) shuts down.

A worker SIGKILLed mid-task stops renewing: the lease lapses and a backup
beat sends the slot again as the next attempt. Workers announce the wrapper
in their configuration (:data:`FLAG`), which beat reads with ``inspect
conf``: beat only hands slots off while every worker that answers has it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, signals
from celery.app.task import Task
from celery.exceptions import Ignore, Retry

from anarchon_core import RunState
from anarchon_core.errors import SkipWork, is_bug
from anarchon_core.handoff import (
    HandOff,
    close_stores,
    note_stray,
    release_all,
    take,
    tracked_ticket,
)

from .settings import namespace_of, store_url

log = logging.getLogger(__name__)

#: The message header (and ``task.request`` attribute) carrying the hand-off ticket.
HEADER = "anarchon"
#: Set in a worker's configuration when the wrapper is installed.
FLAG = "anarchon_worker_tracking"


def task_id(namespace: str, slot_id: str, attempt: int) -> str:
    """The task id of one attempt of one slot: a double send would be visible."""
    return f"anarchon:{namespace}:{slot_id}:{attempt}"


@signals.worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _on_process_shutdown(**_: Any) -> None:
    """A cold shutdown ends tasks mid-run: hand their slots over to a backup at once.

    Then close the stores the process opened for its tasks.
    """
    release_all()
    close_stores()


@signals.worker_shutdown.connect  # type: ignore[untyped-decorator]
def _on_worker_shutdown(**_: Any) -> None:
    """The worker stops (its tasks have returned): close the stores it opened for them.

    With the solo and thread pools, tasks run in the worker's own process.
    """
    close_stores()


def _ticket(task: Task) -> HandOff | None:
    """The hand-off of the task being called by the worker, if it is tracked."""
    request = task.request_stack.top
    if request is None or request.called_directly or len(task.request_stack) != 1:
        return None
    return tracked_ticket(getattr(request, HEADER, None))


_original_call: Any = None


def _stray_entry(task: Task) -> str | None:
    """The ``beat_schedule`` entry of a task sent by a beat that is not anarchon's, if any.

    Every beat marks what it sends with the ``celery_beat_task`` header
    (Celery 5.7's ``apply_async``); anarchon's beats also send the
    :data:`HEADER` ticket. The message does not name its entry: the entry
    is the one of ``beat_schedule`` with this task and these arguments (the
    first by name if several have them, or only the task).
    """
    request = task.request_stack.top
    if request is None or request.called_directly or len(task.request_stack) != 1:
        return None
    if not getattr(request, "celery_beat_task", None) or getattr(request, HEADER, None):
        return None
    entries = task.app.conf.beat_schedule or {}
    named = sorted(
        name
        for name, entry in entries.items()
        if isinstance(entry, dict) and entry.get("task") == task.name
    )
    same = [
        name
        for name in named
        if tuple(entries[name].get("args") or ()) == tuple(request.args or ())
        and dict(entries[name].get("kwargs") or {}) == dict(request.kwargs or {})
    ]
    found = same or named
    return found[0] if found else None


def _note_stray(task: Task) -> None:
    """Count and say a task that a stock beat sent for an entry anarchon schedules.

    A stock beat left running beside anarchon's beats (one pod not yet
    migrated) sends every slot of every entry a second time; the worker is
    the one place that sees both. Said once per entry in this process, at
    WARNING; counted in the store at every send (``celery anarchon status``,
    the dashboard, the ``anarchon_stray_sends_total`` metric).
    """
    entry = _stray_entry(task)
    if entry is None:
        return
    request = task.request_stack.top
    sender = str(getattr(request, "origin", None) or "")
    try:
        first = note_stray(store_url(task.app), namespace_of(task.app), entry, sender)
    except Exception as exc:  # the task runs whatever happens here
        # No anarchon settings (an app on stock beat alone) or no store: nothing to
        # count, and nothing to say at every send; a bug shows with its traceback.
        log.log(
            logging.ERROR if is_bug(exc) else logging.DEBUG,
            "anarchon: could not count a send of %s by another beat: %s",
            entry,
            exc,
            exc_info=exc if is_bug(exc) else None,
        )
        return
    if first:
        log.warning(
            "anarchon: entry %s was sent by a beat that is not anarchon's (from %s, task %s):"
            " a stock beat still runs beside anarchon's beats and sends every slot again;"
            " stop it (see 'Migrating from stock beat'). Counted in 'celery anarchon status'",
            entry,
            sender or "a host the message does not name",
            request.id,
        )


def _call(self: Task, *args: Any, **kwargs: Any) -> Any:
    ticket = _ticket(self)
    if ticket is None:
        _note_stray(self)
        return _original_call(self, *args, **kwargs)
    try:
        lease = take(store_url(self.app), ticket)
    except SkipWork as skip:
        if skip.stale:
            request = self.request_stack.top
            self.backend.mark_as_revoked(request.id, str(skip), request=request)
        raise Ignore(str(skip)) from skip
    try:
        result = _original_call(self, *args, **kwargs)
    except Retry:
        lease.keep_for_retry()
        raise
    except Ignore:
        lease.finish(RunState.DONE)
        raise
    except Exception:
        lease.finish(RunState.FAILED)
        raise
    except BaseException:
        # Interrupted, not failed (a cold shutdown terminates the body): let a
        # backup run the slot again at once.
        lease.release()
        raise
    lease.finish(RunState.DONE)
    return result


def install() -> None:
    """Wrap ``Task.__call__`` once per process (idempotent).

    Done at ``worker_init``: after Celery installed its own stack protection on
    ``Task.__call__`` (which it would otherwise put over ours), before the
    pool forks and before any task's tracer is built.
    """
    global _original_call
    if Task.__call__ is not _call:
        _original_call = Task.__call__
        Task.__call__ = _call


@signals.worker_init.connect  # type: ignore[untyped-decorator]
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Install the wrapper and tell beat, through ``inspect conf``, that it is there."""
    install()
    app = getattr(sender, "app", None)
    if app is not None:
        app.conf[FLAG] = True


#: How long beat collects the workers' answers to one ``inspect conf``. Workers
#: answer within milliseconds; a stop waits for a broadcast under way, so it
#: stays short (a worker that misses it is asked again at the next check).
INSPECT_TIMEOUT = 0.5


def tracking_in_workers(app: Celery, timeout: float = INSPECT_TIMEOUT) -> bool | None:
    """Whether every worker that answers has the wrapper; None if no worker answered."""
    try:
        replies = app.control.inspect(timeout=timeout).conf() or {}
    except Exception as exc:  # broker trouble: decide later
        log.debug("anarchon: inspect conf failed: %s", exc)
        return None
    if not replies:
        return None
    return all(isinstance(conf, dict) and conf.get(FLAG) for conf in replies.values())


class WorkerCheck:
    """Asks the workers, now and then, whether they all track execution.

    Beat hands slots off to workers only while the last answer was yes; until
    the first answer, and after any no, it sends in dispatch-only mode (the
    slot is finished once sent) and says so in a warning.
    """

    def __init__(self, app: Celery, every: float = 30.0) -> None:
        self.app = app
        self.every = every
        self.tracking = False
        self._said: bool | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="anarchon-workers", daemon=True)

    def start(self) -> WorkerCheck:
        self._thread.start()
        return self

    def _loop(self) -> None:
        unanswered = 0
        while True:
            answer = tracking_in_workers(self.app)
            if self._stop.is_set():
                return  # stopped during the broadcast: the answer no longer matters
            if answer is not None:
                self.tracking = answer
            if answer is False and self._said is not False:
                log.warning(
                    "anarchon: a worker answered without execution tracking (anarchon is not"
                    " installed there, or it was not started with the celery command):"
                    " slots are sent without tracking until every worker has it"
                )
            elif answer and not self._said:
                log.info("anarchon: every worker tracks execution: slots are handed off to them")
            if answer is not None:
                self._said = answer
            elif self._said is None and (unanswered := unanswered + 1) == 30:
                log.warning(
                    "anarchon: no worker has answered 'inspect conf' for a minute (remote"
                    " control disabled?): slots are sent without execution tracking"
                )
            # No answer yet (workers still starting): ask again soon.
            if self._stop.wait(self.every if answer is not None else 2.0):
                return

    def stop(self, timeout: float = INSPECT_TIMEOUT + 0.2) -> None:
        """Stop asking, and wait for the thread: about one ``inspect``, at most ``timeout``.

        A broadcast slower than its own timeout (the broker's first connection
        on a loaded machine) is not waited for: beat's stop must not wait on
        it. The thread, a daemon holding nothing of the store's, ends as soon
        as that broadcast returns.
        """
        self._stop.set()
        thread = self._thread
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.info("anarchon: the worker check ends after its broadcast under way")
