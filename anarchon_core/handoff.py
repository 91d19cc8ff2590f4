"""Hand-offs: the ticket a dispatcher sends with a slot's work, and the worker's side of it.

A scheduler that only dispatches work (Celery beat, a Dramatiq scheduler)
hands each slot off to whoever executes the work (see
:meth:`anarchon_core.Run.hand_off`): it marks the slot ``dispatched`` in the
store with the pickup lease and sends a :class:`HandOff` ticket with the
work. The worker that executes it takes the lease with the ticket's token
(:func:`take`), which makes the slot ``running`` again: a refusal means a
later attempt was sent, so the work must not run. It then renews the lease
while the work runs, and finishes the slot, dispatches it again for a retry,
or releases it at once when the process goes down mid-run.

:func:`dispatch` is the dispatcher's side, the same for every integration;
:class:`Executions` owns the worker side of a process (the stores it opened,
the leases its running work holds), closed with :func:`close_stores` when the
worker shuts down.

A worker also sees the work of a job that came without a ticket from a
scheduler that is not anarchon's (a stock Celery beat left running during a
migration sends every slot a second time). :func:`note_stray` counts such
sends in the store, per job (:data:`STRAY` control entries), where
:func:`stray_sends` reads them for status, the dashboard and the metrics.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from .clock import SystemClock
from .control import DEFINED
from .errors import ConfigurationError, Conflict, DispatchFailed, is_bug
from .errors import SkipWork as SkipWork  # defined with every error; importable here as before
from .pauses import PauseReason, failed_reason, pause_for
from .slots import record_job
from .store import ControlStore, LeaseStore, RunState, Store
from .urls import open_store

if TYPE_CHECKING:
    from .jobs import Run
    from .scheduler import Scheduler

log = logging.getLogger(__name__)

#: How long a sent message may wait for a worker by default, in seconds.
DEFAULT_PICKUP = 300.0
#: By how much (seconds) a pickup lease must exceed the job's own lease.
PICKUP_MARGIN = 1.0


def check_pickup(pickup: float, lease: float, *, name: str = "pickup") -> None:
    """Refuse a pickup lease that is not longer than the job's ``lease`` by a second.

    Backups read the hand-off from the store's record (state ``dispatched``),
    not from lease lengths; but a message must be given at least as long to
    reach a worker as the worker is given to renew, or work queued behind a
    busy worker would be given up as never picked up.
    """
    if pickup <= lease + PICKUP_MARGIN:
        raise ConfigurationError(
            f"{name}={pickup:g} must exceed the lease ({lease:g}s) by more than a second"
        )


@dataclass(frozen=True)
class HandOff:
    """The ticket sent with a slot's work: which slot, which attempt, and how to take it.

    ``token`` is the attempt's fencing token; ``lease`` is the job's lease
    (the worker renews with it) and ``pickup`` the lease the slot holds until
    a worker takes it. ``tracked`` is false when the dispatcher finished the
    slot itself (dispatch-only): the worker then has nothing to take.
    ``sent_by`` names the dispatching instance.
    """

    namespace: str
    job: str
    slot_id: str
    attempt: int
    token: int
    tracked: bool
    lease: float
    pickup: float
    sent_by: str = ""
    #: The job is paused on every instance if this work ends failed (``pause_on_failure``).
    pause_on_failure: bool = False

    @classmethod
    def for_run(cls, engine: Scheduler, run: Run, *, pickup: float, tracked: bool) -> HandOff:
        """The ticket of ``run``, a slot ``engine`` won, to send with the slot's work."""
        job = engine.job_named(run.job)
        return cls(
            namespace=engine.namespace,
            job=run.key,
            slot_id=run.slot_id,
            attempt=run.attempt,
            token=run.token,
            tracked=tracked,
            lease=job.options.lease,
            pickup=pickup,
            sent_by=engine.instance,
            pause_on_failure=job.rules.pause_on_failure,
        )

    def to_message(self) -> dict[str, Any]:
        """The ticket as sent in a message (a Celery header, a Dramatiq option).

        ``pause_on_failure`` is sent only when set: a ticket without it reads
        the same in every release.
        """
        info = asdict(self)
        if not self.pause_on_failure:
            del info["pause_on_failure"]
        return info

    @classmethod
    def from_message(cls, info: Mapping[str, Any]) -> HandOff:
        """The ticket a message carries (``pickup`` defaults to ``lease``)."""
        lease = float(info["lease"])
        return cls(
            namespace=str(info["namespace"]),
            job=str(info["job"]),
            slot_id=str(info["slot_id"]),
            attempt=int(info["attempt"]),
            token=int(info["token"]),
            tracked=bool(info.get("tracked")),
            lease=lease,
            pickup=float(info.get("pickup", lease)),
            sent_by=str(info.get("sent_by", "")),
            pause_on_failure=info.get("pause_on_failure") is True,
        )


