"""A seconds-long smoke of the APScheduler 4 peer benchmark (benchmarks/apscheduler_peer.py).

APScheduler, SQLAlchemy and asyncpg come with the ``bench`` dependency group,
which the ``test`` group includes. What it checks is the harness: instances start, slots
run and are counted, every figure is filled in, the row fits the table, and
the run's schema is dropped. APScheduler's own doubled and missed counts are
measured, not asserted.
"""

from __future__ import annotations

import psycopg

from benchmarks.apscheduler_peer import HEADER, run_case


def test_a_short_apscheduler_case_runs_and_fills_the_row(postgres_url: str) -> None:
    result = run_case(10, 2, 2.0, 10.0, postgres=postgres_url)
    assert result.lateness, "no slot ran"
    assert result.doubled >= 0 and result.missed >= 0
    assert 0.5 <= result.busiest_share <= 1 and 0 <= result.least_share <= 0.5
    assert result.calls_per_tick > 0 and result.pg_transactions_per_slot > 0
    assert 0 < result.cpu_share < 1 and result.rss_mb > 0
    head, rule = HEADER.splitlines()
    assert result.row().count("|") == head.count("|") == rule.count("|")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (result.schema,)
        ).fetchall()
    assert result.schema and not left, "the run's schema was not dropped"
