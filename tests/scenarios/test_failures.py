"""Every row of the failure table with real processes, real signals and a real store."""

from __future__ import annotations

import contextlib
import itertools
import signal
import time
from collections import Counter
from typing import Any

import pytest

from anarchon_core import RunState, open_store
from anarchon_core.roles import ON_TIME, PEER_MARGIN
from tests.fleet import Line, anchor_soon, slot_seconds
from tests.waiting import wait_until

pytestmark = pytest.mark.scenario

NAMES = ("a", "b", "c")


def runs_of(lines: list[Line], slot_id: str) -> list[Line]:
    return [line for line in lines if line["kind"] == "start" and line["slot_id"] == slot_id]


def slots_after(lines: list[Line], since: float) -> set[str]:
    """The slots due after ``since`` that started."""
    return {
        x["slot_id"] for x in lines if x["kind"] == "start" and slot_seconds(x["slot_id"]) > since
    }


def test_every_slot_runs_exactly_once_spread_over_instances(any_fleet_factory: Any) -> None:
    # A 1 s job's default catch-up window is 1 s: a fleet stalled longer on a loaded
    # machine would miss slots by design. Slots found late are still run within 10 s.
    fleet = any_fleet_factory(every=1, work=0.2, lease=3, catch_up=10)
    fleet.start(*NAMES)
    began = time.time()

    def settled(lines: list[Line]) -> bool:
        # 31 slots after the start-up second: the first 30 are past their claim window.
        return len(slots_after(lines, began + 1)) >= 31

    wait_until(fleet.watch(settled), 60, "31 slots after the start-up", seen=fleet.tail)
    fleet.stop_all()
    starts = [line for line in fleet.starts() if slot_seconds(line["slot_id"]) > began + 1]
    per_slot = Counter(line["slot_id"] for line in starts)
    seconds = sorted(slot_seconds(s) for s in per_slot)
    assert len(seconds) >= 30
    # No slot missed: consecutive seconds from the first to the last.
    assert seconds == [seconds[0] + k for k in range(len(seconds))]
    duplicates = {s: n for s, n in per_slot.items() if n > 1}
    assert duplicates == {}
    assert {line["attempt"] for line in starts} == {1}
    assert len({line["instance"] for line in starts}) >= 2


def test_killed_runner_is_taken_over_as_attempt_2(fleet_factory: Any) -> None:
    fleet = fleet_factory(every=30, anchor=anchor_soon(6), work=6, lease=2)
    fleet.start(*NAMES)
    first = fleet.first_start()
    killed_at = fleet.kill(first["instance"])
    again = wait_until(
        fleet.watch(lambda ls: [x for x in runs_of(ls, first["slot_id"]) if x["attempt"] == 2]),
        10,
        "attempt 2",
        seen=fleet.tail,
    )[0]
    assert again["instance"] != first["instance"]
    assert again["token"] > first["token"]
    assert again["t"] - killed_at <= 2 + 1.5
    assert len(runs_of(fleet.lines(), first["slot_id"])) == 2


def test_frozen_runner_is_taken_over_then_learns_it_lost(fleet_factory: Any) -> None:
    fleet = fleet_factory(every=60, anchor=anchor_soon(6), work=8, lease=2)
    fleet.start(*NAMES)
    first = fleet.first_start()
    fleet.signal(first["instance"], signal.SIGSTOP)
    takeover = wait_until(  # after the 2 s lease lapsed
        fleet.watch(lambda ls: [x for x in runs_of(ls, first["slot_id"]) if x["attempt"] == 2]),
        2 + 2 + 5,
        "takeover",
        seen=fleet.tail,
    )[0]
    assert takeover["instance"] != first["instance"]
    fleet.signal(first["instance"], signal.SIGCONT)

    def original(kind: str) -> Any:
        return lambda ls: [
            x for x in ls if x["kind"] == kind and x["instance"] == first["instance"]
        ]

    wait_until(
        fleet.watch(original("lost")), 10, "the lost-lease event", seen=fleet.tail
    )  # renewal refused
    aborted = wait_until(
        fleet.watch(original("abort")), 10, "the handler to see run.lost", seen=fleet.tail
    )[0]
    assert aborted["attempt"] == 1
    wait_until(fleet.watch(original("finish_refused")), 10, "the refused finish", seen=fleet.tail)
    ends = [x for x in fleet.lines() if x["kind"] == "end" and x["slot_id"] == first["slot_id"]]
    assert [x["attempt"] for x in ends] in ([], [2])
    assert len(runs_of(fleet.lines(), first["slot_id"])) == 2


