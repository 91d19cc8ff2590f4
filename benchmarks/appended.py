"""JSON lines that processes append to files as they run, read as the files grow."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Appended:
    """The records appended to ``files``: each file read on from where the last
    :meth:`poll` ended, and a line still being written left for the next one."""

    files: list[Path] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)
    _read: dict[Path, int] = field(default_factory=dict)

    def poll(self) -> list[dict[str, Any]]:
        """Every record so far, in each file's order (a file not there yet: none)."""
        for path in self.files:
            try:
                with path.open("rb") as f:
                    f.seek(self._read.get(path, 0))
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._read[path] = self._read.get(path, 0) + len(complete)
            self.seen += [json.loads(line) for line in complete.splitlines() if line.strip()]
        return self.seen
