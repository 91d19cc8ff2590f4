"""A seconds-long smoke of the Celery beat benchmark (benchmarks/celery_beat.py).

Real ``celery beat`` processes (anarchon twice, celery-redbeat, stock beat) on
private redis-servers, with 20 entries every 2 s for 12 s: every row is
measured, nothing is published twice, and anarchon misses no slot.
"""

from __future__ import annotations

from benchmarks.celery_beat import HEADER, run


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
            assert cells["Missed"] == "0", row
        assert float(cells["Redis commands per slot"]) > 0, row
        assert float(cells["Peak RSS (MB)"]) > 0, row
