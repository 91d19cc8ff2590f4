"""``beat_scheduler = "anarchon_celery:Scheduler"``: beat in every pod, each slot sent once.

Every beat instance runs this scheduler. Each ``beat_schedule`` entry is an
anarchon job; at each slot the instances race to claim it in the store, and
only the winner sends the task. The claim, lease, takeover and catch-up logic
is anarchon_core's: this module only translates beat's world into jobs and
sends the task.

Settings (all optional but the store, which defaults to the broker itself when
the broker is Redis/Valkey or RabbitMQ):

``anarchon_store``      store URL (``redis://``, ``postgresql://``, ...)
``anarchon_namespace``  default: the app's name (``app.main``), else ``celery``
``anarchon_lease``      seconds a claim holds without renewal (default 10)
``anarchon_jitter``     bound of the random delay before claiming (default 1)
``anarchon_catch_up``   how late a slot may still be sent (default: one interval, at most 1 h)
``anarchon_tracking``   whether workers track execution (default True, see tracking.py)
``anarchon_pickup``     how long a sent task may wait in the queue before a backup
                        sends it again as the next attempt (default 300 s)
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import Celery, signals
from celery import beat as celery_beat

from anarchon_core import AnarchonError, ConfigurationError, Run
from anarchon_core import Scheduler as Engine
from anarchon_core.jobs import parse_duration
from anarchon_core.urls import redact

from .schedules import Entry, read_entry
from .tracking import HEADER, WorkerCheck, task_id

log = logging.getLogger(__name__)

#: Broker URL schemes whose server can also serve as the store.
BROKER_STORES = {
    "redis": "redis",
    "rediss": "rediss",
    "valkey": "valkey",
    "valkeys": "valkeys",
    "amqp": "amqp",
    "amqps": "amqps",
    "pyamqp": "amqp",
    "librabbitmq": "amqp",
}
DEFAULT_PICKUP = 300.0


def store_url(app: Celery) -> str:
    """``anarchon_store``, else the broker's URL when the broker can serve as a store."""
    configured = app.conf.get("anarchon_store")
    if configured:
        return str(configured)
    broker = app.conf.broker_url or "amqp://guest:guest@localhost:5672//"
    if isinstance(broker, (list, tuple)):
        broker = broker[0]
    broker = str(broker).split(";", 1)[0].strip()
    scheme, _, rest = broker.partition("://")
    if scheme.lower() in BROKER_STORES:
        return f"{BROKER_STORES[scheme.lower()]}://{rest}"
    raise ConfigurationError(
        f"anarchon_store is not set and the broker ({redact(broker)}) cannot serve as the"
        " store: set anarchon_store to a store URL (redis://, postgresql://, nats://, ...)"
    )


_embedded = False


@signals.beat_embedded_init.connect  # type: ignore[untyped-decorator]
def _on_embedded(**_: Any) -> None:
    global _embedded
    _embedded = True


def namespace_of(app: Celery) -> str:
    return str(app.conf.get("anarchon_namespace") or app.main or "celery")


