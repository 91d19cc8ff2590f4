"""What only the MySQL/MariaDB store has to prove, against the machine's MariaDB 10.11.

The contract suite (test_contract.py and its neighbours) runs on this store
too; here: its own tables and layout version, row locks taken in one order,
the server's clock read after the locks, a deadlock's victim retried, lock
waits and lost connections told as outages and ridden out, and its options.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from anarchon_core import (
    Change,
    ClaimRequest,
    ClaimStatus,
    RunState,
    StoreUnavailable,
    TakeoverRequest,
    open_store,
)
from anarchon_core.errors import ConfigurationError
from anarchon_core.names import table_prefix
from anarchon_core.stores.mysql import SCHEMA_VERSION, MySQLStore
from tests import servers
from tests.cleanup import drop_namespace
from tests.stores import racer

SLOT = 1_700_000_000_000

Make = Callable[..., MySQLStore]


@pytest.fixture
def make(mysql_url: str) -> Iterator[Make]:
    """Opens stores on the machine's server; closes them and drops their tables afterwards."""
    made: list[MySQLStore] = []

    def make(namespace: str | None = None, url: str | None = None, **options: Any) -> MySQLStore:
        store = open_store(
            url or mysql_url, namespace=namespace or f"t{uuid.uuid4().hex[:12]}", **options
        )
        assert isinstance(store, MySQLStore)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
    for namespace in {store.namespace for store in made}:
        drop_namespace(mysql_url, namespace)


def connect(url: str) -> pymysql.connections.Connection:
    """A connection of our own to the store's server, as another client would open."""
    store = MySQLStore.from_url(url, namespace="x")
    try:
        return store._open()
    finally:
        store.close()


def tables(url: str, namespace: str) -> dict[str, str]:
    """The namespace's tables and their comments."""
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE %s",
            (table_prefix(namespace).replace("_", "\\_") + "\\_%",),
        )
        return dict(cur.fetchall())


def test_tables_are_made_at_first_use_named_and_versioned(make: Make, mysql_url: str) -> None:
    store = make()
    assert tables(mysql_url, store.namespace) == {}
    store.claim("job", SLOT, "a", 5)
    made = tables(mysql_url, store.namespace)
    prefix = table_prefix(store.namespace)
    parts = ("jobs", "runs", "stats", "paused", "controls", "instances")
    assert sorted(made) == sorted(f"{prefix}_{part}" for part in parts)
    assert all(len(name) <= 64 for name in made)
    comment = made[f"{prefix}_jobs"]
    assert comment == f"anarchon schema {SCHEMA_VERSION} namespace {store.namespace}"


def test_schema_creation_is_idempotent_under_concurrent_first_use(
    make: Make, mysql_url: str
) -> None:
    """Eight instances starting together each make the tables; all of them work at once."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    stores = [make(namespace) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    answers: list[Any] = [None] * len(stores)

    def first(i: int) -> None:
        barrier.wait()
        try:
            answers[i] = stores[i].set_control(f"key{i}", '"v"', 0)
        except BaseException as exc:  # the test reads every answer
            answers[i] = exc

    threads = [threading.Thread(target=first, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(answer, int) and answer > 0 for answer in answers), answers
    assert len(set(answers)) == len(stores)  # versions never repeat


def test_odd_namespaces_map_to_valid_distinct_tables(make: Make, mysql_url: str) -> None:
    names = ["A.b:c-d", "a_b_c_d", "x" * 100, "UPPER", "upper"]
    stores = [make(name) for name in names]
    for store in stores:
        store.claim("job", SLOT, store.namespace, 5)
    assert len({table_prefix(name) for name in names}) == len(names)
    assert [s.state("job").owner for s in stores] == names  # type: ignore[union-attr]
    listed = stores[0].namespaces()
    assert set(names) <= set(listed)


def test_job_names_that_differ_by_trailing_spaces_or_case_are_distinct(make: Make) -> None:
    """MySQL's text collations compare 'a' equal to 'a ' (and often to 'A'): names are binary."""
    store = make()
    names = ["a", "a ", "A", "é", "e\u0301", "😀"]
    claims = store.claim_many([ClaimRequest(name, SLOT, 5) for name in names], "x")
    assert [c.status for c in claims] == [ClaimStatus.WON] * len(names)
    assert store.jobs() == sorted(names)
    assert set(store.states(names)) == set(names)


