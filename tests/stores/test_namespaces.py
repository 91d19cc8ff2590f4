"""``Store.namespaces()``: every namespace a store's server holds, whichever namespace asks."""

from __future__ import annotations

import uuid

import hypothesis.strategies as st
import psycopg
from hypothesis import given

from anarchon_core import open_store
from anarchon_core.store import LeaseStore
from anarchon_core.stores.memory import MemoryStore
from anarchon_core.stores.nats import bucket_name, bucket_namespace
from anarchon_core.stores.postgres import PostgresStore, table_prefix
from tests.cleanup import drop_namespace
from tests.stores.conftest import StoreFactory

SLOT = 1_700_000_000_000


def test_each_namespace_with_a_job_is_listed_by_every_namespace(make_store: StoreFactory) -> None:
    stores = [make_store(name) for name in ("a", "b", "c.d:e_f")]
    for store in stores[:2] + stores[2:]:
        store.claim("job", SLOT, "owner", 30)
    mine = sorted(store.namespace for store in stores)
    for store in stores:
        found = store.namespaces()
        if not isinstance(store, LeaseStore):
            assert found == []  # a claim-only store records no job
        elif isinstance(store, MemoryStore):
            assert found == [store.namespace]  # a memory store is one namespace's alone
        else:
            assert set(mine) <= set(found)
            assert found == sorted(found)


@given(st.from_regex(r"[A-Za-z0-9_.:-]{1,100}", fullmatch=True))
def test_a_nats_bucket_name_gives_its_namespace_back(namespace: str) -> None:
    assert bucket_namespace(bucket_name(namespace)) == namespace


def test_other_streams_are_no_namespace() -> None:
    assert bucket_namespace("KV_other") is None
    assert bucket_namespace("anarchon-a_x") is None  # no escape this store writes
    assert bucket_namespace("anarchon-") is None


def test_postgres_tables_of_an_older_release_are_named_at_the_first_start(
    postgres_url: str,
) -> None:
    """Tables created before their comment named the namespace (release 0.1.0), or whose
    comment is someone else's, are not listed; opened again, they are."""
    namespace = f"t{uuid.uuid4().hex[:10]}-older:release"
    store = open_store(postgres_url, namespace=namespace)
    try:
        store.claim("job", SLOT, "owner", 30)
        assert namespace in store.namespaces()
        jobs = f"{table_prefix(namespace)}_jobs"
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'COMMENT ON TABLE "{jobs}" IS NULL')
        assert namespace not in store.namespaces()
        again = PostgresStore.from_url(postgres_url, namespace=namespace)
        try:
            assert again.jobs() == ["job"]  # its first call brings the tables up to date
            assert namespace in again.namespaces()
        finally:
            again.close()
    finally:
        store.close()
        drop_namespace(postgres_url, namespace)
