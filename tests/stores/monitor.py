"""What a Redis or Valkey server's scripts ran on some keys while a block ran (MONITOR)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def script_commands(client: Any, keys: list[str], seen: list[str]) -> Iterator[None]:
    """Append to ``seen`` each command a Lua script ran on one of ``keys`` inside the block."""
    marker = f"anarchon-monitor-end-{uuid.uuid4().hex}"
    with client.monitor() as monitor:
        yield
        client.echo(marker)
        while marker not in (line := monitor.next_command())["command"]:
            if line.get("client_type") == "lua" and any(k in line["command"] for k in keys):
                seen.append(line["command"])
