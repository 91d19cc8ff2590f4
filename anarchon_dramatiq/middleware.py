"""The ``Anarchon`` middleware: periodic actors, one scheduler per pod, execution tracking.

Periodic actors are declared where they live, with actor options the
middleware adds to the broker::

    broker.add_middleware(Anarchon())

    @dramatiq.actor(schedule="*/5 * * * *", schedule_timezone="Europe/Paris")
    def report() -> None: ...

    @dramatiq.actor(schedule=every(10), schedule_lease=30)
    def sync() -> None: ...

Each periodic actor is an anarchon job named after the actor. The claim,
lease, takeover and catch-up logic is anarchon_core's: this module only
translates actors into jobs and sends their messages.

The ``dramatiq`` command forks several worker processes, each of which runs
this middleware. Only one of them per command runs the scheduler: the one
holding an exclusive ``flock`` on a lock file named after the command's
process id (the worker processes' parent). The kernel drops the lock when its
holder dies; the other processes retry it every few seconds and take over.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from dramatiq import Actor, Broker, Middleware, Worker
from dramatiq.middleware import MiddlewareError, Retries, SkipMessage

from anarchon_core import AnarchonError, ConfigurationError, Job, JobOptions, Run, RunState
from anarchon_core import Scheduler as Engine
from anarchon_core.handoff import (
    DEFAULT_PICKUP,
    ExecutionLease,
    HandOff,
    SkipWork,
    check_pickup,
    take,
    tracked_ticket,
)
from anarchon_core.jobs import Duration, parse_duration
from anarchon_core.schedules import make_schedule
from anarchon_core.urls import check_namespace, redact

log = logging.getLogger(__name__)

#: The message option carrying the hand-off ticket.
OPTION = "anarchon"
#: How often worker processes without the pod lock try to take it.
LOCK_RETRY = 2.0
#: Actor option -> job option.
OVERRIDES = {
    "schedule_lease": "lease",
    "schedule_jitter": "jitter",
    "schedule_catch_up": "catch_up",
}
OPTIONS = frozenset({"schedule", "schedule_timezone", *OVERRIDES})


class ScheduleError(ConfigurationError, MiddlewareError):
    """A periodic actor's declaration is invalid (raised at import, naming the actor).

    Also a Dramatiq ``MiddlewareError``: Dramatiq lets only those out of its hooks.
    """


@dataclass(frozen=True)
class Interval:
    """A fixed-interval schedule: every ``seconds``, on a grid anchored at ``anchor``.

    The default anchor is the Unix epoch, the same on every instance.
    """

    seconds: float | timedelta
    anchor: datetime | None = None


def every(seconds: float | timedelta, *, anchor: datetime | None = None) -> Interval:
    """``schedule=every(10)``: every ten seconds (see :class:`Interval`)."""
    return Interval(seconds, anchor)


@dataclass(frozen=True)
class Periodic:
    """One periodic actor, validated: what the engine needs to schedule it."""

    actor_name: str
    every: float | timedelta | None
    anchor: datetime | None
    cron: str | None
    timezone: str | None
    overrides: dict[str, Duration] = field(default_factory=dict)


def broker_store_url(broker: Broker) -> str:
    """The URL of the broker's own Redis/Valkey or RabbitMQ server, as a store URL."""
    pool = getattr(getattr(broker, "client", None), "connection_pool", None)
    if pool is not None:
        kw = pool.connection_kwargs
        if "path" not in kw:
            scheme = "rediss" if pool.connection_class.__name__ == "SSLConnection" else "redis"
            return f"{scheme}://{_userinfo(kw.get('username'), kw.get('password'))}" + (
                f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
            )
    parameters: Any = getattr(broker, "parameters", None)
    if isinstance(parameters, list) and parameters:
        parameters = parameters[0]
    if parameters is not None and hasattr(parameters, "virtual_host"):
        creds = getattr(parameters, "credentials", None)
        scheme = "amqps" if getattr(parameters, "ssl_options", None) else "amqp"
        userinfo = _userinfo(getattr(creds, "username", None), getattr(creds, "password", None))
        vhost = quote(parameters.virtual_host, safe="")
        return f"{scheme}://{userinfo}{parameters.host}:{parameters.port}/{vhost}"
    raise ConfigurationError(
        f"Anarchon(store=None): the broker ({type(broker).__name__}) cannot serve as the store:"
        " pass store= a store URL (redis://, postgresql://, nats://, ...)"
    )


def _userinfo(user: str | None, password: str | None) -> str:
    if not user and not password:
        return ""
    return f"{quote(user or '', safe='')}:{quote(password or '', safe='')}@"


