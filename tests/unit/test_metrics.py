"""Prometheus metrics of a scheduler (anarchon_core.metrics), read as a scrape reads them.

Schedulers are driven deterministically (memory store, fake clock, tests/sim.py);
each instance's :class:`Metrics` has a registry of its own, read with
``registry.get_sample_value`` exactly as Prometheus would see it.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from anarchon_core import EventKind, Run, Scheduler, StoreUnavailable
from anarchon_core.metrics import Metrics
from anarchon_core.stores.memory import MemoryStore
from tests.sim import START, Cluster

COUNTERS = (
    "anarchon_slots_won_total",
    "anarchon_slots_taken_over_total",
    "anarchon_runs_lost_total",
    "anarchon_slots_missed_total",
    "anarchon_slots_overlapped_total",
    "anarchon_runs_failed_total",
    "anarchon_slots_dispatched_total",
    "anarchon_runs_finished_total",
)


def value(
    metrics: Metrics, name: str, job: str = "job", namespace: str = "default"
) -> float | None:
    """The sample ``name`` of ``job`` as a scrape shows it (None: not exposed)."""
    found: float | None = metrics.registry.get_sample_value(
        name, {"namespace": namespace, "job": job}
    )
    return found


def count(metrics: Metrics, name: str, job: str = "job", namespace: str = "default") -> float:
    """A counter's value; 0 for a series never started."""
    return value(metrics, name, job, namespace) or 0.0


def counts(metrics: Metrics, job: str = "job") -> dict[str, float]:
    """Every counter of ``job``, by name without its ``anarchon_`` prefix and ``_total``."""
    return {name[len("anarchon_") : -len("_total")]: count(metrics, name, job) for name in COUNTERS}


def bucket(metrics: Metrics, histogram: str, le: str, job: str = "job") -> float | None:
    found: float | None = metrics.registry.get_sample_value(
        f"{histogram}_bucket", {"namespace": "default", "job": job, "le": le}
    )
    return found


def up(metrics: Metrics, namespace: str = "default") -> float | None:
    found: float | None = metrics.registry.get_sample_value("anarchon_up", {"namespace": namespace})
    return found


def nothing_but(**expected: float) -> dict[str, float]:
    """Every counter at 0 but those given."""
    zero = {name[len("anarchon_") : -len("_total")]: 0.0 for name in COUNTERS}
    zero.update({k: float(v) for k, v in expected.items()})
    return zero


def one_job(
    cluster: Cluster, name: str, duration: float, every: float, **options: object
) -> Metrics:
    """Instance ``name`` running ``job`` every ``every`` s, ``duration`` s a run; its metrics."""

    def setup(s: Scheduler) -> None:
        s.add_job(cluster.handler(duration), name="job", every=every, **options)  # type: ignore[arg-type]

    return Metrics(cluster.add(name, setup))


# -- counters and histograms ---------------------------------------------------------


def test_won_slots_and_finished_runs_are_counted_with_lateness_and_duration() -> None:
    cluster = Cluster()
    metrics = one_job(cluster, "a", 2, 10, jitter=0)
    cluster.run(31)  # slots 10, 20, 30 won; 10 and 20 finished, 30 runs until 32
    assert counts(metrics) == nothing_but(slots_won=3, runs_finished=2)

    # One lateness per win: the only instance claims at the slot's time.
    assert value(metrics, "anarchon_claim_lateness_seconds_count") == 3
    assert value(metrics, "anarchon_claim_lateness_seconds_sum") == pytest.approx(0, abs=0.01)
    assert bucket(metrics, "anarchon_claim_lateness_seconds", "0.01") == 3

    # One duration per run that ended: each handler took 2 s.
    assert value(metrics, "anarchon_run_duration_seconds_count") == 2
    assert value(metrics, "anarchon_run_duration_seconds_sum") == pytest.approx(4.0, abs=0.05)
    assert bucket(metrics, "anarchon_run_duration_seconds", "1.0") == 0
    assert bucket(metrics, "anarchon_run_duration_seconds", "5.0") == 2

    cluster.run(1.5)  # slot 30 ends
    assert counts(metrics) == nothing_but(slots_won=3, runs_finished=3)
    assert value(metrics, "anarchon_run_duration_seconds_count") == 3


