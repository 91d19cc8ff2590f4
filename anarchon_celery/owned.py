"""Entries whose schedule decides its own due times: decided by one beat at a time, under a lease.

A ``solar`` schedule, a ``crontab`` with a ``nowfun`` of its own, a schedule
class that overrides ``is_due`` (or ``remaining_estimate``...) and any other
``BaseSchedule`` say when they are due only when asked (``is_due``), from
whatever their code reads: no two beats would compute the same slots. Such an
entry is still one job of the engine on every beat (known, shown, its runs
claimed and backed up as any), declared with a schedule that has no slot of
its own (:data:`UNDECIDED`). Its due times are decided by one beat at a time,
the entry's owner, which holds a lease on it: the control entry
``owner/<entry>`` of the store, renewed every third of the entry's lease
(``anarchon_lease``) by compare-and-set on its version.

While it holds the lease, the owner asks the entry's ``is_due`` with the
entry's last slot, as the store records it. When it says due, the owner
writes that moment (whole milliseconds) into the lease's value, by
compare-and-set (a beat that lost the lease cannot write it), then as a
one-off of the entry's job (:mod:`anarchon_core.once`): the beats claim that
slot on the entry's own record, one wins and sends it as any slot (the slot
id, attempt, token, hand-off ticket and history are a slot's). The next due
time is decided once that slot is recorded and its run no longer holds its
lease: one at a time.

The lease keeps the engine's lease rule (docs/failure-scenarios.md, "The
lease rule"): the owner decides only until the moment it sent its last
accepted write, plus the lease less 5 %, on its own monotonic clock; another
beat takes the lease only once it saw the same value unchanged for a whole
lease, on its own monotonic clock, from the first read that showed it (as
leases are judged on NATS). Every decision is itself a compare-and-set on
the lease's version: a beat that lost the lease decides nothing, whatever its
clock says. A beat that stops releases its leases (their value says so), and
the others take them at their next read, every :data:`WATCH` seconds. A new
owner goes on from the due time the lease's value holds: it writes that
one-off again while the store's record does not show it, so a due time
decided just before its owner died runs once, late.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from celery import Celery
from celery.beat import ScheduleEntry

from anarchon_core import ConfigurationError
from anarchon_core import Scheduler as Engine
from anarchon_core.errors import Conflict, StoreUnavailable, is_bug
from anarchon_core.jobs import held_for
from anarchon_core.once import ONCE_EVERY, entry_value
from anarchon_core.schedules import from_ms
from anarchon_core.store import ControlStore, LeaseStore, OnceEntry, OnceStore, Store

from .schedules import Entry

log = logging.getLogger(__name__)

#: The control entries of the owner leases: ``owner/<entry>``.
OWNER = "owner/"
#: Seconds between two reads of the owner leases: how soon a released lease is taken.
WATCH = 0.5
#: Bounds of the wait between two questions to an entry's ``is_due`` (seconds): its
#: answer's own wait, within these.
CHECK_MIN, CHECK_MAX = 0.05, 1.0
#: Seconds before a write of the lease the store did not take is tried again.
RETRY = 0.25
#: The one slot of the schedule an owned entry's job is declared with, never claimed:
#: its due times come from its owner, as one-offs.
NEVER_DUE = datetime(9998, 12, 31, tzinfo=timezone.utc)
#: ``Scheduler.add_job``'s schedule arguments of an owned entry's job.
UNDECIDED: dict[str, Any] = {
    "every": ONCE_EVERY,
    "anchor": NEVER_DUE,
    "start": NEVER_DUE,
    "end": NEVER_DUE,
}


class Owned(Protocol):
    """An entry as scheduled (:class:`~anarchon_celery.entries.ScheduledEntry`)."""

    entry: ScheduleEntry
    spec: Entry


def check_store(store: Store, where: str, kind: str) -> None:
    """Refuse an owned entry on a store that cannot keep its lease and its one-offs."""
    if not (
        isinstance(store, LeaseStore)
        and isinstance(store, ControlStore)
        and isinstance(store, OnceStore)
    ):
        raise ConfigurationError(
            f"{where}: its schedule ({kind}) decides its own due times: one beat at a time"
            f" decides them under a lease kept in the store, and {type(store).__name__} keeps"
            " no leases or one-off runs; use a store that does (Redis, Valkey, PostgreSQL,"
            " MySQL, SQLite, libSQL or NATS) as anarchon_store, or a schedule of every beat"
            " (a number of seconds, a timedelta, schedule(...) or crontab(...))"
        )


def probe(where: str, kind: str, value: Any) -> None:
    """Refuse a schedule whose ``is_due`` cannot answer (it raises, or answers no
    ``(due, seconds)`` pair): asked once, as beat would, with now as its last run."""
    try:
        answer(value.is_due(datetime.now(timezone.utc)))
    except Exception as exc:
        raise ConfigurationError(
            f"{where}: its schedule ({kind}) decides its own due times, and its is_due()"
            f" fails: {type(exc).__name__}: {exc}"
        ) from None


def answer(state: Any) -> tuple[bool, float]:
    """An ``is_due`` answer read: whether due, and when to ask again (seconds)."""
    due, wait = state
    if wait is None:
        wait = CHECK_MAX
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or math.isnan(wait):
        raise TypeError(f"is_due() answered {state!r}, not (is_due, seconds to the next check)")
    return bool(due), float(wait)


def describe(value: str | None) -> str:
    """Who holds (or held) a lease, from its value."""
    data = _read(value)
    by = data.get("by")
    return by if isinstance(by, str) and by else "another beat"


def _read(value: str | None) -> dict[str, Any]:
    try:
        data = json.loads(value) if value else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _lasts(lease: _Lease, data: dict[str, Any]) -> float:
    """How long a lease holds unchanged: this beat's lease of the entry, or its holder's
    if longer (beats of another version, or with other settings, may hold it)."""
    held = data.get("lease")
    if isinstance(held, (int, float)) and not isinstance(held, bool) and held < 86400:
        return max(lease.lease, float(held))
    return lease.lease


def _ms(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class _Lease:
    """One owned entry, and its lease as this beat knows it."""

    name: str
    owned: Owned
    #: The lease's length (the entry's ``anarchon_lease``), seconds.
    lease: float
    #: The value and version last read while another beat held it, and when a read
    #: first showed them (monotonic).
    seen: tuple[int, str] | None = None
    since: float = 0.0
    #: While this beat holds it: the version of its last write (0: not held), until
    #: when it decides (monotonic), when it renews.
    version: int = 0
    until: float = 0.0
    renew_at: float = 0.0
    #: The last due time decided (Unix ms), and whether this beat wrote its one-off
    #: since it took the lease.
    decided: int | None = None
    placed: bool = False
    #: Its ``is_due``'s last run until a slot of it is recorded (Unix ms): the entry's
    #: ``last_run_at`` on the beat that took its lease first (when beat made the entry,
    #: unless given).
    origin: int = 0
    #: When ``is_due`` is asked next (monotonic).
    check_at: float = 0.0
    #: The error of its ``is_due``, said once until it answers again.
    failing: str | None = None

    @property
    def key(self) -> str:
        return OWNER + self.name

    @property
    def kind(self) -> str:
        return self.owned.spec.decides or "?"


class Owners:
    """The owned entries of one beat: their leases taken, renewed and released, and
    their due times decided while held (:meth:`step`, at each tick of beat)."""

    def __init__(self, engine: Engine, app: Celery) -> None:
        self._engine = engine
        self._app = app
        self._leases: dict[str, _Lease] = {}
        self._watch_at = 0.0
        #: This beat's term and count of writes: no two values it writes are alike.
        self._term = secrets.token_hex(8)
        self._writes = 0

    def __contains__(self, name: str) -> bool:
        return name in self._leases

    def holds(self, name: str) -> bool:
        """Whether this beat decides ``name``'s due times now."""
        lease = self._leases.get(name)
        return lease is not None and self._deciding(lease)

    def add(self, name: str, owned: Owned, lease: float) -> None:
        """Decide ``name``'s due times whenever this beat holds its lease."""
        self.remove(name)
        self._leases[name] = _Lease(name, owned, lease)
        self._watch_at = 0.0

    def remove(self, name: str) -> None:
        """No more of ``name``: its lease, if held here, is released."""
        lease = self._leases.pop(name, None)
        if lease is not None and lease.version:
            self._release([lease])

    def release_all(self) -> None:
        """Release every lease held here (beat stops): the other beats take them at once."""
        leases, self._leases = list(self._leases.values()), {}
        self._release([lease for lease in leases if lease.version])

    # -- a step ------------------------------------------------------------------

    def step(self) -> float:
        """Read, take, renew the leases due; decide the due times of those held.
        Seconds until more is due here."""
        if not self._leases:
            return math.inf
        clock = self._engine.clock
        if clock.monotonic() >= self._watch_at:
            self._watch_at = clock.monotonic() + WATCH
            self._guarded("read the owner leases", self._watch)
        for lease in list(self._leases.values()):
            if lease.version and clock.monotonic() >= lease.renew_at:
                what = f"renew the owner lease of {lease.name}"
                if not self._guarded(what, self._renew, lease):
                    lease.renew_at = clock.monotonic() + RETRY
        now = clock.monotonic()
        due = [x for x in self._leases.values() if self._deciding(x) and now >= x.check_at]
        if due and not self._guarded("decide due times", self._decide, due):
            for lease in due:
                lease.check_at = max(lease.check_at, clock.monotonic() + RETRY)
        return self._next_in()

    def _next_in(self) -> float:
        now = self._engine.clock.monotonic()
        times = [self._watch_at]
        for lease in self._leases.values():
            if lease.version:
                times.append(lease.renew_at)
                if self._deciding(lease):
                    times.append(lease.check_at)
        return max(0.0, min(times) - now)

    def _guarded(self, what: str, call: Any, *args: Any) -> bool:
        """``call(*args)``; False if the store was out or refused it: tried again at a
        later step (the leases held meanwhile run out by themselves). A bug propagates."""
        try:
            call(*args)
        except StoreUnavailable as exc:
            log.debug("anarchon: could not %s: %s", what, exc)
            return False
        except Exception as exc:
            if is_bug(exc):
                raise
            log.warning("anarchon: could not %s: %s", what, exc)
            return False
        return True

    def _deciding(self, lease: _Lease) -> bool:
        """The lease rule: this beat decides until its lease's deadline, by its own clock."""
        return bool(lease.version) and self._engine.clock.monotonic() < lease.until

    # -- the leases ----------------------------------------------------------------

    def _watch(self) -> None:
        """Read every owner lease: take those free, released, or unchanged for a lease."""
        store = self._store()
        found = store.controls(OWNER)
        read_at = self._engine.clock.monotonic()
        for lease in list(self._leases.values()):
            current = found.get(lease.key)
            if lease.version:
                if current is None or current[0] != lease.version:
                    holder = describe(current[1] if current is not None else None)
                    self._lost(lease, f"{holder} holds its lease")
                continue
            if current is None:
                self._take(lease, 0, None)
                continue
            data = _read(current[1])
            released = bool(data.get("released"))
            if current != lease.seen:
                lease.seen, lease.since = current, read_at
                if not released:
                    continue
            elif not released and read_at - lease.since < _lasts(lease, data):
                continue
            self._take(lease, *current)

    def _take(self, lease: _Lease, version: int, value: str | None) -> None:
        """Take ``lease`` from ``value`` (its holder's, at ``version``): free, released, or
        unchanged for a whole lease."""
        data = _read(value)
        lease.decided = _ms(data.get("decided"))
        lease.origin = _ms(data.get("from")) or self._first_run(lease)
        lease.placed = False
        if not self._write(lease, version):
            return
        lease.seen, lease.check_at, lease.failing = None, 0.0, None
        if value is None:
            how = "its lease was free"
        elif data.get("released"):
            how = f"{describe(value)} released it"
        else:
            how = f"the lease of {describe(value)} lapsed"
        log.info(
            "anarchon: entry %s: this beat decides its due times now (%s; lease %gs)",
            lease.name,
            how,
            lease.lease,
        )

    def _renew(self, lease: _Lease) -> None:
        if not self._write(lease, lease.version):
            self._lost(lease, "another beat took its lease")

    def _lost(self, lease: _Lease, why: str) -> None:
        lease.version, lease.seen = 0, None
        log.warning(
            "anarchon: entry %s: this beat no longer decides its due times: %s", lease.name, why
        )

    def _release(self, leases: Iterable[_Lease]) -> None:
        for lease in leases:
            try:
                released = self._write(lease, lease.version, released=True)
            except Exception as exc:
                if is_bug(exc):
                    raise
                log.warning(
                    "anarchon: could not release the owner lease of %s (another beat takes it"
                    " once it lapses): %s",
                    lease.name,
                    exc,
                )
            else:
                if released:
                    log.info("anarchon: entry %s: its owner lease released", lease.name)
            lease.version = 0

    def _write(self, lease: _Lease, expected: int, *, released: bool = False) -> bool:
        """Compare-and-set the lease's value at ``expected``: True if written. Held from
        the moment it was sent, for the lease less its margin."""
        self._writes += 1
        value: dict[str, Any] = {
            "by": self._engine.instance,
            "term": self._term,
            "n": self._writes,
            "lease": lease.lease,
            "decided": lease.decided,
            "from": lease.origin,
        }
        if released:
            value["released"] = True
        clock = self._engine.clock
        sent = clock.monotonic()
        try:
            version = self._store().set_control(
                lease.key, json.dumps(value, separators=(",", ":")), expected
            )
        except Conflict:
            return False
        if not released:
            lease.version = version
            lease.until = sent + held_for(lease.lease)
            lease.renew_at = sent + lease.lease / 3
        return True

    # -- the due times -----------------------------------------------------------------

    def _decide(self, due: list[_Lease]) -> None:
        """Ask each entry of ``due`` whether it is due, from its last slot recorded; write
        the due time it decides, then its one-off."""
        store = self._store()
        records = store.states([lease.name for lease in due])
        clock = self._engine.clock
        for lease in due:
            lease.check_at = clock.monotonic() + CHECK_MAX
            record = records.get(lease.name)
            recorded = record.slot_ms if record is not None else None
            decided = lease.decided
            if decided is not None and (recorded is None or recorded < decided):
                if not lease.placed:
                    self._place(lease, decided)  # its one-off, once more: the same slot
                    continue
                if any(e.due_ms == decided for e in store.pending_once(lease.name, 100)):
                    continue  # to be claimed
                # Settled without a slot recorded (past its catch-up window): the next
                # due time is decided from it.
            if record is not None and record.held:
                continue  # one at a time: the run of its last slot goes on
            last_ms = max(m for m in (recorded, decided, lease.origin) if m is not None)
            if not self._within(lease):
                continue
            value = lease.owned.entry.schedule
            try:
                due_now, wait = answer(value.is_due(self._last_run(value, last_ms)))
            except Exception as exc:
                said = f"{type(exc).__name__}: {exc}"
                if lease.failing != said:
                    lease.failing = said
                    log.error(
                        "anarchon: entry %s: its schedule (%s) failed to say whether it is"
                        " due: %s; asked again every %gs",
                        lease.name,
                        lease.kind,
                        said,
                        CHECK_MAX,
                    )
                continue
            lease.failing = None
            lease.check_at = clock.monotonic() + min(max(wait, CHECK_MIN), CHECK_MAX)
            if not due_now:
                continue
            at = max(int(clock.time() * 1000), last_ms + 1)
            if not self._deciding(lease):
                continue  # its lease ran out meanwhile: decided by whoever holds it next
            lease.decided = at
            if not self._write(lease, lease.version):
                lease.decided = decided
                self._lost(lease, "another beat took its lease")
                continue
            self._place(lease, at)

    def _place(self, lease: _Lease, at: int) -> None:
        """Write the one-off of ``lease``'s entry at ``at``: every beat claims it."""
        store = self._store()
        value = entry_value(self._engine.instance, self._engine.clock.time(), decided=lease.kind)
        store.add_once([OnceEntry(at, lease.name, value)])
        lease.placed = True
        log.debug("anarchon: entry %s: due at %s, by its schedule", lease.name, from_ms(at))

    def _within(self, lease: _Lease) -> bool:
        """Whether now is within the entry's ``anarchon_start`` and ``anarchon_end``."""
        bounds = lease.owned.spec.bounds
        now = datetime.fromtimestamp(self._engine.clock.time(), timezone.utc)
        start, end = bounds.get("start"), bounds.get("end")
        return (start is None or start <= now) and (end is None or now <= end)

    def _last_run(self, value: Any, ms: int) -> datetime:
        """The last run at ``ms`` as stock beat gives it to ``is_due``: as the schedule's
        own ``now()`` said it then (its time zone, a ``nowfun`` of its own), else in the
        app's time zone."""
        offset, zone = self._frame(value)
        return (from_ms(ms) + timedelta(seconds=offset)).astimezone(zone)

    def _first_run(self, lease: _Lease) -> int:
        """The entry's ``last_run_at`` (in its schedule's own time) as Unix ms."""
        entry = lease.owned.entry
        offset, zone = self._frame(entry.schedule)
        last = entry.last_run_at
        try:
            if last.utcoffset() is None:
                last = last.replace(tzinfo=zone)
            seconds: float = last.timestamp() - offset
            return round(seconds * 1000)
        except (AttributeError, TypeError, ValueError, OverflowError):
            return round(self._engine.clock.time() * 1000)

    def _frame(self, value: Any) -> tuple[int, Any]:
        """How far ahead of this beat's clock the schedule's own ``now()`` is (whole
        seconds: a ``nowfun`` of its own), and its time zone (else the app's)."""
        try:
            frame = value.maybe_make_aware(value.now())
        except Exception:
            frame = None
        if not isinstance(frame, datetime) or frame.utcoffset() is None:
            return 0, self._app.timezone
        now = datetime.fromtimestamp(self._engine.clock.time(), timezone.utc)
        return round((frame - now).total_seconds()), frame.tzinfo

    def _store(self) -> Any:
        return self._engine.store
