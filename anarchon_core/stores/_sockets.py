"""Whether an idle pooled connection's socket has input waiting: a server that dropped
the connection (a restart, an idle timeout, a proxy) has sent its end of it."""

from __future__ import annotations

import select


def input_waiting(fileno: int) -> bool:
    """True if ``fileno`` can be read without blocking (the peer wrote or closed)."""
    if not hasattr(select, "poll"):  # pragma: no cover - Windows
        return bool(select.select([fileno], [], [], 0)[0])
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    return bool(poller.poll(0))
