"""A seconds-long smoke of the benchmark suite (docs/benchmarks.md): it runs, and counts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run
from benchmarks.run import HEADER, OVERLOAD_HEADER, POSTGRES, REDIS, Result, run_case, top_frames

ROOT = Path(__file__).resolve().parents[1]


def test_a_short_benchmark_case_runs_every_slot_once(tmp_path: Path) -> None:
    result = run_case(f"sqlite:///{tmp_path}/bench.db", 20, 2, 1.0, 4.0, 0.0)
    assert result.lateness, "no slot ran"
    assert result.doubled == 0
    assert result.missed == 0
    assert result.calls_per_tick > 0
    assert 0 < result.cpu_share < 1 and result.rss_mb > 0
    assert result.row().count("|") == HEADER.splitlines()[0].count("|")


def test_a_short_mysql_case_counts_the_servers_transactions_per_slot(mysql_url: str) -> None:
    """The SQL part's row: the engine's figures and MariaDB's commits per slot run."""
    result = run_case(mysql_url, 20, 2, 1.0, 4.0, 0.0)
    assert result.lateness and result.doubled == 0 and result.missed == 0
    # Each slot's claim and end are transactions of their own: at least one per slot.
    assert result.pg_per_slot is not None and result.pg_per_slot >= 1
    row = result.row(peer=True)
    assert row.startswith("| mysql |")
    assert row.count("|") == run.SQL_HEADER.splitlines()[0].count("|")
    assert [case[0] for case in run.SQL] == [POSTGRES] * 3 + [run.MYSQL] * 3


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


def test_the_overload_part_runs_its_cases_into_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its wiring only: the 100,000-job cases themselves take minutes each."""
    cases: list[tuple[Any, ...]] = []

    def measured(*case: Any) -> Result:
        cases.append(case)
        store, jobs, instances, every, seconds, _ = case
        return Result(
            store,
            jobs,
            instances,
            every,
            seconds,
            lateness=[0.2, 4.0, 9.0],
            doubled=0,
            missed=7,
            busiest_share=0.4,
            calls_per_tick=3.0,
            cpu_share=0.9,
            rss_mb=900,
            events=Counter(catch_up=12, lost=0, missed=7),
        )

    monkeypatch.setattr(run, "run_case", measured)
    page = tmp_path / "benchmarks.md"
    page.write_text("before\n\n<!-- overload -->\n\nNot measured yet.\n\n<!-- /overload -->\n")
    assert run.main(["--suite", "--parts", "overload", "--write", str(page)]) == 0
    assert cases == [(REDIS, 100000, 3, 60.0, 180, 0.0), (POSTGRES, 100000, 3, 60.0, 180, 0.0)]
    text = page.read_text()
    assert text.startswith("before\n") and "Not measured yet" not in text
    rows = [line for line in text.splitlines() if line.startswith(("| redis", "| postgresql"))]
    assert len(rows) == 2
    assert all(row.count("|") == OVERLOAD_HEADER.splitlines()[0].count("|") for row in rows)
    assert rows[0].endswith("| catch_up 12, missed 7 |")
    # The page of the repository has its place for the table.
    assert "<!-- overload -->" in (ROOT / "docs" / "benchmarks.md").read_text()


def test_an_unknown_part_is_refused_before_any_part_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(run, "suite_part", lambda part: ran.append(part) or ("", []))
    with pytest.raises(SystemExit):
        run.main(["--suite", "--parts", "engine,overloaded"])
    assert ran == []


def test_a_short_once_case_reads_the_due_one_offs_once_a_second(tmp_path: Path) -> None:
    """The one-offs part (benchmarks/once.py): pending one-offs, the due read, the engine."""
    from benchmarks import once

    result = once.run_case(f"sqlite:///{tmp_path}/once.db", 2000, 20, 3.0, reads=20, warmup=1.0)
    assert len(result.read_ms) == 20 and all(ms > 0 for ms in result.read_ms)
    # The engine read the due one-offs once per poll (every second), not more.
    assert 0.5 <= result.reads_per_second <= 1.5, result
    assert result.cpu_per_tick_ms > 0
    row = result.row()
    assert row.startswith("| sqlite | 2,000 | 10 |")
    assert row.count("|") == once.HEADER.splitlines()[0].count("|")
    assert "once" in run.PARTS
