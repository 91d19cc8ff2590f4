"""Seconds-long smokes of the Celery beat benchmark (benchmarks/celery_beat.py) and of
the Dramatiq pods' (benchmarks/dramatiq_pods.py).

Real ``celery beat`` processes (anarchon twice, celery-redbeat, stock beat) on
private redis-servers, with 20 entries every 2 s for 12 s: every row is
measured, nothing is published twice, and anarchon misses no slot it did not
report missed (a beat held up past the next slot by a loaded machine skips
the one it waited for, and says so: benchmarks/missed.py). With a
real Celery worker running the tasks (``--worker``), anarchon's beats hand the
slots off to it (execution tracking), each slot run once.
"""

from __future__ import annotations

from benchmarks.celery_beat import HEADER, results, run


def test_a_short_celery_beat_benchmark_sends_each_slot_once() -> None:
    rows = run(entries=20, seconds=12, every=2)
    columns = [c.strip() for c in HEADER.splitlines()[0].strip("|").split("|")]
    assert len(rows) == 4
    for row in rows:
        cells = dict(zip(columns, (c.strip() for c in row.strip("|").split("|")), strict=True))
        assert int(cells["Published"]) > 0, row
        assert cells["Lateness p50 / p99 / max (ms)"] != "- / - / -", row
        assert cells["Duplicated"] == "0", row
        if cells["Scheduler"].startswith("anarchon"):
            missed, _, reported = cells["Missed"].partition(" (")
            assert missed == "0" or reported == f"{missed} reported)", row
        assert float(cells["Redis commands per slot"]) > 0, row
        assert float(cells["Peak RSS (MB)"]) > 0, row


def test_with_a_worker_anarchons_slots_are_handed_off_and_run_once() -> None:
    found = results(10, seconds=8, every=2, worker=True, only="anarchon", together=False)
    result = next(found)  # the default jitter's case
    found.close()
    assert result.published > 0 and result.tracked == result.published
    assert result.sends.duplicated == 0 and result.sends.missed == result.sends.reported
    assert result.commands_per_slot > 0


def test_dramatiq_pods_hand_each_slot_off_and_run_it_once() -> None:
    """3 real ``dramatiq`` pods with the Anarchon middleware on a private Redis."""
    from benchmarks.dramatiq_pods import measure

    result = measure(actors=10, seconds=6, every=2)
    assert result.slots > 0 and result.tracked == result.slots
    assert result.duplicated == 0 and result.missed == result.reported
    assert result.commands_per_slot > 0
