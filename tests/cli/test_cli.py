"""The ``anarchon`` command as a user runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from anarchon_core import RunState
from anarchon_core.cli import main
from anarchon_core.stores.sqlite import SQLiteStore

SLOT = 1_700_000_000_000


@pytest.mark.scenario
def test_demo_shows_a_takeover_and_a_hand_over_and_no_duplicate() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "anarchon_core.cli", "demo", "--duration", "14"],
        capture_output=True,
        text=True,
        timeout=150,  # 14 s of demo, plus stopping and restarting instances on a loaded machine
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^\s+\d\d:\d\d:\d\d\s+i\d\s+2\s+takeover \(lease lapsed\)$", out, re.M)
    assert re.search(r"^\s+\d\d:\d\d:\d\d\s+i\d\s+2\s+takeover \(hand-over\)$", out, re.M)
    summary = re.search(
        r"slots: (\d+), duplicates: (\d+), takeovers: (\d+), hand-overs: (\d+)", out
    )
    assert summary, out
    slots, duplicates, takeovers, handovers = map(int, summary.groups())
    assert slots >= 5
    assert duplicates == 0
    assert takeovers >= 2
    assert handovers >= 1


def test_status_shows_jobs_and_leases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"), namespace="billing")
    running = store.claim("sync", SLOT, "host:12:ab", 30).holder
    done = store.claim("digest", SLOT, "host:13:cd", 30).holder
    assert running and done
    store.finish("digest", done.token, RunState.DONE)
    assert (
        main(["status", "--store", f"sqlite:///{tmp_path / 's.db'}", "--namespace", "billing"]) == 0
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].split() == [
        "job",
        "last",
        "slot",
        "(UTC)",
        "owner",
        "attempt",
        "state",
        "lease",
        "left",
    ]
    assert re.match(r"digest\s+2023-11-14 22:13:20\s+host:13:cd\s+1\s+done\s+-$", lines[2])
    assert re.match(r"sync\s+2023-11-14 22:13:20\s+host:12:ab\s+1\s+running\s+\d+\.\ds$", lines[3])


def test_status_never_prints_a_password(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["status", "--store", "bogus://admin:s3cret@db.internal/x"])
    assert code == 2
    captured = capsys.readouterr()
    assert "s3cret" not in captured.out + captured.err
    assert "bogus://admin:***@db.internal/x" in captured.err
    assert "sqlite://" in captured.err  # names the supported schemes


def test_status_of_an_empty_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--store", f"sqlite:///{tmp_path / 'e.db'}"]) == 0
    assert "no jobs recorded in namespace 'default'" in capsys.readouterr().out


@pytest.mark.scenario
def test_ctrl_c_stops_the_demo_cleanly() -> None:
    import os
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "anarchon_core.cli", "demo", "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(5)
    # Ctrl-C in a terminal signals the whole process group: the demo and its instances.
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "interrupted" in out
    assert re.search(r"slots: \d+, duplicates: 0", out)
    assert "Traceback" not in err
    time.sleep(0.5)
    leftovers = subprocess.run(
        ["pgrep", "-g", str(proc.pid)], capture_output=True, text=True, check=False
    )
    assert leftovers.stdout.strip() == ""
