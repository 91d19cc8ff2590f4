"""A Dramatiq broker and periodic actor that use only what ``anarchon[dramatiq]`` installs.

Copied into an empty directory and run by the ``dramatiq`` command of a
virtual environment holding the project and one extra, nothing else.
Configured from the environment: ``APP_BROKER`` (``redis://`` or ``amqp://``),
``APP_STORE`` (optional: the broker serves as the store), ``APP_NAMESPACE``
(also the queue), ``APP_REPORT`` (the JSON-lines file the actor appends to).
"""

from __future__ import annotations

import json
import os

import dramatiq
from dramatiq import Broker
from dramatiq.middleware import CurrentMessage

from anarchon_dramatiq import Anarchon, every

NAMESPACE = os.environ["APP_NAMESPACE"]
URL = os.environ["APP_BROKER"]

broker: Broker
if URL.startswith("amqp"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=URL)
else:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=URL)
broker.add_middleware(CurrentMessage())
# A pod on a loaded machine may stall for longer than the 1 s interval: the slots it
# then finds late are still sent within this window (one missed past it fails the test).
broker.add_middleware(
    Anarchon(store=os.environ.get("APP_STORE") or None, namespace=NAMESPACE, catch_up=10)
)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=NAMESPACE, max_retries=0, schedule=every(1))
def tick() -> None:
    message = CurrentMessage.get_current_message()
    info = (message.options.get("anarchon") if message else None) or {}
    line = {
        "slot_id": info.get("slot_id"),
        "attempt": info.get("attempt"),
        "id": message.message_id if message else None,
    }
    fd = os.open(os.environ["APP_REPORT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
