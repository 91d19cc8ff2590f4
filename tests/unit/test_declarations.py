"""The jobs the live instances declare, read from the registry: known before their first slot.

Schedulers in this process, on one memory store and a fake clock, announce
themselves as the engine does (each step, every ``ANNOUNCE_EVERY`` seconds);
``Control``, the ``anarchon`` command's functions and the dashboard read what
they declare, as an admin on another machine would.
"""

from __future__ import annotations

import argparse
import io
import json
import uuid
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from anarchon_core import Control, FakeClock, Run, Scheduler
from anarchon_core import declarations as decl
from anarchon_core.cli import EXIT_CONFIG, EXIT_EMPTY, EXIT_OK, control_verb, main, status
from anarchon_core.control import Definition
from anarchon_core.dashboard import Dashboard
from anarchon_core.declarations import (
    INDEX,
    MAX_COPIES,
    PARTS,
    STALE_AFTER,
    VERIFY_EVERY,
    WHOLE_EVERY,
)
from anarchon_core.errors import ConfigurationError, UnknownJob
from anarchon_core.peers import ANNOUNCE_EVERY, ANNOUNCE_TTL
from anarchon_core.schedules import make_schedule
from anarchon_core.store import MAX_CONTROL_VALUE, Store
from anarchon_core.stores.memory import MemoryStore
from anarchon_core.stores.sqlite import SQLiteStore

#: 2023-11-14 22:15:00 UTC: a quarter past, so an hourly job's first slot is 45 minutes away.
START = 1_700_000_100.0
HOUR = 3600


def noop(run: Run) -> None:
    """A handler that is never due in these tests."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock, namespace="declared")


def instance(store: Store, clock: FakeClock, name: str, **jobs: dict[str, Any]) -> Scheduler:
    """An instance declaring ``jobs`` (name -> add_job options), as a service's pod does."""
    made = Scheduler(store, instance=name, clock=clock)
    for job, options in jobs.items():
        made.add_job(noop, name=job, **options)
    return made


def run_for(clock: FakeClock, seconds: float, *instances: Scheduler) -> None:
    """Step ``instances`` every second for ``seconds`` of fake time."""
    for _ in range(int(seconds)):
        for each in instances:
            each.run_pending()
        clock.advance(1)


def parts(store: Store) -> dict[str, dict[str, int]]:
    """The copies the store keeps: digest -> part key -> version."""
    found: dict[str, dict[str, int]] = {}
    for key, (version, _) in store.controls(PARTS).items():
        digest = key[len(PARTS) :].split("/")[0]
        found.setdefault(digest, {})[key] = version
    return found


def digests(store: Store) -> dict[str, Any]:
    """What each live instance announces under ``decl``."""
    return {r.instance: r.info.get("decl") for r in store.instances()}


# -- known at once ------------------------------------------------------------------


def test_a_job_declared_by_live_instances_is_known_before_its_first_slot(
    store: MemoryStore, clock: FakeClock
) -> None:
    a = instance(store, clock, "a", tick={"every": HOUR})
    b = instance(store, clock, "b", tick={"every": HOUR})
    a.run_pending()
    b.run_pending()
    assert store.jobs() == [], "no slot of tick has run: the store has no record of it"

    control = Control(store)
    declared = control.declarations()
    assert list(declared.jobs) == ["tick"] and declared.silent == ()
    tick = declared.jobs["tick"]
    assert (tick.spec, tick.instances) == ({"every": 3600.0}, 2)
    now = datetime.fromtimestamp(START, timezone.utc)
    assert tick.schedule is not None
    assert tick.schedule.next_after(now) == datetime(2023, 11, 14, 23, 0, tzinfo=timezone.utc)

    # Every control verb knows it, without --unrecorded.
    assert control.known("tick")
    [status_] = control.jobs()
    assert status_.job == "tick" and status_.state is None and status_.declared == tick
    assert control.history("tick") == []
    slot_id = control.trigger("tick")
    assert slot_id.startswith("tick@")
    assert control.pause("tick") is True
    assert control.resume("tick") is True

    # A name no live instance declares and the store never recorded is still refused.
    for verb in (control.trigger, control.pause, control.history):
        with pytest.raises(UnknownJob, match="no job named 'tikc' is recorded, stored or declared"):
            verb("tikc")
    out = io.StringIO()
    with pytest.raises(UnknownJob, match="'tikc'"):
        control_verb(argparse.Namespace(verb="pause", jobs=["tick", "tikc"], all=False,
                                        unrecorded=False), control, out)  # fmt: skip
    assert store.paused().jobs == (), "nothing paused when one name is unknown"


