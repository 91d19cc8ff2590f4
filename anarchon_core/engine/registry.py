"""This instance in the store's registry of live instances, and the peers read back.

See :mod:`anarchon_core.peers` for what the peers decide (who claims a slot first).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import socket
from collections.abc import Callable

from ..errors import StoreUnavailable
from ..peers import ANNOUNCE_EVERY, ANNOUNCE_TTL
from .context import Context
from .gateway import describe

log = logging.getLogger(__name__)


def _version() -> str:
    try:
        return importlib.metadata.version("anarchon")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


#: This package's version, as instances record it in the registry.
VERSION = _version()


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
        try:
            live = gateway.store.announce(ctx.instance, info, ANNOUNCE_TTL)
        except StoreUnavailable:
            raise
        except Exception as exc:
            gateway.registry = peers.registry = False
            log.warning("anarchon: the store's registry is unusable: %s", describe(exc))
            return
        self._announce_at = now_mono + ANNOUNCE_EVERY
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
