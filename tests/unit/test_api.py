"""Declaring jobs: the public API, and bad input refused at declaration time."""

from __future__ import annotations

from datetime import timedelta

import pytest

import anarchon_core as anarchon
from anarchon_core import ConfigurationError, MissingDependency, Scheduler
from anarchon_core.durations import parse_duration
from anarchon_core.jobs import JobOptions
from anarchon_core.stores.memory import MemoryStore
from anarchon_core.urls import SCHEMES, open_store, redact


@pytest.fixture
def cron() -> Scheduler:
    return Scheduler(MemoryStore(namespace="billing"))


def test_the_error_tree() -> None:
    assert issubclass(anarchon.ConfigurationError, anarchon.AnarchonError)
    assert issubclass(anarchon.ConfigurationError, ValueError)
    assert issubclass(anarchon.MissingDependency, anarchon.AnarchonError)
    assert issubclass(anarchon.MissingDependency, ImportError)
    assert issubclass(anarchon.StoreUnavailable, anarchon.AnarchonError)
    assert issubclass(anarchon.LeaseLost, anarchon.AnarchonError)


def test_decorator_registers_jobs_with_their_options(cron: Scheduler) -> None:
    @cron.job(every=10)
    def sync_customers(run: anarchon.Run) -> None: ...

    @cron.job("digest", cron="0 8 * * *", timezone="Europe/Athens", lease=30, catch_up="1h")
    def send_digest(run: anarchon.Run) -> None: ...

    jobs = cron.jobs
    assert sorted(jobs) == [
        "digest",
        "test_decorator_registers_jobs_with_their_options.<locals>.sync_customers",
    ]
    digest = jobs["digest"]
    assert digest.options.lease == 30
    assert digest.options.renew_every == 10
    assert digest.options.catch_up == 3600
    assert send_digest.__name__ == "send_digest"  # the decorator returns the function


def test_scheduler_defaults_apply_to_every_job_and_jobs_override(cron: Scheduler) -> None:
    scheduler = Scheduler(MemoryStore(), lease="20s", jitter=0.5)
    a = scheduler.add_job(lambda: None, name="a", every=60)
    b = scheduler.add_job(lambda: None, name="b", every=60, lease=45, jitter=timedelta(seconds=2))
    assert (a.options.lease, a.jitter) == (20, 0.5)
    assert (b.options.lease, b.jitter) == (45, 2)


def test_jitter_is_capped_at_a_tenth_of_the_interval(cron: Scheduler) -> None:
    assert cron.add_job(lambda: None, name="fast", every=2).jitter == pytest.approx(0.2)
    assert cron.add_job(lambda: None, name="slow", every=60).jitter == 1.0


