"""The fault-injecting simulation (tests/sim.py): fixed seeds pass, and it catches what it must.

Each seed plays ten minutes of a three-instance fleet with kills, freezes,
graceful stops, rolling restarts with another lease, flaky links (refused,
erroring, slow calls, replies lost after the write), blackhole partitions,
error episodes, clock offsets and drift, dispatched work whose workers die
or never pick it up, and broker outages. After every step the invariants are
checked: (a) never two attempts of one slot that both believe they hold it,
(b) tokens rise, (c) every slot due while an instance was healthy through its
window runs, (d) no scheduling step raises. With an overlap policy
(``--overlap``), every job queues the slots that come while its previous run
holds the lease, and (e) a slot is won by a claim once, (f) the slots of a
job start in order, (g) every slot that waited starts once the run before
it ended (none lost to the crash of an instance it waited on, none stuck),
(h) the instances decide alike which slots wait. With ``--overlap allow_all``,
the runs of a job's slots go on side by side, each in its lane's record: (a)
and (e) still hold per slot (a slot's claims compared by record and token), the
one-run-at-a-time rule of an instance holds per lane, (c) holds as for any job
(a crashed run taken over), and (i) a slot is skipped as an overlap only while
its lane holds the run of the slot 16 intervals older. Always, (j) no handler begins
before its slot's time by its instance's clock; with ``--lookahead``, claims go ahead of
their slots and every invariant holds as without. The long soak is
``python -m tests.sim --seeds 0:1000`` (see docs/failure-scenarios.md).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import pytest

from anarchon_core import jobs
from anarchon_core.engine import pacing, table
from anarchon_core.engine.backups import Backups
from anarchon_core.engine.loop import Loop
from anarchon_core.engine.runs import Runs
from anarchon_core.engine.table import JobTable
from anarchon_core.events import EventKind
from anarchon_core.slots import LANE, LANES
from tests.sim import FAULTS, Chaos, Cluster, Violation, main, overloaded, started_again

#: The overlap policies that queue slots (``skip``, the default, is every test above).
POLICIES = ["buffer_one", "buffer_all", "cancel_other"]

#: Virtual time: the simulation asserts nothing about the machine's speed.
pytestmark = pytest.mark.background

#: Seeds CI runs, in chunks that run in parallel.
CHUNKS = [range(k, k + 4) for k in range(0, 40, 4)]


# Four ten-minute seeds: about 30 s on an idle core; at a lower CPU priority under the full
# suite on 2 cores, 376 s was seen (2026-12-07), hence the margin of a hang guard only.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seeds", CHUNKS, ids=lambda r: f"seeds{r.start}-{r.stop - 1}")
def test_fixed_seeds_keep_every_invariant(seeds: range) -> None:
    steps = faults = 0
    for seed in seeds:
        chaos = Chaos(seed, seconds=600)
        chaos.run()
        steps, faults = steps + chaos.steps, faults + chaos.faults
    # The run was not idle: the fleet stepped and faults were injected.
    assert steps > 5_000 * len(seeds) and faults > 20 * len(seeds)


@pytest.mark.timeout(600)  # "errors" alone: about 35 s on an idle core, far more under -n 8
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_alone_keeps_every_invariant(fault: str, seed: int) -> None:
    # One test per seed: the slowest fault's seeds run in parallel.
    Chaos(seed, seconds=300, faults=[fault, "kill"] if fault == "deploy" else [fault]).run()


@pytest.mark.timeout(600)  # four ten-minute seeds: about 10 s on an idle core
@pytest.mark.parametrize(
    "seeds", [range(0, 4), range(4, 8)], ids=lambda r: f"seeds{r.start}-{r.stop - 1}"
)
@pytest.mark.parametrize("overlap", POLICIES)
def test_overlap_policies_keep_every_invariant(overlap: str, seeds: range) -> None:
    waited = started = cancelled = together = 0
    for seed in seeds:
        chaos = Chaos(seed, seconds=600, overlap=overlap)
        chaos.run()
        waited += len(chaos.buffered)
        started += len(set(chaos.buffered) & set(chaos.claimed))
        cancelled += len(chaos.cancelled)
        together = max(together, *chaos.together.values(), 0)
    # The policy was at work: slots waited, most of them started (the others were still
    # waiting at the end), and with cancel_other, runs were asked to stop.
    assert waited > 20 * len(seeds) and started > waited / 2
    assert (cancelled > 5 * len(seeds)) is (overlap == "cancel_other")
    # The slots of a job ran one after another, never two handlers at once.
    assert together == 1


@pytest.mark.timeout(600)  # three five-minute seeds: about 4 s on an idle core
def test_allow_all_runs_slots_side_by_side_keeping_every_invariant() -> None:
    long_jobs = seen_together = 0
    for seed in range(3):
        chaos = Chaos(seed, seconds=300, overlap="allow_all")
        chaos.run()
        # Every job whose handler outlasts its interval had runs of several slots going
        # on at once (its runs, not dispatched work, which workers run).
        for plan in chaos.jobs:
            if plan.duration > plan.every and not plan.handoff:
                long_jobs += 1
                seen_together += chaos.together.get(plan.name, 0) > 1
        # Every slot was claimed in its lane's record (whose tokens rose, (b)), never in
        # the job's own, and the slots spread over many lanes.
        records = set(chaos.tokens)
        assert all(LANE in record for record in records) and len(records) > LANES
    assert long_jobs >= 4 and seen_together == long_jobs


def first_violation(
    faults: list[str], seeds: range = range(30), overlap: str | None = None, lookahead: float = 0
) -> str:
    for seed in seeds:
        try:
            Chaos(seed, seconds=600, faults=faults, overlap=overlap, lookahead=lookahead).run()
        except Violation as exc:
            return str(exc)
    raise AssertionError(f"no seed of {seeds} found a violation with {faults}")


def test_a_runner_holding_past_its_lease_is_caught_with_its_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(a): a runner that relies on its lease for 50 % longer than the store grants it."""
    monkeypatch.setattr(jobs, "LEASE_MARGIN", -0.5)
    found = first_violation(["partition", "freeze"])
    assert "(a)" in found and "both believe they hold it" in found
    assert "replay: python -m tests.sim --seed" in found