def test_batches_in_any_order_neither_deadlock_nor_double_win(make: Make) -> None:
    """Four instances claim the same 40 jobs each tick, each batch in its own order."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    racer.batches_in_any_order([make(namespace) for _ in range(4)], SLOT)


def locked(url: str, store: MySQLStore, job: str) -> pymysql.connections.Connection:
    """Another client's open transaction holding ``job``'s row lock."""
    conn = connect(url)
    conn.begin()
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT token FROM `{table_prefix(store.namespace)}_jobs` WHERE job = %s FOR UPDATE",
            (job,),
        )
        assert cur.fetchone() is not None
    return conn


def test_the_lease_is_judged_by_the_servers_clock_after_the_lock_is_granted(
    make: Make, mysql_url: str
) -> None:
    """A takeover that waits on the row lock past the lease's end sees the lease lapse."""
    store = make()
    holder = store.claim("job", SLOT, "a", 0.5).holder
    assert holder is not None
    other = locked(mysql_url, store, "job")
    try:
        answer: list[Any] = []
        waiting = threading.Thread(
            target=lambda: answer.append(store.takeover("job", SLOT, "b", 5, holder.token))
        )
        waiting.start()
        time.sleep(1.0)  # the lease lapses while the takeover waits for the lock
        assert waiting.is_alive()
        other.commit()
        waiting.join(10)
        assert answer and answer[0].won, answer
    finally:
        other.close()


def test_a_lock_held_past_the_timeout_is_an_outage_then_ridden_out(
    make: Make, mysql_url: str
) -> None:
    store = make(timeout=2)  # a lock wait of 1 s, within the 2 s every call is bounded by
    first = store.claim("job", SLOT, "a", 60)
    assert first.holder is not None
    other = locked(mysql_url, store, "job")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="Lock wait timeout"):
            store.claim("job", SLOT + 1000, "b", 5)
        assert time.monotonic() - started < 5
    finally:
        other.rollback()
        other.close()
    # The store goes on: the claim that timed out applied nothing.
    assert store.claim("job", SLOT + 1000, "b", 5).status is ClaimStatus.BUSY
    state = store.state("job")
    assert state is not None and (state.owner, state.token) == ("a", first.holder.token)


def test_a_deadlocks_victim_is_retried_and_wins(make: Make, mysql_url: str) -> None:
    """Another client locks 'b', the store's batch locks 'a' then waits on 'b', the other
    client asks for 'a': a deadlock. The store's transaction (which wrote nothing yet) is
    the victim; it is run again and claims both."""
    store = make()
    store.claim_many([ClaimRequest("a", SLOT, 0), ClaimRequest("b", SLOT, 0)], "old")
    jobs = f"`{table_prefix(store.namespace)}_jobs`"
    other = connect(mysql_url)
    try:
        other.begin()
        with other.cursor() as cur:
            # Heavier than the store's transaction: the server picks the store's as victim.
            cur.execute(f"UPDATE {jobs} SET owner = 'other' WHERE job = 'b'")
        answer: list[Any] = []
        claiming = threading.Thread(
            target=lambda: answer.append(
                store.claim_many(
                    [ClaimRequest("a", SLOT + 1, 5), ClaimRequest("b", SLOT + 1, 5)], "x"
                )
            )
        )
        claiming.start()
        deadline = time.monotonic() + 5
        while not waiting_for_lock(mysql_url) and time.monotonic() < deadline:
            time.sleep(0.02)
        with other.cursor() as cur:
            cur.execute(f"SELECT owner FROM {jobs} WHERE job = 'a' FOR UPDATE")
            cur.execute(f"UPDATE {jobs} SET owner = 'other' WHERE job = 'a'")
        other.rollback()
        claiming.join(10)
    finally:
        other.close()
    assert answer, "the claim did not come back"
    assert [c.status for c in answer[0]] == [ClaimStatus.WON, ClaimStatus.WON]
    assert {s.owner for s in store.states(["a", "b"]).values()} == {"x"}


def waiting_for_lock(url: str) -> bool:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
        )
        row = cur.fetchone()
    return bool(row and row[0])


def test_a_connection_the_server_dropped_is_replaced_without_an_error(
    make: Make, mysql_url: str
) -> None:
    """'MySQL server has gone away': an idle pooled connection killed by the server (a
    restart, wait_timeout, a proxy) is noticed before use and replaced."""
    store = make()
    store.claim("job", SLOT, "a", 5)
    ids = [conn.thread_id() for conn in store._pool._idle]
    assert ids
    with connect(mysql_url) as conn, conn.cursor() as cur:
        for pid in ids:
            cur.execute(f"KILL CONNECTION {int(pid)}")
    deadline = time.monotonic() + 5
    answer = None
    while answer is None and time.monotonic() < deadline:
        try:
            answer = store.state("job")
        except StoreUnavailable:  # killed while in use is an outage; the next call connects
            time.sleep(0.05)
    assert answer is not None and answer.owner == "a"


