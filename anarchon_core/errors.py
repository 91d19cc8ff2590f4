"""The one error tree of anarchon.

Every error the library raises on purpose derives from :class:`AnarchonError`,
so ``except anarchon_core.AnarchonError`` catches them all (the distribution is
``anarchon``; its package is ``anarchon_core``). Two of them also derive from
the builtin a Python programmer would reach for first: bad configuration is a
:class:`ValueError`, a missing optional driver is an :class:`ImportError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class AnarchonError(Exception):
    """Base class of every error raised by anarchon."""


class ConfigurationError(AnarchonError, ValueError):
    """A schedule, an option, a URL or a job declaration is invalid.

    Raised at declaration time, before anything is registered or connected,
    with a message that names the offending value.
    """


class MissingDependency(AnarchonError, ImportError):
    """The driver a store needs is not installed; the message names the extra."""


class StoreUnavailable(AnarchonError):
    """The store could not be reached or did not answer.

    Stores translate their driver's connection errors into this one, so the
    engine can back off and retry without knowing which driver failed.
    """


class DamagedRecord(AnarchonError, ValueError):
    """A record in the store is not one that a store's step wrote (it was changed by hand).

    The store refuses the steps on that job alone (see :class:`BatchRefused`);
    the other jobs go on.
    """


class BatchRefused(AnarchonError):
    """The store refused some items of a batch and applied the others.

    Raised by the batch steps of every store (``claim_many``,
    ``takeover_many``, ``change_many``): ``answers`` holds, in the order of
    the batch, each item's answer (a ``Claim``, a ``bool``) or the error the
    server gave for that item alone. A store that applies a batch in one
    transaction (PostgreSQL) sends each item again on its own when the server
    refuses the batch, and answers the same way. A store that cannot be
    reached raises :class:`StoreUnavailable` for the whole call instead.
    """

    def __init__(self, answers: Sequence[Any]) -> None:
        self.answers: list[Any] = list(answers)
        errors = [a for a in self.answers if isinstance(a, BaseException)]
        first = f"{type(errors[0]).__name__}: {errors[0]}" if errors else "none"
        super().__init__(
            f"the store refused {len(errors)} of {len(self.answers)} items; the first: {first}"
        )


class LeaseLost(AnarchonError):
    """This instance no longer holds the lease of the run it is executing.

    Raised by :meth:`anarchon_core.Run.check` once a renewal was refused (another
    instance took the slot over), the lease ran out while the store was
    unreachable, or the run was handed over during a graceful stop.
    """


class Cancelled(AnarchonError):
    """The run was asked to stop: a newer slot of its job waits for it to end.

    Raised by :meth:`anarchon_core.Run.check` once ``run.cancelled`` is true
    (a job declared with ``overlap="cancel_other"``). A handler may let it
    propagate: the run then ends ``done``, like a handler that returns, and
    the waiting slot starts.
    """


class DispatchFailed(AnarchonError):
    """A handler that hands its slot's work off could not send it (the broker is unreachable).

    Raised by the Celery and Dramatiq dispatchers (and by any handler that
    dispatches work elsewhere): the slot did not run, so it is not recorded as
    failed. After a back-off, whichever instance can reach the broker takes it
    over as another attempt, within the job's catch-up window; once that
    window has passed it is recorded failed.
    """


class Conflict(AnarchonError):
    """A compare-and-set of a control entry found another version than expected.

    Someone else changed (or created, or removed) the entry since it was
    read: nothing was written. ``found`` is the version the store holds
    (0: no entry). Read it again, decide again.
    """

    def __init__(self, key: str, expected: int, found: int, message: str = "") -> None:
        self.key, self.expected, self.found = key, expected, found
        now = "it does not exist" if found == 0 else f"it is at version {found}"
        was = "to be absent" if expected == 0 else f"at version {expected}"
        super().__init__(message or f"{key!r} changed meanwhile: expected {was}, {now}")


class UnknownJob(AnarchonError, LookupError):
    """A control named a job the namespace has no trace of."""


class JobPaused(AnarchonError):
    """A run-now request for a job (or namespace) that is paused: resume it first."""


class SkipWork(AnarchonError):
    """Handed-off work must not run: its attempt is stale, or the store cannot tell.

    Raised by :func:`anarchon_core.handoff.take` in the worker that received
    the work; ``stale`` is true when a later attempt of the slot was sent.
    """

    def __init__(self, reason: str, *, stale: bool) -> None:
        super().__init__(reason)
        self.stale = stale


#: What only a bug raises, never a store, a driver or a network: a store call that
#: raises one of these is logged with its traceback, not taken for an outage.
BUG_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    NameError,
    LookupError,
    AssertionError,
)


def is_bug(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a store call, is a bug of the code rather than an outage.

    The library's own errors never are (``UnknownJob`` is a ``LookupError``).
    """
    return isinstance(exc, BUG_ERRORS) and not isinstance(exc, AnarchonError)
