"""One version, read from one place (``anarchon_core/version.py``), everywhere a user sees it.

The three commands as installed (the virtual environment's scripts, ``celery``'s
subcommand), the three packages, the installed distribution's metadata (which the
build reads from the same file) and the registry of live instances, as ``anarchon
status`` shows it, say the same release.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import anarchon_celery
import anarchon_core
import anarchon_dramatiq
from anarchon_core import Run, Scheduler
from anarchon_core.version import __version__
from tests.cli.command import anarchon, shown
from tests.waiting import wait_until

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_the_release_is_written_once_and_read_by_the_build() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject and '\nversion = "' not in pyproject
    assert 'path = "anarchon_core/version.py"' in pyproject
    assert importlib.metadata.version("anarchon") == __version__
    packages = (anarchon_core, anarchon_celery, anarchon_dramatiq)
    assert {package.__version__ for package in packages} == {__version__}


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["anarchon", "--version"], "anarchon"),
        (["dramatiq-anarchon", "--version"], "dramatiq-anarchon"),
        (["celery", "anarchon", "--version"], "celery anarchon"),
    ],
)
def test_each_command_says_the_release(argv: list[str], prog: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # no app of this tree in the way: the installed command alone
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{prog} {__version__}", done.stdout


def test_the_registry_shows_the_release_of_each_instance(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'version.db'}"

    def tick(run: Run) -> None:
        pass

    scheduler = Scheduler(url, instance="pod-1")
    scheduler.add_job(tick, name="tick", every=3600)
    scheduler.start()
    try:
        wait_until(lambda: scheduler.store.instances(), 10, "the instance to announce itself")  # type: ignore[attr-defined]
        done = anarchon("status", "--store", url)
        assert done.returncode == 0, shown(done)
        rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line}
        assert rows["instance"][3] == "version", shown(done)
        assert rows["pod-1"][3] == __version__, shown(done)
    finally:
        scheduler.stop()
