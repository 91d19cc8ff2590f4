"""The store contract: the few atomic steps the engine asks of a shared store.

A store keeps, per job of a namespace, one record of the job's current slot
(job, slot, owner, attempt, token, state, lease end) and a short history of
its runs. The engine reads and changes them only through the methods of
:class:`Store` and :class:`LeaseStore`, each documented on itself.

Batch first: the methods a store implements take a batch (claims,
takeovers, changes to held runs, state reads), so that an instance makes one
round trip per step whatever the number of jobs; the single steps (``claim``,
``takeover``, ``renew``, ``dispatch``, ``finish``, ``release``, ``state``)
are written once, in the base classes, in terms of them.

Atomicity: each item of a batch is **one atomic operation on the server** (a
Lua script, one SQL statement or transaction, one compare-and-set), never a
read in Python followed by a write. The batch as a whole is not atomic. The
decisions each step takes are those of :mod:`anarchon_core.decide`, written
once as pure functions; every store agrees with them.

Answers, the same on every store:

- each item is answered by a value (a :class:`Claim`, a ``bool``), in the
  order of the batch;
- an item the server refuses alone (a value it cannot store, a key of
  another type) is refused alone: the others are applied, and the batch
  raises :class:`~anarchon_core.errors.BatchRefused` with every item's answer,
  the refused one's being the server's error. A single step raises that error
  itself;
- an outage of the call (the server unreachable, a timeout, a read-only
  replica, a primary refusing writes: any error of the driver or the server
  that is not about one item) raises
  :class:`~anarchon_core.errors.StoreUnavailable` for the whole call, raised
  ``from`` the driver's error at the store's boundary, with credentials
  scrubbed from its message;
- any other exception is a bug, and propagates with its traceback.

Capabilities are types, not flags: :class:`Store` claims slots and reads
records; :class:`LeaseStore` keeps leases (takeover, renew, dispatch,
finish, release); :class:`RegistryStore` keeps the registry of live
instances; :class:`ControlStore` keeps pause marks and control entries;
:class:`ClaimOnlyStore` picks the one winner of each slot and nothing more.

Clock: lease expiry is judged by the store's own clock, so instances whose
clocks disagree cannot take a live lease early (NATS gives clients no clock:
its store judges by the observer's monotonic clock instead, see
:mod:`anarchon_core.stores.nats` and :class:`LeasesByObservation`).
"""

from __future__ import annotations

import abc
import enum
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import BatchRefused, ConfigurationError
from .names import check_name, check_namespace
from .slots import lane_records, record_job

T = TypeVar("T")
R = TypeVar("R")

#: How many attempts per job a store's history keeps.
HISTORY = 50
#: The largest ``info`` an instance records in the registry, in bytes of JSON.
MAX_INFO = 4096
#: The longest control key, in characters, and value, in bytes (:meth:`Store.set_control`).
MAX_CONTROL_KEY, MAX_CONTROL_VALUE = 300, 16384
#: Bounds of a registry record's time to live, in seconds.
MIN_TTL, MAX_TTL = 1.0, 3600.0


class ClaimStatus(str, enum.Enum):
    """The answer to a claim or takeover."""

    WON = "won"
    TAKEN = "taken"
    BUSY = "busy"
    STALE = "stale"
    #: The job, or its whole namespace, is paused (:meth:`Store.pause`): nothing written.
    PAUSED = "paused"
    #: The job has run its limit of slots (:attr:`ClaimRequest.limit`): nothing written.
    ENDED = "ended"


class RunState(str, enum.Enum):
    """The state of one attempt of one slot."""

    RUNNING = "running"
    #: Handed off (:meth:`Store.dispatch`): the work waits for its executor,
    #: whose first renewal makes the run ``running`` again.
    DISPATCHED = "dispatched"
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"
    LOST = "lost"
    ABANDONED = "abandoned"


#: States in which a run holds its slot's lease (renewed, finished or released by token).
HELD_STATES = (RunState.RUNNING, RunState.DISPATCHED)