def test_a_catch_up_counts_as_won_and_its_lateness_is_from_the_slot_time() -> None:
    cluster = Cluster()
    first = one_job(cluster, "a", 1, 10, jitter=0)
    cluster.run(10.5)  # a wins slot 10
    cluster.kill("a")
    cluster.run(13.5)  # slot 20 passes with nobody up; now 24
    late = one_job(cluster, "b", 1, 10, jitter=0)
    cluster.run(1)
    assert [e.kind for e in cluster.events if e.instance == "b"] == [EventKind.CATCH_UP]

    assert counts(late) == nothing_but(slots_won=1)
    # Claimed 4 s after the slot's time (the second "b" started at).
    assert value(late, "anarchon_claim_lateness_seconds_count") == 1
    assert value(late, "anarchon_claim_lateness_seconds_sum") == pytest.approx(4.0, abs=0.05)
    assert bucket(late, "anarchon_claim_lateness_seconds", "2.0") == 0
    assert bucket(late, "anarchon_claim_lateness_seconds", "5.0") == 1
    # Each instance counts its own events only.
    assert counts(first) == nothing_but(slots_won=1)
    assert value(first, "anarchon_claim_lateness_seconds_count") == 1


def _frozen_takeover() -> tuple[Cluster, str, Metrics, str, Metrics]:
    """Two instances; the winner of slot 60 freezes past its 3 s lease and the other
    takes the slot over. Gives the cluster, the frozen instance and the taker."""
    cluster = Cluster()
    metrics = {name: one_job(cluster, name, 6, 60, lease=3, jitter=0.5) for name in "ab"}
    cluster.run(61)
    frozen = cluster.spans[0].instance
    taker = "b" if frozen == "a" else "a"
    cluster.freeze(frozen)
    cluster.run(5)
    return cluster, frozen, metrics[frozen], taker, metrics[taker]


def test_a_takeover_is_counted_by_the_taker_and_the_loss_by_the_frozen_instance() -> None:
    cluster, frozen, lost, _, took = _frozen_takeover()
    assert counts(took) == nothing_but(slots_taken_over=1)
    # Its lateness runs from the slot's time: the 3 s lease lapsed, then a watch.
    assert value(took, "anarchon_claim_lateness_seconds_count") == 1
    assert 3.0 <= value(took, "anarchon_claim_lateness_seconds_sum") <= 5.0  # type: ignore[operator]
    assert counts(lost) == nothing_but(slots_won=1)  # frozen: it saw nothing yet

    cluster.thaw(frozen)
    cluster.run(10)
    assert counts(took) == nothing_but(slots_taken_over=1, runs_finished=1)
    assert value(took, "anarchon_run_duration_seconds_count") == 1
    assert value(took, "anarchon_run_duration_seconds_sum") == pytest.approx(6.0, abs=0.1)
    # The frozen instance's run is lost, never finished; its duration is measured once.
    assert count(lost, "anarchon_runs_lost_total") >= 1
    assert count(lost, "anarchon_runs_finished_total") == 0
    assert count(lost, "anarchon_slots_taken_over_total") == 0
    assert value(lost, "anarchon_run_duration_seconds_count") == 1


def test_one_lost_run_counts_once_in_runs_lost() -> None:
    cluster, frozen, lost, _, _ = _frozen_takeover()
    cluster.thaw(frozen)
    cluster.run(10)
    kinds = [e.kind for e in cluster.events if e.instance == frozen]
    assert kinds == [EventKind.WON, EventKind.LOST, EventKind.FINISH_REFUSED]  # one run
    assert count(lost, "anarchon_runs_lost_total") == 1


def test_overlapped_slots_are_counted_one_per_slot_skipped() -> None:
    cluster = Cluster()
    metrics = one_job(cluster, "a", 2.5, 1, lease=3, jitter=0)
    cluster.run(10.5)
    # Slot 1 runs until 3.5, so 2 and 3 are skipped; likewise 5, 6, 8 and 9.
    overlaps = [e.slot_id for e in cluster.kinds("overlap")]
    assert len(overlaps) == 6
    assert counts(metrics) == nothing_but(slots_won=4, slots_overlapped=6, runs_finished=3)
    # A skipped slot is no run: neither its lateness nor a duration is recorded.
    assert value(metrics, "anarchon_claim_lateness_seconds_count") == 4
    assert value(metrics, "anarchon_run_duration_seconds_count") == 3
    assert value(metrics, "anarchon_run_duration_seconds_sum") == pytest.approx(7.5, abs=0.05)


