"""A seconds-long smoke of the benchmark suite (docs/benchmarks.md): it runs, and counts.

No slot runs twice, and none is missed that the instances did not report missed (an
instance held up past the next slot by a loaded machine skips the one it waited for and
says so: benchmarks/missed.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run
from benchmarks.run import HEADER, OVERLOAD_HEADER, POSTGRES, REDIS, Result, run_case, top_frames

ROOT = Path(__file__).resolve().parents[1]


def measured_as(cases: list[tuple[Any, ...]], figures: dict[str, Any]) -> Any:
    """A stand-in for ``run_case`` in a part's wiring test: notes each case in ``cases``
    and answers ``figures`` for it (lateness 0.2 / 4 / 9 s, none doubled)."""

    def measured(*case: Any) -> Result:
        cases.append(case)
        store, jobs, instances, every, seconds, _ = case
        return Result(
            store, jobs, instances, every, seconds, lateness=[0.2, 4.0, 9.0], doubled=0, **figures
        )

    return measured


def test_a_short_benchmark_case_runs_every_slot_once(tmp_path: Path) -> None:
    result = run_case(f"sqlite:///{tmp_path}/bench.db", 20, 2, 1.0, 4.0, 0.0)
    assert result.lateness, "no slot ran"
    assert result.doubled == 0
    assert result.missed == result.reported
    assert result.calls_per_tick > 0
    assert 0 < result.cpu_share < 1 and result.rss_mb > 0
    assert result.row().count("|") == HEADER.splitlines()[0].count("|")


def test_a_short_mysql_case_counts_the_servers_transactions_per_slot(mysql_url: str) -> None:
    """The SQL part's row: the engine's figures and MariaDB's commits per slot run."""
    result = run_case(mysql_url, 20, 2, 1.0, 4.0, 0.0)
    assert result.lateness and result.doubled == 0 and result.missed == result.reported
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
    figures = {"missed": 7, "busiest_share": 0.4, "calls_per_tick": 3.0, "cpu_share": 0.9}
    figures |= {"rss_mb": 900, "events": Counter(catch_up=12, lost=0, missed=7)}
    monkeypatch.setattr(run, "run_case", measured_as(cases, figures))
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


