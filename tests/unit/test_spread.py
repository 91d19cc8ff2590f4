"""Who runs a slot: the jobs due together spread over the instances, and a gone
instance's share is taken on after a short wait, then without one."""

from __future__ import annotations

from collections import Counter

from anarchon_core import (
    Claim,
    ClaimStatus,
    EventKind,
    InstanceRecord,
    JobState,
    Run,
    RunState,
    Scheduler,
)
from anarchon_core.peers import Peers
from anarchon_core.stores.memory import MemoryStore
from tests.sim import START, Cluster

JOBS = 60


def _fleet(
    cluster: Cluster,
    names: list[str],
    wins: Counter[tuple[str, float]],
    lateness: dict[float, list[float]] | None = None,
) -> None:
    def setup(scheduler: Scheduler) -> None:
        def handler(run: Run) -> None:
            wins[(run.instance, run.slot.timestamp())] += 1
            if lateness is not None:
                late = cluster.now() - run.slot.timestamp()
                lateness.setdefault(run.slot.timestamp(), []).append(late)

        for k in range(JOBS):
            scheduler.add_job(handler, name=f"job{k:02d}", every=10, jitter=0)

    for name in names:
        cluster.add(name, setup)


def _share(wins: Counter[tuple[str, float]], tick: float) -> dict[str, int]:
    return {name: n for (name, at), n in wins.items() if at == tick}


def test_the_jobs_due_together_spread_over_the_instances() -> None:
    cluster, wins = Cluster(), Counter[tuple[str, float]]()
    _fleet(cluster, ["i0", "i1", "i2"], wins)
    cluster.run(45)
    ticks = sorted({at for _, at in wins})
    assert len(ticks) >= 4
    for tick in ticks:
        assert sum(_share(wins, tick).values()) == JOBS  # every slot once
    # From the second tick on, each instance wins its own share, claimed without waiting.
    for tick in ticks[1:]:
        share = _share(wins, tick)
        assert set(share) == {"i0", "i1", "i2"}, share
        assert max(share.values()) <= JOBS * 0.6, share
    assert not cluster.kinds(EventKind.CATCH_UP) and not cluster.kinds(EventKind.MISSED)
    # Each instance's claims of the others' share are answered "taken": never doubled.
    assert len(cluster.kinds(EventKind.WON)) == JOBS * len(ticks)


def test_a_gone_instances_share_runs_after_a_wait_until_its_record_expires() -> None:
    cluster, wins = Cluster(), Counter[tuple[str, float]]()
    lateness: dict[float, list[float]] = {}
    _fleet(cluster, ["i0", "i1", "i2"], wins, lateness)
    cluster.run(25)
    cluster.freeze("i2")  # gone without a word: its share must still run
    cluster.run(50)
    after = sorted(t for t in lateness if t > START + 25)
    assert len(after) >= 5
    for tick in after:
        share = _share(wins, tick)
        assert sum(share.values()) == JOBS and set(share) == {"i0", "i1"}, share
    # Its share waits for it (the jitter, 0, plus 1 s) while its registry record
    # lives (15 s after its last announcement, at most 25 s ago); then not.
    assert 1.0 <= max(lateness[after[0]]) < 1.3
    assert all(max(lateness[t]) < 1.3 for t in after)
    assert all(max(lateness[t]) < 0.05 for t in after if t >= START + 50)
    assert not cluster.kinds(EventKind.MISSED) and not cluster.kinds(EventKind.CATCH_UP)


def test_an_instance_that_stops_hands_its_share_over_at_once() -> None:
    cluster, wins = Cluster(), Counter[tuple[str, float]]()
    lateness: dict[float, list[float]] = {}
    _fleet(cluster, ["i0", "i1", "i2"], wins, lateness)
    cluster.run(25)
    cluster.terminate("i2")  # a graceful stop leaves the registry
    cluster.run(30)
    after = sorted(t for t in lateness if t > START + 25)
    # The others read the registry within 5 s: no slot after that waits for it.
    assert all(max(lateness[t]) < 0.05 for t in after if t >= START + 40), lateness
    assert all(set(_share(wins, t)) == {"i0", "i1"} for t in after)


class _Counted(MemoryStore):
    """One instance's view of a shared memory store, counting the claims it sends."""

    def __init__(self, shared: MemoryStore) -> None:
        super().__init__(namespace=shared.namespace)
        self.shared, self.claims = shared, 0

    def claim_many(self, requests, owner):  # type: ignore[no-untyped-def]
        self.claims += len(requests)
        return self.shared.claim_many(requests, owner)

    def __getattribute__(self, name: str) -> object:
        if name in ("claim", "takeover", "change_many", "states", "_announce", "withdraw"):
            return getattr(object.__getattribute__(self, "shared"), name)
        return object.__getattribute__(self, name)


def test_instances_that_wait_read_the_slot_and_claim_only_what_nobody_claimed() -> None:
    cluster, wins = Cluster(), Counter[tuple[str, float]]()
    stores = {name: _Counted(cluster.store) for name in ("i0", "i1", "i2")}
    for name, store in stores.items():
        scheduler = Scheduler(
            store,
            instance=name,
            clock=cluster.clock,
            seed=len(name),
            jitter=0,
            listener=cluster.events.append,
        )
        for k in range(JOBS):
            scheduler.add_job(
                lambda run: wins.update([(run.instance, run.slot.timestamp())]),
                name=f"job{k:02d}",
                every=10,
            )
        cluster.live[name] = cluster.all[name] = scheduler
    cluster.run(25)  # the first tick, while they learn of each other
    before = sum(store.claims for store in stores.values())
    cluster.run(30)  # three more ticks
    assert sum(store.claims for store in stores.values()) - before == 3 * JOBS
    ticks = sorted({at for _, at in wins if at > START + 25})
    assert len(ticks) == 3 and all(sum(_share(wins, t).values()) == JOBS for t in ticks)


def test_peers_learned_from_claims_and_dropped_without_a_registry() -> None:
    holder = JobState("job", 1000, "b", 1, 1, RunState.RUNNING, 5.0)
    taken, won = Claim(ClaimStatus.TAKEN, holder), Claim(ClaimStatus.WON, holder)
    for registry in (True, False):
        peers = Peers("a", registry=registry)
        peers.learn(taken, None)
        assert peers.names() == ["b"]  # seen holding a slot: live
        peers.learn(won, "b")  # a claim that waited for b found the slot free
        # Without a registry, b is dropped at once; with one, its record's expiry decides.
        assert peers.names() == (["b"] if registry else [])
    peers = Peers("a")
    record = InstanceRecord("c", {"jobs": 3}, 0.0, 15.0)
    idle = InstanceRecord("d", {"jobs": 0}, 0.0, 15.0)
    peers.refresh([record, idle, InstanceRecord("a", {"jobs": 3}, 0.0, 15.0)])
    assert peers.names() == ["c"]  # not itself, nor an instance that runs no job