def test_identical_instances_share_one_copy_written_once(
    store: MemoryStore, clock: FakeClock
) -> None:
    jobs = {"tick": {"every": HOUR}, "nightly": {"cron": "0 3 * * *", "timezone": "Europe/Paris"}}
    fleet = [instance(store, clock, name, **jobs) for name in ("a", "b", "c")]
    run_for(clock, 1, *fleet)
    announced = digests(store)
    assert set(announced) == {"a", "b", "c"}
    [digest] = set(announced.values())
    copies = parts(store)
    assert list(copies) == [digest], "one copy, shared by the identical instances"
    # Ten minutes on: announced every 5 s, checked every minute, never written again.
    run_for(clock, 600, *fleet)
    assert digests(store) == announced
    assert parts(store) == copies, "the copy was written again"
    index = json.loads(store.controls(INDEX)[INDEX][1])
    assert list(index) == [digest]


def test_a_change_of_jobs_is_a_new_copy_and_the_copy_nobody_announces_goes(
    store: MemoryStore, clock: FakeClock
) -> None:
    a = instance(store, clock, "a", tick={"every": HOUR})
    b = instance(store, clock, "b", tick={"every": HOUR})
    run_for(clock, 1, a, b)
    first = digests(store)["a"]

    # a declares a job more (a stored schedule applied, a deploy): a new digest, a new copy.
    a.add_job(noop, name="report", cron="0 6 * * *")
    run_for(clock, ANNOUNCE_EVERY + 1, a, b)
    second = digests(store)["a"]
    assert second != first and digests(store)["b"] == first
    declared = Control(store).declarations().jobs
    assert (declared["tick"].instances, declared["report"].instances) == (2, 1)
    # The first copy stays while b announces it, however long.
    run_for(clock, STALE_AFTER + 2 * VERIFY_EVERY, a, b)
    assert set(parts(store)) == {first, second}

    # b gone (its record expires): its copy is swept at a's next check, a's own kept.
    run_for(clock, ANNOUNCE_TTL + STALE_AFTER + VERIFY_EVERY + 2 * ANNOUNCE_EVERY, a)
    assert set(parts(store)) == {second}
    assert list(json.loads(store.controls(INDEX)[INDEX][1])) == [second]
    assert list(Control(store).declarations().jobs) == ["report", "tick"]


