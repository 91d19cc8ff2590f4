"""The executor's side of a handed-off run (see :meth:`anarchon_core.Run.hand_off`).

A scheduler that only dispatches work (Celery beat, a Dramatiq scheduler)
hands each slot's lease off to whoever executes the work. The integrations'
worker hooks use :class:`ExecutionLease` to take it: renew with the token
before the work runs (a refusal means a later attempt was sent: skip the
work), renew in a thread while it runs, and finish, keep (for a retry) or
release (when the process goes down mid-run) afterwards.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from .errors import AnarchonError
from .store import RunState, Store
from .urls import open_store

log = logging.getLogger(__name__)

_stores: dict[tuple[str, str], Store] = {}
_lock = threading.Lock()
#: Leases held by work running in this process, released if it goes down.
running: set[ExecutionLease] = set()


def store_for(url: str, namespace: str) -> Store:
    """This process's store for ``url`` and ``namespace``, opened once (after any fork)."""
    key = (url, namespace)
    with _lock:
        if key not in _stores:
            _stores[key] = open_store(url, namespace=namespace)
        return _stores[key]


class ExecutionLease:
    """The lease of one piece of dispatched work, as its executor holds it.

    ``info`` is what the dispatcher sent along: ``job``, ``slot_id``,
    ``token``, ``lease`` (the job's) and ``pickup`` (the hand-off lease).
    """

    def __init__(self, store: Store, info: Mapping[str, Any]) -> None:
        self.job = str(info["job"])
        self.slot_id = str(info["slot_id"])
        self.token = int(info["token"])
        self.lease = float(info["lease"])
        self.pickup = float(info.get("pickup", self.lease))
        self.store = store
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self) -> bool:
        """Take the lease for execution; False if this attempt is stale (do not run it)."""
        if not self.store.renew(self.job, self.token, self.lease):
            return False
        self._thread = threading.Thread(
            target=self._beat, name=f"anarchon:{self.slot_id}", daemon=True
        )
        self._thread.start()
        running.add(self)
        return True

    def _beat(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                if not self.store.renew(self.job, self.token, self.lease):
                    log.warning("anarchon: %s lost its lease while running", self.slot_id)
                    return
            except AnarchonError as exc:
                log.warning("anarchon: could not renew %s: %s", self.slot_id, exc)

    def pause(self) -> None:
        """Stop renewing (the work returned; its outcome may come later)."""
        running.discard(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def end(self, outcome: RunState | None) -> None:
        """Finish the slot as ``outcome``; ``None`` keeps it, with the pickup lease, for a retry."""
        self.pause()
        try:
            if outcome is None:
                self.store.renew(self.job, self.token, self.pickup)
            elif not self.store.finish(self.job, self.token, outcome):
                log.warning("anarchon: %s finished after losing its lease", self.slot_id)
        except AnarchonError as exc:
            log.warning("anarchon: could not finish %s: %s", self.slot_id, exc)

    def hand_over(self) -> None:
        """Release the lease at once (the process goes down mid-run): a backup runs it again."""
        self.pause()
        try:
            if self.store.release(self.job, self.token):
                log.warning("anarchon: %s handed over: stopped mid-run", self.slot_id)
        except AnarchonError as exc:
            log.warning("anarchon: could not hand %s over: %s", self.slot_id, exc)


class SkipWork(Exception):
    """The work must not run: its attempt is stale, or the store cannot tell."""

    def __init__(self, reason: str, *, stale: bool) -> None:
        super().__init__(reason)
        self.stale = stale


def take(url: str, info: Mapping[str, Any]) -> ExecutionLease:
    """Take the lease of dispatched work before it runs, or raise :class:`SkipWork`.

    Never runs what may have been sent again: when the store cannot be asked,
    the work is skipped too (left unpicked, it is not sent again; the job's
    next slot supersedes it).
    """
    try:
        lease = ExecutionLease(store_for(url, str(info["namespace"])), info)
        current = lease.begin()
    except AnarchonError as exc:
        log.warning("anarchon: skipping %s, the store is unavailable: %s", info["slot_id"], exc)
        raise SkipWork(str(exc), stale=False) from exc
    if not current:
        log.warning(
            "anarchon: skipping %s attempt %s: a later attempt of this slot was sent",
            info["slot_id"],
            info["attempt"],
        )
        raise SkipWork("stale anarchon attempt", stale=True)
    return lease


def hand_over_all() -> None:
    """Release every lease held by work running in this process."""
    for lease in list(running):
        lease.hand_over()
