"""``beat_scheduler = "anarchon_celery:Scheduler"``: beat in every pod, each slot sent once.

Every beat instance runs this scheduler. Each entry of ``scheduler.schedule``
(``beat_schedule``, Celery's default entries, and entries added at run time
with ``add()`` or ``update_from_dict()``) is an anarchon job (see
:mod:`anarchon_celery.entries`); at each slot the instances race to claim it
in the store, and only the winner sends the task, through beat's own
``apply_entry`` and ``apply_async``. The claim, lease, takeover and catch-up
logic is anarchon_core's: this module is beat's interface, and the sending of
a won slot. Settings: :mod:`anarchon_celery.settings`. Stopping:
:mod:`anarchon_celery.steps`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from celery import Celery, signals
from celery import beat as celery_beat
from celery.beat import ScheduleEntry, SchedulingError
from kombu.exceptions import OperationalError

from anarchon_core import AnarchonError, ConfigurationError, Run
from anarchon_core import Scheduler as Engine
from anarchon_core.control import Definition
from anarchon_core.handoff import DEFAULT_PICKUP, PICKUP_MARGIN, HandOff, dispatch
from anarchon_core.probes import OutageLog, ProbeServer, serve_beside
from anarchon_core.scheduler import MAX_SLEEP
from anarchon_core.store import LeaseStore
from anarchon_core.urls import redact

from .entries import EntryJobs, ScheduledEntry, check_entry, entry_fields
from .schedules import Entry, check_expires, expires_at, read_entry
from .settings import BeatSettings, namespace_of, read_settings, store_url, timezone_of
from .steps import Steps
from .tracking import HEADER, WorkerCheck, task_id

log = logging.getLogger(__name__)

#: The longest close() waits for a scheduling step running in another thread.
STEP_WAIT = 10.0

_embedded = False


@signals.beat_embedded_init.connect  # type: ignore[untyped-decorator]
def _on_embedded(**_: Any) -> None:
    global _embedded
    _embedded = True


def embedded() -> bool:
    """Whether this beat was started by a worker (``celery worker -B``), in a process of its own."""
    return _embedded


def _sent_cause(exc: BaseException) -> BaseException:
    """What failed in a send: beat wraps the send's error in SchedulingError."""
    inner: BaseException | None = None
    if isinstance(exc, SchedulingError):
        inner = exc.__cause__ or exc.__context__
    return inner if inner is not None else exc


def _deadline(expires: Any) -> float | None:
    """An ``expires`` option as Unix seconds, if it names an instant (aware, or ISO with offset)."""
    if isinstance(expires, str):
        with contextlib.suppress(ValueError):
            expires = datetime.fromisoformat(expires.strip())
    if not isinstance(expires, datetime) or expires.utcoffset() is None:
        return None  # none, or a naive time: each worker reads it in its own time zone
    return expires.timestamp()


#: How many entry names the startup line lists at most.
NAMED_ENTRIES = 8


def describe_entries(names: Iterable[str]) -> str:
    """The entries beat schedules, as its startup line says them: the user's, then Celery's.

    Celery adds entries of its own (``celery.backend_cleanup``): counted
    apart, so that "3 entries" never stands for a user's two.
    """
    own = sorted(n for n in names if n.startswith("celery."))
    users = sorted(n for n in names if not n.startswith("celery."))
    shown = ", ".join(users[:NAMED_ENTRIES]) + (", ..." if len(users) > NAMED_ENTRIES else "")
    said = f"{len(users)} {'entry' if len(users) == 1 else 'entries'}"
    if users:
        said += f" ({shown})"
    if own:
        said += f" and Celery's own {', '.join(own)}"
    return said