def test_default_catch_up_is_one_interval_capped_at_an_hour(cron: Scheduler) -> None:
    from datetime import datetime, timezone

    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert cron.add_job(lambda: None, name="a", every=30).catch_up_for(at) == 30
    assert cron.add_job(lambda: None, name="b", cron="0 8 * * *").catch_up_for(at) == 3600
    assert cron.add_job(lambda: None, name="c", every=60, catch_up=0).catch_up_for(at) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "0 25 * * *"}, "hour"),
        ({"cron": "61 * * * *"}, "minute"),
        ({"cron": "0 8 32 * *"}, "day"),
        ({"cron": "0 8 * 13 *"}, "month"),
        ({"cron": "0 8 * * 9"}, "day"),
        ({"cron": "0 8 * *"}, "expected 5 fields"),
        ({"cron": "0 8 * * *", "timezone": "Mars/Base"}, "unknown time zone 'Mars/Base'"),
        ({"every": 0.5}, "under 1 second"),
        ({"every": 10, "cron": "* * * * *"}, "every"),
        ({}, "every"),
        ({"every": 10, "timezone": "UTC"}, "timezone"),
        ({"every": 10, "lease": 3, "renew": 2}, "shorter than 3 renewals"),
        ({"every": 10, "jitter": 10}, "not shorter than the interval"),
        ({"every": 10, "lease": 0}, "lease"),
        ({"every": 10, "lease": "ten"}, "duration"),
        ({"every": 10, "catch_up": -1}, "catch_up"),
        ({"every": 10, "watch": 0}, "watch"),
    ],
)
def test_bad_declarations_are_refused_with_a_clear_message(
    cron: Scheduler, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        cron.add_job(lambda: None, name="bad", **kwargs)  # type: ignore[arg-type]
    assert cron.jobs == {}  # nothing half-registered


def test_duplicate_names_are_refused_and_the_first_job_stays(cron: Scheduler) -> None:
    first = cron.add_job(lambda: None, name="job", every=10)
    with pytest.raises(ConfigurationError, match="duplicate job name 'job'"):
        cron.add_job(lambda: None, name="job", every=20)
    assert cron.jobs == {"job": first}


def test_a_removed_job_can_be_declared_again(cron: Scheduler) -> None:
    cron.add_job(lambda: None, name="job", every=10)
    cron.remove_job("job")
    assert cron.add_job(lambda: None, name="job", every=20).name == "job"


def test_bad_names_and_handlers(cron: Scheduler) -> None:
    with pytest.raises(ConfigurationError, match="empty or only spaces"):
        cron.add_job(lambda: None, name="  ", every=10)
    with pytest.raises(ConfigurationError, match="not callable"):
        cron.add_job("print", name="x", every=10)  # type: ignore[arg-type]


def test_store_urls() -> None:
    with pytest.raises(ConfigurationError, match=r"memory://, sqlite://, redis://"):
        open_store("mongodb://u:pw@host/db")
    with pytest.raises(ConfigurationError) as info:
        open_store("mongodb://u:pw@host/db")
    assert "pw" not in str(info.value)
    assert "mongodb://u:***@host/db" in str(info.value)
    with pytest.raises(ConfigurationError, match="sqlite:////absolute"):
        open_store("sqlite://relative.db")
    with pytest.raises(ConfigurationError, match="namespace"):
        open_store("memory://", namespace="has space")
    assert open_store("memory://", namespace="a").namespace == "a"


def test_a_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SCHEMES, "fancy", ("anarchon_no_such_driver:Store", "fancy"))
    with pytest.raises(MissingDependency, match=r"pip install 'anarchon\[fancy\]'"):
        open_store("fancy://host")


def test_the_namespace_belongs_to_the_store() -> None:
    with pytest.raises(ConfigurationError, match="namespace"):
        Scheduler(MemoryStore(namespace="a"), namespace="b")
    assert Scheduler("memory://", namespace="billing").namespace == "billing"
    with pytest.raises(ConfigurationError, match="expected a Store"):
        Scheduler(42)  # type: ignore[arg-type]


def test_redact_hides_passwords_only() -> None:
    assert redact("redis://:secret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("postgresql://app:pw@db/x") == "postgresql://app:***@db/x"
    assert redact("sqlite:///jobs.db") == "sqlite:///jobs.db"


def test_durations() -> None:
    assert parse_duration("x", "1h") == 3600
    assert parse_duration("x", "500ms") == 0.5
    assert parse_duration("x", "2d") == 172800
    assert parse_duration("x", timedelta(minutes=5)) == 300
    assert parse_duration("x", 7) == 7
    for bad in (True, "1 week", float("nan"), -1, None):
        with pytest.raises(ConfigurationError, match="x="):
            parse_duration("x", bad)  # type: ignore[arg-type]
    assert JobOptions.build(lease="30s").renew_every == 10


def test_redact_hides_tokens_in_the_query() -> None:
    assert redact("libsql://db.example?authToken=abc.def") == "libsql://db.example?authToken=***"
    assert redact("sqlite:///x.db?busy_timeout=2") == "sqlite:///x.db?busy_timeout=2"
