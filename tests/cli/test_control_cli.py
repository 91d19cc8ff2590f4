"""``anarchon jobs|pause|resume|history``, run as a user runs them (a subprocess).

Against the machine's Redis and a SQLite file, each test in a namespace of
its own (Redis keys dropped afterwards). Exit status, as documented: 0 changed
or shown, 1 nothing changed (already so, an unknown job), 2 bad URL, usage or
a store that keeps no controls, 3 the store cannot be reached.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from anarchon_core import ClaimStatus, EventKind, Paused, RunState, Scheduler, Store, open_store
from anarchon_core.errors import MissingDependency
from anarchon_core.stores.sqlite import SQLiteStore
from anarchon_core.urls import store_class
from tests import servers
from tests.cleanup import drop_namespace
from tests.cli.command import anarchon, shown
from tests.sim import START, Cluster
from tests.waiting import wait_until

EXIT_OK, EXIT_EMPTY, EXIT_CONFIG, EXIT_UNREACHABLE = 0, 1, 2, 3

#: 2023-11-14 22:13:20 UTC, and the slot a minute later.
SLOT = 1_700_000_000_000
NEXT = SLOT + 60_000

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def expect(done: subprocess.CompletedProcess[str], code: int, stdout: str | None = None) -> str:
    """Assert the exit status (and the exact stdout if given); the stdout."""
    assert done.returncode == code, shown(done)
    if stdout is not None:
        assert done.stdout == stdout, shown(done)
    return done.stdout


def table(out: str) -> dict[str, list[str]]:
    """The rows of a ``jobs`` table, by job: each row's cells split on blanks."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["job", "paused"])
    rows = [line.split() for line in lines[start + 1 :]]
    return {row[0]: row for row in rows if len(row) >= 6 and row[1] in FLAGS}


FLAGS = ("yes", "no", "namespace")


def attempts(out: str) -> list[dict[str, str]]:
    """The rows of a ``history`` table, each by its column's name.

    The slot is split into ``date`` and ``time``; ``started`` and ``ended`` are
    each a date and a time (``ended``: ``-`` while the attempt goes on).
    """
    header, *lines = out.splitlines()
    assert header.startswith("slot (UTC)"), out
    columns = header.split()[2:]
    assert columns[-2:] == ["started", "ended"], out
    middle = columns[:-2]
    rows = []
    for line in lines:
        cells = line.split()
        row = {"date": cells[0], "time": cells[1]}
        row.update(zip(middle, cells[2 : 2 + len(middle)], strict=True))
        times = cells[2 + len(middle) :]
        assert len(times) in (3, 4), line
        row["started"], row["ended"] = " ".join(times[:2]), " ".join(times[2:])
        rows.append(row)
    return rows