@dataclass(frozen=True)
class JobState:
    """A job's current record in the store."""

    job: str
    slot_ms: int
    owner: str
    attempt: int
    token: int
    state: RunState
    #: Seconds of lease left by the store's clock; zero or less means lapsed.
    lease_remaining: float

    @property
    def lapsed(self) -> bool:
        """True when a backup may take this record over."""
        return self.state is RunState.RELEASED or (
            self.state is RunState.RUNNING and self.lease_remaining <= 0
        )

    @property
    def held(self) -> bool:
        """True while a live lease holds the slot: running, or dispatched and awaiting pickup."""
        return self.state in HELD_STATES and self.lease_remaining > 0

    @property
    def unpicked(self) -> bool:
        """True when the slot was dispatched and no executor picked it up within its lease.

        Such a slot is never taken over (its work may run where nothing renews
        it); the job's next slot supersedes it.
        """
        return self.state is RunState.DISPATCHED and self.lease_remaining <= 0


@dataclass(frozen=True)
class Claim:
    """The answer to a claim (:meth:`Store.claim_many`) or a takeover
    (:meth:`LeaseStore.takeover_many`).

    ``holder`` is the record after the step: the caller's own when won, the
    current holder's otherwise (``None`` only if the record vanished).
    """

    status: ClaimStatus
    holder: JobState | None

    @property
    def won(self) -> bool:
        return self.status is ClaimStatus.WON


@dataclass(frozen=True)
class ClaimRequest:
    """One entry of a batched claim.

    ``limit``: the most claims of the job that may ever win (None: no limit),
    judged by the store's own count of them (:meth:`JobStats.claims`): once it
    has reached ``limit``, a claim that would win answers **ended**
    (see :meth:`Store.claim_many`).
    """

    job: str
    slot_ms: int
    lease: float
    limit: int | None = None


@dataclass(frozen=True)
class Change:
    """One entry of a batch of changes to held runs (:meth:`LeaseStore.change_many`).

    ``state`` says which step: ``running`` renews the lease for ``lease``
    seconds (:meth:`LeaseStore.renew`), ``dispatched`` hands the run off for
    ``lease`` seconds (:meth:`LeaseStore.dispatch`), ``done`` or ``failed``
    finishes it (:meth:`LeaseStore.finish`), ``released`` hands it over
    (:meth:`LeaseStore.release`).
    """

    job: str
    token: int
    state: RunState
    lease: float = 0.0

    def __post_init__(self) -> None:
        if self.state in (RunState.LOST, RunState.ABANDONED):
            raise ValueError(f"a held run is renewed, dispatched or ended, not {self.state.value}")


@dataclass(frozen=True)
class JobStats:
    """A job's counts since its first slot, kept by the store's own steps (:meth:`Store.stats`)."""

    job: str
    #: Attempts started: claims won and takeovers.
    runs: int
    #: Attempts that took a slot over (a crashed, frozen or handed-over run).
    takeovers: int
    #: Runs finished ``done``, and ``failed``.
    done: int
    failed: int
    #: When the last run finished ``done`` / ``failed``, store-clock Unix seconds.
    last_success: float | None
    last_failure: float | None

    @property
    def claims(self) -> int:
        """Claims won: the slots started, takeovers left out (what a job's limit counts)."""
        return self.runs - self.takeovers


@dataclass(frozen=True)
class Paused:
    """What is paused in a namespace (:meth:`Store.paused`)."""

    #: The whole namespace: no job's slot starts.
    namespace: bool
    #: The jobs paused by name, sorted (each stays paused when the namespace resumes).
    jobs: tuple[str, ...]

    def covers(self, job: str) -> bool:
        """Whether a claim of ``job`` is refused."""
        return self.namespace or job in self.jobs


#: The key of a namespace's own pause among the pause marks (no job has this name).
NAMESPACE_PAUSE = ""


@dataclass(frozen=True)
class InstanceRecord:
    """One live instance in a store's registry (:meth:`Store.announce`)."""

    instance: str
    #: What the instance said of itself (host, pid, version, jobs...).
    info: dict[str, Any]
    #: Seconds since it last announced itself, by the store's clock.
    age: float
    #: Seconds left before its record expires, by the store's clock.
    expires_in: float


def holders(states: Mapping[str, JobState | None]) -> dict[str, list[str]]:
    """Per owner, the jobs (sorted) whose current run it holds with a live lease."""
    held: dict[str, list[str]] = {}
    for job, state in sorted(states.items()):
        if state is not None and state.held:
            held.setdefault(state.owner, []).append(job)
    return held


@dataclass(frozen=True)
class RunRecord:
    """One attempt of one slot, as kept in the history."""

    job: str
    slot_ms: int
    attempt: int
    token: int
    owner: str
    state: RunState
    #: Store-clock Unix seconds.
    started_at: float
    ended_at: float | None


