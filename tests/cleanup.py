"""Removing what a test wrote to a shared server, so repeated runs leave nothing behind.

Each test writes under namespaces of its own; afterwards those are dropped
here. RabbitMQ needs nothing: the tests' claim queues expire within a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit


def drop_namespace(url: str, namespace: str) -> None:
    """Best effort: a failed clean-up must not fail the test that made the data."""
    scheme = urlsplit(url).scheme
    with contextlib.suppress(Exception):
        if scheme in ("redis", "valkey", "rediss", "valkeys"):
            _drop_redis(url, namespace)
        elif scheme in ("postgresql", "postgres"):
            _drop_postgres(url, namespace)
        elif scheme in ("mysql", "mariadb"):
            _drop_mysql(url, namespace)
        elif scheme == "nats":
            asyncio.run(_drop_nats(url, namespace))


def _drop_redis(url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(url.replace("valkey", "redis", 1), socket_timeout=3)
    try:
        keys = list(client.scan_iter(match=f"anarchon:{{{namespace}/*", count=1000))
        parts = ("jobs", "instances", "seen", "paused", "controls", "once", "once:v")
        keys += [f"anarchon:{{{namespace}}}:{part}" for part in parts]
        client.delete(*keys)
    finally:
        client.close()


def _drop_postgres(url: str, namespace: str) -> None:
    import psycopg

    from anarchon_core.stores.postgres import table_prefix

    prefix = table_prefix(namespace)
    with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
        conn.execute(
            f'DROP TABLE IF EXISTS "{prefix}_runs", "{prefix}_jobs", "{prefix}_instances",'
            f' "{prefix}_paused", "{prefix}_controls", "{prefix}_stats", "{prefix}_once" CASCADE'
        )
        conn.execute(f'DROP FUNCTION IF EXISTS "{prefix}_log"() CASCADE')


def _drop_mysql(url: str, namespace: str) -> None:
    from anarchon_core.names import table_prefix
    from anarchon_core.stores.mysql import MySQLStore

    store = MySQLStore.from_url(url, namespace=namespace, timeout=3)
    prefix = table_prefix(namespace)
    parts = ("jobs", "runs", "stats", "paused", "controls", "instances", "once")
    conn = store._open()
    try:
        with conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS " + ", ".join(f"`{prefix}_{p}`" for p in parts))
    finally:
        conn.close()
        store.close()


async def _drop_nats(url: str, namespace: str) -> None:
    import nats

    from anarchon_core.stores.nats import bucket_name

    client = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        js = client.jetstream()
        with contextlib.suppress(Exception):  # a namespace that had no one-off has no stream
            await js.delete_stream("ONCE_" + bucket_name(namespace))
        await js.delete_key_value(bucket_name(namespace))
    finally:
        await client.close()