class Scheduler(celery_beat.Scheduler):  # type: ignore[misc]
    """A beat scheduler that sends each slot of each entry from one instance only."""

    def __init__(self, app: Celery, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        self.engine: Engine | None = None
        self.workers: WorkerCheck | None = None
        super().__init__(app, *args, lazy=lazy, **kwargs)

    @property
    def tracking(self) -> bool:
        """Whether slots are handed off to the workers that execute them."""
        return self.workers is not None and self.workers.tracking

    # -- beat's interface -------------------------------------------------

    def setup_schedule(self) -> None:
        """Read the settings and ``beat_schedule``; stop beat with one clear message if wrong."""
        try:
            self._setup()
        except AnarchonError as exc:
            log.critical("anarchon: beat cannot start: %s", exc)
            raise SystemExit(1) from None

    def _setup(self) -> None:
        self._parent = os.getppid()
        app = self.app
        conf = app.conf
        timezone = str(conf.timezone or "UTC")
        entries = [read_entry(n, e, timezone) for n, e in (conf.beat_schedule or {}).items()]
        self.pickup = parse_duration("anarchon_pickup", conf.get("anarchon_pickup", DEFAULT_PICKUP))
        engine = Engine(
            store_url(app),
            namespace=namespace_of(app),
            instance=f"{socket.gethostname()}:{os.getpid()}:beat",
            lease=conf.get("anarchon_lease"),
            jitter=conf.get("anarchon_jitter"),
            catch_up=conf.get("anarchon_catch_up"),
            inline=True,
        )
        try:
            for entry in entries:
                try:
                    engine.add_job(
                        self._dispatcher(entry),
                        name=entry.name,
                        every=entry.every,
                        cron=entry.cron,
                        timezone=entry.timezone,
                        **entry.overrides,
                    )
                except ConfigurationError as exc:
                    raise ConfigurationError(f"beat_schedule[{entry.name!r}]: {exc}") from None
                lease = engine.jobs[entry.name].options.lease
                if self.pickup <= lease + 1:
                    # Backups tell a queued task from a running one by the lease length.
                    raise ConfigurationError(
                        f"beat_schedule[{entry.name!r}]: anarchon_pickup={self.pickup:g} must"
                        f" exceed the lease ({lease:g}s) by more than a second"
                    )
        except Exception:
            engine.stop(timeout=0)
            raise
        self.workers = None
        if conf.get("anarchon_tracking", True) and engine.store.supports_lease:
            self.workers = WorkerCheck(app).start()
        self.engine = engine
        log.info(
            "anarchon: %d entries, store %s, namespace %s, execution tracking %s",
            len(entries),
            redact(store_url(app)),
            engine.namespace,
            "when every worker has it" if self.workers else "off",
        )

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Claim and send whatever is due; return the seconds beat may sleep."""
        if self.engine is None:
            return float(self.max_interval)
        if _embedded and os.getppid() != self._parent:
            # The worker that started this beat (-B) is gone: a beat must not outlive its pod.
            log.warning("anarchon: the worker of this embedded beat is gone; stopping beat")
            raise SystemExit(0)
        try:
            delay = self.engine.run_pending()
        except Exception:  # beat must keep ticking; the engine logs store trouble itself
            log.exception("anarchon: scheduling step failed")
            delay = 1.0
        return max(0.0, min(delay, float(self.max_interval)))

    def close(self) -> None:
        """Hand held slots over to another instance, then release beat's resources."""
        engine, self.engine = self.engine, None
        if self.workers is not None:
            self.workers.stop()
        if engine is not None:
            engine.stop(timeout=1.0)
        super().close()

    def sync(self) -> None:
        """Nothing to write: the state lives in the store."""

    @property
    def info(self) -> str:
        try:
            where = redact(store_url(self.app))
        except ConfigurationError:
            where = "(not configured)"  # setup_schedule says what is wrong, once
        return f"    . anarchon store -> {where} (namespace {namespace_of(self.app)})"

    # -- sending a slot ---------------------------------------------------

    def _dispatcher(self, entry: Entry) -> Any:
        def dispatch(run: Run) -> None:
            self.send(entry, run)

        dispatch.__name__ = f"send {entry.task}"
        return dispatch

    def send(self, entry: Entry, run: Run) -> None:
        """Send ``entry``'s task for ``run``: task id and headers name the slot and attempt."""
        assert self.engine is not None
        options = dict(entry.options)
        headers = dict(options.pop("headers", None) or {})
        headers["celery_beat_task"] = True
        tracked = self.tracking
        headers[HEADER] = {
            "namespace": self.engine.namespace,
            "job": run.job,
            "slot_id": run.slot_id,
            "attempt": run.attempt,
            "token": run.token,
            "tracked": tracked,
            "lease": self.engine.jobs[run.job].options.lease,
            "pickup": self.pickup,
            "sent_by": self.engine.instance,
        }
        ident = task_id(self.engine.namespace, run.slot_id, run.attempt)
        if tracked:
            # The worker that runs the task renews and finishes the slot from now on.
            run.hand_off(self.pickup)
        task = self.app.tasks.get(entry.task)
        if task is not None:
            task.apply_async(entry.args, entry.kwargs, task_id=ident, headers=headers, **options)
        else:
            self.app.send_task(
                entry.task, entry.args, entry.kwargs, task_id=ident, headers=headers, **options
            )
