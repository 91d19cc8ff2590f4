"""Jobs, their options, and the run context handed to handlers.

Everything here is a value: validated when it is built, so a bad declaration
fails at import time with a message naming the problem, and nothing is
half-registered.
"""

from __future__ import annotations

import enum
import functools
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .durations import Duration, parse_duration, within
from .errors import Cancelled, ConfigurationError, DispatchFailed, LeaseLost
from .names import MAX_NAME as MAX_NAME  # importable from here as before
from .names import check_name as check_name
from .schedules import NEVER, Schedule, grid_of, shared
from .slots import BACKFILL, Slot, is_own_record, lane_record

#: Defaults of every job option, in seconds (``renew`` defaults to lease / 3,
#: ``catch_up`` to one interval capped at one hour).
DEFAULT_LEASE = 10.0
DEFAULT_JITTER = 1.0
#: The default jitter of jobs whose handler only sends work elsewhere (Celery,
#: Dramatiq): the slot's preferred instance spreads the sending over the
#: instances (see peers.py), and a delay would only make every task later.
DISPATCH_JITTER = 0.0
DEFAULT_WATCH = 0.5
MAX_DEFAULT_CATCH_UP = 3600.0

#: Bounds of the job options, in seconds (see docs/concepts.md, "Configuration
#: errors"). Below them an instance would poll its store without pause; a
#: lease above a day would leave a crashed runner's slot stuck that long.
MIN_LEASE, MAX_LEASE = 1.0, 86400.0
MIN_RENEW = 0.1
MIN_WATCH, MAX_WATCH = 0.05, 3600.0

#: The share of a lease a runner gives up as a safety margin: it holds a run
#: until (when its last successful renewal was sent) + lease x (1 - margin), by
#: its own monotonic clock. This covers clocks whose rates differ by up to
#: :data:`CLOCK_RATE_BOUND` (see docs/failure-scenarios.md, "The lease rule").
LEASE_MARGIN = 0.05
#: The largest difference in rate between a runner's monotonic clock and the
#: store's clock that :data:`LEASE_MARGIN` covers (2 %; NTP keeps real clocks
#: within 0.05 %, a free-running quartz within 0.01 %).
CLOCK_RATE_BOUND = 0.02


def held_for(lease: float) -> float:
    """How long after sending a claim or renewal of ``lease`` seconds a runner may rely on it."""
    return lease * (1.0 - LEASE_MARGIN)


@dataclass(frozen=True)
class JobOptions:
    """Lease and timing options of one job, in seconds, validated together.

    ``lease``: how long a claim holds without renewal. ``renew``: how often the
    runner renews it (default ``lease / 3``; the lease must cover at least three
    renewals). ``jitter``: the upper bound of the random delay before claiming
    (default 1 s; always capped at a tenth of the interval; an explicit jitter
    as long as the interval is an error). ``catch_up``: how late a slot may still
    be claimed, notably after every instance was down (default: one interval,
    at most an hour; 0 turns catch-up off). ``watch``: how often backups check
    a running slot's lease, which bounds how long a hand-over takes.
    """

    lease: float = DEFAULT_LEASE
    renew: float | None = None
    jitter: float | None = None
    catch_up: float | None = None
    watch: float = DEFAULT_WATCH

    def __post_init__(self) -> None:
        within("lease", self.lease, MIN_LEASE, MAX_LEASE, "how long a claim holds unrenewed")
        if self.renew is not None:
            within("renew", self.renew, MIN_RENEW, why="how often a runner writes to the store")
            if self.lease < 3 * self.renew:
                raise ConfigurationError(
                    f"lease={self.lease:g} is shorter than 3 renewals (renew={self.renew:g}):"
                    " a single delayed renewal would lose the lease"
                )
        within("watch", self.watch, MIN_WATCH, MAX_WATCH, "how often backups read the store")

    @property
    def renew_every(self) -> float:
        return self.renew if self.renew is not None else self.lease / 3

    @classmethod
    def build(cls, **values: Duration | None) -> JobOptions:
        """Options from user input (numbers, timedeltas or strings); ``None`` keeps the default."""
        parsed = {k: parse_duration(k, v) for k, v in values.items() if v is not None}
        return cls(**parsed)

    def merged(self, **values: Duration | None) -> JobOptions:
        """These options with some replaced (``None`` keeps the current value)."""
        current = {
            "lease": self.lease,
            "renew": self.renew,
            "jitter": self.jitter,
            "catch_up": self.catch_up,
            "watch": self.watch,
        }
        current.update({k: parse_duration(k, v) for k, v in values.items() if v is not None})
        return JobOptions(**current)  # type: ignore[arg-type]


