"""Real ``dramatiq`` and ``dramatiq-anarchon`` processes running tests/dramatiq/e2e_app.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fleet import BIN, Fleet, Line, per_slot, slot_seconds

APP = "tests.dramatiq.e2e_app"
__all__ = ["APP", "DramatiqFleet", "Line", "per_slot", "slot_seconds"]


class DramatiqFleet(Fleet):
    """Fleet of one test (``dramatiq`` commands), each in its own process group."""

    prefix = "d"

    expected_exits = None  # workers stop in many ways: the tests check their exits

    def __init__(
        self,
        tmp_path: Path,
        broker: str,
        schedule: dict[str, Any],
        *,
        store: str = "",
        lease: float = 3,
    ) -> None:
        super().__init__(tmp_path, store)
        self.app_settings(broker, schedule, lease)

    def worker(
        self, name: str, *, processes: int = 2, threads: int = 2, scheduler: bool = True
    ) -> None:
        argv = [str(BIN / "dramatiq"), APP, "--processes", str(processes)]
        argv += ["--threads", str(threads), "--queues", self.namespace, "-v"]
        self.spawn(name, argv, {"E2E_SCHEDULER": "1" if scheduler else "0"})

    def scheduler(self, name: str) -> None:
        self.spawn(name, [str(BIN / "dramatiq-anarchon"), APP, "-v"])
