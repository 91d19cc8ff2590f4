"""The Dramatiq broker and actors that the end-to-end tests run in real worker processes.

Configured from the environment: ``E2E_BROKER`` (redis:// or amqp:// URL), ``E2E_STORE``
(optional: the broker serves as the store), ``E2E_NAMESPACE`` (also the queue
name), ``E2E_LEASE``, ``E2E_SCHEDULER`` ("0": workers only track execution),
``E2E_SCHEDULE`` (JSON: actor name -> {"every": seconds} or {"cron": "* * * * *"},
plus "work": seconds the actor works), ``E2E_REPORT`` (the JSON-lines file).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import dramatiq
from dramatiq import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from anarchon_core.tools.instance import Reporter
from anarchon_dramatiq import Anarchon, every

NAMESPACE = os.environ["E2E_NAMESPACE"]
broker: Broker
if os.environ["E2E_BROKER"].startswith("amqp"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=os.environ["E2E_BROKER"])
else:
    broker = RedisBroker(url=os.environ["E2E_BROKER"])
broker.add_middleware(CurrentMessage())
if os.environ.get("dramatiq_prom_port"):  # noqa: SIM112 - the name Dramatiq reads
    from dramatiq.middleware.prometheus import Prometheus

    broker.add_middleware(Prometheus())
broker.add_middleware(
    Anarchon(
        store=os.environ.get("E2E_STORE") or None,
        namespace=NAMESPACE,
        lease=float(os.environ.get("E2E_LEASE", "3")),
        scheduler=os.environ.get("E2E_SCHEDULER", "1") != "0",
        metrics_port=int(os.environ["E2E_METRICS_PORT"])
        if os.environ.get("E2E_METRICS_PORT")
        else None,
        metrics_host="127.0.0.1",
    )
)
dramatiq.set_broker(broker)
_reporter: Reporter | None = None


def report() -> Reporter:
    global _reporter
    if _reporter is None:
        _reporter = Reporter(os.environ["E2E_REPORT"], f"{os.uname().nodename}:{os.getpid()}")
    return _reporter


def _actor(name: str, spec: dict[str, Any]) -> None:
    def work() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        info = message.options.get("anarchon") or {}
        fields = {
            "job": name,
            "slot_id": info.get("slot_id"),
            "attempt": info.get("attempt"),
            "sent_by": info.get("sent_by"),
            "pid": os.getpid(),
            "message_id": message.message_id,
            "info": info,
        }
        report().write("start", **fields)
        time.sleep(spec.get("work", 0.2))
        report().write("end", **fields)

    schedule = spec["cron"] if "cron" in spec else every(spec["every"])
    dramatiq.actor(work, actor_name=name, queue_name=NAMESPACE, max_retries=0, schedule=schedule)


for _name, _spec in json.loads(os.environ.get("E2E_SCHEDULE", "{}")).items():
    _actor(_name, _spec)


@dramatiq.actor(actor_name="e2e_echo", queue_name=NAMESPACE, max_retries=0)
def echo(*args: Any, **kwargs: Any) -> None:
    """Not periodic: what schedules stored at run time name; reports the arguments it got."""
    message = CurrentMessage.get_current_message()
    assert message is not None
    info = message.options.get("anarchon") or {}
    fields = {
        "job": info.get("job"),
        "slot_id": info.get("slot_id"),
        "attempt": info.get("attempt"),
        "sent_by": info.get("sent_by"),
        "pid": os.getpid(),
        "message_id": message.message_id,
        "info": info,
        "args": list(args),
        "kwargs": kwargs,
    }
    report().write("start", **fields)
    time.sleep(0.1)
    report().write("end", **fields)
