"""The Celery app of every benchmark beat: the publish stamp and the ready mark.

Each message gets two headers just before it is published: when
(``bench_published``, ``time.time()``) and by which beat process
(``bench_beat``). A beat touches ``BENCH_DJ_READY/<pid>`` once its scheduler
has read the rows (``beat_init`` comes after the scheduler's setup).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.django_project.settings")

#: Message headers: when the beat published the message, and the beat's process id.
PUBLISHED = "bench_published"
BEAT = "bench_beat"

app = Celery("bench_dj")
app.config_from_object("django.conf:settings", namespace="CELERY")


def _stamp(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None:
        headers[PUBLISHED] = time.time()
        headers[BEAT] = os.getpid()


def _ready(**_: Any) -> None:
    ready = os.environ.get("BENCH_DJ_READY")
    if ready:
        (Path(ready) / str(os.getpid())).touch()


signals.before_task_publish.connect(_stamp, weak=False)
signals.beat_init.connect(_ready, weak=False)
