"""``beat_scheduler = "anarchon_celery:Scheduler"``: beat in every pod, each slot sent once.

Every beat instance runs this scheduler. Each entry of ``scheduler.schedule``
(``beat_schedule``, Celery's default entries, and entries added at run time
with ``add()`` or ``update_from_dict()``) is an anarchon job; at each slot the
instances race to claim it in the store, and only the winner sends the task,
through beat's own ``apply_entry`` and ``apply_async``. The claim, lease,
takeover and catch-up logic is anarchon_core's: this module only translates
beat's world into jobs and sends the task.

Settings (all optional but the store, which defaults to the broker itself when
the broker is Redis/Valkey or RabbitMQ):

``anarchon_store``      store URL (``redis://``, ``postgresql://``, ...)
``anarchon_namespace``  default: the app's name (``app.main``), else ``celery``
``anarchon_lease``      seconds a claim holds without renewal (default 10)
``anarchon_jitter``     bound of the random delay before claiming (default 1)
``anarchon_catch_up``   how late a slot may still be sent (default: one interval, at most 1 h)
``anarchon_tracking``   whether workers track execution (default True, see tracking.py)
``anarchon_pickup``     how long a sent task may wait in the queue for a worker
                        (default 300 s); one never picked up is not sent again

Stopping: beat's SIGTERM/SIGINT handler closes the scheduler from the signal
handler. A signal that arrives while a scheduling step runs (the step may hold
the store's connection) is held back until the step ends, then handed to the
handler that was installed, so nothing waits on the interrupted step.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from celery import Celery, signals
from celery import beat as celery_beat
from celery.beat import ScheduleEntry

from anarchon_core import AnarchonError, ConfigurationError, Run
from anarchon_core import Scheduler as Engine
from anarchon_core.handoff import DEFAULT_PICKUP, HandOff, check_pickup
from anarchon_core.jobs import Job, JobOptions, parse_duration
from anarchon_core.scheduler import MAX_SLEEP
from anarchon_core.schedules import make_schedule
from anarchon_core.urls import redact

from .schedules import Entry, read_entry, read_schedule_entry
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
#: The longest close() waits for a scheduling step running in another thread.
STEP_WAIT = 10.0


def store_url(app: Celery) -> str:
    """``anarchon_store``, else the broker's URL when the broker can serve as a store."""
    configured = app.conf.get("anarchon_store")
    if configured:
        if str(configured).partition("://")[0].lower() == "memory":
            # Each process (each beat, each worker) would open a store of its own.
            raise ConfigurationError(
                "anarchon_store=memory:// is private to one process: beats and workers would"
                " share no slot; use a shared store (a sqlite:/// file in tests)"
            )
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


def _fields(entry: ScheduleEntry) -> tuple[Any, ...]:
    """What makes an entry's job: compared to notice an entry changed in place."""
    args, kwargs, options = entry.args or (), entry.kwargs or {}, entry.options or {}
    return (
        entry.task,
        tuple(args) if isinstance(args, (list, tuple)) else args,
        dict(kwargs) if isinstance(kwargs, Mapping) else kwargs,
        dict(options) if isinstance(options, Mapping) else options,
        entry.schedule,
    )


@dataclass
class _Job:
    """An entry of ``schedule`` as scheduled: the entry, its fields then, anarchon's reading."""

    entry: ScheduleEntry
    seen: tuple[Any, ...]
    spec: Entry


class _Sending:
    """The send in progress: where beat's ``apply_async`` records its failure."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.error: BaseException | None = None


def _no_handler() -> None:
    """Stands for a job's handler while an entry is checked."""


