"""The one error tree of anarchon.

Every error the library raises on purpose derives from :class:`AnarchonError`,
so ``except anarchon_core.AnarchonError`` catches them all (the distribution is
``anarchon``; its package is ``anarchon_core``). Two of them also derive from
the builtin a Python programmer would reach for first: bad configuration is a
:class:`ValueError`, a missing optional driver is an :class:`ImportError`.
"""

from __future__ import annotations


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


class LeaseLost(AnarchonError):
    """This instance no longer holds the lease of the run it is executing.

    Raised by :meth:`anarchon_core.Run.check` once a renewal was refused (another
    instance took the slot over), the lease ran out while the store was
    unreachable, or the run was handed over during a graceful stop.
    """


class DispatchFailed(AnarchonError):
    """A handler that hands its slot's work off could not send it (the broker is unreachable).

    Raised by the Celery and Dramatiq dispatchers (and by any handler that
    dispatches work elsewhere): the slot did not run, so it is not recorded as
    failed. After a back-off, whichever instance can reach the broker takes it
    over as another attempt, within the job's catch-up window; once that
    window has passed it is recorded failed.
    """