@pytest.mark.parametrize("overlap", [None, "allow_all"])
def test_a_backup_that_never_takes_over_is_caught(
    overlap: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(c): slots whose runner was killed are never run again (with allow_all, each run
    is taken over alone, in its lane)."""
    monkeypatch.setattr(Backups, "_take_over", lambda self, lapsed: None)
    assert "(c)" in first_violation(["kill"], overlap=overlap)


@pytest.mark.parametrize("overlap", POLICIES)
def test_slots_left_waiting_behind_a_run_that_ended_are_caught(
    overlap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(g): the slots waiting are never claimed once the run they wait for ended."""
    monkeypatch.setattr(Backups, "_start_waiting", lambda self, ended: None)
    found = first_violation(list(FAULTS), overlap=overlap)
    assert "(g)" in found and f"--overlap {overlap}" in found


def _one_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slot claimed in lane 0: a slot whose run goes on holds the next one back."""
    monkeypatch.setattr(table, "lane_of", lambda slot_ms, interval_ms, lanes: 0)


def _as_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slot claimed in the job's own record, as overlap="skip" claims them."""
    monkeypatch.setattr(JobTable, "runs_in", lambda self, rt, slot: (rt, slot))


def _lanes_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each instance picks its own lane for a slot: each wins it in a record of its own
    (the tokens of two lanes may well be equal)."""
    picks = itertools.count()
    monkeypatch.setattr(table, "lane_of", lambda slot_ms, interval_ms, lanes: next(picks) % lanes)


@pytest.mark.parametrize(
    ("break_lanes", "caught"),
    [(_one_lane, ("(i)",)), (_as_skip, ("(i)",)), (_lanes_apart, ("(a)", "(e)"))],
    ids=["one-lane", "as-skip", "lanes-apart"],
)
def test_allow_all_broken_lanes_are_caught(
    break_lanes: Callable[[pytest.MonkeyPatch], None],
    caught: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(i): slots held back by the runs of others (one lane, or none, for every slot);
    (a)/(e): a slot won in two lanes, so run twice."""
    break_lanes(monkeypatch)
    found = first_violation(list(FAULTS), overlap="allow_all")
    assert any(letter in found for letter in caught) and "--overlap allow_all" in found


@pytest.mark.timeout(600)  # eight ten-minute seeds: about 7 s on an idle core
def test_claims_sent_ahead_keep_every_invariant() -> None:
    ahead = 0
    for seed in range(8):
        chaos = Chaos(seed, seconds=600, lookahead=1.0)
        chaos.run()
        ahead += sum(
            1 for slot, won in chaos.claimed.items() if won < int(slot.rsplit("@", 1)[1]) / 1000
        )
    # Slots were won ahead of their time (their handlers then waited for it).
    assert ahead > 100


def test_a_handler_begun_before_its_slots_time_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """(j): a slot won ahead whose handler starts at once instead of at its time."""
    begin = Runs.begin

    def at_once(self: Runs, *args: object) -> None:
        begin(self, *args[:4])  # type: ignore[arg-type]

    monkeypatch.setattr(Runs, "begin", at_once)
    found = first_violation(list(FAULTS), seeds=range(3), lookahead=1.0)
    assert "(j)" in found and "before its time" in found and "--lookahead 1" in found


def test_a_scheduling_step_that_raises_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """(d): the step lets a server error escape, as the engine once did."""

    def escape(self: Loop, exc: Exception) -> float:
        raise exc

    monkeypatch.setattr(Loop, "_failed", escape)
    assert "(d)" in first_violation(["errors"])


def test_the_command_replays_a_seed_and_reports_what_it_simulated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--seed", "3", "--seconds", "120"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 seeds, 0 failed:") and "faults injected" in out


