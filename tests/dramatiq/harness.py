"""Real ``dramatiq`` and ``dramatiq-anarchon`` processes running tests/dramatiq/e2e_app.py."""

from __future__ import annotations

from tests.pods import BIN, Line, Pods, per_slot, slot_seconds

APP = "tests.dramatiq.e2e_app"
__all__ = ["APP", "DramatiqFleet", "Line", "per_slot", "slot_seconds"]


class DramatiqFleet(Pods):
    """Pods of one test (``dramatiq`` commands), each in its own process group."""

    prefix = "d"

    def worker(
        self, name: str, *, processes: int = 2, threads: int = 2, scheduler: bool = True
    ) -> None:
        argv = [str(BIN / "dramatiq"), APP, "--processes", str(processes)]
        argv += ["--threads", str(threads), "--queues", self.namespace, "-v"]
        self.spawn(name, argv, {"E2E_SCHEDULER": "1" if scheduler else "0"})

    def scheduler(self, name: str) -> None:
        self.spawn(name, [str(BIN / "dramatiq-anarchon"), APP, "-v"])
