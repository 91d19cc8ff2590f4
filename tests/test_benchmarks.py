"""A seconds-long smoke of the benchmark suite (docs/benchmarks.md): it runs, and counts."""

from __future__ import annotations

from pathlib import Path

from benchmarks.run import HEADER, run_case, top_frames


def test_a_short_benchmark_case_runs_every_slot_once(tmp_path: Path) -> None:
    result = run_case(f"sqlite:///{tmp_path}/bench.db", 20, 2, 1.0, 4.0, 0.0)
    assert result.lateness, "no slot ran"
    assert result.doubled == 0
    assert result.missed == 0
    assert result.calls_per_tick > 0
    assert 0 < result.cpu_share < 1 and result.rss_mb > 0
    assert result.row().count("|") == HEADER.splitlines()[0].count("|")


def test_a_profile_is_summed_by_function(tmp_path: Path) -> None:
    profile = tmp_path / "profile.raw"
    profile.write_text(
        "Thread.run (threading.py:1);Scheduler._step (s.py:2);claim_many (r.py:3) 6\n"
        "Thread.run (threading.py:1);Scheduler._step (s.py:2) 2\n"
        "Thread.run (threading.py:1);Workers._work (c.py:9) 2\n"
    )
    rows = top_frames(profile)
    assert rows[0] == "| `Scheduler._step` | 80% | 20% |"
    assert "| `claim_many` | 60% | 60% |" in rows
    assert not any("Thread.run" in row for row in rows)
