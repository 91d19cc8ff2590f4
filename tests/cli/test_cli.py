"""The ``anarchon`` command as a user runs it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from anarchon_core import RunState
from anarchon_core.cli import main
from anarchon_core.stores.sqlite import SQLiteStore
from anarchon_core.tools.demo import STOP_GRACE, Demo
from tests.processes import OWN_GROUP
from tests.waiting import wait_until

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
    assert re.search(r"^\s+\d\d:\d\d:\d\d\s+i\d\s+2\s+takeover \(lease lapsed\)$", out, re.M), out
    # The hand-over's takeover is attempt 3 when the SIGTERM hits the very run that
    # took the killed one over (a slow machine: that run is still on).
    assert re.search(r"^\s+\d\d:\d\d:\d\d\s+i\d\s+[23]\s+takeover \(hand-over\)$", out, re.M), out
    summary = re.search(
        r"slots: (\d+), duplicates: (\d+), takeovers: (\d+), hand-overs: (\d+)", out
    )
    assert summary, out
    slots, duplicates, takeovers, handovers = map(int, summary.groups())
    assert slots >= 3  # 7 due; the restarts take their time on a loaded machine
    assert duplicates == 0
    assert takeovers >= 2
    assert handovers >= 1
    overlaps = re.search(r"overlap skips: (\d+)", out)
    assert overlaps, out
    assert len(re.findall(r" overlap skip \(", out)) == int(overlaps.group(1)), out


def test_the_demo_prints_a_line_for_each_overlap_skip_it_counts(tmp_path: Path) -> None:
    out = io.StringIO()
    demo = Demo(instances=2, interval=2, duration=1, out=out, folder=tmp_path)
    lines = [
        {"kind": "start", "instance": "i1", "slot_id": "tick@1796005388000", "attempt": 1},
        {
            "kind": "overlap",
            "instance": "i2",
            "slot_id": "tick@1796005390000",
            "attempt": None,
            "detail": "tick@1796005388000 still holds its lease",
        },
    ]
    demo.report.write_text("".join(json.dumps(line) + "\n" for line in lines))
    demo.poll()
    assert demo.tally.overlaps == 1
    said = [line for line in out.getvalue().splitlines() if "overlap skip" in line]
    assert said == [
        "  02:23:10     i2        -        overlap skip (tick@1796005388000 still holds its lease)"
    ]


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
    # Reached, nothing recorded: 1, not the 0 of jobs shown.
    assert main(["status", "--store", f"sqlite:///{tmp_path / 'e.db'}"]) == 1
    out = capsys.readouterr().out
    assert "no jobs recorded in namespace 'default'" in out
    # Without --namespace, it says where else the jobs may be.
    assert "the jobs may be in another namespace: --namespace NS (Celery's is" in out


def test_status_without_a_namespace_names_the_namespaces_in_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'n.db'}"
    for namespace in ("proj", "billing"):
        SQLiteStore(str(tmp_path / "n.db"), namespace=namespace).claim("sync", SLOT, "h:1:a", 30)
    assert main(["status", "--store", url]) == 1  # nothing in 'default'
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "namespaces in this store: billing, proj  (--namespace NS shows another)"
    assert "no jobs recorded in namespace 'default'" in out[2]
    # Asked for one, it shows that one alone.
    assert main(["status", "--store", url, "--namespace", "proj"]) == 0
    out = capsys.readouterr().out
    assert "namespaces in this store" not in out and "sync" in out


@pytest.mark.scenario
def test_ctrl_c_stops_the_demo_cleanly(tmp_path: Path) -> None:
    import os
    import signal
    import time

    stdout, stderr = tmp_path / "out", tmp_path / "err"
    with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "anarchon_core.cli", "demo", "--duration", "60"],
            stdout=out_file,
            stderr=err_file,
            text=True,
            **OWN_GROUP,
        )
    # Running: the demo shows a first run's row (its slot's time first).
    wait_until(
        lambda: re.search(r"^  \d\d:\d\d:\d\d ", stdout.read_text(), re.M),
        30,
        "the demo's first run",
        seen=stdout.read_text,
    )
    # Ctrl-C in a terminal signals the whole process group: the demo and its instances.
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=30)
    out, err = stdout.read_text(), stderr.read_text()
    assert proc.returncode == 0, err
    assert "interrupted" in out
    assert re.search(r"slots: \d+, duplicates: 0", out)
    assert "Traceback" not in err
    time.sleep(0.5)
    leftovers = subprocess.run(
        ["pgrep", "-g", str(proc.pid)], capture_output=True, text=True, check=False
    )
    assert leftovers.stdout.strip() == ""


CTRL_C_DEMO = 6.0  # seconds: SIGKILL at 2 s, SIGTERM at 4 s, then the summary


def _ctrl_c_moments() -> list[tuple[str, float]]:
    """When to press Ctrl-C: the output line it follows, and how many seconds after.

    Seeded, so that a failing moment replays: one moment in each second of
    the demo's timeline, from its first line (before any instance starts) to
    its natural end (when it stops the instances and prints the summary), and
    moments just after it SIGKILLs and SIGTERMs an instance, while it waits
    for that one to exit and starts it again.
    """
    rng = random.Random(2024)
    moments = [("anarchon demo:", 0.0)]
    moments += [("anarchon demo:", round(rng.uniform(n, n + 1), 3)) for n in range(6)]
    moments.append(("anarchon demo:", CTRL_C_DEMO))
    for line in (">> SIGKILL", ">> SIGTERM"):
        moments.append((line, round(rng.uniform(0, 0.15), 3)))
        moments.append((line, round(rng.uniform(0.15, 0.5), 3)))
    return moments


def _process_group(pgid: int) -> list[str]:
    """The processes of group ``pgid``, zombies included, as "pid state name"."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        state, _, group = stat[stat.rfind(")") + 2 :].split()[:3]
        if int(group) == pgid:
            found.append(f"{entry.name} {state} {name}")
    return found


