"""The jobs the live instances declare, kept in every store's registry and control entries.

Each instance announces the digest of its declarations in the registry and
keeps the list once per digest in control entries (see
:mod:`anarchon_core.declarations`): on every store that keeps both, another
process reads which jobs each instance declares, with their schedules, and
the copies nobody announces go. RabbitMQ keeps neither: nothing is
announced, no job is known before it is recorded (it records none), and
asking for a job's schedule says the store cannot tell.
"""

from __future__ import annotations

import time
import uuid

import pytest

from anarchon_core import ConfigurationError, Control, FakeClock, Run, Scheduler
from anarchon_core import declarations as decl
from anarchon_core.declarations import INDEX, PARTS, STALE_AFTER
from anarchon_core.peers import ANNOUNCE_EVERY
from anarchon_core.schedules import make_schedule
from anarchon_core.store import MAX_CONTROL_VALUE
from tests.stores.conftest import StoreFactory

#: A bound far ahead: written down with the schedule, read back as written.
END = "2099-01-01T00:00:00+00:00"


def noop(run: Run) -> None:
    """Never due in these tests."""


def test_the_jobs_each_instance_declares_are_read_from_the_store(
    kind: str, make_store: StoreFactory
) -> None:
    clock = FakeClock(time.time())
    fleet = [Scheduler(make_store(), instance=name, clock=clock) for name in ("a", "b")]
    for instance in fleet:
        instance.add_job(noop, name="tick", every=3600)
        instance.add_job(noop, name="nightly", cron="0 3 * * *", timezone="Europe/Paris", end=END)
    for instance in fleet:
        instance.run_pending()
    reader = make_store()
    control = Control(reader)
    if kind == "rabbitmq":
        assert control.declarations().jobs == {}
        with pytest.raises(ConfigurationError, match="keeps no registry of instances nor"):
            control.schedule_of("tick")
        return

    declared = control.declarations()
    assert declared.silent == ()
    assert {name: (job.spec, job.instances) for name, job in declared.jobs.items()} == {
        "nightly": ({"cron": "0 3 * * *", "timezone": "Europe/Paris", "end": END}, 2),
        "tick": ({"every": 3600.0}, 2),
    }
    # One copy, shared: both announce its digest.
    [digest] = {record.info["decl"] for record in reader.instances()}
    assert {key.split("/")[1] for key in reader.controls(PARTS)} == {digest}
    # Known to every verb before its first slot, with its next slots.
    assert control.trigger("tick").startswith("tick@")
    upcoming, _, source = control.next_slots("nightly", 2)
    assert [slot.local.hour for slot in upcoming] == [3, 3]
    assert source == "declared by 2 live instance(s)"

    # b stops declaring nightly: a copy of its own; nightly is declared by a alone.
    fleet[1].remove_job("nightly")
    clock.advance(ANNOUNCE_EVERY)
    for instance in fleet:
        instance.run_pending()
    declared = control.declarations()
    assert (declared.jobs["nightly"].instances, declared.jobs["tick"].instances) == (1, 2)
    assert len({key.split("/")[1] for key in reader.controls(PARTS)}) == 2


def test_a_long_list_round_trips_in_parts_and_the_stale_copy_goes(
    kind: str, make_store: StoreFactory
) -> None:
    if kind == "rabbitmq":
        pytest.skip("RabbitMQ keeps no control entries (see the test above)")
    store = make_store()
    every = decl.written(make_schedule(every=60))
    cron = decl.written(make_schedule(cron="*/5 * * * *", timezone="America/New_York", end=END))
    old = decl.encode({str(uuid.uuid4()): every if i % 2 else cron for i in range(20_000)})
    new = decl.encode({f"job-{i}": every for i in range(10)})
    assert len(old.parts) > 2
    assert all(len(part.encode()) <= MAX_CONTROL_VALUE for part in old.parts)
    now = time.time()
    assert decl.publish(store, old, now) is None
    assert decl.publish(store, new, now) is None
    other = make_store()  # another connection reads it whole
    listed = decl.read(other, old.digest)
    assert listed is not None and len(listed) == 20_000
    assert decl.read(other, new.digest) == {f"job-{i}": every for i in range(10)}

    # Announced copies stay, however old; a recent one too; the others go.
    assert decl.sweep(store, {new.digest}, now + 1) == []
    assert decl.sweep(store, {new.digest}, now + STALE_AFTER + 1) == [old.digest]
    assert store.controls(f"{PARTS}{old.digest}/") == {}
    assert decl.read(other, new.digest) is not None
    assert list(decl.read(store, new.digest) or {}) == [f"job-{i}" for i in range(10)]
    assert INDEX in store.controls(INDEX)
    assert decl.sweep(store, set(), now + STALE_AFTER + 1) == [new.digest]
    assert store.controls(PARTS, INDEX) == {}
