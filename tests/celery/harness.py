"""Real ``celery worker`` / ``celery beat`` processes running tests/celery/e2e_app.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.fleet import BIN, Fleet, Line, per_slot, slot_seconds

CELERY = str(BIN / "celery")
__all__ = ["CELERY", "CeleryFleet", "Line", "per_slot", "slot_seconds"]


class CeleryFleet(Fleet):
    """Worker and beat processes of one test, each in its own process group (a pod)."""

    prefix = "c"
    #: The Celery app module the processes run (``-A``).
    app = "tests.celery.e2e_app"
    #: The scheduler of anarchon's beats.
    scheduler = "anarchon_celery:Scheduler"

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
        self,
        name: str,
        *,
        beat: bool = True,
        concurrency: int = 2,
        queue: str | None = None,
        release: Path | None = None,
        **extra: str,
    ) -> None:
        # Node names unique across tests that share the broker: "<pod>.<namespace>@host".
        argv = [CELERY, "-A", self.app, "worker", "-n", f"{name}.{self.namespace}@%h"]
        argv += [
            "-c",
            str(concurrency),
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
        ]
        if queue is not None:
            argv += ["-Q", queue]  # consumes that queue instead of the test's own
        if beat:
            argv += ["-B", "--scheduler", self.scheduler]
            argv += ["-s", str(self.tmp_path / f"{name}-beat-schedule")]
        self.spawn(name, argv, release=release)

    def worker_without_anarchon(self, name: str) -> None:
        """A worker started in code, not by the ``celery`` command: no anarchon hooks."""
        code = (
            "from tests.celery.e2e_app import app; "
            f"app.Worker(hostname='{name}.{self.namespace}@%h', concurrency=1, pool='solo',"
            " without_gossip=True, without_mingle=True, loglevel='INFO').start()"
        )
        self.spawn(name, [sys.executable, "-c", code])

    def beat(self, name: str) -> None:
        argv = [CELERY, "-A", self.app, "beat", "--scheduler"]
        argv += [self.scheduler, "--loglevel", "INFO"]
        argv += ["-s", str(self.tmp_path / f"{name}-beat-schedule")]
        self.spawn(name, argv)

    def tracking(self, *names: str) -> bool:
        """Whether the beats of ``names`` hand slots off to tracking workers."""
        return all("every worker tracks execution" in self.log(n) for n in names)

    def stock_beat(self, name: str) -> None:
        """Celery's own beat (a pod not yet migrated): it sends every entry on its own."""
        argv = [CELERY, "-A", self.app, "beat", "--scheduler"]
        argv += ["celery.beat:PersistentScheduler", "--loglevel", "INFO"]
        argv += ["-s", str(self.tmp_path / f"{name}-stock-schedule")]
        self.spawn(name, argv)

    @staticmethod
    def pod_of_worker(worker: str) -> str:
        """The pod name of a worker node name ("w1.<namespace>@host")."""
        return worker.split("@", 1)[0].split(".", 1)[0]

    def resend(self, start: Line) -> None:
        """Publish again the message of a run that started (as a broker redelivery would)."""
        from celery import Celery

        app = Celery("resend", broker=self.env["E2E_BROKER"])
        try:
            app.send_task(
                "e2e.work",
                args=(start["job"], 0.2),
                task_id=start["task_id"],
                headers={"anarchon": start["info"]},
                queue=self.namespace,
            )
        finally:
            app.close()