def test_unknown_faults_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown faults \\['nope'\\]"):
        Chaos(0, faults=["nope"])


def _overloaded() -> tuple[Cluster, Counter[str]]:
    """300 jobs due at once every 10 s on three instances with 3 s leases, whose store
    calls cost 8 ms per item, times 1, 2 and 3: one instance's batch of every claim,
    of every renewal or of every finish takes longer than the lease."""
    cluster = overloaded(jobs=300, per_item=0.008, seconds=60, slowness=(1.0, 2.0, 3.0))
    return cluster, Counter(span.slot_id for span in cluster.spans)


def test_an_overloaded_fleet_runs_slots_late_never_twice() -> None:
    cluster, starts = _overloaded()
    assert started_again(cluster) == []
    assert [slot for slot, n in starts.items() if n > 1] == []
    # It was overloaded: slots ran late, yet every one ran.
    assert cluster.kinds(EventKind.CATCH_UP)
    assert len(starts) == 300 * 5


def test_without_pacing_the_overloaded_fleet_runs_slots_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scenario catches the defect: one batch per step, however long, and no deferral."""
    for name in ("FIRST_CHUNK", "MIN_CHUNK", "MAX_CHUNK"):
        monkeypatch.setattr(pacing, name, 10**9)
    monkeypatch.setattr(pacing, "STEP_SHARE", float("inf"))
    monkeypatch.setattr(pacing, "BEHIND_SHARE", float("inf"))
    cluster, starts = _overloaded()
    assert [slot for slot, n in starts.items() if n > 1]
    assert cluster.kinds(EventKind.FINISH_REFUSED)


@pytest.mark.timeout(600)  # about 15 s on an idle core, far more under -n 8
def test_a_burst_of_thousands_of_due_jobs_runs_each_slot_once() -> None:
    """1,200 jobs due at once every 10 s, on instances that take 2.4 to 7.2 s to claim them
    all: more than a 3 s lease per batch, yet every slot runs, and once."""
    cluster = overloaded(jobs=1200, per_item=0.002, seconds=29, slowness=(1.0, 2.0, 3.0))
    starts = Counter(span.slot_id for span in cluster.spans)
    assert started_again(cluster) == []
    assert [slot for slot, n in starts.items() if n > 1] == []
    assert len(starts) == 1200 * 2  # two bursts, each slot of both
