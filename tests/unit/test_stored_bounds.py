"""Stored schedules with a start and an end: written down, read back, and run.

A definition's bounds are kept in its JSON as ISO 8601 strings with their
offset; they are checked with the schedule, before anything is written; every
instance that runs the stored schedule runs only its slots between them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from anarchon_core import ConfigurationError, Control, Scheduler, slot_id
from anarchon_core.control import DEFINED, Definition
from anarchon_core.store import ControlStore
from anarchon_core.stores.memory import MemoryStore
from anarchon_core.stores.sqlite import SQLiteStore
from tests.sim import START, Cluster

UTC = timezone.utc
PARIS_WINTER = timezone(timedelta(hours=1))


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(START + seconds, UTC)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ControlStore]:
    if request.param == "memory":
        opened: ControlStore = MemoryStore(namespace="bounds")
    else:
        opened = SQLiteStore(str(tmp_path / "bounds.db"), namespace="bounds")
    try:
        yield opened
    finally:
        opened.close()


def test_bounds_are_written_as_iso_strings_with_their_offset_and_read_back(
    store: ControlStore,
) -> None:
    control = Control(store)
    added = control.add(
        Definition(
            name="report",
            handler="work",
            cron="0 9 * * *",
            timezone="Europe/Paris",
            start=datetime(2027, 1, 1, 8, tzinfo=PARIS_WINTER),  # an aware datetime
            end="2027-03-31T23:59:59.500+02:00",  # or an ISO string, in any offset
        )
    )
    written = json.loads(store.controls(DEFINED + "report")[DEFINED + "report"][1])
    assert (written["start"], written["end"]) == (
        "2027-01-01T07:00:00+00:00",
        "2027-03-31T21:59:59.500000+00:00",
    )
    read = control.definitions()["report"]
    assert read == added
    assert (read.start, read.end) == (written["start"], written["end"])
    assert read.describe() == (
        "cron '0 9 * * *' (Europe/Paris), starting 2027-01-01T07:00:00+00:00,"
        " ending 2027-03-31T21:59:59.500000+00:00 -> work"
    )
    # The same instants given either way make the same definition.
    assert read == Definition(
        name="report",
        handler="work",
        cron="0 9 * * *",
        timezone="Europe/Paris",
        start="2027-01-01T07:00:00Z",
        end=datetime(2027, 3, 31, 21, 59, 59, 500_000, tzinfo=UTC),
        version=read.version,
    )


def test_a_definition_written_without_bounds_still_reads_and_is_written_without_them(
    store: ControlStore,
) -> None:
    # As an instance that predates start and end wrote it.
    old = '{"anchor":null,"args":[],"cron":null,"every":60,"handler":"work",'
    old += '"job_options":{},"kwargs":{},"options":{},"timezone":null}'
    store.set_control(DEFINED + "old", old, 0)
    read = Control(store).definitions()["old"]
    assert (read.start, read.end, read.every) == (None, None, 60)
    assert read.describe() == "every 60s -> work"
    # Unbounded, it is written as before: an older instance still reads it.
    assert read.to_json() == old


@pytest.mark.parametrize(
    ("bounds", "said"),
    [
        ({"start": "2027-01-01T08:00:00"}, "job 'report': start=2027-01-01T08:00:00: give its"),
        ({"end": datetime(2027, 1, 1)}, "job 'report': end=2027-01-01T00:00:00: give its"),
        ({"end": "next tuesday"}, "job 'report': end='next tuesday': not an ISO 8601"),
        ({"start": 1_700_000_000}, "job 'report': start=1700000000: expected a datetime"),
        (
            {"start": "2027-02-01T00:00:00+00:00", "end": "2027-01-01T00:00:00+00:00"},
            "job 'report': end=2027-01-01T00:00:00+00:00 is before start=2027-02-01",
        ),
        (
            {"start": "2027-01-01T09:00:30+00:00", "end": "2027-01-01T09:00:50+00:00"},
            "job 'report': every 60s has no slot from start=",
        ),
    ],
)
def test_bad_bounds_name_the_job_and_the_field_and_nothing_is_written(
    store: ControlStore, bounds: dict[str, object], said: str
) -> None:
    control = Control(store)
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        Definition(name="report", handler="work", every=60, **bounds)  # type: ignore[arg-type]
    # A change to such bounds is refused the same way, and leaves the stored one as it is.
    stored = control.add(Definition(name="report", handler="work", every=60))
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        control.change("report", **bounds)
    assert control.definitions() == {"report": stored}


def test_a_change_sets_keeps_and_clears_each_bound(store: ControlStore) -> None:
    control = Control(store)
    control.add(Definition(name="report", handler="work", every=60, start=at(0)))
    _, after = control.change("report", end=at(3600))
    assert (after.start, after.end) == (at(0).isoformat(), at(3600).isoformat())
    _, after = control.change("report", every=120)  # another field: the bounds stay
    assert (after.every, after.start, after.end) == (120, at(0).isoformat(), at(3600).isoformat())
    _, after = control.change("report", start=None)  # cleared
    assert (after.start, after.end) == (None, at(3600).isoformat())
    assert control.definitions()["report"] == after
    assert "start" not in json.loads(after.to_json())


def test_a_stored_schedule_runs_only_its_slots_from_start_to_end_on_every_instance() -> None:
    cluster = Cluster()
    for name in "abc":
        cluster.add(name, lambda s: s.handler("work")(cluster.handler(0.2)), jitter=0)
    Control(cluster.store).add(
        Definition(name="stored", handler="work", every=10, start=at(25), end=at(65))
    )
    cluster.run(120)
    slots = cluster.slots("stored")
    assert set(slots) == {slot_id("stored", at(k)) for k in (30, 40, 50, 60)}
    assert all(len(spans) == 1 for spans in slots.values())  # each once, fleet-wide

    # Its end moved later: every instance follows it, and stops at the new end.
    Control(cluster.store).change("stored", end=at(185))
    cluster.run(120)
    later = {
        int(s.split("@")[1]) // 1000 - int(START)
        for s in cluster.slots("stored")
        if int(s.split("@")[1]) > (START + 60) * 1000
    }
    assert {130, 140, 150, 160, 170, 180} <= later, sorted(later)
    assert max(later) == 180 and min(later) >= 120, sorted(later)
    assert all(len(spans) == 1 for spans in cluster.slots("stored").values())


def test_an_ended_stored_schedule_is_applied_and_runs_nothing() -> None:
    clock_start = START + 1000
    cluster = Cluster()
    cluster.clock.advance(1000)
    assert cluster.now() == clock_start
    ran: list[str] = []
    cluster.add("a", lambda s: s.handler("work")(lambda run: ran.append(run.slot_id)), jitter=0)
    Control(cluster.store).add(Definition(name="gone", handler="work", every=10, end=at(500)))
    cluster.run(60)
    scheduler: Scheduler = cluster.live["a"]
    assert "gone" in scheduler.jobs  # applied, not refused
    assert ran == []
    assert scheduler.next_slots("gone") == []
