"""Prometheus metrics of one scheduler (the ``metrics`` extra: ``prometheus_client``).

:class:`Metrics` turns the scheduler's events into counters and histograms
as they happen, and reads its gauges from the scheduler and the store each
time it is scraped. Every metric is labelled by ``namespace`` and ``job``
only (event kinds are fixed): no slot ids, no instance names, so the number
of series is bounded by the number of jobs. Each instance serves its own;
Prometheus adds the ``instance`` label of the pod it scrapes.

Serve them with :func:`anarchon_core.probes.serve`, beside ``/healthz`` and
``/readyz``; or register them in a registry of your own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .errors import MissingDependency
from .events import Event, EventKind
from .handoff import stray_sends
from .slots import Slot
from .store import LeaseStore

if TYPE_CHECKING:
    from .scheduler import Scheduler

#: The counters, by the event kinds that move them: (name, help, kinds).
COUNTERS: tuple[tuple[str, str, tuple[EventKind, ...]], ...] = (
    (
        "anarchon_slots_won",
        "Slots this instance won (on time, as a catch-up, or asked to run now).",
        (EventKind.WON, EventKind.CATCH_UP, EventKind.MANUAL),
    ),
    (
        "anarchon_slots_taken_over",
        "Slots this instance took over from another attempt (lease lapsed or handed over).",
        (EventKind.TAKEOVER,),
    ),
    (
        "anarchon_runs_lost",
        "Runs of this instance that lost their lease (taken over, lapsed), or whose finish"
        " was refused.",
        (EventKind.LOST, EventKind.FINISH_REFUSED),
    ),
    (
        "anarchon_slots_missed",
        "Slots this instance reports missed: not claimed in their window, or handed off"
        " and never picked up.",
        (EventKind.MISSED,),
    ),
    (
        "anarchon_slots_overlapped",
        "Slots skipped because the previous slot still held its lease.",
        (EventKind.OVERLAP,),
    ),
    (
        "anarchon_limit_reached",
        "Claims of this instance refused because the job has run its limit of slots (it then"
        " claims the job no more).",
        (EventKind.LIMIT_REACHED,),
    ),
    (
        "anarchon_runs_failed",
        "Runs of this instance that ended as failed (the handler raised, or the dispatch failed).",
        (EventKind.FAILED, EventKind.DISPATCH_FAILED),
    ),
    (
        "anarchon_jobs_paused_on_failure",
        "Times this instance paused a pause_on_failure job after one of its runs ended failed.",
        (EventKind.PAUSED_ON_FAILURE,),
    ),
    (
        "anarchon_slots_dispatched",
        "Runs this instance handed off to a worker (Celery, Dramatiq).",
        (EventKind.DISPATCHED,),
    ),
    (
        "anarchon_runs_finished",
        "Runs of this instance that ended as done.",
        (EventKind.FINISHED,),
    ),
)
#: Kinds that tell of one lost run (both may come for the same run).
_LOSSES = (EventKind.LOST, EventKind.FINISH_REFUSED)
#: Kinds that start a run here: lateness is measured from the slot's time.
_STARTS = (EventKind.WON, EventKind.CATCH_UP, EventKind.MANUAL, EventKind.TAKEOVER)
#: Kinds that end a run started here: its duration is measured.
_ENDS = (
    EventKind.FINISHED,
    EventKind.FAILED,
    EventKind.DISPATCHED,
    EventKind.DISPATCH_FAILED,
    EventKind.LOST,
    EventKind.FINISH_REFUSED,
    EventKind.HANDED_OVER,
)
#: Buckets of claim lateness and of run duration, in seconds.
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise MissingDependency(
            "metrics need prometheus_client: pip install 'anarchon[metrics]'"
        ) from exc
    return prometheus_client


class Metrics:
    """The metrics of ``scheduler``, registered in ``registry`` (default: a new one).

    Counters (``*_total``) and histograms move with the scheduler's events;
    the gauges are read when collected: the next slot of each job declared
    here, the lease this instance still holds on its runs, and each job's
    last success (from the store's counts, fleet-wide; left out while the
    store does not answer).
    """

    def __init__(self, scheduler: Scheduler, registry: Any = None) -> None:
        prom = _prometheus()
        self.scheduler = scheduler
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self._ns = scheduler.namespace
        labels = ("namespace", "job")
        self._counters: dict[EventKind, Any] = {}
        for name, text, kinds in COUNTERS:
            counter = prom.Counter(name, text, labels, registry=self.registry)
            for kind in kinds:
                self._counters[kind] = counter
        self.lateness = prom.Histogram(
            "anarchon_claim_lateness_seconds",
            "From a slot's time to this instance's winning claim (or takeover) of it.",
            labels,
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        self.duration = prom.Histogram(
            "anarchon_run_duration_seconds",
            "From a run's start here to its end here (finished, failed, handed off or lost).",
            labels,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Gauges(self))
        self._started: dict[tuple[str, int], float] = {}
        #: Runs counted as lost, oldest first (a bounded memory of them).
        self._lost: dict[tuple[str, int], None] = {}
        self._lock = threading.Lock()
        scheduler.add_listener(self.on_event)

    def on_event(self, event: Event) -> None:
        """Count ``event``; time the runs it starts and ends."""
        job = event.job
        if job is None:
            return
        key = (event.slot_id or "", event.attempt or 0)
        if event.kind in _LOSSES:
            with self._lock:
                if key in self._lost:  # a lost run whose finish was then refused: once
                    return
                self._lost[key] = None
                if len(self._lost) > 10_000:
                    self._lost.pop(next(iter(self._lost)))
        counter = self._counters.get(event.kind)
        if counter is not None:
            counter.labels(self._ns, job).inc()
        if event.slot_id is None or event.attempt is None:
            return
        now = self.scheduler.clock.time()
        if event.kind in _STARTS:
            slot_time = Slot.from_id(event.slot_id).ms / 1000
            self.lateness.labels(self._ns, job).observe(max(0.0, now - slot_time))
            with self._lock:
                self._started[key] = now
                if len(self._started) > 10_000:  # starts whose end was never seen
                    self._started.pop(next(iter(self._started)))
        elif event.kind in _ENDS:
            with self._lock:
                began = self._started.pop(key, None)
            if began is not None:
                self.duration.labels(self._ns, job).observe(max(0.0, now - began))


class _Gauges:
    """The gauges, read from the scheduler (and the store's counts) when collected."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def _strays(self, ns: str) -> Any:
        """Per job, its sends by a scheduler that is not anarchon's, as the workers counted them."""
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "anarchon_stray_sends",
            "Sends of a job's work by a scheduler that is not anarchon's (a stock beat left"
            " running), counted by the workers (from the store).",
            labels=["namespace", "job"],
        )
        try:
            found = stray_sends(self.metrics.scheduler.store)
        except Exception:  # the store does not answer: left out this time
            found = []
        for sent in found:
            family.add_metric([ns, sent.job], float(sent.count))
        return family

    def describe(self) -> list[Any]:
        return []  # read at each collection: nothing to check up front

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        scheduler = self.metrics.scheduler
        ns = scheduler.namespace
        labels = ["namespace", "job"]
        upcoming = scheduler.upcoming()
        next_slot = GaugeMetricFamily(
            "anarchon_next_slot_timestamp_seconds",
            "The time of each job's next slot, as this instance schedules it.",
            labels=labels,
        )
        lease = GaugeMetricFamily(
            "anarchon_lease_remaining_seconds",
            "The lease this instance surely still holds on a job's run (jobs it runs now).",
            labels=labels,
        )
        for job, (at, left) in sorted(upcoming.items()):
            if at is not None:
                next_slot.add_metric([ns, job], at)
            if left is not None:
                lease.add_metric([ns, job], left)
        yield next_slot
        yield lease
        success = GaugeMetricFamily(
            "anarchon_last_success_timestamp_seconds",
            "When each job's last run ended as done, on any instance (from the store).",
            labels=labels,
        )
        try:
            stats = (
                scheduler.store.stats(list(upcoming))
                if isinstance(scheduler.store, LeaseStore)
                else {}
            )
        except Exception:  # the store does not answer: the gauge is left out this time
            stats = {}
        for job, counts in sorted(stats.items()):
            if counts.last_success is not None:
                success.add_metric([ns, job], counts.last_success)
        yield success
        yield self._strays(ns)
        health = scheduler.health()
        alive = GaugeMetricFamily(
            "anarchon_up",
            "1 while the scheduling loop steps and the store answers it (readiness), else 0.",
            labels=["namespace"],
        )
        alive.add_metric([ns], 1.0 if health.ready else 0.0)
        yield alive
        behind = GaugeMetricFamily(
            "anarchon_behind_seconds",
            "How late this instance's own renewals and finishes ran at its last step; past a"
            " quarter of their lease, it defers its claims.",
            labels=["namespace"],
        )
        behind.add_metric([ns], health.behind)
        yield behind
        deferred = CounterMetricFamily(
            "anarchon_claims_deferred",
            "Claims and takeovers this instance deferred, being behind on its own runs.",
            labels=["namespace"],
        )
        deferred.add_metric([ns], float(health.deferred))
        yield deferred