class PodLock:
    """An exclusive, non-blocking ``flock`` on a file: held by one process, freed on death."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the lock


class Anarchon(Middleware):
    """Periodic actors sent once per slot, and execution tracking of their messages.

    ``store``: a store URL (default: the broker's own Redis/Valkey or RabbitMQ).
    ``namespace``: the store namespace (default ``"dramatiq"``). ``lease``,
    ``jitter``, ``catch_up``: defaults of every periodic actor (see
    :class:`anarchon_core.JobOptions`). ``pickup``: how long a sent message may
    wait in the queue (must exceed every lease by more than a second).
    ``scheduler=False``: only track execution; the scheduler runs elsewhere
    (``dramatiq-anarchon``).
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
    ) -> None:
        self.namespace = check_namespace(namespace or "dramatiq")
        self.defaults = JobOptions.build(lease=lease, jitter=jitter, catch_up=catch_up)
        self.pickup = parse_duration("pickup", pickup)
        self.scheduler = scheduler
        self.periodic: dict[str, Periodic] = {}
        self.engine: Engine | None = None
        self._store = store
        self._broker: Broker | None = None
        #: Tracked messages being processed: their lease, and whether the actor raised.
        self._leases: dict[int, tuple[ExecutionLease, bool]] = {}
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
        try:
            self.periodic[actor.actor_name] = self._read(actor.actor_name, options)
        except ConfigurationError as exc:
            raise ScheduleError(f"actor {actor.actor_name!r}: {exc}") from None

    def _read(self, name: str, options: dict[str, Any]) -> Periodic:
        value = options.get("schedule")
        if value is None:
            raise ConfigurationError(f"{', '.join(sorted(options))} given without schedule=")
        timezone = options.get("schedule_timezone")
        if isinstance(value, Interval):
            spec = Periodic(name, value.seconds, value.anchor, None, timezone)
        elif isinstance(value, str):
            spec = Periodic(name, None, None, value, timezone)
        else:
            raise ConfigurationError(
                f"schedule={value!r}: expected a cron string ('*/5 * * * *') or every(seconds)"
            )
        overrides = {OVERRIDES[k]: v for k, v in options.items() if k in OVERRIDES}
        schedule = make_schedule(
            every=spec.every, cron=spec.cron, timezone=spec.timezone, anchor=spec.anchor
        )
        job = Job(name, _noop, schedule, self.defaults.merged(**overrides))
        check_pickup(self.pickup, job.options.lease)
        return Periodic(name, spec.every, spec.anchor, spec.cron, spec.timezone, overrides)

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
        )
        for spec in self.periodic.values():
            engine.add_job(
                self._dispatcher(broker, engine, spec.actor_name),
                name=spec.actor_name,
                every=spec.every,
                cron=spec.cron,
                timezone=spec.timezone,
                anchor=spec.anchor,
                **spec.overrides,
            )
        return engine

    def _dispatcher(self, broker: Broker, engine: Engine, name: str) -> Any:
        def dispatch(run: Run) -> None:
            self.send(broker, engine, name, run)

        dispatch.__name__ = f"send {name}"
        return dispatch

    def send(self, broker: Broker, engine: Engine, name: str, run: Run) -> None:
        """Send the actor's message for ``run``: its ``anarchon`` option names slot and attempt."""
        ticket = HandOff.for_run(
            engine, run, pickup=self.pickup, tracked=engine.store.supports_lease
        )
        message = broker.get_actor(name).message_with_options(
            args=(), kwargs={}, **{OPTION: ticket.to_message()}
        )
        if ticket.tracked:
            # The worker that processes the message renews and finishes the slot from now on.
            run.hand_off(ticket.pickup)
        broker.enqueue(message)

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        """Every actor module is imported: the process holding the pod lock runs the engine."""
        self._broker = broker
        if not self.scheduler or not self.periodic:
            return
        digest = hashlib.sha256(
            f"{self.namespace}|{self.store_url(broker)}|{os.getppid()}".encode()
        ).hexdigest()[:16]
        self._pod_lock = PodLock(os.path.join(tempfile.gettempdir(), f"anarchon-dq-{digest}.lock"))
        self._stop.clear()
        self._thread = threading.Thread(target=self._hold, name="anarchon-pod-lock", daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        assert self._pod_lock is not None and self._broker is not None
        while not self._pod_lock.acquire():
            if self._stop.wait(LOCK_RETRY):
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
        log.info(
            "anarchon: scheduler running in process %d: %d periodic actors, store %s, namespace %s",
            os.getpid(),
            len(self.periodic),
            redact(self.store_url(self._broker)),
            self.namespace,
        )

    def before_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        """Hand the held slots over to another instance and let another process lock."""
        self._stop.set()
        with self._lock:
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.stop(timeout=1.0)
        if self._thread is not None:
            self._thread.join(LOCK_RETRY + 1)
        if self._pod_lock is not None:
            self._pod_lock.release()

    # -- execution tracking ---------------------------------------------

    def before_process_message(self, broker: Broker, message: Any) -> None:
        """Take the slot's lease with the message's token; skip a stale attempt."""
        ticket = tracked_ticket(message.options.get(OPTION))
        if ticket is None:
            return
        try:
            lease = take(self.store_url(broker), ticket)
        except SkipWork as skip:
            raise SkipMessage(str(skip)) from skip
        with self._lock:
            self._leases[id(message)] = (lease, False)

    def after_process_message(
        self, broker: Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        """Stop renewing; the ack (done, or retried) or nack (failed) decides the outcome."""
        with self._lock:
            held = self._leases.get(id(message))
            if held is not None:
                self._leases[id(message)] = (held[0], exception is not None)
        if held is not None:
            held[0].stop_renewing()

    def after_ack(self, broker: Broker, message: Any) -> None:
        with self._lock:
            held = self._leases.pop(id(message), None)
        if held is not None:
            lease, raised = held
            if raised and any(isinstance(m, Retries) for m in broker.middleware):
                lease.keep_for_retry()
            else:
                lease.finish(RunState.FAILED if raised else RunState.DONE)

    def after_nack(self, broker: Broker, message: Any) -> None:
        with self._lock:
            held = self._leases.pop(id(message), None)
        if held is not None:
            held[0].finish(RunState.FAILED)


def _noop() -> None:
    """The placeholder handler used to validate a declaration."""