@dataclass
class Target:
    """A store the CLI is pointed at: its URL and namespace, and the test's own handle on it."""

    url: str
    namespace: str
    store: Store

    def args(self) -> list[str]:
        return ["--store", self.url, "--namespace", self.namespace]

    def run(self, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
        return anarchon(verb, *args, *self.args())


@pytest.fixture
def namespace() -> str:
    return f"ctl-{uuid.uuid4().hex[:10]}"


def _seed(store: Store) -> None:
    """``x``: slot SLOT done, slot NEXT running (two attempts); ``y``: slot SLOT done."""
    first = store.claim("x", SLOT, "host:1:aa", 30).holder
    assert first is not None
    assert store.finish("x", first.token, RunState.DONE)
    assert store.claim("x", NEXT, "host:2:bb", 30).won
    other = store.claim("y", SLOT, "host:3:cc", 30).holder
    assert other is not None
    assert store.finish("y", other.token, RunState.DONE)


@pytest.fixture(params=["redis", "sqlite"])
def target(request: pytest.FixtureRequest, namespace: str, tmp_path: Path) -> Iterator[Target]:
    if request.param == "redis":
        url = str(request.getfixturevalue("redis_url"))
    else:
        url = f"sqlite:///{tmp_path / 'control.db'}"
    store = open_store(url, namespace=namespace)
    try:
        _seed(store)
        yield Target(url, namespace, store)
    finally:
        store.close()
        drop_namespace(url, namespace)


def test_pause_resume_and_jobs(target: Target) -> None:
    ns, store = target.namespace, target.store
    # Pause a recorded job: said, done, and seen by the store.
    expect(target.run("pause", "x"), EXIT_OK, "paused job 'x'\n")
    assert store.paused() == Paused(namespace=False, jobs=("x",))
    assert store.claim("x", NEXT + 60_000, "host:4:dd", 30).status is ClaimStatus.PAUSED
    # Again: nothing changed.
    expect(target.run("pause", "x"), EXIT_EMPTY, "job 'x' was paused already\n")

    # A name the store has no trace of is refused, naming it...
    unknown = target.run("pause", "nope")
    expect(unknown, EXIT_EMPTY, "")
    assert "'nope'" in unknown.stderr and ns in unknown.stderr, shown(unknown)
    assert store.paused() == Paused(namespace=False, jobs=("x",))
    # ...unless it is said to be a job not recorded yet.
    expect(target.run("pause", "nope", "--unrecorded"), EXIT_OK, "paused job 'nope'\n")
    assert store.paused() == Paused(namespace=False, jobs=("nope", "x"))

    rows = table(expect(target.run("jobs"), EXIT_OK))
    assert sorted(rows) == ["nope", "x", "y"]
    assert rows["x"][:2] == ["x", "yes"]
    # No record yet: no slot, no run, no counts.
    assert rows["nope"] == ["nope", "yes", *["-"] * 8]
    assert rows["y"][:2] == ["y", "no"]
    # Its last slot's run (cells 2-3 are the slot's date and time), then the
    # counts: runs, takeovers, last success (date, time) or "-", last failure.
    assert rows["x"][4:9] == ["host:2:bb", "1", "running", "2", "0"]
    assert rows["y"][4:9] == ["host:3:cc", "1", "done", "1", "0"]
    assert rows["y"][-1] == "-" and rows["y"][-3:-1] != ["-", "-"]  # a success, no failure
    assert "is paused" not in target.run("jobs").stdout

    # The whole namespace.
    expect(target.run("pause", "--all"), EXIT_OK, f"paused namespace {ns!r}\n")
    assert store.paused() == Paused(namespace=True, jobs=("nope", "x"))
    assert store.claim("y", NEXT, "host:4:dd", 30).status is ClaimStatus.PAUSED
    expect(target.run("pause", "--all"), EXIT_EMPTY, f"namespace {ns!r} was paused already\n")
    out = expect(target.run("jobs"), EXIT_OK)
    assert out.splitlines()[0] == f"namespace {ns!r} is paused: no job's slot starts", out
    rows = table(out)
    assert (rows["x"][1], rows["nope"][1], rows["y"][1]) == ("yes", "yes", "namespace")

    # Resumed: the jobs paused by name stay paused.
    expect(target.run("resume", "--all"), EXIT_OK, f"resumed namespace {ns!r}\n")
    assert store.paused() == Paused(namespace=False, jobs=("nope", "x"))
    expect(target.run("resume", "--all"), EXIT_EMPTY, f"namespace {ns!r} was not paused\n")
    assert table(target.run("jobs").stdout)["y"][1] == "no"

    expect(target.run("resume", "x"), EXIT_OK, "resumed job 'x'\n")
    assert store.paused() == Paused(namespace=False, jobs=("nope",))
    expect(target.run("resume", "x"), EXIT_EMPTY, "job 'x' was not paused\n")
    rows = table(expect(target.run("jobs"), EXIT_OK))
    assert (rows["x"][1], rows["nope"][1], rows["y"][1]) == ("no", "yes", "no")

    # Several at once: each is said; 0 when any changed.
    out = expect(target.run("resume", "nope", "x"), EXIT_OK)
    assert out == "resumed job 'nope'\njob 'x' was not paused\n", out
    assert store.paused() == Paused(namespace=False, jobs=())
    # Resumed, the job's next slot is claimed again.
    assert store.claim("y", NEXT, "host:4:dd", 30).won


def test_history(target: Target) -> None:
    out = expect(target.run("history", "x"), EXIT_OK)
    runs = attempts(out)
    assert len(runs) == 2, out
    newest, oldest = runs
    # Newest first: slot NEXT running (no end yet), then slot SLOT done.
    assert (newest["date"], newest["time"][:8]) == ("2023-11-14", "22:14:20")
    assert newest["attempt"] == "1"
    assert (newest["owner"], newest["state"], newest["ended"]) == ("host:2:bb", "running", "-")
    assert (oldest["date"], oldest["time"][:8]) == ("2023-11-14", "22:13:20")
    assert oldest["attempt"] == "1"
    # The job's first token is the store's clock in milliseconds; each claim after adds one.
    assert abs(int(oldest["token"]) - time.time() * 1000) < 60_000, oldest
    assert int(newest["token"]) > int(oldest["token"]), runs
    assert (oldest["owner"], oldest["state"]) == ("host:1:aa", "done")
    assert oldest["ended"] != "-"

    limited = attempts(expect(target.run("history", "x", "--limit", "1"), EXIT_OK))
    assert [run["state"] for run in limited] == ["running"], limited

    unknown = target.run("history", "ghost")
    expect(unknown, EXIT_EMPTY, "")
    assert "'ghost'" in unknown.stderr, shown(unknown)

    # Known by its pause mark alone: no attempt to show, nothing shown.
    expect(target.run("pause", "ghost", "--unrecorded"), EXIT_OK)
    expect(target.run("history", "ghost"), EXIT_EMPTY, "no run of 'ghost' recorded\n")
    # A paused job's history is still shown.
    expect(target.run("pause", "x"), EXIT_OK)
    assert len(attempts(expect(target.run("history", "x"), EXIT_OK))) == 2


def test_usage_errors_change_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    store = ["--store", f"sqlite:///{db}"]
    for argv in (["pause"], ["resume"], ["pause", "x", "--all"], ["resume", "x", "--all"]):
        done = anarchon(*argv, *store)
        expect(done, EXIT_CONFIG, "")
        assert "name the jobs, or give --all" in done.stderr, shown(done)
    done = anarchon("history", "x", "--limit", "0", *store)
    expect(done, EXIT_CONFIG, "")
    assert "--limit" in done.stderr
    # Refused before the store was even opened.
    assert not db.exists()
    # A namespace no store accepts.
    done = anarchon("pause", "--all", *store, "--namespace", "no spaces")
    expect(done, EXIT_CONFIG, "")
    assert "namespace" in done.stderr


def test_a_store_without_controls_is_refused() -> None:
    try:
        store_class(AMQP)
    except MissingDependency as exc:
        servers.unavailable(f"the RabbitMQ driver ({exc})")
    for argv in (["pause", "--all"], ["pause", "x", "--unrecorded"], ["resume", "--all"], ["jobs"]):
        done = anarchon(*argv, "--store", AMQP)
        expect(done, EXIT_CONFIG, "")
        assert "needs a lease store" in done.stderr, shown(done)
    # Its password is not shown either.
    done = anarchon("pause", "--all", "--store", "amqp://guest:s3cretpw@127.0.0.1:5672//")
    expect(done, EXIT_CONFIG, "")
    assert "s3cretpw" not in done.stdout + done.stderr, shown(done)


@pytest.mark.parametrize(
    "argv",
    [["pause", "--all"], ["pause", "x"], ["resume", "--all"], ["jobs"], ["history", "x"]],
    ids=" ".join,
)
def test_an_unreachable_store_exits_3_and_never_shows_its_password(argv: list[str]) -> None:
    done = anarchon(*argv, "--store", "redis://127.0.0.1:1")
    expect(done, EXIT_UNREACHABLE, "")
    assert "cannot reach the store redis://127.0.0.1:1" in done.stderr, shown(done)

    done = anarchon(*argv, "--store", "redis://:s3cretpw@127.0.0.1:1/0")
    expect(done, EXIT_UNREACHABLE, "")
    assert "s3cretpw" not in done.stdout + done.stderr, shown(done)
    assert "redis://:***@127.0.0.1:1/0" in done.stderr, shown(done)

    # A malformed URL with a password: a configuration error, the password hidden.
    done = anarchon(*argv, "--store", "bogus://admin:s3cretpw@db.internal/x")
    expect(done, EXIT_CONFIG, "")
    assert "s3cretpw" not in done.stdout + done.stderr, shown(done)
    assert "bogus://admin:***@db.internal/x" in done.stderr, shown(done)


def test_a_pause_by_the_cli_is_obeyed_by_a_running_scheduler(
    tmp_path: Path, namespace: str
) -> None:
    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    cluster = Cluster(store=SQLiteStore(str(db), namespace=namespace))  # type: ignore[arg-type]
    try:

        def setup(scheduler: Scheduler) -> None:
            scheduler.add_job(cluster.handler(0.1), name="tick", every=1)

        for name in "ab":
            cluster.add(name, setup)
        cluster.run(2.5)
        assert [s.slot_id.rsplit("@")[0] for s in cluster.spans] == ["tick", "tick"]
        ran = len(cluster.spans)

        cli = ["--store", url, "--namespace", namespace]
        expect(anarchon("pause", "tick", *cli), EXIT_OK, "paused job 'tick'\n")
        cluster.run(3)  # three slots come while paused
        assert len(cluster.spans) == ran  # no handler ran on either instance
        paused = cluster.kinds("paused")
        assert {e.instance for e in paused} == {"a", "b"}
        assert len({e.slot_id for e in paused}) == 3
        assert all(e.kind is EventKind.PAUSED and e.job == "tick" for e in paused)
        # The store itself answers paused (the CLI wrote the mark there).
        claim = cluster.store.claim("tick", int((START + 100) * 1000), "probe", 5)
        assert claim.status is ClaimStatus.PAUSED
        rows = table(expect(anarchon("jobs", *cli), EXIT_OK))
        assert rows["tick"][:2] == ["tick", "yes"]
        assert rows["tick"][6] == "done"  # job, paused, slot (date, time), owner, attempt, state
        assert rows["tick"][7] == str(len(cluster.store.history("tick")))  # runs counted

        # Namespace pause and resume by the CLI: the job stays paused by name.
        expect(anarchon("pause", "--all", *cli), EXIT_OK)
        expect(anarchon("resume", "--all", *cli), EXIT_OK)
        cluster.run(1)
        assert len(cluster.spans) == ran

        expect(anarchon("resume", "tick", *cli), EXIT_OK, "resumed job 'tick'\n")
        cluster.run(1)
        # The next slot runs, once; none of those passed while paused.
        assert len(cluster.spans) == ran + 1
        assert cluster.spans[-1].slot_id not in {e.slot_id for e in cluster.kinds("paused")}
        cluster.run(2)
        slots = [s.slot_id for s in cluster.spans]
        assert len(slots) == len(set(slots)) == ran + 3
        history = attempts(expect(anarchon("history", "tick", *cli), EXIT_OK))
        assert [run["state"] for run in history] == ["done"] * (ran + 3)
    finally:
        for scheduler in cluster.live.values():
            scheduler.stop(timeout=0)
        cluster.store.close()


def test_a_pause_naming_an_unknown_job_pauses_none_of_them(target: Target) -> None:
    """All or nothing: a typo among the names leaves every job as it was."""
    done = target.run("pause", "x", "nope", "y")
    expect(done, EXIT_EMPTY, "")
    assert "'nope'" in done.stderr, shown(done)
    assert target.store.paused() == Paused(namespace=False, jobs=())
    assert target.store.claim("y", NEXT, "host:5:ee", 30).won


def test_resume_with_catch_up_runs_the_latest_missed_slot_once(tmp_path: Path) -> None:
    """``resume`` runs none of the slots missed while paused; ``resume --catch-up`` the most
    recent one (within its window), once across the instances, with its own slot id."""
    url = f"sqlite:///{tmp_path / 'catchup.db'}"
    cli = ["--store", url, "--namespace", "cu"]
    runs: list[tuple[str, str]] = []
    engines = []
    for name in "abc":
        # A catch-up window wide enough that the latest missed slot is always in it.
        engine = Scheduler(url, namespace="cu", instance=name, jitter=0, catch_up=10)
        engine.add_job(lambda run, n=name: runs.append((n, run.slot_id)), name="job", every=4)
        engine.start()
        engines.append(engine)
    try:
        wait_until(lambda: runs, 10, "the job to run")

        def missed_while_paused(catch_up: bool) -> list[tuple[str, str]]:
            expect(anarchon("pause", "job", *cli), EXIT_OK)
            paused_at = time.time()
            # Resume half a second after a slot that came while paused (and was refused):
            # the slots are 4 s apart, so that slot is still the latest when the command
            # acts, however long it takes to start on a loaded machine (under 3.5 s).
            refused = (int(paused_at) // 4 + 1) * 4
            if refused - paused_at < 1:
                refused += 4
            time.sleep(max(0.0, refused + 0.5 - time.time()))
            before = len(runs)
            resume = ["resume", "job", *cli] + (["--catch-up"] if catch_up else [])
            resuming = time.time()
            expect(anarchon(*resume), EXIT_OK)

            def in_pause() -> list[tuple[str, str]]:
                return [
                    (who, slot)
                    for who, slot in runs[before:]
                    if paused_at < int(slot.rsplit("@")[1]) / 1000 < resuming
                ]

            # Every instance reads the request within a second; a loaded machine may
            # take longer to claim and run it, so the catch-up is waited for.
            deadline = time.monotonic() + 10
            while catch_up and not in_pause() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(2.5)  # and a second run of it, or a run without --catch-up, would show
            return in_pause()

        assert missed_while_paused(catch_up=False) == []
        caught = missed_while_paused(catch_up=True)
        assert len(caught) == 1, caught  # the latest missed slot, on one instance
        assert int(caught[0][1].rsplit("@")[1]) % 4000 == 0  # its own id on the grid
    finally:
        for engine in engines:
            engine.stop()
