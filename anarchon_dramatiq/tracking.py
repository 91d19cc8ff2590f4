"""Execution tracking: the worker processing a slot's message holds the slot's lease.

A periodic actor's message carries the slot's hand-off ticket as the message
option :data:`OPTION` (:class:`anarchon_core.handoff.HandOff`: the slot, the
attempt and its fencing token). Before the actor runs, the worker takes the
slot's lease with the ticket's token; a stale token (another attempt of this
slot was sent since) skips the message. The lease is renewed while the actor
runs; the ack or nack decides the outcome: done, failed, or (the message
retried by Dramatiq's ``Retries``) kept for the retried message with the
pickup lease. The stores the worker opened are closed when it shuts down.
"""

from __future__ import annotations

import threading
from typing import Any

from dramatiq import Broker, Middleware, Worker
from dramatiq.middleware import Retries, SkipMessage

from anarchon_core import RunState
from anarchon_core.errors import SkipWork
from anarchon_core.handoff import ExecutionLease, close_stores, take, tracked_ticket

from .broker_store import broker_store_url

#: The message option carrying the hand-off ticket.
OPTION = "anarchon"


class ExecutionTracking(Middleware):
    """The worker side of periodic actors' messages: take, renew and finish the slot's lease.

    ``store``: the store URL (default: the broker's own Redis/Valkey or
    RabbitMQ), where the scheduler that sent the messages claims its slots.
    """

    def __init__(self, *, store: str | None = None) -> None:
        self._store = store
        #: Tracked messages being processed: their lease, and whether the actor raised.
        self._leases: dict[int, tuple[ExecutionLease, bool]] = {}
        self._leases_lock = threading.Lock()

    def store_url(self, broker: Broker) -> str:
        """``store=``, else the broker's own server."""
        return self._store or broker_store_url(broker)

    def before_process_message(self, broker: Broker, message: Any) -> None:
        """Take the slot's lease with the message's token; skip a stale attempt."""
        ticket = tracked_ticket(message.options.get(OPTION))
        if ticket is None:
            return
        try:
            lease = take(self.store_url(broker), ticket)
        except SkipWork as skip:
            raise SkipMessage(str(skip)) from skip
        with self._leases_lock:
            self._leases[id(message)] = (lease, False)

    def after_process_message(
        self, broker: Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        """Stop renewing; the ack (done, or retried) or nack (failed) decides the outcome."""
        with self._leases_lock:
            held = self._leases.get(id(message))
            if held is not None:
                self._leases[id(message)] = (held[0], exception is not None)
        if held is not None:
            held[0].stop_renewing()

    def after_ack(self, broker: Broker, message: Any) -> None:
        with self._leases_lock:
            held = self._leases.pop(id(message), None)
        if held is not None:
            lease, raised = held
            if raised and any(isinstance(m, Retries) for m in broker.middleware):
                lease.keep_for_retry()
            else:
                lease.finish(RunState.FAILED if raised else RunState.DONE)

    def after_nack(self, broker: Broker, message: Any) -> None:
        with self._leases_lock:
            held = self._leases.pop(id(message), None)
        if held is not None:
            held[0].finish(RunState.FAILED)

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        """The worker's threads have ended: close the stores they opened."""
        close_stores()
