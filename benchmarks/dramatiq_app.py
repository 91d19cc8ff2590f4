"""The Dramatiq app of a benchmark pod (benchmarks/dramatiq_pods.py): N periodic actors.

Configured by one environment variable, ``ANARCHON_BENCH_DRAMATIQ`` (JSON): the
broker's URL (also the store), the number of actors, their interval, the file each
started message is written to (a line each, no Redis command of its own) and the
directory where each worker process marks itself ready. Each message is stamped
just before it is enqueued (``bench_published`` in its options).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware

from anarchon_dramatiq import Anarchon, every

CONFIG = "ANARCHON_BENCH_DRAMATIQ"
#: The queue of every actor.
QUEUE = "bench"
PUBLISHED = "bench_published"

config: dict[str, Any] = json.loads(os.environ[CONFIG])
record = Path(config["record"])
ready = Path(config["ready"])


class Stamp(Middleware):  # type: ignore[misc]
    """When each message is enqueued, and each worker process ready."""

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        message.options[PUBLISHED] = time.time()

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        (ready / str(os.getpid())).touch()


broker = RedisBroker(url=config["broker"])
broker.add_middleware(CurrentMessage())
broker.add_middleware(Stamp())
broker.add_middleware(Anarchon(namespace="bench"))
dramatiq.set_broker(broker)


def _actor(name: str) -> None:
    def work() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        line = {
            "actor": name,
            "slot_id": (message.options.get("anarchon") or {}).get("slot_id"),
            "tracked": bool((message.options.get("anarchon") or {}).get("tracked")),
            "published": message.options.get(PUBLISHED),
            "started": time.time(),
        }
        with open(record, "a") as out:  # one write per line: processes share the file
            out.write(json.dumps(line) + "\n")

    dramatiq.actor(
        work, actor_name=name, queue_name=QUEUE, max_retries=0, schedule=every(config["every"])
    )


for n in range(int(config["actors"])):
    _actor(f"a{n:05d}")
