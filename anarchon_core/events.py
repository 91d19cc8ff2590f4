"""Events: what the engine reports, at which log level, and the emitter that reports it."""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .slots import BACKFILL, Slot, record_job, shown

#: The ``extra`` attributes of every event's log record (``None`` where they do not apply).
LOG_FIELDS = ("event", "job", "slot_id", "attempt", "token", "instance", "namespace", "detail")


class EventKind(str, enum.Enum):
    """What the engine did; each kind carries the :attr:`level` it is logged at.

    A kind is also the string of its value, so ``event.kind == "won"`` holds,
    and logs and f-strings show ``won``.
    """

    _value_: str
    level: int

    def __new__(cls, value: str, level: int) -> EventKind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.level = level
        return member

    def __str__(self) -> str:
        return str.__str__(self)

    #: This instance won a slot's claim, on time.
    WON = ("won", logging.DEBUG)
    #: This instance won a slot more than ``jitter + 1 s`` after its time.
    CATCH_UP = ("catch_up", logging.INFO)
    #: The slot was already claimed, or a newer slot is recorded.
    TAKEN = ("taken", logging.DEBUG)
    #: The slot was skipped: the previous slot still holds its lease.
    OVERLAP = ("overlap", logging.INFO)
    #: This instance took a slot over (detail ``lease lapsed`` or ``hand-over``).
    TAKEOVER = ("takeover", logging.INFO)
    #: A run of this instance ended as ``done``.
    FINISHED = ("finished", logging.DEBUG)
    #: A run of this instance ended as ``failed``.
    FAILED = ("failed", logging.WARNING)
    #: A handler handed its run off to an executor (:meth:`~anarchon_core.Run.hand_off`).
    DISPATCHED = ("dispatched", logging.DEBUG)
    #: A handler could not hand its run off (the broker was unreachable): another
    #: attempt takes the slot over after a back-off, within its catch-up window, or
    #: it is recorded failed once that window has passed.
    DISPATCH_FAILED = ("dispatch_failed", logging.WARNING)
    #: This instance lost the lease of a run it holds.
    LOST = ("lost", logging.WARNING)
    #: A handler returned, but another instance holds the slot now.
    FINISH_REFUSED = ("finish_refused", logging.WARNING)
    #: This instance released a run during a graceful stop.
    HANDED_OVER = ("handed_over", logging.INFO)
    #: This instance won a slot someone asked to run now (:meth:`~anarchon_core.Control.trigger`).
    MANUAL = ("manual", logging.INFO)
    #: The slot was not started: its job, or the whole namespace, is paused.
    PAUSED = ("paused", logging.DEBUG)
    #: A ``pause_on_failure`` job was paused after a run ended failed (on every instance).
    PAUSED_ON_FAILURE = ("paused_on_failure", logging.WARNING)
    #: The slot was not started: its job has run its ``limit`` of slots (counted in the
    #: store, across instances); this instance claims no more of it.
    LIMIT_REACHED = ("limit_reached", logging.INFO)
    #: A slot was not claimed, or a handed-off run was never picked up.
    MISSED = ("missed", logging.WARNING)
    #: The store stopped answering, or answered with an error (once per outage).
    STORE_UNAVAILABLE = ("store_unavailable", logging.WARNING)
    #: The store answered a call about one job with an error while it took the
    #: same call about the others: that job is tried again (its claims after a
    #: back-off, within its catch-up window), the other jobs go on. Reported
    #: once until the store takes that job's calls again.
    STORE_REFUSED = ("store_refused", logging.WARNING)
    #: The store answers again.
    STORE_RECOVERED = ("store_recovered", logging.INFO)
    #: This instance deferred claims and takeovers: its own renewals and finishes run
    #: late (detail: how many, how late). Other instances, or later steps, take them.
    CLAIMS_DEFERRED = ("claims_deferred", logging.WARNING)


@dataclass(frozen=True)
class Event:
    """Something the engine did, for listeners, metrics and the demo.

    ``kind`` is an :class:`EventKind`; ``dispatched`` means the handler
    handed the run off (see :meth:`Run.hand_off`). ``job``, ``slot_id`` and
    ``attempt`` are ``None`` where they do not apply.
    """

    kind: EventKind
    job: str | None
    slot_id: str | None
    attempt: int | None
    instance: str
    detail: str = ""


@dataclass(frozen=True)
class Health:
    """What a probe reports of one scheduler (:meth:`~anarchon_core.Scheduler.health`)."""

    #: The scheduling loop steps (a liveness probe).
    live: bool
    #: Live, and the store answered the last step (a readiness probe).
    ready: bool
    #: Why, in a few words.
    detail: str
    #: How late this instance's own renewals and finishes ran at its last step
    #: (seconds; see :mod:`anarchon_core.engine.pacing`).
    behind: float = 0.0
    #: Claims and takeovers this instance deferred since it started, being behind.
    deferred: int = 0


class Emitter:
    """Reports the events of one instance: counts them, logs them, calls the listeners.

    Messages go to ``logger``, each at its kind's level.
    """

    def __init__(self, *, instance: str, namespace: str, logger: logging.Logger) -> None:
        self.instance = instance
        self.namespace = namespace
        self._log = logger
        self._listeners: list[Callable[[Event], None]] = []
        self._counts: Counter[str] = Counter()
        # Reentrant: a signal handler that stops the scheduler may emit while this
        # thread is inside an emit.
        self._lock = threading.RLock()

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    @property
    def counts(self) -> dict[str, int]:
        """How many events of each kind were reported, by kind name."""
        with self._lock:
            return dict(self._counts)

    def __call__(
        self,
        kind: EventKind,
        *,
        slot: Slot | None = None,
        attempt: int | None = None,
        detail: str = "",
        job: str | None = None,
        token: int | None = None,
    ) -> None:
        """Report that ``kind`` happened, to ``slot`` (its ``attempt`` and ``token``) or
        ``job`` if one.

        The log record carries the event's fields as ``extra`` attributes
        (:data:`LOG_FIELDS`), for any structured formatter to emit.
        """
        if slot is not None and slot.job.endswith(BACKFILL):
            slot = shown(slot)
            detail = f"backfill; {detail}" if detail else "backfill"
        elif slot is not None:
            slot = shown(slot)  # a lane's slot (overlap="allow_all") is its job's
        if job is not None:
            job = record_job(job)
        sid = slot.id if slot is not None else None
        event = Event(
            kind, slot.job if slot is not None else job, sid, attempt, self.instance, detail
        )
        with self._lock:
            self._counts[kind.value] += 1
        if self._log.isEnabledFor(kind.level):
            fields = {
                "event": kind.value,
                "job": event.job,
                "slot_id": sid,
                "attempt": attempt,
                "token": token,
                "instance": self.instance,
                "namespace": self.namespace,
                "detail": detail or None,
            }
            self._log.log(
                kind.level,
                "anarchon: %s %s attempt %s on %s%s",
                kind,
                sid or self.namespace,
                attempt if attempt is not None else "-",
                self.instance,
                f" ({detail})" if detail else "",
                extra=fields,
            )
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                self._log.exception("anarchon: event listener %r failed", listener)