def test_a_failing_handler_counts_failed_runs_and_no_success() -> None:
    cluster = Cluster()

    def boom(run: Run) -> None:
        cluster.clock.sleep(0.3)
        raise RuntimeError("boom")

    def setup(s: Scheduler) -> None:
        s.add_job(boom, name="job", every=10, jitter=0)

    metrics = Metrics(cluster.add("a", setup))
    cluster.run(21)
    assert counts(metrics) == nothing_but(slots_won=2, runs_failed=2)
    assert value(metrics, "anarchon_run_duration_seconds_count") == 2
    assert value(metrics, "anarchon_run_duration_seconds_sum") == pytest.approx(0.6, abs=0.05)
    # Nothing ever succeeded: no last-success gauge to mislead an alert.
    assert value(metrics, "anarchon_last_success_timestamp_seconds") is None


def test_a_slot_missed_past_its_catch_up_window_is_counted_missed() -> None:
    cluster = Cluster()
    metrics = one_job(cluster, "a", 1, 10, jitter=0, catch_up=3)
    cluster.run(12)  # slot 10 won and finished
    cluster.clock.advance(12.5)  # the process stalls: now 24.5, slot 20 is 4.5 s old
    cluster.run(0.5)
    assert [(e.slot_id, e.detail) for e in cluster.kinds("missed")] == [
        (f"job@{int((START + 20) * 1000)}", "too late")
    ]
    assert counts(metrics) == nothing_but(slots_won=1, runs_finished=1, slots_missed=1)
    # A missed slot is no claim: no lateness is recorded for it.
    assert value(metrics, "anarchon_claim_lateness_seconds_count") == 1

    cluster.run(6)  # slot 30 is won on time
    assert counts(metrics) == nothing_but(slots_won=2, runs_finished=1, slots_missed=1)
    assert value(metrics, "anarchon_claim_lateness_seconds_count") == 2
    assert value(metrics, "anarchon_claim_lateness_seconds_sum") == pytest.approx(0, abs=0.01)


# -- gauges, read at collection ---------------------------------------------------------


def test_gauges_show_the_next_slot_the_lease_held_and_the_last_success() -> None:
    cluster = Cluster()
    metrics = one_job(cluster, "a", 2, 10, jitter=0, lease=3)
    next_slot = "anarchon_next_slot_timestamp_seconds"
    lease = "anarchon_lease_remaining_seconds"
    success = "anarchon_last_success_timestamp_seconds"
    # Before the first step: not placed, not live.
    assert value(metrics, next_slot) is None
    assert value(metrics, lease) is None
    assert up(metrics) == 0

    cluster.run(0.5)
    assert up(metrics) == 1
    assert value(metrics, next_slot) == START + 10
    assert value(metrics, lease) is None  # nothing held
    assert value(metrics, success) is None

    cluster.run(10.5)  # now 11: slot 10 runs until 12
    assert value(metrics, next_slot) == START + 20
    held = value(metrics, lease)
    assert held is not None and 0 < held <= 3
    assert value(metrics, success) is None  # not finished yet

    cluster.run(1.5)  # now 12.5: finished at 12
    assert value(metrics, lease) is None
    last = value(metrics, success)
    assert last == cluster.store.stats(["job"])["job"].last_success
    assert last == pytest.approx(START + 12, abs=0.05)
    assert value(metrics, next_slot) == START + 20
    assert up(metrics) == 1


#: Every call a scheduler (or a scrape) makes of its store.
CALLS = {
    name
    for name in dir(MemoryStore)
    if not name.startswith("_") and callable(getattr(MemoryStore, name))
}


class Outage(MemoryStore):
    """A memory store that can be switched off, as a server outage: every call fails."""

    down = False

    def __getattribute__(self, name: str) -> object:
        attr = super().__getattribute__(name)
        if name in CALLS and name != "close" and super().__getattribute__("down"):
            raise StoreUnavailable("connection refused")
        return attr


