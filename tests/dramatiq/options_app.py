"""The end-to-end app (tests/dramatiq/e2e_app.py), plus actors declared with actor options.

Its broker and report are e2e_app's; ``E2E_OPTIONED`` (JSON) declares more actors:
actor name -> {"every": seconds, "work": seconds, "options": {actor options}}.
Each reports its runs as e2e_app's actors do (``start`` and ``end`` lines).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from anarchon_dramatiq import every
from tests.dramatiq.e2e_app import NAMESPACE, broker, report

__all__ = ["broker"]


def _actor(name: str, spec: dict[str, Any]) -> None:
    def work() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        info = message.options.get("anarchon") or {}
        fields = {
            "job": name,
            "slot_id": info.get("slot_id"),
            "attempt": info.get("attempt"),
            "pid": os.getpid(),
            "message_id": message.message_id,
            "max_age": message.options.get("max_age"),
        }
        report().write("start", **fields)
        time.sleep(spec.get("work", 0.2))
        report().write("end", **fields)

    dramatiq.actor(
        work,
        actor_name=name,
        queue_name=NAMESPACE,
        max_retries=0,
        schedule=every(spec["every"]),
        **spec.get("options", {}),
    )


for _name, _spec in json.loads(os.environ.get("E2E_OPTIONED", "{}")).items():
    _actor(_name, _spec)
