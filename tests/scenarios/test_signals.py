"""Signals close together: ``run_forever`` stops on the first and never hangs on the next.

``Scheduler.run_forever`` stops on SIGTERM or SIGINT. A handler runs between
any two steps of the main thread, so one that takes a lock the main thread may
hold (``Event.set`` does) hangs the process when a second signal lands at the
wrong moment: Ctrl-C followed by a supervisor's SIGTERM, say. Each process
here gets SIGINT and SIGTERM a moment apart, while it waits in its loop, and
must exit by itself, promptly, every time.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.waiting import wait_until

#: Processes per test, each stopped by a close pair of signals.
RUNS = 24
#: How long a stopped process may take to exit (a hang shows as never).
EXIT_LIMIT = 10.0


def _stop_one(tmp_path: Path, index: int, seed: int) -> str | None:
    """Start one instance, send SIGINT then SIGTERM; what went wrong, if anything."""
    rng = random.Random(seed * 1000 + index)
    folder = tmp_path / f"i{index}"
    folder.mkdir()
    report = folder / "report.jsonl"
    report.touch()
    argv = [sys.executable, "-m", "anarchon_core.tools.instance", "--store"]
    argv += [f"sqlite:///{folder / 'db'}", "--name", f"i{index}", "--report", str(report)]
    argv += ["--every", "1", "--watch", "0.25"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: '"up"' in report.read_text(), 60, "the instance to be up", interval=0.02)
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGINT)
        time.sleep(rng.uniform(0.0, 0.003))
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=EXIT_LIMIT)
        except subprocess.TimeoutExpired:
            return f"instance {index} (seed {seed}) still running {EXIT_LIMIT:g}s after the signals"
        if b"Traceback" in err:
            return f"instance {index} (seed {seed}) printed a traceback:\n{err.decode()[-1500:]}"
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.scenario
def test_two_signals_close_together_never_hang_run_forever(tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(10**6)
    with ThreadPoolExecutor(4) as pool:
        problems = [p for p in pool.map(lambda i: _stop_one(tmp_path, i, seed), range(RUNS)) if p]
    assert not problems, "\n".join(problems)