class _Sending:
    """The send in progress: where beat's ``apply_async`` records its failure."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.error: BaseException | None = None


#: Set while a scheduler of this thread is being built (see Scheduler.__init__).
_building = threading.local()


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
        #: The metrics and probes endpoint (``anarchon_metrics_port``), if served.
        self._probes: ProbeServer | None = None
        #: Says, every minute while it lasts, that the store does not answer.
        self._outage: OutageLog | None = None
        self.settings: BeatSettings | None = None
        self._entries: EntryJobs | None = None
        self._lock = threading.RLock()
        self._steps = Steps(close=self.close, lock=self._lock)
        self._sending: _Sending | None = None
        self._parent = os.getppid()
        #: close() ran: beat is stopping (set again to False by a new setup).
        self._closed = False
        #: A loop interval the user chose (Celery's class default of 300 s is not one).
        self._max_interval_setting = max_interval or app.conf.beat_max_loop_interval
        # Beat's SIGTERM handler asks its Service for the scheduler, to close it. If
        # the signal comes while that very scheduler is being built, the Service
        # builds a second one inside the handler: that one is left empty (lazy),
        # and the first one, once built, closes itself (its first tick then ends
        # beat's loop). The handler's SystemExit may end the build first (the
        # setup then tears down what it had built), or be lost inside the
        # import or compile it interrupted: the close does not depend on it.
        outer = not getattr(_building, "active", False)
        if outer:
            _building.active, _building.stop = True, False
        else:
            _building.stop = True  # asked for while the scheduler is being built
        try:
            super().__init__(app, schedule, max_interval, *args, lazy=lazy or not outer, **kwargs)
        finally:
            if outer:
                _building.active = False
        if outer and _building.stop:
            log.warning("anarchon: beat was told to stop while its scheduler was being built")
            self.close()

    @property
    def pickup(self) -> float:
        """How long a sent task may wait for a worker (``anarchon_pickup``)."""
        return self.settings.pickup if self.settings is not None else DEFAULT_PICKUP

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
            self._teardown()  # nothing claimed yet: stopping the engine closes its store
            log.critical("anarchon: beat cannot start: %s", exc)
            raise SystemExit(1) from None
        except BaseException:  # a signal's SystemExit while setting up: nothing may linger
            self._closed = True
            self._teardown()
            raise

    def _setup(self) -> None:
        # A second setup replaces the first: its engine, store and thread must not linger.
        self._teardown()
        self._closed = False
        self._parent = os.getppid()
        settings = self.settings = read_settings(self.app, self._max_interval_setting)
        # As stock beat: beat_schedule, then Celery's default entries (backend_cleanup).
        self.merge_inplace(self.app.conf.beat_schedule or {})
        self.install_default_entries(self.schedule)
        entries = self._start_engine(settings)
        engine = entries.engine
        self._outage = OutageLog(engine, store_url(self.app))
        if settings.tracking and isinstance(engine.store, LeaseStore):
            self.workers = WorkerCheck(self.app).start()
        if settings.metrics_port is not None:
            self._probes = serve_beside(engine, settings.metrics_port, settings.metrics_host)
        self._steps.install_signal_handlers()
        log.info(
            "anarchon: %s, store %s, namespace %s, execution tracking %s",
            describe_entries(entries.jobs),
            redact(store_url(self.app)),
            engine.namespace,
            "when every worker has it" if self.workers else "off",
        )

    def _start_engine(self, settings: BeatSettings) -> EntryJobs:
        """The engine and its jobs, one per entry of ``schedule`` (an invalid entry: an error)."""
        defaults = settings.defaults
        engine = Engine(
            store_url(self.app),
            namespace=namespace_of(self.app),
            instance=f"{socket.gethostname()}:{os.getpid()}:beat",
            lease=defaults.lease,
            jitter=defaults.jitter,
            catch_up=defaults.catch_up,
            inline=True,
            resolve=self._stored_entry,
            lookahead=settings.lookahead,
        )
        with self._lock:
            self.engine = engine
            entries = self._entries = EntryJobs(engine, self.app, settings, self._dispatcher)
            try:
                self._apply_schedule(strict=True)
            except BaseException:
                self.engine = self._entries = None
                engine.stop(timeout=0)
                raise
        return entries

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Claim and send whatever is due; return the seconds beat may sleep."""
        engine = self.engine
        if engine is None:
            if self._closed:
                # Beat's SIGTERM/SIGINT handler closed this scheduler, and its
                # SystemExit did not end beat's loop: raised while the main thread
                # ran a finalizer or compiled an import, it is swallowed. A closed
                # scheduler ends the loop itself.
                raise SystemExit(0)
            return float(self.max_interval)
        if _embedded and os.getppid() != self._parent:
            # The worker that started this beat (-B) is gone: a beat must not outlive its pod.
            log.warning("anarchon: the worker of this embedded beat is gone; stopping beat")
            raise SystemExit(0)
        delay = soon = 1.0
        with self._steps.step(), self._lock:
            if self.engine is engine:  # not closed while this step waited
                try:
                    self._apply_schedule()
                except Exception:  # the entries already scheduled must still run
                    log.exception("anarchon: reading the schedule's entries failed")
                try:
                    # The due times of the entries whose schedule decides them, if this
                    # beat holds their lease: claimed by the engine's step, as one-offs.
                    entries = self._entries
                    soon = entries.owners.step() if entries is not None else soon
                except Exception:
                    log.exception("anarchon: deciding the due times of entries failed")
                try:
                    delay = engine.run_pending()
                except Exception:  # beat must keep ticking; the engine logs store trouble
                    log.exception("anarchon: scheduling step failed")
                if self._outage is not None:
                    self._outage.check()
        return max(0.0, min(delay, soon, float(self.max_interval)))

    def close(self) -> None:
        """Hand held slots over to another instance, then release beat's resources."""
        if self._steps.inside:
            # Called inside a step of this thread (a signal handler, a send): the step
            # may hold the store's connection, so close once it ends.
            self._steps.close_after()
            return
        stepped = self._lock.acquire(timeout=STEP_WAIT)
        try:
            self._closed = True
            self._teardown(hand_over=stepped)
        finally:
            if stepped:
                self._lock.release()
            super().close()  # beat's broker connection is released whatever happened

    def _teardown(self, hand_over: bool = True) -> None:
        """Stop the engine (handing its slots over), the worker check and the signal hooks."""
        self._steps.restore_signal_handlers()
        probes, self._probes = self._probes, None
        if probes is not None:
            probes.close()
        engine, self.engine = self.engine, None
        workers, self.workers = self.workers, None
        self._outage = None
        entries, self._entries = self._entries, None
        # The hand-over first: it is what a backup waits for; the worker check
        # may be in the middle of a broadcast, which it finishes before stopping.
        # The owner leases go first, while the engine's store is open.
        if entries is not None and hand_over:
            try:
                entries.owners.release_all()
            except Exception:  # the engine's runs must be handed over all the same
                log.exception("anarchon: releasing the owner leases failed")
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
        if isinstance(current, ScheduleEntry) and entry_fields(current) == entry_fields(new_entry):
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
            read_entry(name, raw, timezone_of(self.app), where=where, owned=True)
            try:
                entry = self.Entry(**dict(raw, name=name, app=self.app))
            except Exception as exc:
                raise ConfigurationError(f"{where}: {exc}") from None
        check_entry(entry, where, self.app, self.settings)
        return entry

    def _apply_schedule(self, strict: bool = False) -> None:
        """Make the engine's jobs those of ``schedule`` (see :class:`EntryJobs`).

        Runs at setup, after ``add()`` and the like, and at each step (to notice
        entries changed in ``schedule`` directly).
        """
        with self._lock:
            if self._entries is not None:
                self._entries.apply(self.schedule, strict=strict)

    # -- sending a slot ---------------------------------------------------

    def _stored_entry(self, definition: Definition) -> Callable[[Run], None] | None:
        """The handler of an entry stored at run time (``celery anarchon add``).

        It sends the task named by the definition's ``handler`` with its
        ``args``, ``kwargs`` and ``options``, as beat sends an entry of
        ``beat_schedule``; the task is sent by name, so it need not be
        registered in the beat's own process (as with beat_schedule).
        """
        engine = self.engine
        if engine is None:
            return None
        every = definition.every
        entry = self.Entry(
            name=definition.name,
            task=definition.handler,
            schedule=timedelta(seconds=every if every is not None else 60),
            args=tuple(definition.args),
            kwargs=dict(definition.kwargs),
            options=dict(definition.options),
            app=self.app,
        )
        spec = Entry(
            name=definition.name,
            task=definition.handler,
            every=every,
            cron=definition.cron,
            timezone=definition.timezone,
            args=tuple(definition.args),
            kwargs=dict(definition.kwargs),
            options=dict(definition.options),
            overrides=dict(definition.job_options),
        )
        return self._dispatcher(ScheduledEntry(entry, entry_fields(entry), spec), engine)

    def _dispatcher(self, job: ScheduledEntry, engine: Engine) -> Callable[[Run], None]:
        # A stored entry's options are checked here, as beat_schedule's are when read.
        check_expires(f"job {job.spec.name!r}", job.spec.options.get("expires"))

        def dispatch(run: Run) -> None:
            self.send(job, run, engine)

        dispatch.__name__ = f"send {job.spec.task}"
        return dispatch

    def send(self, job: ScheduledEntry, run: Run, engine: Engine) -> None:
        """Send ``job``'s task for ``run`` through beat's ``apply_entry``.

        The task id and the ``anarchon`` header name the slot and the attempt;
        an ``expires`` option counts from the slot's time (:meth:`_expiry`). A
        send that fails (beat's ``apply_entry`` only logs it) fails the slot,
        except when the broker could not be reached: then nothing was sent, and
        :class:`~anarchon_core.DispatchFailed` lets another attempt send it
        within the catch-up window (from whichever beat reaches the broker).
        """
        pickup = self.pickup
        deadline = _deadline(self._sent_expiry(job, run))
        if deadline is not None:
            # A task that reaches a worker after its expiry is dropped there: the
            # slot waits for it no longer (the entry's next slots are not held up).
            left = deadline - engine.clock.time()
            pickup = min(pickup, max(0.0, left) + PICKUP_MARGIN)
            if left <= 0:
                log.warning(
                    "anarchon: %s attempt %d sent %.3fs past its expiry (%s):"
                    " the workers drop its task",
                    run.slot_id,
                    run.attempt,
                    -left,
                    datetime.fromtimestamp(deadline, timezone.utc).isoformat(),
                )
        dispatch(
            engine,
            run,
            pickup=pickup,
            tracked=self.tracking,
            prepare=lambda ticket: self._prepare(job, run, engine, ticket),
            send=self._apply,
            broker_errors=self._broker_errors(),
            cause=_sent_cause,
        )

    def _prepare(
        self, job: ScheduledEntry, run: Run, engine: Engine, ticket: HandOff
    ) -> tuple[ScheduleEntry, Any]:
        """This send's own entry, and beat's producer (connecting on the first send)."""
        spec = job.spec
        options = dict(spec.options)
        headers = dict(options.get("headers") or {})
        headers["celery_beat_task"] = True
        headers[HEADER] = ticket.to_message()
        options["headers"] = headers
        options["task_id"] = task_id(engine.namespace, run.slot_id, run.attempt)
        expires = self._sent_expiry(job, run)
        if expires is None:
            options.pop("expires", None)
        else:
            options["expires"] = expires
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
        return sent, self.producer

    def _expiry(self, job: ScheduledEntry, run: Run) -> Any:
        """The ``expires`` option of ``run``'s task, counted from its slot (None: none).

        A number of seconds or a ``timedelta`` counts from the slot's time, so
        that a slot sent late (a catch-up, a takeover) is dropped by the worker
        once it is that old; a datetime is kept as it is.
        """
        return expires_at(job.spec.options.get("expires"), run.slot)

    def _sent_expiry(self, job: ScheduledEntry, run: Run) -> Any:
        """:meth:`_expiry`, except for a backfill: it runs past slots on purpose, unexpiring."""
        return None if run.key != run.job else self._expiry(job, run)

    def _apply(self, prepared: tuple[ScheduleEntry, Any]) -> None:
        """Send through beat's ``apply_entry``, which only logs a failure: raise it here."""
        sent, producer = prepared
        sending = self._sending = _Sending()
        try:
            self.apply_entry(sent, producer=producer)
        finally:
            self._sending = None
        if sending.error is not None:
            raise sending.error

    def _broker_errors(self) -> tuple[type[BaseException], ...]:
        """The errors that mean the broker could not be reached (nothing was sent)."""
        return (OperationalError, OSError, *self.connection.connection_errors)

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
