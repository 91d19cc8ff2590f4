"""A seconds-long smoke of the benchmark suite (docs/benchmarks.md): it runs, and counts."""

from __future__ import annotations

from pathlib import Path

from benchmarks.run import HEADER, run_case


def test_a_short_benchmark_case_runs_every_slot_once(tmp_path: Path) -> None:
    result = run_case(f"sqlite:///{tmp_path}/bench.db", 20, 2, 1.0, 4.0, 0.0)
    assert result.lateness, "no slot ran"
    assert result.doubled == 0
    assert result.missed == 0
    assert result.calls_per_tick > 0
    assert 0 < result.cpu_share < 1 and result.rss_mb > 0
    assert result.row().count("|") == HEADER.splitlines()[0].count("|")
