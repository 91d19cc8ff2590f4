"""A Celery app and a Dramatiq broker whose store URL holds a secret (see test_cli_secrets.py).

Configured from the environment: ``SECRET_APP_STORE``, the store URL (unset:
Celery's store is its broker, ``SECRET_APP_BROKER``, default ``memory://``);
``SECRET_APP_NAMESPACE``. Neither broker is ever reached: Celery's is in
memory and Dramatiq's is a stub, so only the store is contacted.
"""

from __future__ import annotations

import os
from datetime import timedelta

import dramatiq
from celery import Celery
from dramatiq.brokers.stub import StubBroker

from anarchon_dramatiq import Anarchon, every

STORE = os.environ.get("SECRET_APP_STORE") or None
NAMESPACE = os.environ.get("SECRET_APP_NAMESPACE", "secrets")

app = Celery("anarchon_secrets", broker=os.environ.get("SECRET_APP_BROKER", "memory://"))
app.conf.update(
    anarchon_store=STORE,
    anarchon_namespace=NAMESPACE,
    anarchon_lease=3,
    beat_schedule={"tick": {"task": "secrets.tick", "schedule": timedelta(seconds=1)}},
    task_ignore_result=True,
    timezone="UTC",
)


@app.task(name="secrets.tick")  # type: ignore[untyped-decorator]
def tick() -> None:
    """Never runs: no worker is started."""


broker = StubBroker()
broker.add_middleware(Anarchon(store=STORE, namespace=NAMESPACE, lease=3))
dramatiq.set_broker(broker)


def _periodic() -> None:
    """Never runs: no worker is started."""


dramatiq.actor(actor_name="secrets_periodic", schedule=every(1))(_periodic)