def refusal(slot_ms: int, holder: JobState | None) -> Claim | None:
    """The answer to a claim of ``slot_ms`` that ``holder`` refuses, or ``None`` if it wins.

    **taken** when ``holder`` holds this slot, **stale** when a newer one,
    **busy** when an older one whose lease is live (see :meth:`Store.claim_many`).
    The rule every store applies; :mod:`anarchon_core.decide` holds the others.
    """
    if holder is None:
        return None
    if holder.slot_ms == slot_ms:
        return Claim(ClaimStatus.TAKEN, holder)
    if holder.slot_ms > slot_ms:
        return Claim(ClaimStatus.STALE, holder)
    if holder.held:
        return Claim(ClaimStatus.BUSY, holder)
    return None


def refused(
    slot_ms: int, holder: JobState | None, *, paused: bool = False, ended: bool = False
) -> Claim:
    """The answer to a claim of ``slot_ms`` that the server refused (wrote nothing for);
    ``holder``, and whether the job is ``paused`` and its limit reached (``ended``),
    read in the same atomic step.

    **paused** first; then **taken** or **stale** by the holder's slot; then
    **ended**; else as :func:`lost`. The order of :func:`anarchon_core.decide.claim`.
    """
    if paused:
        return Claim(ClaimStatus.PAUSED, holder)
    answer = refusal(slot_ms, holder)
    if answer is not None and answer.status is not ClaimStatus.BUSY:
        return answer
    if ended:
        return Claim(ClaimStatus.ENDED, holder)
    return lost(slot_ms, holder)


def lost(slot_ms: int, holder: JobState | None) -> Claim:
    """The answer to a claim of ``slot_ms`` that the server refused; ``holder`` read since.

    As :func:`refusal`, except that no holder means **taken** and an older
    slot means **busy** even if its lease has lapsed since the refusal.
    """
    if holder is None:
        return Claim(ClaimStatus.TAKEN, None)
    answer = refusal(slot_ms, holder)
    return answer if answer is not None else Claim(ClaimStatus.BUSY, holder)


def one_by_one(
    step: Callable[[T], R],
    items: Sequence[T],
    refused: type[BaseException] | tuple[type[BaseException], ...],
) -> list[R]:
    """``step`` of every item in turn, for a batch whose items go through one by one.

    An outage stops the batch (:class:`StoreUnavailable`, as any call); an
    item the server refuses alone (an error of the ``refused`` kinds) does
    not: the others go on, and the batch then raises :class:`BatchRefused`
    with every item's answer or error. Any other error propagates.
    """
    answers: list[R | BaseException] = []
    for item in items:
        try:
            answers.append(step(item))
        except refused as exc:
            answers.append(exc)
    return refused_if_any(answers)


def refused_if_any(answers: Sequence[R | BaseException]) -> list[R]:
    """``answers``, or :class:`BatchRefused` if any of them is an error."""
    if any(isinstance(answer, BaseException) for answer in answers):
        raise BatchRefused(answers)
    return list(answers)  # type: ignore[arg-type]


def item_by_item(
    call: Callable[[Sequence[T]], list[R]],
    items: Sequence[T],
    refused: type[BaseException] | tuple[type[BaseException], ...],
) -> list[R]:
    """``call(items)`` as one batch, answered item by item when the server refuses it.

    For stores that apply a batch in one transaction: an error of the
    ``refused`` kinds (the server's, not an outage) means the batch was
    applied not at all, so each item is sent again alone, and only the items
    the server refuses alone are refused (:class:`BatchRefused`, as on every
    store). Outages and any other error propagate.
    """
    try:
        return call(items)
    except refused as exc:
        if len(items) == 1:
            raise BatchRefused([exc]) from exc
    answers: list[R | BaseException] = []
    for item in items:
        try:
            answers.extend(call([item]))
        except refused as exc:
            answers.append(exc)
    return refused_if_any(answers)


def _one(answers: Callable[[], Sequence[R]]) -> R:
    """The answer of a batch of one item: its value, or its refusal raised as it was given."""
    try:
        (answer,) = answers()
    except BatchRefused as refused:
        (error,) = refused.answers
        if isinstance(error, BaseException):
            raise error from None
        answer = error
    return answer


@dataclass(frozen=True)
class TakeoverRequest:
    """One entry of a batch of takeovers (:meth:`LeaseStore.takeover_many`)."""

    job: str
    slot_ms: int
    lease: float
    #: The token of the lapsed run, as the backup read it.
    seen_token: int


