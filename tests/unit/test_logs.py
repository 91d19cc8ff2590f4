"""Structured logs: every event's record carries its fields; json_logs() writes JSON lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from anarchon_core import Event, Scheduler
from anarchon_core.logs import LOGGERS, json_logs
from anarchon_core.stores.memory import MemoryStore
from tests.waiting import wait_until


@pytest.fixture
def restore_loggers() -> Iterator[None]:
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in LOGGERS]
    handlers = {n: list(logging.getLogger(n).handlers) for n in LOGGERS}
    yield
    for logger, level in saved:
        logger.setLevel(level)
        logger.propagate = True
        logger.handlers[:] = handlers[logger.name]


def _run_two_slots(instance: str) -> None:
    seen: list[Event] = []
    scheduler = Scheduler(
        MemoryStore(namespace="logs"), instance=instance, jitter=0, listener=seen.append
    )
    scheduler.add_job(lambda run: None, name="tick", every=1)
    scheduler.start()
    wait_until(
        lambda: [e for e in seen if e.kind == "finished"], 10, "a finished run", seen=seen.copy
    )
    scheduler.stop()


def test_json_logs_write_one_object_per_event_with_its_fields(restore_loggers: None) -> None:
    out = io.StringIO()
    json_logs(logging.DEBUG, out)
    _run_two_slots("inst-1")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    won = [line for line in lines if line.get("event") == "won"]
    finished = [line for line in lines if line.get("event") == "finished"]
    assert won and finished, lines
    first = won[0]
    assert first["job"] == "tick" and first["slot_id"].startswith("tick@")
    assert first["attempt"] == 1 and isinstance(first["token"], int)
    assert first["instance"] == "inst-1" and first["namespace"] == "logs"
    assert first["level"] == "DEBUG" and first["logger"] == "anarchon_core.scheduler"
    assert first["message"].startswith("anarchon: won tick@")
    assert first["time"].endswith("+00:00")
    # The same slot's end carries the same token: a run can be followed by its fields.
    assert {(x["slot_id"], x["token"]) for x in finished} <= {
        (x["slot_id"], x["token"]) for x in won
    }


def test_any_formatter_finds_the_fields_on_the_record(restore_loggers: None) -> None:
    """No anarchon formatter needed: the fields are attributes of the log record."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("anarchon_core")
    logger.addHandler(Keep())
    logger.setLevel(logging.DEBUG)
    _run_two_slots("inst-2")
    events = [r for r in records if getattr(r, "event", None) == "won"]
    assert events
    record = events[0]
    assert (record.job, record.instance, record.attempt) == ("tick", "inst-2", 1)  # type: ignore[attr-defined]
    assert record.slot_id.startswith("tick@") and record.detail is None  # type: ignore[attr-defined]
