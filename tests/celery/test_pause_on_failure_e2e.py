"""``anarchon_pause_on_failure``: real ``celery beat`` and ``celery worker`` processes on a
Redis broker; the entry's task fails, the worker pauses the entry on every beat, with why."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon_core import open_store
from anarchon_core.pauses import reasons
from tests.celery.harness import slot_seconds
from tests.celery.test_expiry_e2e import ExpiryFleet
from tests.fleet import fleets
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

EVERY = 3


@pytest.fixture
def pods(tmp_path: Path, redis_url: str) -> Iterator[ExpiryFleet]:
    broker = f"{redis_url.rsplit('/', 1)[0]}/{1 + uuid.uuid4().int % 9}"
    for make in fleets(ExpiryFleet, tmp_path):
        fleet = make(broker, {"broken": {"every": EVERY, "work": 0.1, "task": "e2e.broken"}})
        fleet.env["E2E_OPTIONS"] = json.dumps({"broken": {"anarchon_pause_on_failure": True}})
        fleet.worker("w1", beat=False, concurrency=1)
        yield fleet


def test_a_failed_task_pauses_its_entry_on_every_beat_with_the_reason(pods: ExpiryFleet) -> None:
    pods.beat("b1")
    pods.beat("b2")
    pods.first_start()
    store = open_store(pods.env["E2E_BROKER"], namespace=pods.namespace)
    try:
        wait_until(lambda: "broken" in store.paused().jobs, 20, "the entry to be paused")
        why = reasons(store)["broken"]
        # The first failure a worker tracked (beat hands slots off once it has seen that
        # the workers track execution: a slot sent before that is the worker's alone).
        started = [line["slot_id"] for line in pods.starts("broken")]
        assert why.slot_id in started
        assert why.reason == f"paused on failure: {why.slot_id} attempt 1 ended failed"
        assert why.by.startswith(pods.starts("broken")[0]["worker"].split("@")[-1])
        # Two more slots pass: neither beat sends the entry again.
        quiet_until = slot_seconds(why.slot_id) + 2 * EVERY + 1
        wait_until(lambda: time.time() > quiet_until, 3 * EVERY + 5, "two more slots to pass")
        assert [line["slot_id"] for line in pods.starts("broken")] == started
        assert max(started, key=slot_seconds) == why.slot_id
        assert pods.mentions("paused on every instance"), pods.tail()
    finally:
        store.close()