class Store(abc.ABC):
    """A shared store bound to one namespace: claims of slots, and reads of records.

    The contract is batch first: :meth:`claim_many` and :meth:`states` are
    what a store implements, one atomic server-side step per item (see the
    module docstring); :meth:`claim` and :meth:`state` are written once,
    here, in terms of them. What else a store can do is said by its type:
    :class:`LeaseStore` (leases: takeover, renew, dispatch, finish, release),
    :class:`RegistryStore` (the registry of live instances),
    :class:`ControlStore` (pause marks and control entries). The protected
    helpers below are for implementations only.
    """

    def __init__(self, *, namespace: str) -> None:
        """Bind the store to ``namespace``: 1-100 letters, digits, ``_``, ``-``, ``.`` or ``:``.

        Namespaces end up in keys, table, bucket and queue names; any other
        raises :class:`~anarchon_core.errors.ConfigurationError`.
        """
        self.namespace = check_namespace(namespace)

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> Store:
        """Build the store from its URL; each store module documents its form."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a URL")

    @abc.abstractmethod
    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """Claim several slots for ``owner`` at once; answers in the order of ``requests``.

        Each request is one atomic step: record that ``owner`` runs
        ``slot_ms`` of ``job``, unless someone already does. When won, the
        lease runs for ``lease`` seconds by the store's clock.

        - no record yet, or the record holds an older slot that is finished
          (``done``/``failed``), handed over (``released``) or whose lease has
          lapsed (or a dispatched run never picked up): **won**. ``attempt`` is
          1, ``token`` is the previous token + 1. A previous run left
          ``running`` or ``dispatched`` (its lease lapsed) is recorded in the
          history as ``abandoned``: a newer slot supersedes it, it is not retried
          (a ``released`` one stays ``released``);
        - the record holds an older slot whose lease is live (``running``, or
          ``dispatched`` and awaiting pickup): **busy** (the previous run is
          still going; this slot is skipped, "overlap");
        - the record holds this very slot: **taken**;
        - the record holds a newer slot: **stale**;
        - the job or its namespace is paused (:meth:`pause`), whatever the
          record: **paused**, nothing written. The pause is read in the same
          atomic step as the claim's write (each store says how), so a claim
          begun after :meth:`pause` returned never wins;
        - the request carries a ``limit`` and the job's claims won so far
          (:attr:`JobStats.claims`: takeovers are not counted) have reached
          it: **ended**, nothing written, unless the answer is taken or stale
          (which come first; ended comes before busy). The count is read in
          the same atomic step, so however many instances race, at most
          ``limit`` claims of the job ever win.

        The decisions are :func:`anarchon_core.decide.claim`. Tokens rise with
        every claim and takeover of a job and never repeat, so they serve as
        fencing values: a handler may pass ``run.token`` to its own storage
        and refuse writes carrying a smaller one. A batch lets an instance
        make one round trip per tick whatever the number of jobs due.
        Refusals and outages are answered as the module docstring says.
        """

    def claim(
        self, job: str, slot_ms: int, owner: str, lease: float, limit: int | None = None
    ) -> Claim:
        """One claim (:meth:`claim_many`); a refusal raises the store's own error."""
        return _one(lambda: self.claim_many([ClaimRequest(job, slot_ms, lease, limit)], owner))

    @abc.abstractmethod
    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        """Current records of ``jobs``; jobs with no record are left out.

        One batch, for backups and catch-up: ``lease_remaining`` is computed by
        the store's clock.
        """

    def state(self, job: str) -> JobState | None:
        """The current record of ``job``, or ``None``."""
        return self.states([job]).get(job)

    @abc.abstractmethod
    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """The most recent attempts of ``job``, newest first (at most :data:`HISTORY` kept)."""

    def stats(self, jobs: Iterable[str]) -> dict[str, JobStats]:
        """The counts of ``jobs`` (those with none yet are left out).

        Each count changes in the same atomic step as the record it counts
        (a claim won, a takeover, a finish), so it never disagrees with it;
        a finish re-sent is not counted twice. Stores that keep no records
        answer an empty dict.
        """
        return {}

    @abc.abstractmethod
    def jobs(self) -> list[str]:
        """Names of the jobs that have a record in this namespace, sorted."""

    @abc.abstractmethod
    def namespaces(self) -> list[str]:
        """The namespaces this store's server holds records of (this one's or any other's),
        sorted: at least every namespace with a job recorded, whatever namespace the store
        was opened with (a memory store is one namespace's: it answers its own)."""

    # -- the registry (RegistryStore); answered empty by the others -----------

    def announce(self, instance: str, info: Mapping[str, Any], ttl: float) -> list[InstanceRecord]:
        """Record ``instance`` as live for ``ttl`` seconds, and answer every live instance.

        One atomic step: the instance's record (``info``, a JSON object of at
        most :data:`MAX_INFO` bytes) is written with an expiry ``ttl`` seconds
        (1 s to 1 h) from the store's now, records past their expiry are
        removed, and the live ones are answered, sorted by name, this one
        included. Stores that keep no registry answer an empty list.
        """
        check_name(instance, "instance name")
        if not MIN_TTL <= ttl <= MAX_TTL:
            raise ValueError(f"ttl={ttl!r}: a registry record lives 1 s to 1 h")
        text = json.dumps(dict(info), sort_keys=True, separators=(",", ":"))
        if len(text.encode()) > MAX_INFO:
            raise ValueError(f"info of {instance!r} is over {MAX_INFO} bytes of JSON")
        return self._announce(instance, text, ttl) if isinstance(self, RegistryStore) else []

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        """:meth:`announce` with ``info`` as JSON text (:class:`RegistryStore`)."""
        return []

    def withdraw(self, instance: str) -> None:  # noqa: B027 - stores without a registry
        """Remove ``instance``'s record from the registry (an instance that stops)."""

    def instances(self) -> list[InstanceRecord]:
        """The live instances of the registry, sorted by name (empty if none is kept)."""
        return []

    # -- pause marks and control entries (ControlStore) ------------------------

    def pause(self, job: str | None = None) -> bool:
        """Pause ``job`` (or, with ``None``, the whole namespace): its claims answer **paused**.

        ``True`` if this changed anything, ``False`` if it was paused already.
        A run that holds its lease is not interrupted: it renews, finishes and
        is taken over as before; only slots not yet started are refused. A
        job's pause and the namespace's are kept apart: resuming one leaves
        the other. Stores that are no :class:`ControlStore` raise
        :class:`~anarchon_core.errors.ConfigurationError`, as for every
        method of this part.
        """
        return self._set_marks(job, True)

    def resume(self, job: str | None = None) -> bool:
        """Undo :meth:`pause`; ``True`` if ``job`` (or the namespace) was paused.

        The job's own mark goes first, its lanes' after it: until the last is
        gone, :meth:`paused` still names the job (a resume cut short is seen).
        """
        return self._set_marks(job, False)

    def _set_marks(self, job: str | None, on: bool) -> bool:
        """Set or clear the pause mark of ``job`` (or of the namespace), the job's own
        first; whether any changed. The records of the job's lanes
        (``overlap="allow_all"``) are claimed by their own names: each carries the
        mark too, read in its claim's atomic step."""
        store, mark = self._controlled(), self._mark_of(job)
        changed = store._set_pause(mark, on)
        if job is not None:
            for lane in lane_records(mark):
                changed = store._set_pause(lane, on) or changed
        return changed

    def paused(self) -> Paused:
        """The namespace's pause and the jobs paused by name (a job whose own mark or
        any lane's is set)."""
        marks = self._controlled()._pause_marks()
        jobs = {record_job(mark) for mark in marks - {NAMESPACE_PAUSE}}
        return Paused(NAMESPACE_PAUSE in marks, tuple(sorted(jobs)))

    def _mark_of(self, job: str | None) -> str:
        return NAMESPACE_PAUSE if job is None else check_name(job)

    def _controlled(self) -> ControlStore:
        if not isinstance(self, ControlStore):
            raise ConfigurationError(
                f"{type(self).__name__} keeps no pause marks: pausing needs a lease store"
                " (Redis, Valkey, PostgreSQL, SQLite, libSQL or NATS)"
            )
        return self

    def _check_controls(self) -> None:
        self._controlled()

    def controls(self, *prefixes: str) -> dict[str, tuple[int, str]]:
        """The control entries whose key starts with one of ``prefixes`` (all entries
        without any): key -> (version, value), in one read.

        Control entries are small JSON texts (requests to run a job now, ...)
        kept beside the jobs' records, each with a version that changes with
        every write. See :meth:`set_control`.
        """
        return self._controlled()._controls(prefixes or ("",))

    def set_control(self, key: str, value: str | None, expected: int) -> int:
        """Compare-and-set one control entry: write ``value`` (``None``: remove it).

        Only if the entry's version is ``expected`` (``0``: only if there is
        no entry); otherwise nothing is written and
        :class:`~anarchon_core.errors.Conflict` says which version is there.
        Returns the new version (0 once removed). One atomic step.
        """
        store = self._controlled()
        if not 1 <= len(key) <= MAX_CONTROL_KEY or not key.isprintable():
            raise ValueError(
                f"control key {key[:40]!r}: 1 to {MAX_CONTROL_KEY} printable characters"
            )
        if value is not None and len(value.encode()) > MAX_CONTROL_VALUE:
            raise ValueError(f"control {key!r}: over {MAX_CONTROL_VALUE} bytes")
        if value == "":
            raise ValueError(f"control {key!r}: the value is empty (control values are JSON)")
        if expected < 0:
            raise ValueError(f"control {key!r}: expected version {expected} < 0")
        return store._set_control(key, value, expected)

    # -- the connection --------------------------------------------------------

    def ping(self) -> None:
        """Reach the store once: StoreUnavailable if it cannot, or refuses this client.

        The engine pings after a failed step before it counts the store as
        back: a ping must not depend on any one job's record.
        """
        self.jobs()

    def close(self) -> None:  # noqa: B027 - most stores have nothing to close
        """Release connections this store opened itself."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} namespace={self.namespace!r}>"

    # -- helpers for implementations ----------------------------------------

    @staticmethod
    def _job_state(row: Sequence[Any]) -> JobState:
        """A record from a database row of its fields, in order."""
        job, slot_ms, owner, attempt, token, state, remaining = row
        state = RunState(state)
        return JobState(job, int(slot_ms), owner, int(attempt), int(token), state, remaining)

    @staticmethod
    def _instance_record(row: Sequence[Any]) -> InstanceRecord:
        """A registry record from a row of (instance, info JSON, age, expires in)."""
        instance, info, age, expires_in = row
        return InstanceRecord(instance, json.loads(info), float(age), float(expires_in))

    @staticmethod
    def _run_record(row: Sequence[Any]) -> RunRecord:
        """An attempt from a database row of its fields, in order."""
        job, slot_ms, attempt, token, owner, state, started_at, ended_at = row
        state = RunState(state)
        return RunRecord(
            job, int(slot_ms), int(attempt), int(token), owner, state, started_at, ended_at
        )


class LeaseStore(Store):
    """A store that keeps a lease per claimed slot: renewed, handed off, ended, taken over.

    Implementations provide :meth:`takeover_many` and :meth:`change_many`
    (besides :class:`Store`'s); the single steps are written here in their
    terms. The decisions are those of :mod:`anarchon_core.decide`.
    """

    @abc.abstractmethod
    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        """Compare-and-set for backups: take each slot over from a lapsed run.

        Each request succeeds only if the record still holds ``slot_ms`` with
        token ``seen_token`` and is either ``released`` or ``running`` with a
        lapsed lease. Then ``attempt`` and ``token`` grow by one, the lease
        runs for ``lease`` seconds, and the previous attempt is recorded as
        ``lost`` (or stays ``released``): **won**. Otherwise **taken**, with
        the current holder (``None`` if there is no record). Answers in the
        order of ``requests``, each its own atomic step
        (:func:`anarchon_core.decide.takeover`).
        """

    def takeover(self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int) -> Claim:
        """One takeover (:meth:`takeover_many`); a refusal raises the store's own error."""
        request = TakeoverRequest(job, slot_ms, lease, seen_token)
        return _one(lambda: self.takeover_many([request], owner))

    @abc.abstractmethod
    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        """Apply several changes to held runs at once; answers in the order of ``changes``.

        Each change is its own atomic step (the batch as a whole is not
        atomic), and the changes of one job apply in the order listed (a
        renewal, then a finish). ``state`` says which step
        (:func:`anarchon_core.decide.change`):

        - ``running`` renews: the lease of the run carrying ``token`` runs
          ``lease`` seconds from the store's now. Only while the record carries
          ``token`` and is ``running`` or ``dispatched``: a stale token
          (someone took over since) is refused with ``False``. The state
          becomes ``running``: the first renewal of a dispatched run is its
          executor picking it up;
        - ``dispatched`` hands the run off to whoever executes its work: its
          lease becomes the time the work may wait for an executor, whose
          first renewal makes it ``running``. Only while held, as a renewal
          (a retried message is dispatched again). A dispatched run is never
          taken over: once its pickup lease lapses it stays unpicked until the
          job's next slot supersedes it;
        - ``done`` or ``failed`` finishes the run, ``released`` hands it over
          (a backup takes it over at once): the lease ends at the store's now,
          and the history records the end. Only while held; ``True`` also
          when the record carries ``token`` and already is that state (the
          same end re-sent after its reply was lost), with nothing written.
        """

    def renew(self, job: str, token: int, lease: float) -> bool:
        """Extend the lease of the run carrying ``token`` (a ``running`` change)."""
        return _one(lambda: self.change_many([Change(job, token, RunState.RUNNING, lease)]))

    def dispatch(self, job: str, token: int, pickup: float) -> bool:
        """Hand the run carrying ``token`` off for ``pickup`` seconds (a ``dispatched`` change)."""
        return _one(lambda: self.change_many([Change(job, token, RunState.DISPATCHED, pickup)]))

    def finish(self, job: str, token: int, outcome: RunState) -> bool:
        """End the run carrying ``token`` as ``done`` or ``failed``; else ``ValueError``."""
        if outcome not in (RunState.DONE, RunState.FAILED):
            raise ValueError(f"a run finishes as done or failed, not {outcome.value}")
        return _one(lambda: self.change_many([Change(job, token, outcome)]))

    def release(self, job: str, token: int) -> bool:
        """Hand the run carrying ``token`` over: ``released``, for a backup at once."""
        return _one(lambda: self.change_many([Change(job, token, RunState.RELEASED)]))


class RegistryStore(Store):
    """A store that keeps the registry of live instances (:meth:`Store.announce`)."""

    @abc.abstractmethod
    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        """:meth:`announce` with ``info`` checked and as JSON text."""

    @abc.abstractmethod
    def withdraw(self, instance: str) -> None:
        """Remove ``instance``'s record from the registry (an instance that stops)."""

    @abc.abstractmethod
    def instances(self) -> list[InstanceRecord]:
        """The live instances of the registry, sorted by name."""


class ControlStore(Store):
    """A store that keeps pause marks and control entries (:meth:`Store.pause`,
    :meth:`Store.controls`); every lease store is one."""

    @abc.abstractmethod
    def _set_pause(self, key: str, on: bool) -> bool:
        """Add (``on``) or remove the pause mark ``key`` (a job, or
        :data:`NAMESPACE_PAUSE`); ``True`` if the marks changed."""

    @abc.abstractmethod
    def _pause_marks(self) -> set[str]:
        """Every pause mark of the namespace (job names and :data:`NAMESPACE_PAUSE`)."""

    @abc.abstractmethod
    def _controls(self, prefixes: tuple[str, ...]) -> dict[str, tuple[int, str]]:
        """The entries whose key starts with one of ``prefixes``: key -> (version, value)."""

    @abc.abstractmethod
    def _set_control(self, key: str, value: str | None, expected: int) -> int:
        """:meth:`Store.set_control`, its arguments checked."""


class LeasesByObservation(LeaseStore):
    """A lease store whose leases end by the observer's clock (NATS: no server clock).

    A lease's end is measured from when the reader first saw the record, so a
    record left running long ago looks live to an instance that just started.
    """


class ClaimOnlyStore(Store):
    """A store that picks the one winner of each slot and records nothing else.

    Subclasses implement :meth:`claim_many`. There is no lease: a won claim
    runs with nothing to renew, hand off, finish, hand over or take over, and
    nothing is read back. It is no :class:`LeaseStore`: it has none of those
    steps, and the engine sends it none (a run's end is told by its event
    alone).
    """

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        """Empty: no job record is kept."""
        return {}

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        """Empty: no run history is kept."""
        return []

    def jobs(self) -> list[str]:
        """Empty: no job record is kept."""
        return []

    def namespaces(self) -> list[str]:
        """Empty: no job record is kept."""
        return []


# -- one-off runs (OnceStore) ----------------------------------------------------

#: The most one-off entries one read answers (:meth:`OnceStore.once_due`).
MAX_ONCE_READ = 10_000
#: The largest value of a one-off entry, in bytes of JSON.
MAX_ONCE_VALUE = 1024
#: The latest due time of a one-off, in Unix milliseconds (the year 9999 begins).
MAX_ONCE_MS = 253_370_764_800_000


@dataclass(frozen=True, order=True)
class OnceEntry:
    """One pending one-off run: the slot of ``job`` at ``due_ms`` (Unix milliseconds).

    Entries sort by due time, then job name: the order every read answers them in,
    and the cursor of :meth:`OnceStore.once_due` (:attr:`key`).
    """

    due_ms: int
    job: str
    #: A small JSON object: who asked for it, and when (shown by status, never run).
    value: str = field(default="{}", compare=False)

    @property
    def key(self) -> tuple[int, str]:
        """Its place among the entries: (due time, job)."""
        return self.due_ms, self.job


class OnceStore(Store):
    """A store that keeps one-off runs: a set of (job, due time) entries indexed by due time.

    The engine reads the entries due with one read of that index per poll
    (:meth:`once_due`), whatever the number pending later; what makes a one-off
    run once is the claim of its slot on the job's own record, as for any slot.
    The public methods check their arguments and call the ``_`` methods the store
    implements, each one atomic step on the server.
    """

    def add_once(self, entries: Sequence[OnceEntry]) -> None:
        """Add ``entries``; one already there (same job and due time) takes the new value.

        Idempotent: adding an entry again changes nothing but its value. Each
        entry is written in one atomic step; the batch as a whole is not atomic.
        """
        for entry in entries:
            check_name(entry.job)
            _check_due(entry.due_ms)
            if len(entry.value.encode()) > MAX_ONCE_VALUE or not entry.value.startswith("{"):
                raise ValueError(
                    f"one-off {entry.job!r}: its value is a JSON object of at most"
                    f" {MAX_ONCE_VALUE} bytes"
                )
        if entries:
            self._add_once(list(entries))

    def once_due(
        self, until_ms: int, limit: int = 500, after: tuple[int, str] | None = None
    ) -> list[OnceEntry]:
        """The entries due at or before ``until_ms``, oldest first (then by job), at most
        ``limit``; with ``after`` (an entry's :attr:`OnceEntry.key`), those after it only.

        One read of the store's index on the due time: its cost grows with the
        entries answered, not with those pending later.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_ONCE_READ:
            raise ValueError(f"limit={limit!r}: 1 to {MAX_ONCE_READ} entries")
        return self._once_due(int(until_ms), limit, after)

    def remove_once(self, job: str, due_ms: int) -> bool:
        """Remove the entry of ``job`` due at ``due_ms``; ``False`` if it was not there."""
        return self._remove_once(check_name(job), int(due_ms))

    def pending_once(self, job: str | None = None, limit: int = 100) -> list[OnceEntry]:
        """The pending entries (of ``job``, or of every job), oldest first, at most ``limit``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_ONCE_READ:
            raise ValueError(f"limit={limit!r}: 1 to {MAX_ONCE_READ} entries")
        return self._pending_once(None if job is None else check_name(job), limit)

    @abc.abstractmethod
    def _add_once(self, entries: list[OnceEntry]) -> None:
        """:meth:`add_once`, its entries checked."""

    @abc.abstractmethod
    def _once_due(
        self, until_ms: int, limit: int, after: tuple[int, str] | None
    ) -> list[OnceEntry]:
        """:meth:`once_due`, its arguments checked."""

    @abc.abstractmethod
    def _remove_once(self, job: str, due_ms: int) -> bool:
        """:meth:`remove_once`, its arguments checked."""

    @abc.abstractmethod
    def _pending_once(self, job: str | None, limit: int) -> list[OnceEntry]:
        """:meth:`pending_once`, its arguments checked."""


def onces(store: Store) -> OnceStore:
    """``store`` as a :class:`OnceStore`, or a ConfigurationError saying why it is none."""
    if not isinstance(store, OnceStore):
        raise ConfigurationError(
            f"{type(store).__name__} keeps no one-off runs: a one-off is kept in the store"
            " until its time (and caught up after a restart of every instance), which needs a"
            " store that keeps records (Redis, Valkey, PostgreSQL, MySQL, SQLite, libSQL or"
            " NATS)"
        )
    return store


def _check_due(due_ms: object) -> int:
    if isinstance(due_ms, bool) or not isinstance(due_ms, int) or not 0 <= due_ms < MAX_ONCE_MS:
        raise ValueError(f"due_ms={due_ms!r}: Unix milliseconds from 1970 to 9999")
    return due_ms