class Overlap(str, enum.Enum):
    """What happens to a slot that comes while the job's previous run still holds its lease."""

    #: The new slot is skipped (counted and logged as an overlap).
    SKIP = "skip"
    #: At most one slot waits and starts once the running one ends; later ones are skipped.
    BUFFER_ONE = "buffer_one"
    #: Every slot waits, in order, up to :data:`MAX_BUFFERED`.
    BUFFER_ALL = "buffer_all"
    #: The running handler is told (``run.cancelled``); the new slot starts once it ended.
    CANCEL_OTHER = "cancel_other"
    #: Slots run side by side, each with a lease of its own, up to
    #: :data:`~anarchon_core.slots.LANES` at once.
    ALLOW_ALL = "allow_all"


#: The most slots of one job that ``overlap="buffer_all"`` keeps waiting; later ones are skipped.
MAX_BUFFERED = 100


@dataclass(frozen=True)
class Rules:
    """What a job's schedule says beyond its grid, validated together.

    ``overlap``: a :class:`Overlap` policy or its name (default ``skip``).
    ``limit``: the number of slots the job runs in all, counted in the store
    across instances (takeovers not counted twice); None: no limit.
    ``pause_on_failure``: pause the job on every instance after a run ends failed.
    """

    overlap: Overlap = Overlap.SKIP
    limit: int | None = None
    pause_on_failure: bool = False

    def __post_init__(self) -> None:
        overlap = self.overlap
        if not isinstance(overlap, Overlap):
            try:
                overlap = Overlap(overlap)
            except ValueError:
                names = ", ".join(policy.value for policy in Overlap)
                raise ConfigurationError(
                    f"overlap={self.overlap!r}: not a policy (one of {names})"
                ) from None
            object.__setattr__(self, "overlap", overlap)
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1
        ):
            raise ConfigurationError(
                f"limit={self.limit!r}: expected a whole number of slots, at least 1"
                " (leave it out for no limit)"
            )
        if not isinstance(self.pause_on_failure, bool):
            raise ConfigurationError(
                f"pause_on_failure={self.pause_on_failure!r}: expected True or False"
            )
        if self.limit is not None and overlap is Overlap.ALLOW_ALL:
            raise ConfigurationError(
                f"limit={self.limit!r} with overlap='allow_all': a run limit is counted in"
                " one record, and allow_all keeps a record per lane; use another overlap"
                " policy with a limit"
            )

    @classmethod
    def build(
        cls,
        overlap: Overlap | str | None = None,
        limit: int | None = None,
        pause_on_failure: bool | None = None,
    ) -> Rules:
        """Rules from user input; ``None`` keeps the default."""
        return cls(
            Overlap.SKIP if overlap is None else overlap,  # type: ignore[arg-type]
            limit,
            False if pause_on_failure is None else pause_on_failure,
        )


@dataclass(frozen=True)
class Job:
    """A named periodic task: schedule, handler, options and rules."""

    name: str
    handler: Callable[..., Any]
    schedule: Schedule
    options: JobOptions = field(default_factory=JobOptions)
    rules: Rules = field(default_factory=Rules)

    def __post_init__(self) -> None:
        self.check(self.name, self.schedule, self.options)
        if not callable(self.handler):
            raise ConfigurationError(f"job {self.name!r}: handler {self.handler!r} is not callable")
        object.__setattr__(self, "schedule", shared(self.schedule))

    def backfill(self) -> Job:
        """This job as its backfill's record knows it: the same handler, schedule and
        options, under the record's name (``name`` + :data:`~anarchon_core.slots.BACKFILL`,
        which no declared job may carry)."""
        job = Job(self.name, self.handler, self.schedule, self.options, self.rules)
        object.__setattr__(job, "name", self.name + BACKFILL)
        return job

    def lane(self, lane: int) -> Job:
        """This job as the record of its lane ``lane`` knows it (``overlap="allow_all"``):
        the same handler, schedule and options, under the record's name (``name`` +
        :data:`~anarchon_core.slots.LANE` + the lane), its slots run one at a time."""
        rules = Rules(Overlap.SKIP, None, self.rules.pause_on_failure)
        job = Job(self.name, self.handler, self.schedule, self.options, rules)
        object.__setattr__(job, "name", lane_record(self.name, lane))
        return job

    @functools.cached_property
    def has_lanes(self) -> bool:
        """Whether this job's slots are claimed in its lanes' records (``overlap="allow_all"``;
        a backfill's or a lane's own are claimed in their record)."""
        return self.rules.overlap is Overlap.ALLOW_ALL and is_own_record(self.name)

    @property
    def lane_ms(self) -> int:
        """The width, in ms, of the time buckets that give a slot its lane: the shortest
        interval of the job's grid."""
        return max(1, int(grid_of(self.schedule).min_interval.total_seconds() * 1000))

    @staticmethod
    def check(name: str, schedule: Schedule, options: JobOptions) -> None:
        """Refuse a job's name, schedule and options that cannot go together.

        For declarations whose handler lives elsewhere (a Celery task, a
        Dramatiq actor): the same rules as a job's, without building one.
        """
        check_name(name)
        interval = schedule.min_interval.total_seconds()
        if options.jitter is not None and options.jitter >= interval:
            raise ConfigurationError(
                f"job {name!r}: jitter={options.jitter:g}s is not shorter than the"
                f" interval ({interval:g}s)"
            )

    @functools.cached_property
    def interval(self) -> float:
        """The shortest gap between two of its slots, in seconds (``min_interval``)."""
        return self.schedule.min_interval.total_seconds()

    @functools.cached_property
    def jitter(self) -> float:
        """The effective jitter bound: never more than a tenth of the interval."""
        configured = DEFAULT_JITTER if self.options.jitter is None else self.options.jitter
        return min(configured, self.interval / 10)

    def catch_up_for(self, slot: datetime, after: datetime | None = None) -> float:
        """How late (seconds) ``slot`` may still be claimed.

        By default one interval (the gap from ``slot`` to the next slot,
        ``after`` when the caller knows it, which for cron schedules varies),
        capped at one hour.
        """
        if self.options.catch_up is not None:
            return self.options.catch_up
        after = after or self.schedule.next_after(slot)
        if after == NEVER:  # the last slot before an end=: one interval of the grid still
            after = grid_of(self.schedule).next_after(slot)
        gap = (after - slot).total_seconds()
        return min(gap, MAX_DEFAULT_CATCH_UP)

    @functools.cached_property
    def takes_run(self) -> bool:
        """Whether the handler accepts the :class:`Run` argument."""
        try:
            params = inspect.signature(self.handler).parameters.values()
        except (TypeError, ValueError):
            return True
        return any(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
        )