def test_a_newer_layout_is_refused_not_misread(make: Make, mysql_url: str) -> None:
    store = make()
    store.claim("job", SLOT, "a", 5)
    jobs = f"`{table_prefix(store.namespace)}_jobs`"
    with connect(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(
            f"ALTER TABLE {jobs} COMMENT = %s",
            (f"anarchon schema {SCHEMA_VERSION + 1} namespace {store.namespace}",),
        )
    later = make(store.namespace)
    with pytest.raises(StoreUnavailable, match=f"layout version {SCHEMA_VERSION + 1}"):
        later.state("job")


def test_ends_and_takeovers_are_written_in_history_and_counts(make: Make) -> None:
    store = make()
    first = store.claim("job", SLOT, "a", 0.2).holder
    assert first is not None
    time.sleep(0.3)
    taken = store.takeover("job", SLOT, "b", 5, first.token)
    assert taken.won and taken.holder is not None
    assert store.finish("job", taken.holder.token, RunState.DONE)
    runs = store.history("job")
    assert [(r.owner, r.state) for r in runs] == [("b", RunState.DONE), ("a", RunState.LOST)]
    stats = store.stats(["job"])["job"]
    assert (stats.runs, stats.takeovers, stats.done, stats.failed) == (2, 1, 1, 0)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("?foo=bar", "unknown option 'foo'"),
        ("?timeout=soon", "timeout"),
        ("?pool_size=two", "pool_size"),
        ("?ssl_mode=sometimes", "ssl_mode"),
        ("?ssl_mode=", "ssl_mode is empty"),
    ],
)
def test_bad_options_are_refused_when_opened_naming_them(query: str, said: str) -> None:
    with pytest.raises(ConfigurationError, match=said) as refused:
        open_store(f"mysql://u:s3cr3t@127.0.0.1:3306/db{query}", namespace="x")
    assert "s3cr3t" not in str(refused.value)


def test_a_url_without_a_database_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="name one database"):
        open_store("mariadb://u:s3cr3t@127.0.0.1:3306/", namespace="x")


def test_tls_required_of_a_server_without_it_is_an_outage_that_says_so(
    make: Make, mysql_url: str
) -> None:
    with connect(mysql_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@have_ssl")
        row = cur.fetchone()
    if row and row[0] == "YES":
        pytest.skip("this server offers TLS")
    store = make(url=f"{mysql_url}?ssl_mode=required")
    with pytest.raises(StoreUnavailable, match="SSL is required"):
        store.jobs()
    # preferred (the default) falls back to plain: the store works.
    assert make(url=f"{mysql_url}?ssl_mode=preferred").jobs() == []


def test_a_password_in_the_url_works_and_stays_hidden(make: Make, mysql_url: str) -> None:
    user, secret = f"anarchon_{uuid.uuid4().hex[:8]}", "s3cr3t:/@?"
    with connect(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (secret,))
        cur.execute(f"GRANT ALL ON test.* TO '{user}'@'%'")
    try:
        quoted = "s3cr3t%3A%2F%40%3F"
        base = mysql_url.split("@", 1)[1]
        store = make(url=f"mysql://{user}:{quoted}@{base}")
        assert store.claim("job", SLOT, "a", 5).won
        assert secret not in repr(store) and quoted not in repr(store)
        wrong = make(url=f"mysql://{user}:WRONG-{quoted}@{base}")
        with pytest.raises(StoreUnavailable) as refused:
            wrong.jobs()
        assert "Access denied" in str(refused.value)
        assert "WRONG" not in str(refused.value) and "s3cr3t" not in str(refused.value)
    finally:
        with connect(mysql_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP USER '{user}'@'%'")


def test_a_namespace_is_listed_once_it_has_a_job_not_for_its_empty_tables(make: Make) -> None:
    """``anarchon status`` opens the default namespace, which makes its tables: not listed."""
    looked = make()
    assert looked.jobs() == []
    assert looked.namespace not in looked.namespaces()
    looked.claim("job", SLOT, "a", 5)
    assert looked.namespace in make().namespaces()


def _certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 (not for 'localhost'), a client
    certificate, and a second CA that signed none of them: PEM files made by openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        servers.unavailable("openssl (to make the TLS test's certificates)")
    assert openssl is not None

    def run(*argv: str) -> None:
        subprocess.run([openssl, *argv], cwd=folder, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={ca}",
            "-keyout", f"{ca}.key", "-out", f"{ca}.pem")  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName = IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext",
            "-out", f"{name}.pem")  # fmt: skip
    return {p.stem + p.suffix: p for p in folder.iterdir()}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, Path]]]:
    """A private MariaDB that offers TLS with a certificate of our CA, and a user that
    must show a client certificate."""
    files = _certificates(tmp_path_factory.mktemp("tls"))
    server = servers.start_mariadb("mariadb-tls")
    try:
        server.stop()
        server.argv += [
            f"--ssl-ca={files['ca.pem']}",
            f"--ssl-cert={files['server.pem']}",
            f"--ssl-key={files['server.key']}",
        ]
        server.start(timeout=60)
        root = pymysql.connect(host="127.0.0.1", port=server.port, user="root")
        with root, root.cursor() as cur:
            cur.execute("CREATE USER 'tls'@'%' REQUIRE X509")
            cur.execute("GRANT ALL ON test.* TO 'tls'@'%'")
        yield server.port, files
    finally:
        server.stop()
        if server.workdir is not None:
            shutil.rmtree(server.workdir, ignore_errors=True)


