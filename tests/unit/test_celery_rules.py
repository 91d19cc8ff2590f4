"""An entry's rules: ``anarchon_overlap``, ``anarchon_limit``, ``anarchon_pause_on_failure``."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon_celery import Scheduler
from anarchon_celery.schedules import read_entry
from anarchon_core import ConfigurationError, Overlap
from tests.unit.test_celery_entry_rules import entry, make_app


@pytest.fixture
def beats() -> Iterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for beat in reversed(made):
        beat.close()


def test_the_rules_are_read_from_the_options_and_not_sent() -> None:
    read = read_entry(
        "report",
        entry(
            anarchon_overlap="buffer_one",
            anarchon_limit=3,
            anarchon_pause_on_failure=True,
            queue="q",
        ),
        "UTC",
    )
    assert read.rules == {"overlap": "buffer_one", "limit": 3, "pause_on_failure": True}
    assert read.options == {"queue": "q"}
    assert read.job_options == {}


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"anarchon_overlap": "queue"}, "anarchon_overlap='queue': not a policy"),
        ({"anarchon_limit": 0}, "anarchon_limit=0: expected a whole number of slots"),
        ({"anarchon_pause_on_failure": "yes"}, "anarchon_pause_on_failure='yes'"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_entry_and_the_option(
    options: dict[str, object], said: str
) -> None:
    with pytest.raises(ConfigurationError, match=r"beat_schedule\['report'\]: " + said):
        read_entry("report", entry(**options), "UTC")


def test_beat_declares_the_entrys_job_with_its_rules(
    tmp_path: Path, beats: list[Scheduler]
) -> None:
    app = make_app(
        tmp_path,
        {
            "report": entry(
                anarchon_overlap="buffer_all", anarchon_limit=7, anarchon_pause_on_failure=True
            )
        },
    )
    beats.append(beat := Scheduler(app))
    assert beat.engine is not None
    rules = beat.engine.job_named("report").rules
    assert (rules.overlap, rules.limit, rules.pause_on_failure) == (Overlap.BUFFER_ALL, 7, True)


# -- anarchon_overlap="allow_all": slots side by side, no limit with it -------------


def test_allow_all_is_read_from_the_options_and_declared(
    tmp_path: Path, beats: list[Scheduler]
) -> None:
    read = read_entry("report", entry(anarchon_overlap="allow_all", queue="q"), "UTC")
    assert read.rules == {"overlap": "allow_all"}
    assert read.options == {"queue": "q"}  # not sent with the task
    app = make_app(tmp_path, {"report": entry(anarchon_overlap="allow_all")})
    beats.append(beat := Scheduler(app))
    assert beat.engine is not None
    rules = beat.engine.job_named("report").rules
    assert (rules.overlap, rules.limit) == (Overlap.ALLOW_ALL, None)


def test_allow_all_with_a_limit_is_refused_naming_the_entry(
    tmp_path: Path, beats: list[Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    said = r"beat_schedule\['report'\]: anarchon_limit=3 with overlap='allow_all'"
    with pytest.raises(ConfigurationError, match=said):
        read_entry("report", entry(anarchon_overlap="allow_all", anarchon_limit=3), "UTC")
    # At beat start: beat stops (exit status 1), saying why, naming the entry; an entry
    # beside it that is fine does not start it either.
    app = make_app(
        tmp_path,
        {
            "fine": entry(anarchon_overlap="allow_all"),
            "report": entry(anarchon_overlap="allow_all", anarchon_limit=3),
        },
    )
    with pytest.raises(SystemExit) as stopped:
        beats.append(Scheduler(app))
    assert stopped.value.code == 1
    assert beats == []
    (record,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert re.search("anarchon: beat cannot start: " + said, record.getMessage())