#: Makes a run's new deadline and its loss exclusive (:meth:`Run.hold_until`): one lock
#: for every run, held for a comparison and an assignment.
_HOLD_LOCK = threading.Lock()


class Run:
    """What a handler knows about the run it is executing.

    ``job``, ``slot`` (aware UTC datetime), ``slot_id`` (``"job@unix_ms"``, a
    natural idempotency key), ``attempt`` (1, then +1 per takeover), ``token``
    (a fencing value that rises with every claim and takeover of the job) and
    ``instance`` (who runs it). ``lost`` turns true when this instance no
    longer holds the lease; :meth:`check` raises :class:`LeaseLost` then.
    ``cancelled`` turns true when a newer slot of the job waits for this run
    to end (``overlap="cancel_other"``); :meth:`check` raises
    :class:`~anarchon_core.errors.Cancelled` then.
    The engine builds a run with :meth:`of` and drives it with the members
    listed after :meth:`hand_off`.
    """

    __slots__ = (
        "_cancel_reason",
        "_cancelled",
        "_dispatch",
        "_hand_off",
        "_lost",
        "_monotonic",
        "_reason",
        "_valid_until",
        "attempt",
        "instance",
        "job",
        "key",
        "slot",
        "slot_id",
        "token",
    )

    def __init__(
        self,
        *,
        job: str,
        slot: datetime,
        slot_id: str,
        attempt: int,
        token: int,
        instance: str,
        key: str | None = None,
    ) -> None:
        self.job = job
        #: The store's record of this run: the job's name, or its backfill's (Control.backfill).
        self.key = key or job
        self.slot = slot
        self.slot_id = slot_id
        self.attempt = attempt
        self.token = token
        self.instance = instance
        # Flags, set once (their reason first) and read from any thread.
        self._lost = False
        self._reason = ""
        self._cancelled = False
        self._cancel_reason = ""
        self._hand_off: float | None = None
        self._dispatch: Callable[[float], bool] | None = None
        self._monotonic: Callable[[], float] | None = None
        self._valid_until = float("inf")

    @property
    def lost(self) -> bool:
        """True once the lease is lost (taken over, lapsed, or handed over).

        It turns true on its own when the lease's safe end passes without a
        successful renewal, even while the engine's store call is still blocked.
        """
        if (
            not self._lost
            and self._monotonic is not None
            and self._monotonic() >= self._valid_until
        ):
            self.mark_lost("the lease ran out: no renewal succeeded in time")
        return self._lost

    @property
    def lost_reason(self) -> str:
        return self._reason

    def lease_left(self) -> float | None:
        """Seconds this instance still holds the run for sure; None if unknown or lost."""
        if self._monotonic is None or self._valid_until == float("inf") or self.lost:
            return None
        return max(0.0, self._valid_until - self._monotonic())

    @property
    def cancelled(self) -> bool:
        """True once the run is asked to stop: a newer slot of its job waits for its end.

        Only for jobs declared with ``overlap="cancel_other"``; the request
        reaches the instance running the handler within about a second. The
        run still holds its lease: a handler that stops (returns, or lets
        :meth:`check`'s :class:`~anarchon_core.errors.Cancelled` propagate)
        ends it ``done``, and the waiting slot starts; one that goes on keeps
        the slot waiting until it ends.
        """
        return self._cancelled

    @property
    def cancel_reason(self) -> str:
        return self._cancel_reason

    def check(self) -> None:
        """Raise :class:`LeaseLost` if this instance no longer holds the run, or
        :class:`~anarchon_core.errors.Cancelled` if the run was asked to stop."""
        if self.lost:
            raise LeaseLost(f"{self.slot_id} attempt {self.attempt}: {self._reason}")
        if self.cancelled:
            raise Cancelled(f"{self.slot_id} attempt {self.attempt}: {self._cancel_reason}")

    def hand_off(self, lease: float) -> None:
        """Mark the slot ``dispatched`` in the store with a lease of ``lease`` seconds.

        For handlers that only dispatch the work to someone else (a Celery or
        Dramatiq worker): call it before dispatching; ``lease`` is the time the
        work may wait to be picked up. When the handler returns, the engine
        neither finishes nor renews the run: whoever executes the work renews
        it with the job's lease and :attr:`token` (which makes it ``running``
        again), then finishes it. The store's record says which phase the slot
        is in, so every instance decides alike: if the executor stops
        renewing, a backup takes the slot over as the next attempt; if nobody
        picks the work up before ``lease`` ends (it may run somewhere that
        cannot renew, or be lost), it is not sent again, and the job's next
        slot supersedes it. If the sending then fails, the handler raises
        :class:`~anarchon_core.errors.DispatchFailed`.
        Raises :class:`LeaseLost` if the lease is no longer this run's, and
        :class:`~anarchon_core.errors.DispatchFailed` if the store could not
        record the hand-off.
        """
        if lease <= 0:
            raise ValueError("hand_off(lease): the lease must be positive")
        self.check()
        sent = self._monotonic() if self._monotonic is not None else 0.0
        try:
            accepted = self._dispatch is None or self._dispatch(lease)
        except Exception as exc:  # the store failed: nothing was sent, so nothing ran
            raise DispatchFailed(
                f"{self.slot_id}: the store could not record the hand-off"
            ) from exc
        if not accepted:
            self.mark_lost("hand-off refused: another instance took the slot over")
            self.check()
        self._hand_off = lease
        if self._monotonic is not None:
            self.hold_until(sent + held_for(lease))

    # -- for the engine ------------------------------------------------

    @classmethod
    def of(
        cls,
        slot: Slot,
        *,
        attempt: int,
        token: int,
        instance: str,
        dispatch: Callable[[float], bool] | None = None,
        monotonic: Callable[[], float] | None = None,
        key: str | None = None,
    ) -> Run:
        """The run of ``slot``: its ``job``, ``slot`` and ``slot_id`` all come from it.

        ``dispatch(lease)`` marks the slot dispatched in the store with a lease
        of ``lease`` seconds, and answers whether the store accepted;
        :meth:`hand_off` calls it. ``monotonic`` is the engine's clock, by
        which the deadline of :meth:`hold_until` is judged. ``key`` is the
        store's record of the run when it is not the job's own (a backfill's).
        """
        run = cls(
            job=slot.job,
            slot=slot.time,
            slot_id=slot.id,
            attempt=attempt,
            token=token,
            instance=instance,
            key=key,
        )
        run._dispatch = dispatch
        run._monotonic = monotonic
        return run

    def hold_until(self, deadline: float) -> bool:
        """Hold the run until ``deadline`` on the engine's monotonic clock; False if already lost.

        A run lost (its deadline passed, or told) stays lost: a renewal that
        comes back late does not revive it.
        """
        with _HOLD_LOCK:
            if self.lost:
                return False
            self._valid_until = deadline
            return True

    def cancel(self, reason: str) -> bool:
        """Ask the handler to stop (:attr:`cancelled`), and why; False if it was asked already."""
        if self._cancelled:
            return False
        self._cancel_reason = reason
        self._cancelled = True
        return True

    def mark_lost(self, reason: str) -> bool:
        """Record that the lease is lost, and why; False if it already was."""
        if self._lost:
            return False
        self._reason = reason
        self._lost = True
        return True

    @property
    def handed_off_lease(self) -> float | None:
        """The lease :meth:`hand_off` extended the run to, or None if it was not handed off."""
        return self._hand_off

    def __repr__(self) -> str:
        return f"<Run {self.slot_id} attempt={self.attempt} token={self.token}>"
