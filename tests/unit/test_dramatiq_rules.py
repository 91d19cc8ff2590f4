"""A periodic actor's rules (schedule_overlap, schedule_limit, schedule_pause_on_failure)."""

from __future__ import annotations

import pytest

from anarchon_core import JobOptions, Overlap
from anarchon_dramatiq.declarations import ScheduleError, read_declaration

DEFAULTS = JobOptions.build(lease=10)


def test_the_rules_reach_the_actors_declaration() -> None:
    spec = read_declaration(
        "sync",
        {
            "schedule": "*/5 * * * *",
            "schedule_overlap": "buffer_one",
            "schedule_limit": 3,
            "schedule_pause_on_failure": True,
        },
        DEFAULTS,
        300,
    )
    assert spec.rules == {"overlap": "buffer_one", "limit": 3, "pause_on_failure": True}
    assert Overlap(spec.rules["overlap"]) is Overlap.BUFFER_ONE


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("schedule_overlap", "queue", "actor 'sync': schedule_overlap='queue': not a policy"),
        ("schedule_limit", 0, "actor 'sync': schedule_limit=0: expected a whole number"),
        ("schedule_pause_on_failure", "yes", "actor 'sync': schedule_pause_on_failure='yes'"),
    ],
)
def test_a_bad_rule_fails_at_declaration_naming_actor_and_option(
    option: str, value: object, message: str
) -> None:
    with pytest.raises(ScheduleError, match=message):
        read_declaration("sync", {"schedule": "*/5 * * * *", option: value}, DEFAULTS, 300)


def noop() -> None:
    """An actor body."""


def test_the_pods_scheduler_declares_the_actors_job_with_its_rules() -> None:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from anarchon_dramatiq import Anarchon, every

    broker = StubBroker()
    middleware = Anarchon(store="memory://", scheduler=False)
    broker.add_middleware(middleware)
    dramatiq.actor(
        noop,
        broker=broker,
        schedule=every(60),
        schedule_overlap="buffer_all",
        schedule_limit=10,
        schedule_pause_on_failure=True,
    )
    engine = middleware.build_engine(broker, "test:1")
    try:
        rules = engine.job_named("noop").rules
    finally:
        engine.stop(timeout=0)
    assert (rules.overlap, rules.limit, rules.pause_on_failure) == (Overlap.BUFFER_ALL, 10, True)


# -- schedule_overlap="allow_all": slots side by side, no limit with it -------------


def test_allow_all_is_accepted_and_declared() -> None:
    spec = read_declaration(
        "sync", {"schedule": "*/5 * * * *", "schedule_overlap": "allow_all"}, DEFAULTS, 300
    )
    assert spec.rules == {"overlap": "allow_all"}
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from anarchon_dramatiq import Anarchon, every

    broker = StubBroker()
    middleware = Anarchon(store="memory://", scheduler=False)
    broker.add_middleware(middleware)
    dramatiq.actor(broker=broker, schedule=every(60), schedule_overlap="allow_all")(noop)
    engine = middleware.build_engine(broker, "test:1")
    try:
        rules = engine.job_named("noop").rules
    finally:
        engine.stop(timeout=0)
    assert (rules.overlap, rules.limit) == (Overlap.ALLOW_ALL, None)


def test_allow_all_with_a_limit_is_refused_naming_the_actor() -> None:
    with pytest.raises(
        ScheduleError, match="actor 'sync': schedule_limit=3 with overlap='allow_all'"
    ):
        read_declaration(
            "sync",
            {"schedule": "*/5 * * * *", "schedule_overlap": "allow_all", "schedule_limit": 3},
            DEFAULTS,
            300,
        )
    # Declared as a user declares it: the actor is refused, named, when declared.
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from anarchon_dramatiq import Anarchon, every

    broker = StubBroker()
    broker.add_middleware(Anarchon(store="memory://", scheduler=False))
    with pytest.raises(
        ScheduleError, match="actor 'noop': schedule_limit=3 with overlap='allow_all'"
    ):
        dramatiq.actor(
            broker=broker, schedule=every(60), schedule_overlap="allow_all", schedule_limit=3
        )(noop)
    assert "noop" not in broker.get_declared_actors()