def test_sigterm_hands_the_run_over_at_once(fleet_factory: Any) -> None:
    fleet = fleet_factory(every=60, anchor=anchor_soon(6), work=8, lease=10)
    fleet.start(*NAMES)
    first = fleet.first_start()
    time.sleep(0.5)
    stopped_at = fleet.signal(first["instance"], signal.SIGTERM)
    again = wait_until(
        fleet.watch(lambda ls: [x for x in runs_of(ls, first["slot_id"]) if x["attempt"] == 2]),
        5,
        "hand-over",
        seen=fleet.tail,
    )[0]
    assert again["t"] - stopped_at <= 1.5  # far less than the 10 s lease
    lines = fleet.lines()
    assert any(x["kind"] == "handed_over" and x["instance"] == first["instance"] for x in lines)
    # The stopped process itself ends within its stop timeout (5 s), whatever its handler does.
    wait_until(
        fleet.watch(
            lambda ls: any(x["kind"] == "down" and x["instance"] == first["instance"] for x in ls)
        ),
        6,
        "the stopped instance to end",
        seen=fleet.tail,
    )


def test_all_instances_killed_mid_run_then_restarted_run_the_slot_again(
    fleet_factory: Any,
) -> None:
    fleet = fleet_factory(every=60, anchor=anchor_soon(6), work=20, lease=2)
    fleet.start(*NAMES)
    first = fleet.first_start()
    for name in NAMES:
        fleet.kill(name)
    fleet.start("d", "e", "f", work=1)
    again = wait_until(
        fleet.watch(lambda ls: [x for x in runs_of(ls, first["slot_id"]) if x["attempt"] == 2]),
        10,
        "re-run",
        seen=fleet.tail,
    )
    assert len(again) == 1
    assert again[0]["instance"] in ("d", "e", "f")
    time.sleep(2)
    assert len(runs_of(fleet.lines(), first["slot_id"])) == 2


def test_all_down_across_a_slot_then_restarted_inside_the_window(fleet_factory: Any) -> None:
    """The catch-up window is one interval: the new instances restart 2.5 s into it, and
    their start-up, which a loaded machine stretches to seconds, must end inside it.

    2.5 s: past the margin within which a win counts as on time (:data:`ON_TIME`, plus
    the deferral of an instance that waits for the slot's preferred one, which may be a
    killed instance still in the registry), so that the win is a ``catch_up`` however
    quickly the instances start. Jitter 0: that margin stays short."""
    every = 10
    fleet = fleet_factory(every=every, anchor=anchor_soon(2), work=0.2, jitter=0)
    fleet.start(*NAMES)
    first = fleet.first_start()
    first_ms = int(slot_seconds(first["slot_id"]) * 1000)
    # The first run is over, in the store, before the kills: its handler's "end" line
    # comes before the loop records the end, and a run killed unrecorded would hold its
    # lease (for the whole lease on NATS, whose leases are judged by observation) and
    # the next slot would be skipped as an overlap, not caught up.
    with contextlib.closing(open_store(fleet.store, namespace=fleet.namespace)) as store:
        wait_until(
            lambda: (
                (held := store.state("tick")) is not None
                and held.slot_ms == first_ms
                and held.state is RunState.DONE
            ),
            5,
            "the first run's end recorded in the store",
            seen=fleet.tail,
        )
    for name in NAMES:
        fleet.kill(name)
    missed = f"tick@{first_ms + every * 1000}"
    on_time = ON_TIME + min(PEER_MARGIN, every / 10)  # jitter 0
    time.sleep(max(0.0, slot_seconds(missed) + on_time + 0.5 - time.time()))
    assert runs_of(fleet.lines(), missed) == []
    fleet.start("d", "e", "f")
    wait_until(
        fleet.watch(lambda ls: runs_of(ls, missed)),
        max(1.0, slot_seconds(missed) + every - time.time()),
        "the catch-up inside the window",
        seen=fleet.tail,
    )
    time.sleep(1.5)
    runs = runs_of(fleet.lines(), missed)
    assert len(runs) == 1
    assert any(x["kind"] == "catch_up" and x["slot_id"] == missed for x in fleet.lines())


