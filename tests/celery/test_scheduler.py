"""The Celery scheduler's translation of settings and entries, in process."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar

from anarchon_celery import Scheduler
from anarchon_celery.schedules import read_entry
from anarchon_celery.settings import namespace_of, store_url
from anarchon_celery.tracking import task_id
from anarchon_core import ConfigurationError
from tests.servers import free_port


def make_app(**conf: object) -> Celery:
    app = Celery("billing", broker=str(conf.pop("broker_url", "redis://cache:6379/0")))
    app.conf.update(conf)
    return app


def test_the_store_defaults_to_the_broker_when_it_can_serve() -> None:
    assert store_url(make_app()) == "redis://cache:6379/0"
    assert store_url(make_app(broker_url="pyamqp://u:p@mq//")) == "amqp://u:p@mq//"
    assert store_url(make_app(anarchon_store="postgresql://db/x")) == "postgresql://db/x"
    with pytest.raises(ConfigurationError, match="anarchon_store is not set") as info:
        store_url(make_app(broker_url="sqs://key:secret@"))
    assert "secret" not in str(info.value)


def test_the_namespace_defaults_to_the_app_name() -> None:
    assert namespace_of(make_app()) == "billing"
    assert namespace_of(make_app(anarchon_namespace="other")) == "other"


def test_lazy_construction_neither_connects_nor_claims() -> None:
    # Nothing listens on port 1: a connection attempt would fail.
    app = make_app(anarchon_store="redis://127.0.0.1:1/0", beat_schedule={})
    scheduler = Scheduler(app, lazy=True)
    assert scheduler.engine is None
    assert "redis://127.0.0.1:1/0" in scheduler.info
    assert scheduler.tick() == scheduler.max_interval
    scheduler.close()


@pytest.mark.parametrize(
    ("value", "every", "cron"),
    [
        (10, 10.0, None),
        (timedelta(minutes=5), 300.0, None),
        (schedule(timedelta(seconds=30)), 30.0, None),
        (crontab(minute="*/15"), None, "*/15 * * * *"),
        (crontab(minute=0, hour="8", day_of_week="mon-fri"), None, "0 8 * * mon-fri"),
    ],
)
def test_stock_schedules_map_to_grids_and_cron(value: object, every: float, cron: str) -> None:
    entry = read_entry("e", {"task": "t", "schedule": value}, "Europe/Athens")
    assert (entry.every, entry.cron) == (every, cron)
    assert entry.timezone == ("Europe/Athens" if cron else None)


def test_overrides_are_read_and_removed_from_the_options() -> None:
    raw = {
        "task": "t",
        "schedule": 10,
        "args": (1,),
        "kwargs": {"a": 2},
        "options": {"queue": "q", "anarchon_lease": 30, "anarchon_catch_up": "1h"},
    }
    entry = read_entry("e", raw, "UTC")
    assert entry.options == {"queue": "q"}
    assert entry.overrides == {"lease": 30, "catch_up": "1h"}
    assert (entry.args, entry.kwargs) == ((1,), {"a": 2})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"schedule": 10}, "'task' must name a task"),
        ({"task": "t"}, "'schedule' is missing"),
        # (built without its ephem dependency: only its type matters here)
        ({"task": "t", "schedule": solar.__new__(solar)}, "solar schedules are not supported"),
        ({"task": "t", "schedule": 10, "options": {"anarchon_leese": 3}}, "anarchon_leese"),
        ({"task": "t", "schedule": "often"}, "unsupported schedule"),
    ],
)
def test_invalid_entries_are_named(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        read_entry("nightly", raw, "UTC")
    assert "beat_schedule['nightly']" in str(info.value)


def test_task_ids_name_the_slot_and_attempt() -> None:
    assert task_id("billing", "sync@1700000000000", 2) == "anarchon:billing:sync@1700000000000:2"


def test_a_store_private_to_one_process_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(anarchon_store="memory://", beat_schedule={"e": {"task": "t", "schedule": 1}})
    with pytest.raises(SystemExit):
        Scheduler(app)
    assert "anarchon_store=memory:// is private to one process" in caplog.text


def test_the_pickup_lease_must_exceed_the_lease(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    app = make_app(
        anarchon_store=f"sqlite:///{tmp_path / 's.db'}",
        anarchon_pickup=10,
        beat_schedule={"e": {"task": "t", "schedule": 60, "options": {"anarchon_lease": 30}}},
    )
    with pytest.raises(SystemExit):
        Scheduler(app)
    assert "anarchon_pickup=10 must exceed the lease (30s)" in caplog.text


def test_crontab_fields_given_as_lists_and_sets() -> None:
    entry = read_entry("e", {"task": "t", "schedule": crontab(minute=[0, 30], hour={8, 20})}, "UTC")
    assert entry.cron == "0,30 20,8 * * *"


def test_crontab_with_both_day_fields_is_refused_with_advice_that_keeps_its_meaning() -> None:
    with pytest.raises(ConfigurationError, match="both day_of_month and day_of_week") as info:
        read_entry("e", {"task": "t", "schedule": crontab(day_of_month=1, day_of_week=1)}, "UTC")
    said = str(info.value)
    # Celery means the days that match both: two entries would run on either.
    assert "split it in two" not in said
    assert "match both" in said and "let the task return unless" in said


def test_a_relative_interval_is_refused_with_the_reason() -> None:
    raw = {"task": "t", "schedule": schedule(timedelta(minutes=15), relative=True)}
    with pytest.raises(ConfigurationError, match=r"relative=True\) is not supported") as info:
        read_entry("e", raw, "UTC")
    assert "remove relative=True" in str(info.value)
    plain = read_entry("e", {"task": "t", "schedule": schedule(timedelta(minutes=15))}, "UTC")
    assert plain.every == 900.0


def test_the_startup_line_counts_the_users_entries_apart_from_celerys(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    app = make_app(
        anarchon_store=f"sqlite:///{tmp_path / 's.db'}",
        beat_schedule={
            "digest": {"task": "t", "schedule": 60},
            "report": {"task": "t", "schedule": crontab(minute=0)},
        },
    )
    caplog.set_level("INFO", logger="anarchon_celery.scheduler")
    scheduler = Scheduler(app)
    try:
        assert "celery.backend_cleanup" in scheduler.schedule  # Celery's own, as stock beat
        assert (
            "anarchon: 2 entries (digest, report) and Celery's own celery.backend_cleanup, store"
            in caplog.text
        )
    finally:
        scheduler.close()


@pytest.mark.parametrize("signal", ["worker_shutdown", "worker_process_shutdown"])
def test_a_worker_shutting_down_closes_the_stores_its_tasks_opened(
    signal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery import signals

    from anarchon_core import handoff
    from anarchon_core.stores.memory import MemoryStore

    closed: list[str] = []

    class Closing(MemoryStore):
        def close(self) -> None:
            closed.append(self.namespace)

    monkeypatch.setattr(handoff, "EXECUTIONS", handoff.Executions())
    monkeypatch.setattr(
        handoff, "open_store", lambda url, *, namespace: Closing(namespace=namespace)
    )
    handoff.store_for("sqlite:///tasks.db", "billing")
    getattr(signals, signal).send(sender=None)
    assert closed == ["billing"]


def test_a_store_that_cannot_be_reached_at_start_is_waited_out_and_said_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A wrong port: beat does not stop (a store may come up after the pods), and
    # says at ERROR, with the URL redacted, that nothing is sent meanwhile.
    port = free_port()
    app = make_app(
        anarchon_store=f"redis://:hunter2@127.0.0.1:{port}/0?socket_connect_timeout=1",
        anarchon_tracking=False,
        beat_schedule={"e": {"task": "t", "schedule": 1}},
    )
    scheduler = Scheduler(app)
    try:
        scheduler.tick()
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert [r.name for r in errors] == ["anarchon_core.probes"], caplog.text
        said = errors[0].getMessage()
        assert f"the store redis://:***@127.0.0.1:{port}/0" in said
        assert "has not answered for 0s, since this scheduler started" in said
        assert "no slot is claimed or sent until it does" in said
        assert "hunter2" not in caplog.text
        assert scheduler.engine is not None and scheduler.engine.health().live
    finally:
        scheduler.close()
