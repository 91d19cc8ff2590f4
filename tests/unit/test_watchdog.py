"""The hang watchdog (tests/watchdog.py): a test that no signal can interrupt fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_test_stuck_with_the_gil_held_fails_with_its_stack_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_stuck.py").write_text(
        textwrap.dedent(
            """
            import ctypes

            def test_stuck():
                # A C call that blocks with the GIL held (PyDLL keeps it) and that no
                # signal interrupts: a mutex locked twice. pytest-timeout's SIGALRM
                # handler never gets to run.
                libc = ctypes.PyDLL(None)
                mutex = ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER
                libc.pthread_mutex_lock(mutex)
                libc.pthread_mutex_lock(mutex)

            def test_after():
                assert True
            """
        )
    )
    env = {**os.environ, "ANARCHON_TEST_HANG_SECONDS": "3", "PYTHONPATH": str(ROOT)}
    env.pop("ANARCHON_TEST_HANG_DIR", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.watchdog", "-n", "1", "--timeout", "1",
         "-o", "addopts=", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "test_stuck.py::test_stuck ran past 3 s" in out, out
    assert 'test_stuck.py", line 11 in test_stuck' in out, out
    assert "1 passed" in out, out  # the test after it ran on a new worker
