"""A seconds-long smoke of the django-celery-beat benchmark (benchmarks/django_beat.py).

Its short form: real ``celery beat`` processes of the benchmark's Django
project on new PostgreSQL databases and the Redis broker, every case at once:
100 rows every 2 s in 3 anarchon beats and in one django-celery-beat beat,
and 5 rows every 2 s in 3 beats of each, 6 s each. anarchon sends every slot
once, or reports it missed (beats held up past the next slot);
django-celery-beat's figures are measured, not asserted. Each case
drops its database, its queue and anarchon's namespace.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psycopg
import pytest
import redis

from benchmarks.django_beat import (
    ANARCHON,
    HEADER,
    Case,
    CaseRun,
    results,
    run_group,
)

pytestmark = pytest.mark.scenario


def test_a_short_django_beat_benchmark_sends_each_anarchon_slot_once(
    postgres_url: str, redis_url: str
) -> None:
    done = results(short=True, server=postgres_url, broker=redis_url)

    assert [(r.case.kind, r.case.label.split()[0], r.case.beats) for r in done] == [
        ("scale", "anarchon", 3),
        ("scale", "django-celery-beat", 1),
        ("duplicates", "django-celery-beat", 3),
        ("duplicates", "anarchon", 3),
    ]
    columns = HEADER.splitlines()[0].count("|")
    for result in done:
        row = result.row()
        assert row.count("|") == columns, row
        assert result.due > 0 and result.messages > 0 and result.lateness, row
        assert len(result.cpu) == result.case.beats and min(result.cpu) >= 0, row
        assert result.rss_mb > 0, row
        if result.case.anarchon:
            # Each slot sent once; none missed but those a beat reported it skipped, held
            # up past the next slot by a loaded machine (the frozen beats' test below).
            assert (result.twice, result.more) == (0, 0), row
            assert result.missed == result.reported and result.sent > 0, row

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)",
            ([r.database for r in done],),
        ).fetchall()
    assert not left, "a case's database was not dropped"
    client = redis.Redis.from_url(redis_url)
    try:
        for result in done:
            assert not list(client.scan_iter(f"*{result.queue}*")), result.queue
            assert not list(client.scan_iter(f"anarchon:{{{result.namespace}*")), result.namespace
    finally:
        client.close()


def test_a_slot_skipped_by_frozen_beats_is_counted_missed_as_they_reported_it(
    postgres_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beats held up past the next slot (frozen here; a loaded machine's CPU waits in CI)
    skip the slot they waited for and report it missed, as documented: the figures count
    it missed, said reported, and every other slot sent once."""
    frozen: list[float] = []
    begin = CaseRun.begin

    def begin_then_freeze(run: CaseRun) -> None:
        begin(run)
        window = run.window
        assert window is not None
        last = window.slots[-1]

        def freeze() -> None:
            time.sleep(max(0.0, last - 0.3 - time.time()))
            for beat in run.beats:
                os.killpg(beat.pid, signal.SIGSTOP)
            frozen.append(time.time())
            time.sleep(max(0.0, window.end + 0.5 - time.time()))  # past the next slot
            for beat in run.beats:
                os.killpg(beat.pid, signal.SIGCONT)

        threading.Thread(target=freeze, daemon=True).start()

    monkeypatch.setattr(CaseRun, "begin", begin_then_freeze)
    [result] = run_group(
        [Case("scale", ANARCHON, 3, 5, "2", 4.0)], server=postgres_url, broker=redis_url
    )

    assert frozen, "the beats were not frozen"
    row = result.row()
    assert (result.due, result.sent, result.twice, result.more) == (10, 5, 0, 0), row
    assert (result.missed, result.reported) == (5, 5), row