@pytest.mark.fast
def test_the_cost_part_measures_slots_won_and_lost_each_once() -> None:
    """The cost part (benchmarks/cost.py): real schedulers on one in-memory store, in
    virtual time; the ticks it measures ran each slot once, by one of the instances."""
    from benchmarks import cost

    fleet = cost.Fleet(50, 2, cost.EVERY)
    fleet.run(2 * cost.EVERY, measured=False)
    fleet.run(3 * cost.EVERY, measured=True)
    assert fleet.figures.cpu > fleet.figures.store > 0
    runs = [r for j in range(50) for r in fleet.store.history(f"job{j}", 20)]
    by_slot = Counter((r.slot_ms // 1000) for r in runs)
    # Five ticks, every slot once (a start just after a slot time: the first comes 9.5 s on).
    assert sorted(by_slot.values()) == [50] * 5
    assert {r.state.value for r in runs} == {"done"} and {r.attempt for r in runs} == {1}
    assert {r.owner for r in runs} == {"i1", "i2"}
    row = cost.run(jobs=(20,), ticks=1, callgrind_jobs=None)
    assert len(row) == 3 and all(r.count("|") == cost.HEADER.count("|") // 2 for r in row)
    assert "cost" in run.PARTS


def test_a_short_lookahead_case_runs_behind_a_relay_that_adds_a_round_trip(
    redis_url: str,
) -> None:
    """The look-ahead part: the instances reach the store through benchmarks/delay.py
    (20 ms more per round trip) and send their claims ahead; every slot once, none of
    its handlers started before its time."""
    import time as _time
    from urllib.parse import urlsplit

    import redis

    from benchmarks.delay import relay

    target = urlsplit(redis_url)
    with relay(f"{target.hostname}:{target.port or 6379}", 0.02) as port:
        via = f"redis://127.0.0.1:{port}/{(target.path or '/0').lstrip('/') or 0}"
        client = redis.Redis.from_url(via)
        began = _time.perf_counter()
        for _ in range(5):
            client.ping()
        assert (_time.perf_counter() - began) / 5 >= 0.02  # the relay adds its round trip
        client.close()
        result = run_case(redis_url, 20, 2, 1.0, 4.0, 0.0, lookahead=0.5, via=via)
    assert result.lateness and result.doubled == 0 and result.missed == result.reported
    assert min(result.lateness) >= 0, "a handler started before its slot's time"
    assert "lookahead" in run.PARTS and len(run.LOOKAHEAD) == 8


def test_a_short_case_on_a_redis_cluster_the_scale_part_starts(tmp_path: Path) -> None:
    """The scale part's Redis Cluster (benchmarks/cluster.py, three primaries) takes a
    short case: every slot once, each instance's start-up measured."""
    from benchmarks.cluster import redis_cluster

    with redis_cluster() as url:
        assert url.startswith("redis+cluster://") and url.count(",") == 2
        result = run_case(url, 20, 2, 1.0, 4.0, 0.0)
    assert result.lateness and result.doubled == 0 and result.missed == result.reported
    assert len(result.startup) == 2 and all(0 < s < 30 for s in result.startup)
    assert result.row().startswith("| redis+cluster | 20 | 2 |")


def test_the_scale_part_runs_its_cases_into_its_table_and_draws_the_growth_curves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its wiring, and the plots drawn from the page's tables (the 100,000-job cases
    themselves take 12 minutes each)."""
    import contextlib

    from benchmarks import plots

    cases: list[tuple[Any, ...]] = []
    figures = {"missed": 0, "busiest_share": 0.1, "calls_per_tick": 12.5, "cpu_share": 0.3}
    figures |= {"rss_mb": 400, "events": Counter(catch_up=3), "startup": [8.0, 9.5, 30.25]}
    measured = measured_as(cases, figures)

    @contextlib.contextmanager
    def cluster() -> Any:
        yield "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"

    monkeypatch.setattr(run, "run_case", measured)
    monkeypatch.setattr("benchmarks.cluster.redis_cluster", cluster)
    page = tmp_path / "benchmarks.md"
    cases_shown = [
        "redis | 100 | 3 | 10 s | 60 s | 7 / 13 / 13 | 0 | 0 | 35% / 30% | 3.9 | 0.18% | 36",
        "redis | 1000 | 3 | 10 s | 60 s | 59 / 113 / 128 | 0 | 0 | 34% / 33% | 3.3 | 0.93% | 41",
        "redis | 1000 | 1 | 10 s | 60 s | 72 / 105 / 106 | 0 | 0 | 100% / 100% | 2.0 | 1.2% | 43",
        "redis | 1000 | 3 | `* * * * *` | 120 s | 71 / 96 / 105 | 0 | 0 | 34% / 33% | 3 | 0% | 4",
    ]
    table = "\n".join(f"| {row} |" for row in cases_shown)
    engine = f"<!-- engine -->\n\n{HEADER}\n{table}\n\n<!-- /engine -->\n"
    page.write_text(f"before\n\n{engine}\n<!-- scale -->\n\nNot measured yet.\n\n<!-- /scale -->\n")
    assert run.main(["--suite", "--parts", "scale", "--write", str(page)]) == 0
    assert [c[1:] for c in cases] == [(100000, 10, 60.0, 600, 0.0)] * 2
    assert cases[0][0].startswith("redis+cluster://") and cases[1][0] == POSTGRES
    text = page.read_text()
    rows = [x for x in text.splitlines() if x.startswith(("| redis+cluster", "| postgresql"))]
    assert len(rows) == 2
    assert all(row.count("|") == run.SCALE_HEADER.splitlines()[0].count("|") for row in rows)
    assert rows[0].endswith("| 9.5 / 30.2 | catch_up 3 |")
    # The growth curves: every non-cron row of the engine's and the scale part's tables.
    found = plots.rows(text)
    assert {(r.store, r.jobs, r.instances) for r in found} == {
        ("redis", 100, 3),
        ("redis", 1000, 3),
        ("redis", 1000, 1),
        ("redis", 1000, 3),
        ("redis+cluster", 100000, 10),
        ("postgresql", 100000, 10),
    }
    assert next(r for r in found if r.jobs == 100).p99_ms == 13
    for name in (plots.BY_JOBS, plots.BY_INSTANCES):
        image = tmp_path / plots.IMAGES / name
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 10_000
    # The page of the repository shows the table and both images.
    shipped = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "<!-- scale -->" in shipped
    for name in (plots.BY_JOBS, plots.BY_INSTANCES):
        assert f"({plots.IMAGES}/{name})" in shipped
        assert (ROOT / "docs" / plots.IMAGES / name).exists()
