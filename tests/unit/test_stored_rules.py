"""Stored schedules carry their rules (overlap, limit, pause_on_failure), checked and merged."""

from __future__ import annotations

import json

import pytest

from anarchon_core import ConfigurationError, Control, Overlap, Scheduler
from anarchon_core.cli import main
from anarchon_core.clock import FakeClock
from anarchon_core.control import DEFINED, Definition
from anarchon_core.stores.memory import MemoryStore
from tests.sim import START


def test_rules_round_trip_and_are_left_out_when_unset() -> None:
    plain = Definition("poll", "poll", every=60)
    assert "rules" not in json.loads(plain.to_json())  # as releases before rules wrote it
    ruled = Definition("poll", "poll", every=60, rules={"overlap": "buffer_one", "limit": 3})
    again = Definition.from_json("poll", ruled.to_json(), 1)
    assert again.rules == {"overlap": "buffer_one", "limit": 3}
    assert ruled.describe() == "every 60s, limit 3, overlap buffer_one -> poll"
    assert Definition("p", "p", every=60, rules={"pause_on_failure": True}).describe() == (
        "every 60s, pause on failure -> p"
    )


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"overlap": "queue"}, "job 'poll': overlap='queue': not a policy"),
        ({"limit": 0}, "job 'poll': limit=0: expected a whole number"),
        ({"pause_on_failure": "yes"}, "job 'poll': pause_on_failure='yes'"),
        ({"retries": 3}, "job 'poll': unknown rules \\['retries'\\]"),
    ],
)
def test_a_bad_rule_is_refused_naming_job_and_rule(rules: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Definition("poll", "poll", every=60, rules=rules)


def test_a_change_of_one_rule_or_option_keeps_the_others() -> None:
    control = Control(MemoryStore(namespace="t"))
    control.add(
        Definition(
            "poll",
            "poll",
            every=60,
            job_options={"lease": 30, "jitter": 2},
            rules={"overlap": "buffer_all", "limit": 5},
        )
    )
    _, after = control.change("poll", job_options={"lease": 20}, rules={"limit": None})
    assert dict(after.job_options) == {"lease": 20, "jitter": 2}
    assert dict(after.rules) == {"overlap": "buffer_all"}


def test_a_stored_schedule_is_declared_with_its_rules() -> None:
    store = MemoryStore(namespace="t")
    Control(store).add(
        Definition("poll", "poll", every=60, rules={"overlap": "buffer_one", "limit": 4})
    )
    scheduler = Scheduler(store, clock=FakeClock(START))
    scheduler.handler("poll")(lambda: None)
    scheduler.run_pending()
    rules = scheduler.job_named("poll").rules
    assert (rules.overlap, rules.limit) == (Overlap.BUFFER_ONE, 4)


def test_the_command_line_sets_changes_and_clears_rules(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    argv = ["add", "poll", "--store", url, "--handler", "poll", "--every", "60"]
    rules = ["--overlap", "buffer_one", "--limit", "5", "--pause-on-failure", "true"]
    assert main([*argv, *rules]) == 0
    assert "limit 5, overlap buffer_one, pause on failure -> poll" in capsys.readouterr().out
    assert main(["change", "poll", "--store", url, "--limit", "none"]) == 0
    stored = Control(url).store.controls(DEFINED + "poll")[DEFINED + "poll"][1]
    assert json.loads(stored)["rules"] == {"overlap": "buffer_one", "pause_on_failure": True}
    capsys.readouterr()
    assert main(["change", "poll", "--store", url, "--limit", "many"]) == 2
    assert "--limit 'many': a whole number of slots" in capsys.readouterr().err
    assert main(["change", "poll", "--store", url, "--overlap", "queue"]) == 2
    assert "overlap='queue': not a policy" in capsys.readouterr().err


# -- overlap="allow_all": slots side by side, no limit with it ----------------------


def test_allow_all_is_stored_and_declared_and_a_limit_with_it_refused(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    argv = ["add", "poll", "--store", url, "--handler", "poll", "--every", "60"]
    assert main([*argv, "--overlap", "allow_all"]) == 0
    assert "every 60s, overlap allow_all -> poll" in capsys.readouterr().out
    control = Control(url)
    stored = control.store.controls(DEFINED + "poll")[DEFINED + "poll"][1]
    assert json.loads(stored)["rules"] == {"overlap": "allow_all"}
    # An instance on the store declares it with the policy.
    scheduler = Scheduler(url, clock=FakeClock(START))
    try:
        scheduler.handler("poll")(lambda: None)
        scheduler.run_pending()
        rules = scheduler.job_named("poll").rules
    finally:
        scheduler.stop(timeout=0)
    assert (rules.overlap, rules.limit) == (Overlap.ALLOW_ALL, None)

    # A limit beside it: refused, saying why, whether added so or changed to it.
    said = "job 'other': limit=3 with overlap='allow_all'"
    other = ["add", "other", "--store", url, "--handler", "poll", "--every", "60"]
    assert main([*other, "--overlap", "allow_all", "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert said in err and "use another overlap policy with a limit" in err, err
    assert main(["change", "poll", "--store", url, "--limit", "3"]) == 2
    assert "job 'poll': limit=3 with overlap='allow_all'" in capsys.readouterr().err
    # Nothing stored by either.
    assert DEFINED + "other" not in control.store.controls(DEFINED + "other")
    again = control.store.controls(DEFINED + "poll")[DEFINED + "poll"][1]
    assert json.loads(again)["rules"] == {"overlap": "allow_all"}
    control.store.close()


def test_a_stored_schedule_with_allow_all_and_a_limit_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="job 'poll': limit=3 with overlap='allow_all'"):
        Definition("poll", "poll", every=60, rules={"overlap": "allow_all", "limit": 3})
    control = Control(MemoryStore(namespace="t"))
    control.add(Definition("poll", "poll", every=60, rules={"limit": 3}))
    with pytest.raises(ConfigurationError, match="job 'poll': limit=3 with overlap='allow_all'"):
        control.change("poll", rules={"overlap": "allow_all"})
    assert dict(control.definitions()["poll"].rules) == {"limit": 3}
