"""The ``Anarchon`` middleware: the one users add, made of the two concerns.

::

    broker.add_middleware(Anarchon())

    @dramatiq.actor(schedule="*/5 * * * *", schedule_timezone="Europe/Paris")
    def report() -> None: ...

    @dramatiq.actor(schedule=every(10), schedule_lease=30)
    def sync() -> None: ...

:class:`Anarchon` is both :class:`~anarchon_dramatiq.hosting.SchedulerHost`
(hosting the scheduler that sends periodic actors' messages, once per slot)
and :class:`~anarchon_dramatiq.tracking.ExecutionTracking` (the worker
processing such a message holds the slot's lease). Each is a middleware of
its own, with hooks of its own: none is shared, so this class only joins
their options.
"""

from __future__ import annotations

from anarchon_core.durations import Duration
from anarchon_core.handoff import DEFAULT_PICKUP

from .declarations import OPTIONS as OPTIONS  # importable from here as before
from .hosting import BROKER_ERRORS as BROKER_ERRORS
from .hosting import SchedulerHost
from .tracking import OPTION as OPTION
from .tracking import ExecutionTracking


class Anarchon(SchedulerHost, ExecutionTracking):
    """Periodic actors sent once per slot, and execution tracking of their messages.

    ``store``: a store URL (default: the broker's own Redis/Valkey or RabbitMQ).
    ``namespace``: the store namespace (default ``"dramatiq"``). ``lease``,
    ``jitter``, ``catch_up``: defaults of every periodic actor (see
    :class:`anarchon_core.JobOptions`). ``pickup``: how long a sent message may
    wait in the queue (must exceed every lease by more than a second).
    ``scheduler=False``: only track execution; the scheduler runs elsewhere
    (``dramatiq-anarchon``). ``metrics_port``: serve Prometheus metrics,
    ``/healthz`` and ``/readyz`` from the process that runs the scheduler, on
    ``metrics_host`` (default every interface; port 0: any free port). With
    Dramatiq's own ``Prometheus`` middleware on the broker, anarchon's
    counters and histograms also appear on its exposition server (port 9191
    by default).
    """

    def __init__(
        self,
        *,
        store: str | None = None,
        namespace: str | None = None,
        lease: Duration | None = None,
        jitter: Duration | None = None,
        catch_up: Duration | None = None,
        pickup: Duration = DEFAULT_PICKUP,
        scheduler: bool = True,
        metrics_port: int | None = None,
        metrics_host: str = "0.0.0.0",  # noqa: S104 - Prometheus and the kubelet scrape the pod
        lookahead: Duration = 0.0,
    ) -> None:
        SchedulerHost.__init__(
            self,
            store=store,
            namespace=namespace,
            lease=lease,
            jitter=jitter,
            catch_up=catch_up,
            pickup=pickup,
            scheduler=scheduler,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            lookahead=lookahead,
        )
        ExecutionTracking.__init__(self, store=store)