def _cipher(store: MySQLStore) -> str:
    """The TLS cipher of the store's connection ('' when the connection is plain)."""
    with store._cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        row = cur.fetchone()
    return str(row[1]) if row else ""


def test_tls_options_verify_the_server_and_present_a_client_certificate(
    make: Make, tls_server: tuple[int, dict[str, Path]]
) -> None:
    port, files = tls_server
    at = f"mysql://root@127.0.0.1:{port}/test"
    ca, other = files["ca.pem"], files["other-ca.pem"]
    # The server's certificate checked against our CA, and its name (127.0.0.1).
    verified = make(url=f"{at}?ssl_mode=verify_identity&ssl_ca={ca}")
    assert verified.claim("job", SLOT, "a", 5).won
    assert _cipher(verified)
    assert _cipher(make(url=f"{at}?ssl_ca={ca}"))  # ssl_ca alone: verify_ca
    assert _cipher(make(url=f"{at}?ssl_mode=required"))  # encrypted, unverified
    assert _cipher(make(url=at))  # preferred: TLS, as the server offers it
    assert not _cipher(make(url=f"{at}?ssl_mode=disabled"))
    # A CA that did not sign it, or a name it does not carry: no connection.
    with pytest.raises(StoreUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        make(url=f"{at}?ssl_mode=verify_ca&ssl_ca={other}").jobs()
    localhost = f"mysql://root@localhost:{port}/test?ssl_mode=verify_identity&ssl_ca={ca}"
    with pytest.raises(StoreUnavailable, match=r"CERTIFICATE_VERIFY_FAILED|match"):
        make(url=localhost).jobs()
    ns = verified.namespace
    assert make(ns, url=localhost.replace("verify_identity", "verify_ca")).jobs() == ["job"]
    # A user that must show a client certificate.
    user = f"mysql://tls@127.0.0.1:{port}/test?ssl_mode=verify_ca&ssl_ca={ca}"
    with pytest.raises(StoreUnavailable, match="Access denied"):
        make(url=user).jobs()
    cert, key = files["client.pem"], files["client.key"]
    assert make(ns, url=f"{user}&ssl_cert={cert}&ssl_key={key}").jobs() == ["job"]


def test_tls_files_that_cannot_be_read_are_refused_when_opened(tmp_path: Path) -> None:
    missing = tmp_path / "none.pem"
    with pytest.raises(ConfigurationError, match="TLS files"):
        open_store(f"mysql://u@127.0.0.1/db?ssl_ca={missing}", namespace="x")
    with pytest.raises(ConfigurationError, match="ssl_cert and ssl_key go together"):
        open_store(f"mysql://u@127.0.0.1/db?ssl_mode=required&ssl_cert={missing}", namespace="x")


def test_a_batch_is_two_round_trips_whatever_its_size(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims, takeovers and changes: the rows locked and read, then written and committed."""
    store = make()
    store.jobs()  # the tables made, a connection open
    sent: list[str] = []
    query = pymysql.connections.Connection.query

    def counted(conn: pymysql.connections.Connection, sql: Any, unbuffered: bool = False) -> Any:
        sent.append(str(sql)[:40])
        return query(conn, sql, unbuffered)

    monkeypatch.setattr(pymysql.connections.Connection, "query", counted)
    jobs = [f"job{n}" for n in range(200)]
    claims = store.claim_many([ClaimRequest(job, SLOT, 0.2) for job in jobs], "a")
    assert all(c.won for c in claims) and len(sent) == 2, sent
    sent.clear()
    tokens = {c.holder.token for c in claims if c.holder is not None}
    assert len(tokens) == 1  # one statement's clock: every first token alike
    token = tokens.pop()
    changes = [Change(job, token, RunState.RUNNING, 0.2) for job in jobs]
    assert all(store.change_many(changes)) and len(sent) == 2, sent
    time.sleep(0.3)
    sent.clear()
    takeovers = [TakeoverRequest(job, SLOT, 5, token) for job in jobs]
    assert all(c.won for c in store.takeover_many(takeovers, "b")) and len(sent) == 2, sent


def test_the_store_works_beside_django_on_pymysql(mysql_url: str) -> None:
    """A Django project on PyMySQL loads PyMySQL's error classes twice: the store must
    still retry a lost race for a new row, and call an unreachable server an outage."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.stores.mysql_beside_django", mysql_url],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