def test_a_handler_longer_than_its_interval_never_runs_twice_at_once(fleet_factory: Any) -> None:
    fleet = fleet_factory(every=1, work=2.5, lease=3)
    fleet.start(*NAMES)

    def evidence(lines: list[Line]) -> bool:
        overlaps = sum(x["kind"] == "overlap" for x in lines)
        ended = sum(x["kind"] == "end" for x in lines)
        return overlaps >= 6 and ended >= 3

    wait_until(fleet.watch(evidence), 30, "3 runs to end and 6 overlaps", seen=fleet.tail)
    fleet.stop_all()
    lines = fleet.lines()
    spans = []
    for start in [x for x in lines if x["kind"] == "start"]:
        end = [x for x in lines if x["kind"] == "end" and x["slot_id"] == start["slot_id"]]
        spans.append((start["t"], end[0]["t"] if end else float("inf")))
    spans.sort()
    assert len(spans) >= 3
    for (_, end), (begin, _) in itertools.pairwise(spans):
        assert end <= begin
    assert sum(x["kind"] == "overlap" for x in lines) >= 6


def test_a_newer_slot_supersedes_a_lapsed_run_which_is_not_retried(
    fleet_factory: Any, store_url: str
) -> None:
    """Nobody backs the lapsed run up: the next slot's claim supersedes it; it is not retried.

    b starts after the next slot's time: it finds an older slot whose lease lapsed.
    NATS judges leases by the observer's clock: b calls the record lapsed once it has
    watched it for a lease, so b must be up a lease before the slot after (else that
    slot is an overlap of the run b still sees going, which b then takes over, as
    docs/backends.md says). The 10 s interval leaves a loaded machine 7 s to start b.
    """
    fleet = fleet_factory(every=10, anchor=anchor_soon(2), work=30, lease=2)
    fleet.start("a")
    first = fleet.first_start()
    fleet.kill("a")
    time.sleep(max(0.0, slot_seconds(first["slot_id"]) + 10.2 - time.time()))
    fleet.start("b")
    ready = fleet.all_ready()
    assert ready < slot_seconds(first["slot_id"]) + 20 - 2, "b was not up a lease before its slot"
    wait_until(
        fleet.watch(lambda ls: [x for x in ls if x["kind"] == "start"][1:]),
        15,
        "a newer slot",
        seen=fleet.tail,
    )
    time.sleep(1)
    newer = [x for x in fleet.starts() if x["slot_id"] != first["slot_id"]]
    assert len(runs_of(fleet.lines(), first["slot_id"])) == 1  # not retried
    assert newer and newer[0]["attempt"] == 1
    store = open_store(store_url, namespace=fleet.namespace)
    try:
        states = {r.slot_ms: r.state.value for r in store.history("tick")}
    finally:
        store.close()
    assert states[int(slot_seconds(first["slot_id"]) * 1000)] == "abandoned"