def _read(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _moment_id(value: object) -> str:
    return f"+{value}s" if isinstance(value, float) else str(value).strip("> :")


@pytest.mark.scenario
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups in /proc")
@pytest.mark.parametrize(("after", "delay"), _ctrl_c_moments(), ids=_moment_id)
def test_ctrl_c_at_any_moment_leaves_no_process_behind(after: str, delay: float) -> None:
    argv = [sys.executable, "-m", "anarchon_core.cli", "demo", "--interval", "1"]
    launched = time.monotonic()
    proc = subprocess.Popen(
        [*argv, "--duration", str(CTRL_C_DEMO)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **OWN_GROUP,
    )
    assert proc.stdout and proc.stderr
    out: queue.Queue[str | None] = queue.Queue()
    err: queue.Queue[str | None] = queue.Queue()
    readers = [
        threading.Thread(target=_read, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_read, args=(proc.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60  # a loaded machine starts processes slowly
        while not any(after in line for line in seen) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                line = out.get(timeout=0.5)
                if line is None:
                    break
                seen.append(line)
        if not any(after in line for line in seen):
            proc.wait(STOP_GRACE + 10)
            assert _process_group(proc.pid) == []
            assert any(line.startswith("slots:") for line in seen), "".join(seen)
            # On a very busy machine instances can start too late for the demo to find one
            # in the middle of a run: it ended well, with no such moment to press Ctrl-C at.
            pytest.skip(f"the demo printed no {after!r} line:\n{''.join(seen)}")
        time.sleep(delay)
        # Ctrl-C in a terminal signals the whole process group: the demo and its instances.
        os.killpg(proc.pid, signal.SIGINT)
        pressed = time.monotonic()
        # The demo's own clock starts after its launch: pressed sooner than its duration
        # after the launch, the press surely came before the demo's natural end.
        before_the_end = pressed - launched < CTRL_C_DEMO
        proc.wait(STOP_GRACE + 10)
        took = time.monotonic() - pressed
        # The demo reaps every instance before it returns: nothing of its group remains.
        assert _process_group(proc.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # only if a check above failed
        proc.wait()
        for reader in readers:
            reader.join(5)
        proc.stdout.close()
        proc.stderr.close()
    text = "".join(seen) + "".join(line for line in out.queue if line)
    errors = "".join(line for line in err.queue if line)
    assert proc.returncode == 0, errors
    assert "Traceback" not in errors
    assert re.search(r"slots: \d+, duplicates: 0", text), text
    if before_the_end:
        assert "interrupted" in text, text
    assert took < STOP_GRACE + 5, f"{took:.1f} s to stop:\n{text}"
