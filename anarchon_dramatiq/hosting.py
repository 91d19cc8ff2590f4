"""Hosting the scheduler in a ``dramatiq`` process: periodic actors sent once per slot.

Periodic actors are declared where they live, with actor options this
middleware adds to the broker (see :mod:`anarchon_dramatiq.declarations`).
Each periodic actor is an anarchon job named after the actor. The claim,
lease, takeover and catch-up logic is anarchon_core's: this module only
translates actors into jobs and sends their messages, with the slot's
hand-off ticket as the message option
:data:`~anarchon_dramatiq.tracking.OPTION` (the worker's side is
:mod:`anarchon_dramatiq.tracking`).

A periodic actor declared with ``schedule_expires`` (a stored schedule: its
message option ``schedule_expires``) sends each slot's message with
Dramatiq's ``max_age`` option set to what is left of that expiry, counted
from the slot's time (:func:`age_limit`): Dramatiq's ``AgeLimit`` middleware
drops it in the worker once the slot is that old, however late it was sent.

The ``dramatiq`` command forks several worker processes, each of which runs
this middleware. Only one of them per command runs the scheduler: the one
holding the pod lock (:mod:`anarchon_dramatiq.podlock`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import dramatiq.errors
from dramatiq import Actor, Broker, Middleware, Worker
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import AgeLimit

from anarchon_core import AnarchonError, ConfigurationError, JobOptions, Run
from anarchon_core import Scheduler as Engine
from anarchon_core.control import Definition
from anarchon_core.durations import Duration, parse_duration
from anarchon_core.engine.claims import check_lookahead
from anarchon_core.handoff import DEFAULT_PICKUP, PICKUP_MARGIN, HandOff, dispatch
from anarchon_core.jobs import DISPATCH_JITTER
from anarchon_core.metrics import Metrics
from anarchon_core.names import check_namespace
from anarchon_core.probes import OutageLog, ProbeServer, check_port, serve_beside
from anarchon_core.schedules import EPOCH
from anarchon_core.store import LeaseStore
from anarchon_core.urls import redact

from .broker_store import broker_store_url
from .declarations import EXPIRES, OPTIONS, Periodic, read_declaration, read_expires
from .podlock import LOCK_RETRY, PodLock
from .tracking import OPTION

log = logging.getLogger(__name__)


def _broker_errors() -> tuple[type[BaseException], ...]:
    """The errors of an enqueue that could not reach the broker (nothing was sent)."""
    # Dramatiq 1.18 renamed ConnectionError (the old name warns when read).
    names = vars(dramatiq.errors)
    base = names.get("BrokerConnectionError") or names["ConnectionError"]
    errors: list[type[BaseException]] = [base, OSError]
    try:  # RedisBroker lets the driver's connection errors through
        import redis.exceptions

        errors += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    except ImportError:  # pragma: no cover - a RabbitMQ-only install
        pass
    return tuple(errors)


#: What :meth:`SchedulerHost.send` reports as a dispatch failure.
BROKER_ERRORS = _broker_errors()
#: How often, in seconds, the hosting thread looks for a store that does not answer.
OUTAGE_CHECK = 1.0


def age_limit(slot_ms: int, sent_ms: int, expires: float, current: int | None = None) -> int:
    """The ``max_age`` (ms) of the message of the slot at ``slot_ms``, created at ``sent_ms``.

    Dramatiq's ``AgeLimit`` drops a message once ``max_age`` has passed since
    its ``message_timestamp`` (``sent_ms``); this limit makes that moment the
    slot's time plus ``expires`` seconds. A message created after that moment
    gets a negative limit (how long ago it expired), which ``AgeLimit`` drops
    whenever a worker takes it; one created at that very moment gets -1 ms, as
    Dramatiq reads 0 as no limit. ``current``, the limit the message would
    have without it (its own ``max_age`` option, the actor's, the
    middleware's), still holds when it comes first.
    """
    left = slot_ms + round(expires * 1000) - sent_ms
    if left == 0:
        left = -1
    return min(left, current) if current else left


def expiring_pickup(pickup: float, slot_ms: int, now_ms: int, expires: float) -> float:
    """How long the slot waits for a worker to pick up its message, sent at ``now_ms``.

    ``pickup`` at most, and no longer than the message stays processable plus
    a second (:data:`~anarchon_core.handoff.PICKUP_MARGIN`, for the clocks):
    once expired, the message is dropped unprocessed, and a slot still held
    then would only keep the actor's next slots from being sent.
    """
    left = max(0.0, (slot_ms + round(expires * 1000) - now_ms) / 1000)
    return min(pickup, left + PICKUP_MARGIN)


def _age_limited(broker: Broker) -> bool:
    """Whether ``broker`` drops expired messages (Dramatiq's ``AgeLimit`` middleware)."""
    return any(isinstance(m, AgeLimit) for m in broker.middleware)


def _current_age_limit(broker: Broker, actor: Actor[..., Any], options: Mapping[str, Any]) -> Any:
    """The ``max_age`` a message of ``actor`` with ``options`` has, as ``AgeLimit`` reads it."""
    default = next((m.max_age for m in broker.middleware if isinstance(m, AgeLimit)), None)
    return options.get("max_age") or actor.options.get("max_age", default)


class SchedulerHost(Middleware):
    """Periodic actors sent once per slot, from the scheduler this middleware hosts.

    ``store``: a store URL (default: the broker's own Redis/Valkey or RabbitMQ).
    ``namespace``: the store namespace (default ``"dramatiq"``). ``lease``,
    ``jitter``, ``catch_up``: defaults of every periodic actor (see
    :class:`anarchon_core.JobOptions`). ``pickup``: how long a sent message may
    wait in the queue (must exceed every lease by more than a second).
    ``lookahead``: claims sent that much ahead, each slot's message then sent
    at its time (default 0: off; see the engine's ``lookahead``).
    ``scheduler=False``: host no scheduler; it runs elsewhere
    (``dramatiq-anarchon``). ``metrics_port``: serve Prometheus metrics,
    ``/healthz`` and ``/readyz`` from the process that runs the scheduler, on
    ``metrics_host`` (default every interface). With Dramatiq's own
    ``Prometheus`` middleware on the broker, anarchon's counters and
    histograms also appear on its exposition server (port 9191 by default).
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
        self.lookahead = check_lookahead(lookahead)
        if metrics_port is not None:
            metrics_port = check_port(metrics_port, "metrics_port")
        if not isinstance(metrics_host, str) or not metrics_host:
            raise ConfigurationError(f"metrics_host={metrics_host!r}: expected an address")
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self._probes: ProbeServer | None = None
        self.namespace = check_namespace(namespace or "dramatiq")
        if jitter is None:
            jitter = DISPATCH_JITTER
        self.defaults = JobOptions.build(lease=lease, jitter=jitter, catch_up=catch_up)
        self.pickup = parse_duration("pickup", pickup)
        self.scheduler = scheduler
        self.periodic: dict[str, Periodic] = {}
        self.engine: Engine | None = None
        self._store = store
        self._broker: Broker | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pod_lock: PodLock | None = None

    @property
    def actor_options(self) -> set[str]:
        return set(OPTIONS)

    def store_url(self, broker: Broker) -> str:
        """``store=``, else the broker's own server."""
        return self._store or broker_store_url(broker)

    # -- declaring periodic actors --------------------------------------

    def before_declare_actor(self, broker: Broker, actor: Actor[..., Any]) -> None:
        """Validate a periodic actor's options now, so a bad one fails at import."""
        options = {k: v for k, v in actor.options.items() if k in OPTIONS}
        if not options:
            self.periodic.pop(actor.actor_name, None)
            return
        name = actor.actor_name
        self.periodic[name] = read_declaration(
            name, options, self.defaults, self.pickup, age_limited=_age_limited(broker)
        )

    # -- the scheduler --------------------------------------------------

    def build_engine(self, broker: Broker, instance: str) -> Engine:
        """An engine with one job per periodic actor, sending the actor's message."""
        defaults = self.defaults
        engine = Engine(
            self.store_url(broker),
            namespace=self.namespace,
            instance=instance,
            lease=defaults.lease,
            jitter=defaults.jitter,
            catch_up=defaults.catch_up,
            inline=True,
            resolve=lambda definition: self._stored(broker, engine, definition),
            lookahead=self.lookahead,
        )
        for spec in self.periodic.values():
            if spec.at is not None:  # a one-off: kept in the store until its time
                dispatcher = self._dispatcher(broker, engine, spec.actor_name, expires=spec.expires)
                engine.once(spec.actor_name, spec.at, dispatcher, **spec.overrides)
                continue
            engine.add_job(
                self._dispatcher(broker, engine, spec.actor_name, expires=spec.expires),
                name=spec.actor_name,
                every=spec.every,
                cron=spec.cron,
                timezone=spec.timezone,
                anchor=spec.anchor,
                start=spec.start,
                end=spec.end,
                **spec.overrides,
                **spec.rules,
            )
        return engine

    def _stored(self, broker: Broker, engine: Engine, definition: Definition) -> Any:
        """The handler of a schedule stored at run time: the actor it names, if declared here.

        Its message carries the definition's ``args`` and ``kwargs``, and its
        ``options`` as message options.
        """
        try:
            broker.get_actor(definition.handler)
        except ActorNotFound:
            return None
        return self._dispatcher(
            broker,
            engine,
            definition.handler,
            args=tuple(definition.args),
            kwargs=dict(definition.kwargs),
            options=dict(definition.options),
        )

    def _dispatcher(
        self,
        broker: Broker,
        engine: Engine,
        name: str,
        *,
        expires: float | None = None,
        **message: Any,
    ) -> Any:
        """The handler sending ``name``'s message. A stored schedule's ``schedule_expires``
        message option is its expiry (checked now), not sent as a message option."""
        options = message.get("options")
        if options and EXPIRES in options:
            options = dict(options)
            expires = read_expires(options.pop(EXPIRES), _age_limited(broker))
            message["options"] = options

        def dispatch(run: Run) -> None:
            self.send(broker, engine, name, run, expires=expires, **message)

        dispatch.__name__ = f"send {name}"
        return dispatch

    def send(
        self,
        broker: Broker,
        engine: Engine,
        name: str,
        run: Run,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
        expires: float | None = None,
    ) -> None:
        """Send the actor's message for ``run``: its ``anarchon`` option names slot and attempt.

        With ``expires`` (seconds), the message's ``max_age`` ends that long
        after the slot's time (:func:`age_limit`; a backfill's slots, run late on
        purpose, are sent without it). A broker that cannot be reached raises
        :class:`~anarchon_core.DispatchFailed`: the slot is not failed but sent
        again by another attempt within its catch-up window.
        """
        actor = broker.get_actor(name)
        pickup = self.pickup
        slot_ms: int | None = None
        if expires is not None and run.key == run.job:
            slot_ms = (run.slot - EPOCH) // timedelta(milliseconds=1)
            now_ms = int(time.time() * 1000)
            pickup = expiring_pickup(pickup, slot_ms, now_ms, expires)
            late = (now_ms - slot_ms) / 1000 - expires
            if late >= 0:
                log.warning(
                    "anarchon: %s attempt %d sent %.3fs past its expiry (%s=%gs):"
                    " the workers drop its message",
                    run.slot_id,
                    run.attempt,
                    late,
                    EXPIRES,
                    expires,
                )

        def prepare(ticket: HandOff) -> Any:
            message_options = {**(options or {}), OPTION: ticket.to_message()}
            message = actor.message_with_options(args=args, kwargs=kwargs or {}, **message_options)
            if slot_ms is None or expires is None:
                return message
            current = _current_age_limit(broker, actor, message_options)
            max_age = age_limit(slot_ms, message.message_timestamp, expires, current)
            return message.copy(options={**message.options, "max_age": max_age})

        dispatch(
            engine,
            run,
            pickup=pickup,
            tracked=isinstance(engine.store, LeaseStore),
            prepare=prepare,
            send=broker.enqueue,
            broker_errors=BROKER_ERRORS,
        )

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        """Every actor module is imported: the process holding the pod lock runs the engine.

        Also with no periodic actor declared: schedules stored at run time
        (``dramatiq-anarchon add``) name actors too.
        """
        self._broker = broker
        if not self.scheduler:
            return
        self._pod_lock = PodLock.of_this_command(self.namespace, self.store_url(broker))
        self._stop.clear()
        self._thread = threading.Thread(target=self._hold, name="anarchon-pod-lock", daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        assert self._pod_lock is not None and self._broker is not None
        if not self._pod_lock.wait(self._stop):
            return
        try:
            engine = self.build_engine(self._broker, f"{socket.gethostname()}:{os.getpid()}:dq")
        except AnarchonError as exc:
            log.critical("anarchon: the scheduler cannot start: %s", exc)
            self._pod_lock.release()
            return
        with self._lock:
            if self._stop.is_set():
                engine.stop(timeout=0)
                self._pod_lock.release()
                return
            self.engine = engine
            engine.start()
            try:
                self._serve_metrics(self._broker, engine)
            except AnarchonError as exc:  # the scheduler goes on without them
                log.error("anarchon: cannot serve metrics: %s", exc)
        url = self.store_url(self._broker)
        log.info(
            "anarchon: scheduler running in process %d: %d periodic actors, store %s, namespace %s",
            os.getpid(),
            len(self.periodic),
            redact(url),
            self.namespace,
        )
        # From here on, this thread only watches for a store that does not answer.
        outage = OutageLog(engine, url)
        while not self._stop.wait(OUTAGE_CHECK):
            outage.check()

    def _serve_metrics(self, broker: Broker, engine: Engine) -> None:
        """Serve metrics and probes on ``metrics_port``; count into Dramatiq's Prometheus
        exposition when its middleware is on the broker (its multiprocess files)."""
        if self.metrics_port is not None:
            self._probes = serve_beside(engine, self.metrics_port, self.metrics_host)
        elif any(type(m).__name__ == "Prometheus" for m in broker.middleware):
            Metrics(engine)

    def before_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        """Hand the held slots over to another instance and let another process lock."""
        self._stop.set()
        probes, self._probes = self._probes, None
        if probes is not None:
            probes.close()
        with self._lock:
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.stop(timeout=1.0)
        if self._thread is not None:
            self._thread.join(LOCK_RETRY + 1)
        if self._pod_lock is not None:
            self._pod_lock.release()