class Scheduler(celery_beat.Scheduler):  # type: ignore[misc]
    """A beat scheduler that sends each slot of each entry from one instance only."""

    #: Beat wakes up at least once a second: the engine's longest sleep.
    max_interval = MAX_SLEEP

    def __init__(
        self,
        app: Celery,
        schedule: Any = None,
        max_interval: float | None = None,
        *args: Any,
        lazy: bool = False,
        **kwargs: Any,
    ) -> None:
        self.engine: Engine | None = None
        self.workers: WorkerCheck | None = None
        self.pickup = DEFAULT_PICKUP
        self._defaults: JobOptions | None = None
        self._jobs: dict[str, _Job] = {}
        self._refused: dict[str, tuple[Any, ...]] = {}
        self._lock = threading.RLock()
        self._stepping: int | None = None
        self._close_pending = False
        self._deferred: list[tuple[int, FrameType | None]] = []
        self._handlers: dict[int, Callable[[int, FrameType | None], Any]] = {}
        self._sending: _Sending | None = None
        self._parent = os.getppid()
        #: A loop interval the user chose (Celery's class default of 300 s is not one).
        self._max_interval_setting = max_interval or app.conf.beat_max_loop_interval
        super().__init__(app, schedule, max_interval, *args, lazy=lazy, **kwargs)

    @property
    def tracking(self) -> bool:
        """Whether slots are handed off to the workers that execute them."""
        workers = self.workers
        return workers is not None and workers.tracking

    # -- beat's interface -------------------------------------------------

    def setup_schedule(self) -> None:
        """Read the settings and the entries; stop beat with one clear message if wrong."""
        try:
            self._setup()
        except AnarchonError as exc:
            log.critical("anarchon: beat cannot start: %s", exc)
            raise SystemExit(1) from None

    def _setup(self) -> None:
        # A second setup replaces the first: its engine, store and thread must not linger.
        self._teardown()
        self._parent = os.getppid()
        app = self.app
        conf = app.conf
        self._check_settings()
        self.pickup = parse_duration("anarchon_pickup", conf.get("anarchon_pickup", DEFAULT_PICKUP))
        self._defaults = JobOptions.build(
            lease=conf.get("anarchon_lease"),
            jitter=conf.get("anarchon_jitter"),
            catch_up=conf.get("anarchon_catch_up"),
        )
        # As stock beat: beat_schedule, then Celery's default entries (backend_cleanup).
        self.merge_inplace(conf.beat_schedule or {})
        self.install_default_entries(self.schedule)
        engine = Engine(
            store_url(app),
            namespace=namespace_of(app),
            instance=f"{socket.gethostname()}:{os.getpid()}:beat",
            lease=conf.get("anarchon_lease"),
            jitter=conf.get("anarchon_jitter"),
            catch_up=conf.get("anarchon_catch_up"),
            inline=True,
        )
        with self._lock:
            self.engine = engine
            try:
                self._apply_schedule(strict=True)
            except BaseException:
                self.engine = None
                self._jobs.clear()
                engine.stop(timeout=0)
                raise
        if conf.get("anarchon_tracking", True) and engine.store.supports_lease:
            self.workers = WorkerCheck(app).start()
        self._install_signal_handlers()
        log.info(
            "anarchon: %d entries, store %s, namespace %s, execution tracking %s",
            len(self._jobs),
            redact(store_url(app)),
            engine.namespace,
            "when every worker has it" if self.workers else "off",
        )

    def _check_settings(self) -> None:
        """Refuse the beat settings that the user set and that could not take effect."""
        chosen = self._max_interval_setting
        if chosen and float(chosen) > MAX_SLEEP:
            raise ConfigurationError(
                f"a loop interval of {float(chosen):g}s (beat_max_loop_interval or"
                f" --max-interval) cannot take effect: beat checks the schedule at least every"
                f" {MAX_SLEEP:g}s with anarchon_celery; remove the setting"
            )
        if self.app.conf.get("beat_cron_starting_deadline") is not None:
            raise ConfigurationError(
                "beat_cron_starting_deadline is not supported: how late a missed slot may"
                " still be sent is set by anarchon_catch_up (for one entry, its"
                " anarchon_catch_up option); remove beat_cron_starting_deadline"
            )

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Claim and send whatever is due; return the seconds beat may sleep."""
        engine = self.engine
        if engine is None:
            return float(self.max_interval)
        if _embedded and os.getppid() != self._parent:
            # The worker that started this beat (-B) is gone: a beat must not outlive its pod.
            log.warning("anarchon: the worker of this embedded beat is gone; stopping beat")
            raise SystemExit(0)
        delay = 1.0
        ended = False
        self._stepping = threading.get_ident()
        try:
            with self._lock:
                if self.engine is engine:  # not closed while this step waited
                    try:
                        self._apply_schedule()
                    except Exception:  # the entries already scheduled must still run
                        log.exception("anarchon: reading the schedule's entries failed")
                    try:
                        delay = engine.run_pending()
                    except Exception:  # beat must keep ticking; the engine logs store trouble
                        log.exception("anarchon: scheduling step failed")
            ended = True
        finally:
            self._stepping = None
            deferred, self._deferred = self._deferred, []
            if self._close_pending:
                self._close_pending = False
                self.close()
        if ended and deferred:
            # A signal came during the step: its handler runs now (beat's closes the
            # scheduler and raises SystemExit).
            self._redispatch(*deferred[0])
        return max(0.0, min(delay, float(self.max_interval)))

    def close(self) -> None:
        """Hand held slots over to another instance, then release beat's resources."""
        if self._stepping == threading.get_ident():
            # Called inside a step of this thread (a signal handler, a send): the step
            # may hold the store's connection, so close once it ends (see tick).
            self._close_pending = True
            return
        stepped = self._lock.acquire(timeout=STEP_WAIT)
        try:
            self._teardown(hand_over=stepped)
        finally:
            if stepped:
                self._lock.release()
            super().close()  # beat's broker connection is released whatever happened

    def _teardown(self, hand_over: bool = True) -> None:
        """Stop the engine (handing its slots over), the worker check and the signal hooks."""
        self._restore_signal_handlers()
        engine, self.engine = self.engine, None
        workers, self.workers = self.workers, None
        self._jobs.clear()
        self._refused.clear()
        # The hand-over first: it is what a backup waits for; the worker check
        # may be in the middle of a broadcast, which it finishes before stopping.
        if engine is not None and hand_over:
            engine.stop(timeout=1.0)
        elif engine is not None:
            log.warning(
                "anarchon: a scheduling step still runs after %gs; closing without handing"
                " its slots over (backups take them over when their leases lapse)",
                STEP_WAIT,
            )
        if workers is not None:
            workers.stop()

    def sync(self) -> None:
        """Nothing to write: the state lives in the store."""

    @property
    def info(self) -> str:
        try:
            where = redact(store_url(self.app))
        except ConfigurationError:
            where = "(not configured)"  # setup_schedule says what is wrong, once
        return f"    . anarchon store -> {where} (namespace {namespace_of(self.app)})"

    # -- entries ------------------------------------------------------------

    def add(self, **kwargs: Any) -> ScheduleEntry:
        """Add (or replace) an entry; it is scheduled at once. Invalid: ConfigurationError."""
        name = kwargs.get("name")
        entry = self._new_entry(name, kwargs, f"entry {name!r}")
        with self._lock:
            self.schedule[entry.name] = entry
            self._apply_schedule()
        return entry

    def update_from_dict(self, dict_: Mapping[str, Any]) -> None:
        """Add or replace entries (each checked first: none is added if one is invalid)."""
        entries = {
            name: self._new_entry(name, raw, f"entry {name!r}") for name, raw in dict_.items()
        }
        with self._lock:
            self.schedule.update(entries)
            self._apply_schedule()

    def merge_inplace(self, b: Mapping[str, Any]) -> None:
        """Make the entries those of ``b`` (``beat_schedule``), each checked first."""
        entries = {name: self._new_entry(name, raw) for name, raw in b.items()}
        with self._lock:
            schedule = self.schedule
            for name in set(schedule) - set(entries):
                schedule.pop(name, None)
            for name, entry in entries.items():
                current = schedule.get(name)
                if isinstance(current, ScheduleEntry):
                    current.update(entry)
                else:
                    schedule[name] = entry
            self._apply_schedule()

    def reserve(self, entry: ScheduleEntry) -> ScheduleEntry:
        """The entry's next instance; it replaces the schedule's only for that very entry.

        ``apply_async(advance=True)`` calls this; given the copy of one send (with that
        send's task id and headers), it leaves the schedule as it is.
        """
        new_entry = next(entry)
        current = self.schedule.get(entry.name)
        if isinstance(current, ScheduleEntry) and _fields(current) == _fields(new_entry):
            self.schedule[entry.name] = new_entry
        return new_entry

    def _new_entry(self, name: Any, raw: Any, where: str = "") -> ScheduleEntry:
        """A checked ``ScheduleEntry`` from a dict of its fields or from an entry."""
        where = where or f"beat_schedule[{name!r}]"
        if isinstance(raw, ScheduleEntry):
            raw.app = self.app
            entry = raw
        else:
            # Read the raw fields first: a bad schedule fails in ScheduleEntry obscurely.
            read_entry(name, raw, self._timezone(), where=where)
            try:
                entry = self.Entry(**dict(raw, name=name, app=self.app))
            except Exception as exc:
                raise ConfigurationError(f"{where}: {exc}") from None
        self._check(entry, where)
        return entry

    def _timezone(self) -> str:
        return str(self.app.conf.timezone or "UTC")

    def _check(self, entry: ScheduleEntry, where: str) -> Entry:
        """anarchon's reading of ``entry``, or a ConfigurationError naming it."""
        spec = read_schedule_entry(entry, self._timezone(), where)
        if self._defaults is None:
            return spec  # not set up yet: the settings are checked at setup
        try:
            options = self._defaults.merged(**spec.overrides)
            schedule = make_schedule(every=spec.every, cron=spec.cron, timezone=spec.timezone)
            Job(name=spec.name, handler=_no_handler, schedule=schedule, options=options)
            check_pickup(self.pickup, options.lease, name="anarchon_pickup")
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        return spec

    def _apply_schedule(self, strict: bool = False) -> None:
        """Make the engine's jobs those of ``schedule``: add, replace and remove.

        Runs at setup, after ``add()`` and the like, and at each step (to notice
        entries changed in ``schedule`` directly). ``strict``: raise on an invalid
        entry; otherwise it is logged (once) and left unscheduled.
        """
        with self._lock:
            engine = self.engine
            if engine is None:
                return
            current = dict(self.schedule)
            for name in [n for n in self._jobs if n not in current]:
                engine.remove_job(name)
                del self._jobs[name]
                log.info("anarchon: entry %s removed", name)
            for name, entry in current.items():
                job = self._jobs.get(name)
                if isinstance(entry, ScheduleEntry):
                    seen = _fields(entry)
                    if job is not None and seen == job.seen:
                        job.entry = entry  # an equal entry (beat's reserve() replaces them)
                        continue
                    if self._refused.get(name) == seen:
                        continue
                else:
                    seen = (entry,)
                where = f"beat_schedule[{name!r}]"
                try:
                    if not isinstance(entry, ScheduleEntry):
                        got = type(entry).__name__
                        raise ConfigurationError(f"{where}: expected a ScheduleEntry, not {got}")
                    spec = self._check(entry, where)
                    if job is not None and spec == job.spec:
                        job.entry, job.seen = entry, seen
                        continue
                    if job is not None:
                        engine.remove_job(name)
                        del self._jobs[name]
                    new = _Job(entry, seen, spec)
                    try:
                        engine.add_job(
                            self._dispatcher(new, engine),
                            name=name,
                            every=spec.every,
                            cron=spec.cron,
                            timezone=spec.timezone,
                            **spec.overrides,
                        )
                    except ConfigurationError as exc:
                        raise ConfigurationError(f"{where}: {exc}") from None
                except ConfigurationError as exc:
                    if strict:
                        raise
                    self._refused[name] = seen
                    if name in self._jobs:
                        engine.remove_job(name)
                        del self._jobs[name]
                    log.error("anarchon: %s; the entry is not scheduled", exc)
                    continue
                self._refused.pop(name, None)
                self._jobs[name] = new
                if not strict:
                    log.info("anarchon: entry %s %s", name, "changed" if job else "added")

    # -- sending a slot ---------------------------------------------------

    def _dispatcher(self, job: _Job, engine: Engine) -> Callable[[Run], None]:
        def dispatch(run: Run) -> None:
            self.send(job, run, engine)

        dispatch.__name__ = f"send {job.spec.task}"
        return dispatch

    def send(self, job: _Job, run: Run, engine: Engine) -> None:
        """Send ``job``'s task for ``run`` through beat's ``apply_entry``.

        The task id and the ``anarchon`` header name the slot and the attempt. A
        send that fails (beat's ``apply_entry`` only logs it) fails the slot.
        """
        spec = job.spec
        options = dict(spec.options)
        headers = dict(options.get("headers") or {})
        headers["celery_beat_task"] = True
        ticket = HandOff.for_run(engine, run, pickup=self.pickup, tracked=self.tracking)
        headers[HEADER] = ticket.to_message()
        options["headers"] = headers
        options["task_id"] = task_id(engine.namespace, run.slot_id, run.attempt)
        entry = job.entry
        sent_at = run.slot.astimezone(self.app.timezone)
        # This send's own entry (as beat's next(entry) builds it): its options are
        # this send's, and whoever patches apply_entry may change them freely.
        sent = type(entry)(
            **dict(
                entry,
                options=options,
                last_run_at=sent_at,
                total_run_count=entry.total_run_count + 1,
            )
        )
        entry.last_run_at, entry.total_run_count = sent_at, sent.total_run_count
        producer = self.producer  # connects on the first send: a failure fails the slot
        if ticket.tracked:
            # The worker that runs the task renews and finishes the slot from now on.
            run.hand_off(ticket.pickup)
        sending = self._sending = _Sending()
        try:
            self.apply_entry(sent, producer=producer)
        finally:
            self._sending = None
        if sending.error is not None:
            raise sending.error

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Beat's send; a failure is also recorded for the slot being sent."""
        try:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        except Exception as exc:
            sending = self._sending
            if sending is not None and sending.thread == threading.get_ident():
                sending.error = sending.error or exc
            raise

    def _ensure_connected(self) -> Any:
        """Beat's broker connection for sending, tried as briefly as one publish is.

        Stock beat retries ``broker_connection_max_retries`` times (minutes); a beat
        that has won a slot would hold it all that time. A failed attempt fails the
        slot; the next send tries again.
        """
        policy = dict(self.app.conf.task_publish_retry_policy or {})

        def error(exc: Exception, interval: float) -> None:
            log.error("beat: Connection error: %s. Trying again in %s seconds...", exc, interval)

        return self.connection.ensure_connection(
            error,
            max_retries=policy.get("max_retries", 3),
            interval_start=policy.get("interval_start", 0),
            interval_step=policy.get("interval_step", 0.2),
            interval_max=policy.get("interval_max", 1),
        )

    # -- signals --------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        """Wrap the SIGTERM and SIGINT handlers so that they never run inside a step."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            current = signal.getsignal(sig)
            if current == self._on_signal or not callable(current):
                continue
            self._handlers[sig] = current
            signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, original in self._handlers.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, original)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stepping == threading.get_ident() and not self._deferred:
            # Inside a step: the handler would close the scheduler while the step may
            # hold the store's connection. It runs when the step ends.
            self._deferred.append((signum, frame))
            return
        # Not inside a step, or the same signal again while a step hangs: run it now
        # (a close() from within the step then waits for the step's end).
        self._redispatch(signum, frame)

    def _redispatch(self, signum: int, frame: FrameType | None) -> None:
        handler = self._handlers.get(signum)
        if callable(handler):
            handler(signum, frame)
