"""The ``anarchon`` command run as a user runs it: a subprocess of this interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
