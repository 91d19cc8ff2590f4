"""A slot's three forms: its time, the store's milliseconds, and the "job@ms" id."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from anarchon_core import ConfigurationError, Run, slot_id
from anarchon_core.slots import Slot

AT = datetime(2024, 1, 1, tzinfo=timezone.utc)


def test_a_slot_in_milliseconds_and_as_an_id() -> None:
    slot = Slot("backup", AT + timedelta(microseconds=1500))
    assert slot.ms == 1704067200001  # floored, as the store keys it
    assert slot.id == "backup@1704067200001" == slot_id("backup", slot.time)


def test_slots_are_equal_by_job_and_instant() -> None:
    athens = datetime(2024, 1, 1, 2, tzinfo=ZoneInfo("Europe/Athens"))
    assert Slot("a", athens) == Slot("a", AT)
    assert Slot("a", AT) != Slot("b", AT)


def test_a_slot_from_milliseconds_and_from_its_id() -> None:
    assert Slot.from_ms("a", 1704067200000) == Slot("a", AT)
    assert Slot.from_id("a@1704067200000") == Slot("a", AT)
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert Slot.from_id("mail@home@-1") == Slot("mail@home", epoch - timedelta(milliseconds=1))
    slot = Slot("a", AT)
    assert Slot.from_id(slot.id) == Slot.from_ms(slot.job, slot.ms) == slot


@pytest.mark.parametrize("bad", ["a", "@1000", "a@", "a@ten", "a@1.5", "a@--1"])
def test_a_malformed_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="job@unix_ms"):
        Slot.from_id(bad)


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        Slot("a", datetime(2024, 1, 1))


def test_a_run_of_a_slot() -> None:
    run = Run.of(Slot("a", AT), attempt=2, token=7, instance="i")
    assert (run.job, run.slot, run.slot_id) == ("a", AT, "a@1704067200000")
    assert (run.attempt, run.token, run.instance) == (2, 7, "i")
