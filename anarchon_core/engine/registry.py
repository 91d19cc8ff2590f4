"""This instance in the store's registry of live instances, and the peers read back.

See :mod:`anarchon_core.peers` for what the peers decide (who claims a slot first).
With each announcement goes the digest of the jobs this instance declares,
their list kept once per digest in control entries (see
:mod:`anarchon_core.declarations`): :class:`Declaring` keeps it current.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from .. import declarations
from ..declarations import VERIFY_EVERY, WHOLE_EVERY, Copy, SpecText, written
from ..errors import StoreUnavailable, is_bug
from ..jobs import Job
from ..peers import ANNOUNCE_EVERY, ANNOUNCE_TTL
from ..slots import is_own_record
from ..version import __version__
from .context import Context
from .gateway import describe

log = logging.getLogger(__name__)


#: This package's version, as instances record it in the registry.
VERSION = __version__


class Registry:
    """Announces this instance every :data:`~anarchon_core.peers.ANNOUNCE_EVERY` seconds.

    ``peers_changed`` is called when the live peers read back changed (the
    claims deferred for a gone peer are placed again); ``load`` says how far
    behind this instance runs and how many claims it deferred (see
    :mod:`.pacing`), recorded with it for ``anarchon status`` and
    ``anarchon check --fail-behind``.
    """

    def __init__(
        self,
        ctx: Context,
        peers_changed: Callable[[], None],
        load: Callable[[], tuple[float, int]],
    ) -> None:
        self._ctx = ctx
        self._peers_changed = peers_changed
        self._load = load
        #: When to announce next (monotonic); 0 until the first announcement.
        self._announce_at = 0.0
        self._declarations = Declaring(ctx)

    def announce(self, now_mono: float) -> None:
        """Record this instance in the store's registry, and read the live peers back.

        A store that answers with an error other than an outage (a role that
        may not create the registry's table) leaves this instance without a
        registry: it learns its peers from claims alone.
        """
        ctx = self._ctx
        gateway, peers = ctx.gateway, ctx.peers
        if not gateway.registry or now_mono < self._announce_at:
            return
        info = {"host": socket.gethostname(), "pid": os.getpid(), "version": VERSION}
        info["jobs"] = len(ctx.table)
        behind, deferred = self._load()
        info["behind"], info["deferred"] = round(behind, 1), deferred
        digest = self._declarations.current(now_mono)
        if digest is not None:
            info["decl"] = digest
        try:
            live = gateway.store.announce(ctx.instance, info, ANNOUNCE_TTL)
        except StoreUnavailable:
            raise
        except Exception as exc:
            gateway.registry = peers.registry = False
            log.warning("anarchon: the store's registry is unusable: %s", describe(exc))
            return
        self._announce_at = now_mono + ANNOUNCE_EVERY
        self._declarations.announced([r.info.get("decl") for r in live])
        version = peers.version
        peers.refresh(live)
        if peers.version != version:
            self._peers_changed()

    def withdraw(self) -> None:
        """Leave the registry at once (on stop), if this instance announced itself."""
        ctx = self._ctx
        if ctx.gateway.registry and self._announce_at:
            try:
                ctx.gateway.store.withdraw(ctx.instance)
            except Exception as exc:  # its record expires instead
                log.debug("anarchon: could not leave the registry: %s", describe(exc))


class Declaring:
    """The digest this instance announces, its copy kept whole in the store, stale copies swept.

    The jobs' written schedules are kept per job object, so that telling
    whether the jobs changed since the last announcement costs a pass over
    the table, and a change writes down only the jobs declared anew. A copy
    is written when its digest is new here; every
    :data:`~anarchon_core.declarations.VERIFY_EVERY` seconds its part 0 is
    read back (every :data:`~anarchon_core.declarations.WHOLE_EVERY` seconds,
    all of it), what went missing written again, and the copies no live
    instance announces are swept.
    """

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        #: Per job name: the job object written down, and its schedule as written.
        self._written: dict[str, tuple[Job, SpecText]] = {}
        self._copy: Copy | None = None
        #: The job table's version the copy was worked out at.
        self._copy_version = -1
        #: The digest whose copy the store keeps whole, as last seen.
        self._kept: str | None = None
        #: When to check the copy and sweep next, and to read it whole (monotonic).
        self._check_at = self._whole_at = 0.0
        #: The digests the live instances announced, at the last announcement (``None``
        #: before the first: nothing is swept before the registry was read).
        self._announced: set[str] | None = None
        #: Why the last copy could not be kept (said once per reason).
        self._refused: str | None = None
        #: Off after a bug: the registry goes on without digests.
        self._off = False

    def current(self, now_mono: float) -> str | None:
        """The digest to announce now: ``None`` while the store does not keep its copy."""
        gateway = self._ctx.gateway
        if self._off or not gateway.controls:
            return None
        copy = self._copy_of_jobs()
        if copy.digest == self._kept and now_mono < self._check_at:
            return self._kept
        store, now = gateway.store, self._ctx.clock.time()
        try:
            if copy.digest != self._kept:
                # Room first: the copies nobody announces any more go before a new one.
                self._sweep(copy)
                refused = declarations.publish(store, copy, now)
                self._whole_at = now_mono + WHOLE_EVERY
            else:
                refused = None
                if now_mono >= self._whole_at:
                    self._whole_at = now_mono + WHOLE_EVERY
                    there = declarations.whole(store, copy)
                else:
                    there = declarations.present(store, copy)
                if not there:
                    refused = declarations.publish(store, copy, now)
                self._sweep(copy)
        except StoreUnavailable:
            raise
        except Exception as exc:
            self._kept = None
            if is_bug(exc):
                self._off = True
                log.error("anarchon: declarations left out of the registry", exc_info=exc)
            else:
                log.warning(
                    "anarchon: could not keep this instance's declarations in the store: %s",
                    describe(exc),
                )
            self._check_at = now_mono + VERIFY_EVERY
            return None
        self._check_at = now_mono + VERIFY_EVERY
        if refused is not None:
            if refused != self._refused:
                log.warning("anarchon: this instance's declarations are not announced: %s", refused)
            self._refused, self._kept = refused, None
            return None
        self._refused, self._kept = None, copy.digest
        return self._kept

    def _sweep(self, copy: Copy) -> None:
        if self._announced is not None:
            keep = self._announced | {copy.digest}
            declarations.sweep(self._ctx.gateway.store, keep, self._ctx.clock.time())

    def announced(self, digests: list[object]) -> None:
        """The digests the live instances announced (the registry's answer)."""
        self._announced = {d for d in digests if isinstance(d, str)}

    def _copy_of_jobs(self) -> Copy:
        """The copy of the jobs declared now (backfills and removed jobs left out); worked
        out again only once a job was declared or removed since."""
        table = self._ctx.table
        if self._copy is not None and self._copy_version == table.version:
            return self._copy
        self._copy_version = table.version
        known = self._written
        changed = self._copy is None
        names: set[str] = set()
        for rt in self._ctx.table.runtimes():
            job = rt.job
            if rt.removed or not is_own_record(job.name):  # a backfill's or a lane's
                continue
            names.add(job.name)
            seen = known.get(job.name)
            if seen is None or seen[0] is not job:
                known[job.name] = (job, written(job.schedule, job.rules))
                changed = True
        if len(names) != len(known):  # some were removed
            for name in set(known) - names:
                del known[name]
            changed = True
        if changed or self._copy is None:
            self._copy = declarations.encode({name: text for name, (_, text) in known.items()})
        return self._copy