def test_steps_with_the_same_jobs_do_not_walk_them_again(
    store: MemoryStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy of the jobs an instance announces is worked out once per declaration or
    removal, not at each announcement: between slots, a step costs the same whatever the
    number of jobs."""
    a = instance(store, clock, "a", **{f"job{n}": {"every": HOUR} for n in range(1000)})
    walks: list[int] = []
    table = a._table
    walk = table.runtimes
    monkeypatch.setattr(table, "runtimes", lambda: walks.append(1) or walk())
    run_for(clock, 1, a)
    first = digests(store)["a"]
    assert len(walks) == 1 and first
    # Ten minutes of steps, announcements and checks, no slot due: the jobs not walked.
    run_for(clock, 600, a)
    assert len(walks) == 1 and digests(store)["a"] == first
    assert len(a.jobs) == 1000
    # A job removed, then declared again: each a new copy, worked out once.
    a.remove_job("job7")
    run_for(clock, ANNOUNCE_EVERY + 1, a)
    assert len(walks) == 2 and digests(store)["a"] != first
    assert "job7" not in Control(store).declarations().jobs and len(a.jobs) == 999
    a.add_job(noop, name="job7", every=HOUR)
    run_for(clock, ANNOUNCE_EVERY + 1, a)
    assert len(walks) == 3 and digests(store)["a"] == first
    assert "job7" in Control(store).declarations().jobs


def test_a_copy_removed_from_the_store_is_written_again(
    store: MemoryStore, clock: FakeClock
) -> None:
    a = instance(store, clock, "a", tick={"every": HOUR})
    run_for(clock, 1, a)
    [digest] = parts(store)
    for key, (version, _) in store.controls(PARTS).items():
        store.set_control(key, None, version)
    assert Control(store).declarations().silent == ("a",)
    run_for(clock, VERIFY_EVERY + ANNOUNCE_EVERY, a)
    assert list(parts(store)) == [digest]
    assert list(Control(store).declarations().jobs) == ["tick"]


def test_many_jobs_make_a_copy_of_several_parts_each_within_an_entry(
    store: MemoryStore, clock: FakeClock
) -> None:
    names = [f"tenant-{uuid.uuid4().hex}" for _ in range(3000)]
    a = instance(store, clock, "a", **{name: {"every": HOUR} for name in names})
    a.add_job(noop, name="nightly", cron="0 3 * * *", timezone="Europe/Paris")
    run_for(clock, 1, a)
    [copy] = parts(store).values()
    assert len(copy) > 1
    assert all(len(v.encode()) <= MAX_CONTROL_VALUE for _, v in store.controls(PARTS).values())
    declared = Control(store).declarations().jobs
    assert sorted(declared) == sorted([*names, "nightly"])
    assert declared["nightly"].spec == {"cron": "0 3 * * *", "timezone": "Europe/Paris"}

    # A part lost (a sweep that raced with a rewrite): the copy reads as absent until
    # the instance, reading its copy whole every WHOLE_EVERY seconds, writes it again.
    [key] = [k for k in copy if k.endswith("/1")]
    store.set_control(key, None, copy[key])
    assert Control(store).declarations().silent == ("a",)
    run_for(clock, WHOLE_EVERY + VERIFY_EVERY, a)
    assert len(Control(store).declarations().jobs) == len(names) + 1


# -- the list itself -----------------------------------------------------------------


def test_a_hundred_thousand_jobs_round_trip_through_a_store(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "d.db"), namespace="big")
    forms = [
        decl.written(make_schedule(every=60)),
        decl.written(make_schedule(cron="0 3 * * *", timezone="Europe/Paris")),
        decl.written(make_schedule(every=3600, end="2030-01-01T00:00:00+00:00")),
    ]
    listed = {str(uuid.uuid4()): forms[i % 3] for i in range(100_000)}
    copy = decl.encode(listed)
    assert len(copy.parts) > 10
    assert all(len(part.encode()) <= MAX_CONTROL_VALUE for part in copy.parts)
    assert decl.encode(dict(reversed(listed.items()))) == copy, "the digest is of the list alone"
    assert decl.publish(store, copy, START) is None
    assert decl.read(store, copy.digest) == listed
    # A part missing, or not the one written: the copy reads as absent, never as a wrong list.
    key = copy.key(3)
    version, text = store.controls(key)[key]
    value = json.loads(text)
    value["data"] = value["data"][::-1]
    store.set_control(key, json.dumps(value), version)
    assert decl.read(store, copy.digest) is None
    store.set_control(key, None, store.controls(key)[key][0])
    assert decl.read(store, copy.digest) is None
    # Published again: made whole, part by part.
    assert decl.publish(store, copy, START) is None
    assert decl.read(store, copy.digest) == listed
    store.close()


def test_the_copies_kept_are_bounded(store: MemoryStore) -> None:
    copies = [decl.encode({f"job{i}": '{"every":60.0}'}) for i in range(MAX_COPIES + 1)]
    for copy in copies[:MAX_COPIES]:
        assert decl.publish(store, copy, START) is None
    refused = decl.publish(store, copies[-1], START)
    assert refused is not None and str(MAX_COPIES) in refused
    assert decl.read(store, copies[-1].digest) is None, "nothing written past the bound"
    # Once nobody announces them and they are old, the sweep makes room.
    kept = {copies[0].digest}
    removed = decl.sweep(store, kept, START + STALE_AFTER + 1)
    assert sorted(removed) == sorted(c.digest for c in copies[1:MAX_COPIES])
    assert set(parts(store)) == kept
    assert decl.publish(store, copies[-1], START + STALE_AFTER + 1) is None


# -- older instances, and what the readers make of them --------------------------------


def test_instances_that_say_nothing_of_their_jobs_do_not_break_readers(
    store: MemoryStore, clock: FakeClock
) -> None:
    # An older instance announces how many jobs it has, and no digest; its job ran once.
    store.announce("old-1", {"host": "h", "pid": 1, "version": "0.0.9", "jobs": 2}, 15)
    holder = store.claim("legacy", int(START - 60) * 1000, "old-1", 30).holder
    assert holder is not None
    # Others announce a digest that is not one, or one whose copy is not there.
    store.announce("odd", {"jobs": 1, "decl": ["not", "a", "digest"]}, 15)
    store.announce("early", {"jobs": 1, "decl": "0" * decl.DIGEST_LEN}, 15)
    store.announce("idle", {"jobs": 0}, 15)  # runs no job: says nothing, hides nothing
    a = instance(store, clock, "a", tick={"every": HOUR})
    a.run_pending()

    control = Control(store)
    declared = control.declarations()
    assert list(declared.jobs) == ["tick"]
    assert declared.silent == ("early", "odd", "old-1")
    assert [job.job for job in control.jobs()] == ["legacy", "tick"]
    assert control.known("legacy") and control.known("tick")
    with pytest.raises(UnknownJob, match=r"'legacy' is known .* its schedule is unknown here"):
        control.schedule_of("legacy")

    out = io.StringIO()
    assert status(store, out) == 2
    shown = out.getvalue()
    rows = {line.split()[0]: line for line in shown.splitlines() if line[:1].isalpha()}
    assert rows["legacy"].endswith("  -"), "no schedule known: no next slot"
    assert rows["tick"].split()[-2:][0].count("-") == 2, rows["tick"]  # a date, then a time
    assert (
        "3 live instance(s) do not say which jobs they declare (early, odd, old-1: an older"
        " anarchon, or just started): their jobs show once recorded or stored" in shown
    )


# -- ended jobs ---------------------------------------------------------------------


def test_a_job_past_its_end_shows_as_ended(store: MemoryStore, clock: FakeClock) -> None:
    gone = datetime.fromtimestamp(START - HOUR, timezone.utc).isoformat()
    a = instance(store, clock, "a", tick={"every": HOUR}, finished={"every": 60, "end": gone})
    a.run_pending()

    out = io.StringIO()
    status(store, out)
    rows = {line.split()[0]: line.split() for line in out.getvalue().splitlines()[:3]}
    assert rows["job"][-3:] == ["next", "slot", "(UTC)"]
    assert rows["finished"] == ["finished", "-", "-", "-", "-", "-", "ended"]
    assert rows["tick"][-1] != "ended"

    control = Control(store)
    out = io.StringIO()
    assert control_verb(argparse.Namespace(verb="jobs"), control, out) == EXIT_OK
    rows = {line.split()[0]: line.split() for line in out.getvalue().splitlines()[:3]}
    assert rows["finished"][-1] == "ended" and rows["finished"][1] == "no"

    dashboard = Dashboard(store, namespace=store.namespace, clock=clock.time)
    shown = {row["name"]: row for row in dashboard.state()["jobs"]}
    assert shown["finished"]["ended"] is True
    assert shown["finished"]["next"] is None and shown["finished"]["upcoming"] == []
    assert shown["tick"]["ended"] is False

    out = io.StringIO()
    args = argparse.Namespace(verb="next", job="finished", n=5)
    assert control_verb(args, control, out) == EXIT_EMPTY
    assert out.getvalue().splitlines()[-1] == f"no slot to come: 'finished' ended at {gone}"


# -- the dashboard ----------------------------------------------------------------------


def test_the_dashboard_shows_a_declared_job_with_its_next_slots_and_runs_it_now(
    store: MemoryStore, clock: FakeClock
) -> None:
    a = instance(store, clock, "a", tick={"every": HOUR})
    b = instance(store, clock, "b", tick={"every": HOUR})
    a.run_pending()
    b.run_pending()
    dashboard = Dashboard(store, namespace=store.namespace, clock=clock.time, action_token="t" * 16)
    state = dashboard.state()
    [row] = state["jobs"]
    assert row["name"] == "tick" and row["state"] is None and row["timeline"] == []
    assert row["declared"] == 2 and row["schedule"] == "every 3600s" and row["zone"] == "UTC"
    first = datetime(2023, 11, 14, 23, 0, tzinfo=timezone.utc).timestamp()
    assert row["next"] == {"at": first, "estimated": False}
    assert [slot["at"] for slot in row["upcoming"]] == [first, first + HOUR, first + 2 * HOUR]
    assert row["upcoming"][0]["local"] == "2023-11-14T23:00:00+00:00"
    assert [i["declares"] for i in state["instances"]] == [True, True]

    body = json.dumps({"job": "tick"}).encode()
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/api/trigger",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_X_ANARCHON_TOKEN": "t" * 16,
        "wsgi.input": io.BytesIO(body),
    }
    said: list[str] = []
    answer = json.loads(b"".join(dashboard(environ, lambda s, h: said.append(s))))
    assert said == ["200 OK"], answer
    assert answer["done"].startswith("asked to run tick@")
    [(job, _)] = Control(store).pending()
    assert job == "tick"


# -- next ---------------------------------------------------------------------------


def _last_sunday(year: int, month: int) -> date:
    last = date(year, month, 31)
    return last - timedelta(days=(last.weekday() - 6) % 7)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'next.db'}"


def test_next_prints_the_slots_in_the_zone_and_in_utc_with_dst_marked(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    paris = ZoneInfo("Europe/Paris")
    year = datetime.now(timezone.utc).year + 1
    spring, autumn = _last_sunday(year, 3), _last_sunday(year, 10)
    spring_start = datetime.combine(spring - timedelta(days=2), datetime.min.time(), paris)
    autumn_start = datetime.combine(autumn - timedelta(days=1), datetime.min.time(), paris)
    cron = {"cron": "30 2 * * *", "timezone": "Europe/Paris"}
    a = Scheduler(sqlite_url, namespace="n", instance="a")
    a.add_job(noop, name="spring", start=spring_start, **cron)
    a.add_job(noop, name="autumn", start=autumn_start, **cron)
    a.run_pending()
    try:
        assert main(["next", "spring", "-n", "4", "--store", sqlite_url, "--namespace", "n"]) == 0
        lines = capsys.readouterr().out.splitlines()
        utc_start = spring_start.astimezone(timezone.utc).isoformat()
        assert lines[0] == (
            f"spring: cron '30 2 * * *' Europe/Paris, starting {utc_start}"
            " (declared by 1 live instance(s))"
        )
        assert lines[1].split() == ["slot", "(Europe/Paris)", "slot", "(UTC)", "note"]
        d = [spring + timedelta(days=k) for k in (-2, -1, 0, 1)]
        assert [line.split()[:6] for line in lines[2:]] == [
            [str(d[0]), "02:30:00", "CET", "+0100", str(d[0]), "01:30:00"],
            [str(d[1]), "02:30:00", "CET", "+0100", str(d[1]), "01:30:00"],
            # 02:30 does not exist that night: the slot is at the gap's end, and says so.
            [str(d[2]), "03:00:00", "CEST", "+0200", str(d[2]), "01:00:00"],
            [str(d[3]), "02:30:00", "CEST", "+0200", str(d[3]), "00:30:00"],
        ]
        notes = [" ".join(line.split()[6:]) for line in lines[2:]]
        assert notes[0] == notes[1] == notes[3] == "-"
        assert notes[2].startswith("DST gap: the wall time it names does not exist")

        assert main(["next", "autumn", "-n", "2", "--store", sqlite_url, "--namespace", "n"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[3].split()[:6] == [str(autumn), "02:30:00", "CEST", "+0200", str(autumn),
                                        "00:30:00"]  # fmt: skip
        assert "DST fold: 02:30:00 happens twice in Europe/Paris; this is the first" in lines[3]

        # An unknown job: said, exit 1; a bad count: a usage error.
        assert main(["next", "nope", "--store", sqlite_url, "--namespace", "n"]) == EXIT_EMPTY
        err = capsys.readouterr().err
        assert "no job named 'nope' is declared by a live instance, stored or recorded" in err
        with pytest.raises(SystemExit) as usage:
            main(["next", "spring", "-n", "0", "--store", sqlite_url, "--namespace", "n"])
        assert usage.value.code == EXIT_CONFIG
        capsys.readouterr()
    finally:
        a.stop()


def test_next_reads_a_stored_schedule_when_no_instance_runs(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Control(sqlite_url, namespace="n") as control:
        control.add(Definition(name="report", handler="report", cron="0 6 * * 1"))
    assert main(["next", "report", "-n", "3", "--store", sqlite_url, "--namespace", "n"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "report: cron '0 6 * * 1' UTC (stored (v1))"
    assert lines[1].split() == ["slot", "(UTC)", "note"]  # one column: its zone is UTC
    slots = [datetime.fromisoformat(" ".join(line.split()[:2])) for line in lines[2:]]
    assert len(slots) == 3 and all(s.weekday() == 0 and s.hour == 6 for s in slots)
    assert slots == sorted(slots) and slots[0] > datetime.now(timezone.utc).replace(tzinfo=None)


def test_a_claim_only_store_knows_no_declaration_and_says_so() -> None:
    from tests.unit.test_claim_only import Winners

    control = Control(Winners())
    assert control.declarations().jobs == {}
    with pytest.raises(ConfigurationError, match="keeps no registry of instances nor stored"):
        control.schedule_of("tick")


def test_the_health_check_does_not_fail_a_declared_job_before_its_first_slot(
    store: MemoryStore, clock: FakeClock
) -> None:
    from anarchon_core.check import check

    instance(store, clock, "a", tick={"every": HOUR}).run_pending()
    found = {f.check: f for f in check(store, START, host=None, jobs=("tick", "tikc"))}
    assert found["job 'tick'"].ok, found
    assert found["job 'tick'"].detail == (
        "no slot recorded yet (declared by 1 live instance(s)); next slot 2023-11-14 23:00:00 UTC"
    )
    assert not found["job 'tikc'"].ok
    assert found["job 'tikc'"].detail == "not recorded in the store"
