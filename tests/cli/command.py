"""The ``anarchon`` command run as a user runs it: a subprocess of this interpreter."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from anarchon_core import Control
from anarchon_core.control import Definition
from tests.cleanup import drop_namespace

ROOT = Path(__file__).resolve().parents[2]


def anarchon(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``anarchon ARGS`` from the source tree; it must not end in a traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "anarchon_core.cli", *args],
        capture_output=True,
        text=True,
        errors="replace",
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def shown(done: subprocess.CompletedProcess[str]) -> str:
    """A finished command, for an assertion's message."""
    return f"exit {done.returncode}\n--- stdout:\n{done.stdout}--- stderr:\n{done.stderr}"


@dataclass(frozen=True)
class Target:
    """The store the command is pointed at."""

    url: str
    namespace: str

    def run(self, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
        return anarchon(verb, *args, "--store", self.url, "--namespace", self.namespace)

    def definitions(self) -> dict[str, Definition]:
        with Control(self.url, namespace=self.namespace) as control:
            return control.definitions()


@contextlib.contextmanager
def target_store(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> Iterator[Target]:
    """A namespace of its own on Redis or a SQLite file (``request.param``), dropped after."""
    if request.param == "redis":
        url = str(request.getfixturevalue("redis_url"))
    else:
        url = f"sqlite:///{tmp_path / (name + '.db')}"
    namespace = f"{name}-{uuid.uuid4().hex[:10]}"
    try:
        yield Target(url, namespace)
    finally:
        drop_namespace(url, namespace)
