"""A seconds-long smoke of the django-celery-beat benchmark (benchmarks/django_beat.py).

Its short form: real ``celery beat`` processes of the benchmark's Django
project on new PostgreSQL databases and the Redis broker, every case at once:
100 rows every 2 s in 3 anarchon beats and in one django-celery-beat beat,
and 5 rows every 2 s in 3 beats of each, 6 s each. anarchon sends every slot
once; django-celery-beat's figures are measured, not asserted. Each case
drops its database, its queue and anarchon's namespace.
"""

from __future__ import annotations

import psycopg
import pytest
import redis

from benchmarks.django_beat import HEADER, results

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
            assert result.sent == result.due, row
            assert (result.twice, result.more, result.missed) == (0, 0, 0), row

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