def tracked_ticket(info: Any) -> HandOff | None:
    """The ticket of a message whose worker must take the slot's lease, else None."""
    if not isinstance(info, dict) or not info.get("tracked"):
        return None
    return HandOff.from_message(info)


_NOT_FINISHED = "anarchon: could not finish %s: %s"

#: What a dispatcher sends with the ticket: built before the hand-off, sent after it.
P = TypeVar("P")


def dispatch(
    engine: Scheduler,
    run: Run,
    *,
    pickup: float,
    tracked: bool,
    prepare: Callable[[HandOff], P],
    send: Callable[[P], object],
    broker_errors: tuple[type[BaseException], ...],
    cause: Callable[[BaseException], BaseException] = lambda exc: exc,
) -> None:
    """Hand ``run``'s work off: the ticket, the hand-off, the send, in that order.

    The one dispatch path of the Celery and Dramatiq integrations. ``prepare``
    builds what is sent with the ticket (it may connect to the broker);
    then, if ``tracked``, the slot is handed off with the ``pickup`` lease
    (:meth:`Run.hand_off <anarchon_core.Run.hand_off>`: the worker that takes
    the ticket renews and finishes it from now on); then ``send`` sends it.
    An error of either step whose ``cause`` (by default the error itself) is
    one of ``broker_errors`` means the broker could not be reached and
    nothing was sent: it becomes :class:`~anarchon_core.DispatchFailed`, so
    that another attempt sends the slot within its catch-up window. Any
    other error propagates as it is (the slot fails).
    """
    ticket = HandOff.for_run(engine, run, pickup=pickup, tracked=tracked)
    try:
        prepared = prepare(ticket)
        if ticket.tracked:
            run.hand_off(ticket.pickup)
        send(prepared)
    except DispatchFailed:
        raise
    except Exception as exc:
        found = cause(exc)
        if isinstance(found, broker_errors):
            raise DispatchFailed(f"the broker is unreachable: {found}") from exc
        raise


class Executions:
    """The worker side of one process: its stores, and the leases its running work holds.

    The one owner of both, each change under its one lock: work runs in
    several threads of a worker process (Celery's thread pools, Dramatiq's
    worker threads), and a shutdown hook releases what they hold from yet
    another. :func:`store_for`, :func:`take`, :func:`release_all` and
    :func:`close_stores` act on the process's own (:data:`EXECUTIONS`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, str], Store] = {}
        self._running: set[ExecutionLease] = set()
        #: (url, namespace, job) known to be scheduled by anarchon, and those said.
        self._scheduled: set[tuple[str, str, str]] = set()
        self._said_stray: set[tuple[str, str, str]] = set()

    def note_stray(self, url: str, namespace: str, job: str, sender: str) -> bool | None:
        """Count a send of ``job`` by a scheduler that is not anarchon's (see :func:`note_stray`).

        None if anarchon does not schedule ``job`` (nothing counted); else
        whether this process sees it for the first time (to say it once).
        """
        store = self.store_for(url, namespace)
        key = (url, namespace, job)
        with self._lock:
            known = key in self._scheduled
        if not known:
            # Recorded (a slot of it ran) or stored (a schedule defined at run time).
            controls = isinstance(store, ControlStore)
            stored = controls and DEFINED + job in store.controls(DEFINED + job)
            if store.state(job) is None and not stored:
                return None  # not anarchon's job, or not yet: asked again next time
            with self._lock:
                self._scheduled.add(key)
        if isinstance(store, ControlStore):
            _count_stray(store, job, sender, SystemClock().time())
        with self._lock:
            first = key not in self._said_stray
            self._said_stray.add(key)
        return first

    def store_for(self, url: str, namespace: str) -> Store:
        """The store for ``url`` and ``namespace``, opened once (after any fork)."""
        key = (url, namespace)
        with self._lock:
            if key not in self._stores:
                self._stores[key] = open_store(url, namespace=namespace)
            return self._stores[key]

    def add(self, lease: ExecutionLease) -> None:
        """``lease`` is held by work running now."""
        with self._lock:
            self._running.add(lease)

    def discard(self, lease: ExecutionLease) -> None:
        """``lease`` is no longer renewed here."""
        with self._lock:
            self._running.discard(lease)

    def running(self) -> list[ExecutionLease]:
        """The leases held by work running now."""
        with self._lock:
            return list(self._running)

    def release_all(self) -> None:
        """Release every lease held by running work (a cold shutdown)."""
        for lease in self.running():  # released outside the lock: each is a store call
            lease.release()

    def close_stores(self) -> None:
        """Close every store opened here (the worker shuts down); a later use opens it again."""
        with self._lock:
            stores = list(self._stores.values())
            self._stores.clear()
        for store in stores:
            try:
                store.close()
            except Exception as exc:  # a shutdown goes on; the connection dies with the process
                log.warning("anarchon: could not close the store %s: %s", store.namespace, exc)


#: This process's worker side.
EXECUTIONS = Executions()


def store_for(url: str, namespace: str) -> Store:
    """This process's store for ``url`` and ``namespace``, opened once (after any fork)."""
    return EXECUTIONS.store_for(url, namespace)