def test_a_backup_takes_a_lapsed_run_over_before_the_next_slot(fleet_factory: Any) -> None:
    """Backups look rarely (watch=20), yet the lapsed run is taken over before the next claim.

    The run killed is of a slot due a second after the last instance had done its first
    step (placed the job, read the store): one that places the job after a slot's time but
    before that slot's claim is written reads no record, starts with the next slot and
    knows of no run to back up (its claim of that slot supersedes the lapsed run, as in the
    test above). The first slot comes 3 s after the start (the one before it came before);
    on a machine so loaded that the instances take longer to come up, the killed run is the
    first of a later slot."""
    fleet = fleet_factory(every=4, anchor=anchor_soon(3), work=12, lease=2, watch=20)
    fleet.start(*NAMES)
    first = fleet.first_start(after=fleet.all_ready() + 1)
    fleet.kill(first["instance"])
    wait_until(
        fleet.watch(lambda ls: len(runs_of(ls, first["slot_id"])) > 1),
        20,  # two slots; more on a loaded machine (the next slot's skip is asserted below)
        "the takeover",
        seen=fleet.tail,
    )
    assert [x["attempt"] for x in runs_of(fleet.lines(), first["slot_id"])] == [1, 2]
    later = f"tick@{int((slot_seconds(first['slot_id']) + 4) * 1000)}"
    assert not runs_of(fleet.lines(), later)  # skipped as an overlap of the taken-over run


def test_instances_on_different_schedule_versions_never_run_a_slot_twice(
    any_fleet_factory: Any,
) -> None:
    fleet = any_fleet_factory(work=0.2, lease=3)
    fleet.start("old1", "old2", every=2)
    fleet.start("new", every=3)
    began = time.time()

    def both_ran(lines: list[Line]) -> bool:
        seconds = {int(slot_seconds(s)) for s in slots_after(lines, began)}
        # As many slots as 14 s of both schedules give, each schedule's own among them.
        return (
            len(seconds) >= 9
            and any(s % 3 == 0 and s % 2 for s in seconds)
            and any(s % 2 == 0 and s % 3 for s in seconds)
        )

    wait_until(fleet.watch(both_ran), 40, "slots of both schedule versions", seen=fleet.tail)
    fleet.stop_all()
    per_slot = Counter(line["slot_id"] for line in fleet.starts())
    assert max(per_slot.values()) == 1
    seconds = {int(slot_seconds(s)) for s in per_slot}
    assert any(s % 3 == 0 and s % 2 for s in seconds)  # the new schedule's own slots ran
    assert any(s % 2 == 0 and s % 3 for s in seconds)  # and the old one's


@pytest.mark.parametrize("skews", [(5, -5, 0)])
def test_skewed_clocks_cause_no_double_run_and_no_premature_takeover(
    any_fleet_factory: Any, skews: tuple[int, ...]
) -> None:
    fleet = any_fleet_factory(work=0.3, lease=2)
    for name, skew in zip(NAMES, skews, strict=True):
        fleet.start(name, every=1, skew=skew)
    began = time.time()
    wait_until(
        fleet.watch(lambda ls: len(slots_after(ls, began)) >= 9), 30, "9 slots", seen=fleet.tail
    )
    fleet.stop_all()
    lines = fleet.lines()
    per_slot = Counter(line["slot_id"] for line in lines if line["kind"] == "start")
    assert len(per_slot) >= 8
    assert max(per_slot.values()) == 1
    assert [x for x in lines if x["kind"] in ("takeover", "lost")] == []


def test_a_skewed_backup_does_not_take_a_live_lease_early(fleet_factory: Any) -> None:
    fleet = fleet_factory(every=60, anchor=anchor_soon(6), work=7, lease=2)
    for name, skew in zip(NAMES, (0, 5, -5), strict=True):
        fleet.start(name, skew=skew)
    first = fleet.first_start()
    wait_until(
        fleet.watch(
            lambda ls: [x for x in ls if x["kind"] == "end" and x["slot_id"] == first["slot_id"]]
        ),
        12,
        "the run to end",
        seen=fleet.tail,
    )
    lines = fleet.lines()
    assert [x for x in lines if x["kind"] in ("takeover", "lost", "abort")] == []
    assert len(runs_of(lines, first["slot_id"])) == 1