def test_up_drops_to_0_while_the_store_fails_and_last_success_is_left_out() -> None:
    cluster = Cluster()
    cluster.store = store = Outage(clock=cluster.clock)
    metrics = one_job(cluster, "a", 0.5, 10, jitter=0)
    cluster.run(11)
    assert up(metrics) == 1
    assert value(metrics, "anarchon_last_success_timestamp_seconds") == pytest.approx(
        START + 10.5, abs=0.05
    )

    store.down = True
    cluster.run(9.5)  # now 20.5: the claim of slot 20 failed
    assert up(metrics) == 0
    # The store does not answer: the gauge is left out, the rest is still served.
    assert value(metrics, "anarchon_last_success_timestamp_seconds") is None
    assert count(metrics, "anarchon_slots_won_total") == 1
    assert value(metrics, "anarchon_next_slot_timestamp_seconds") == START + 20

    store.down = False
    cluster.run(3)
    assert up(metrics) == 1
    assert count(metrics, "anarchon_slots_won_total") == 2  # slot 20, caught up
    last = value(metrics, "anarchon_last_success_timestamp_seconds")
    assert last == store.stats(["job"])["job"].last_success
    assert last is not None and last > START + 20  # slot 20's run, once it ended


def test_up_stays_0_for_as_long_as_the_store_is_down() -> None:
    cluster = Cluster()
    cluster.store = store = Outage(clock=cluster.clock)
    metrics = one_job(cluster, "a", 0.5, 10, jitter=0)
    cluster.run(11)
    store.down = True
    cluster.run(0.15)
    assert len(cluster.kinds("store_unavailable")) == 1  # a call failed: the outage is seen
    readings = []
    for _ in range(50):  # the next 5 s, the store down throughout
        cluster.run(0.1)
        readings.append(up(metrics))
    assert readings == [0.0] * 50
    assert not cluster.kinds("store_recovered")


# -- labels -------------------------------------------------------------------------


Series = set[tuple[str, tuple[tuple[str, str], ...]]]


def _series(registry: CollectorRegistry) -> Series:
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in registry.collect()
        for sample in family.samples
    }


def _lasting(series: Series) -> Series:
    """Less the lease gauge, shown only while a run is held."""
    return {one for one in series if one[0] != "anarchon_lease_remaining_seconds"}


def test_labels_are_namespace_and_job_only_however_many_slots_pass() -> None:
    cluster = Cluster()
    cluster.store = MemoryStore(namespace="billing", clock=cluster.clock)

    def setup(s: Scheduler) -> None:
        s.add_job(cluster.handler(0.3), name="sync", every=1, jitter=0)
        s.add_job(cluster.handler(1.5), name="digest", every=1, jitter=0, lease=3)

    metrics = {name: Metrics(cluster.add(name, setup)) for name in "ab"}
    cluster.run(20.5)
    before = {name: _series(m.registry) for name, m in metrics.items()}
    cluster.run(40)
    assert len(cluster.spans) > 50  # many slots, overlaps and runs
    for name, m in metrics.items():
        series = _series(m.registry)
        # No new series appeared with the slots: one per job and counter kind only.
        assert _lasting(series) == _lasting(before[name]), name
        labels = [dict(pairs) for _, pairs in series]
        assert {key for lab in labels for key in lab} <= {"namespace", "job", "le"}
        assert {lab["namespace"] for lab in labels} == {"billing"}
        assert {lab["job"] for lab in labels if "job" in lab} == {"sync", "digest"}
        assert not any("@" in v for lab in labels for v in lab.values())  # no slot ids
    # Both instances won slots of both jobs, each counted by its winner.
    total = sum(count(m, "anarchon_slots_won_total", "sync", "billing") for m in metrics.values())
    won = {s.slot_id for s in cluster.spans if s.job == "sync"}
    assert total == len(won)


def test_metrics_register_in_the_registry_given() -> None:
    cluster = Cluster()
    registry = CollectorRegistry()

    def setup(s: Scheduler) -> None:
        s.add_job(cluster.handler(0.1), name="job", every=5, jitter=0)

    scheduler = cluster.add("a", setup)
    metrics = Metrics(scheduler, registry=registry)
    assert metrics.registry is registry
    cluster.run(5.5)
    assert (
        registry.get_sample_value(
            "anarchon_slots_won_total", {"namespace": "default", "job": "job"}
        )
        == 1
    )
    assert registry.get_sample_value("anarchon_up", {"namespace": "default"}) == 1