class ExecutionLease:
    """The lease of one slot's work, as the worker executing it holds it."""

    def __init__(
        self, store: LeaseStore, ticket: HandOff, executions: Executions | None = None
    ) -> None:
        self.ticket = ticket
        self.store = store
        self._executions = executions if executions is not None else EXECUTIONS
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pick_up(self) -> bool:
        """Renew with the ticket's token, then keep renewing; False if the attempt is stale."""
        ticket = self.ticket
        if not self.store.renew(ticket.job, ticket.token, ticket.lease):
            return False
        self._thread = threading.Thread(
            target=self._keep_renewing, name=f"anarchon:{ticket.slot_id}", daemon=True
        )
        self._thread.start()
        self._executions.add(self)
        return True

    def _keep_renewing(self) -> None:
        ticket = self.ticket
        while not self._stop.wait(ticket.lease / 3):
            try:
                if not self.store.renew(ticket.job, ticket.token, ticket.lease):
                    log.warning("anarchon: %s lost its lease while running", ticket.slot_id)
                    return
            except Exception as exc:  # any store error: try again at the next renewal
                _store_failed("anarchon: could not renew %s: %s", ticket.slot_id, exc)

    def stop_renewing(self) -> None:
        """Stop renewing (the work returned; its outcome may come later)."""
        self._executions.discard(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def finish(self, outcome: RunState) -> None:
        """Stop renewing and finish the slot as ``outcome``."""
        t = self.ticket
        finish = partial(self.store.finish, t.job, t.token, outcome)
        finished = self._last_step(finish, _NOT_FINISHED)
        if finished is False:
            log.warning("anarchon: %s finished after losing its lease", t.slot_id)
        elif finished and outcome is RunState.FAILED and t.pause_on_failure:
            self._pause(t)

    def _pause(self, t: HandOff) -> None:
        """Pause the job on every instance: its work ended failed (``pause_on_failure``)."""
        job = record_job(t.job)  # a backfill's or a lane's failure pauses its job
        worker = f"{socket.gethostname()}:{os.getpid()}"
        reason = PauseReason(
            job, failed_reason(t.slot_id, t.attempt), worker, time.time(), t.slot_id
        )
        try:
            if pause_for(self.store, reason):
                log.warning("anarchon: %s paused on every instance: %s", job, reason.reason)
        except Exception as exc:  # the store failed: the pause is not made, and says so
            _store_failed("anarchon: could not pause %s after its failure: %s", t.slot_id, exc)

    def keep_for_retry(self) -> None:
        """Stop renewing; dispatch the slot again with the pickup lease, for the retried message."""
        t = self.ticket
        self._last_step(partial(self.store.dispatch, t.job, t.token, t.pickup), _NOT_FINISHED)

    def release(self) -> None:
        """Release the lease at once (the process goes down mid-run): a backup runs it again."""
        t = self.ticket
        failure = "anarchon: could not hand %s over: %s"
        if self._last_step(partial(self.store.release, t.job, t.token), failure):
            log.warning("anarchon: %s handed over: stopped mid-run", t.slot_id)

    def _last_step(self, step: Callable[[], bool], failure: str) -> bool | None:
        """Stop renewing, then ``step``'s answer; None if the store failed (logged: ``failure``)."""
        self.stop_renewing()
        try:
            return step()
        except Exception as exc:  # any store error, not only "unavailable"
            _store_failed(failure, self.ticket.slot_id, exc)
            return None


def _store_failed(message: str, slot_id: str, exc: Exception) -> None:
    """Log a store call's failure: a warning, or an error with its traceback if a bug raised it.

    Either way the worker goes on (a renewal is tried again, an outcome is
    left to the lease): a bug must show, not pass for an outage.
    """
    if is_bug(exc):
        log.error(message, slot_id, exc, exc_info=exc)
    else:
        log.warning(message, slot_id, exc)


def take(url: str, ticket: HandOff) -> ExecutionLease:
    """Take the lease of handed-off work before it runs, or raise :class:`SkipWork`.

    Never runs what may have been sent again: when the store cannot be asked,
    the work is skipped too (left unpicked, it is not sent again; the job's
    next slot supersedes it). A bug raised by the store call is skipped the
    same way, and logged as an error with its traceback, not as an outage.
    """
    try:
        store = store_for(url, ticket.namespace)
        if not isinstance(store, LeaseStore):  # only work sent tracked comes here
            raise TypeError(f"{type(store).__name__} keeps no lease: the work cannot be taken")
        lease = ExecutionLease(store, ticket)
        current = lease.pick_up()
    except Exception as exc:  # the store cannot tell, so the work is skipped
        if is_bug(exc):
            _store_failed("anarchon: skipping %s, the store call failed: %s", ticket.slot_id, exc)
        else:
            log.warning("anarchon: skipping %s, the store is unavailable: %s", ticket.slot_id, exc)
        raise SkipWork(str(exc), stale=False) from exc
    if not current:
        log.warning(
            "anarchon: skipping %s attempt %s: a later attempt of this slot was sent",
            ticket.slot_id,
            ticket.attempt,
        )
        raise SkipWork("stale anarchon attempt", stale=True)
    return lease


#: The control entries counting, per job, its sends by a scheduler that is not anarchon's.
STRAY = "stray/"
#: How many times a count is tried again when another worker counted at the same moment.
_STRAY_TRIES = 8


@dataclass(frozen=True)
class StraySends:
    """A job's work sent without a ticket by a scheduler that is not anarchon's.

    ``count`` sends seen by the workers so far, the last at ``last_at``
    (Unix seconds) from ``sender`` (the sending host as the message names
    it, ``""`` if it does not).
    """

    job: str
    count: int
    last_at: float
    sender: str


def note_stray(url: str, namespace: str, job: str, sender: str) -> bool | None:
    """A worker of this process got ``job``'s work sent by a scheduler that is not anarchon's.

    If anarchon schedules ``job`` in ``namespace`` (a record or a stored
    schedule of it is in the store), the send is counted in the store
    (:func:`stray_sends`) and the answer is whether this process sees it
    for the first time, so that the integration says it once; otherwise
    nothing is counted and the answer is None.
    """
    return EXECUTIONS.note_stray(url, namespace, job, sender)


def _count_stray(store: Store, job: str, sender: str, now: float) -> None:
    """Add one send to ``job``'s count (compare-and-set: workers count at the same time)."""
    key = STRAY + job
    for _ in range(_STRAY_TRIES):
        found = store.controls(key).get(key)
        version, count = (found[0], int(json.loads(found[1])["count"])) if found else (0, 0)
        value = json.dumps({"count": count + 1, "last_at": now, "sender": sender[:200]})
        try:
            store.set_control(key, value, version)
            return
        except Conflict:
            continue
    log.info("anarchon: a send of %s by another scheduler was not counted (busy)", job)


def stray_sends(store: Store) -> list[StraySends]:
    """Per job, the sends counted by :func:`note_stray` in ``store``'s namespace, by name."""
    if not isinstance(store, ControlStore):
        return []
    found = []
    for key, (_, text) in sorted(store.controls(STRAY).items()):
        value = json.loads(text)
        found.append(
            StraySends(
                job=key[len(STRAY) :],
                count=int(value["count"]),
                last_at=float(value["last_at"]),
                sender=str(value.get("sender") or ""),
            )
        )
    return found


def release_all() -> None:
    """Release every lease held by work running in this process (a cold shutdown)."""
    EXECUTIONS.release_all()


def close_stores() -> None:
    """Close the stores this process's workers opened (call it when the worker shuts down).

    The Celery and Dramatiq integrations call it at their worker's shutdown;
    a store used afterwards is opened again.
    """
    EXECUTIONS.close_stores()
