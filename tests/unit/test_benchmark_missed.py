"""Missed slots in the benchmarks' figures (benchmarks/missed.py), and the django-celery-beat
benchmark's figures of anarchon's cases from messages and beat logs written here: a slot
sent after the window's end is sent, not missed; a slot a beat reported missed, or skipped
after one it reported, is counted missed and said to be reported; any other is not."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import missed
from benchmarks.django_beat import ANARCHON, Case, CaseRun, Database, Window


def message(row: str, slot: float, stamp: float) -> bytes:
    headers = {
        "anarchon": {"slot_id": f"{row}@{round(slot * 1000)}"},
        "bench_published": stamp,
        "bench_beat": 1,
        "periodic_task_name": row,
    }
    return json.dumps({"headers": headers}).encode()


def test_a_slot_is_reported_when_told_or_skipped_after_a_told_one_with_no_run_between() -> None:
    told = {("a", 2000), ("b", 4000)}
    ran = {("a", 1000), ("a", 8000), ("b", 2000), ("c", 2000)}
    missing = [
        ("a", 2000),  # told itself
        ("a", 4000),  # skipped after a@2000, told, nothing of a ran between
        ("a", 6000),
        ("a", 10000),  # after a@8000 ran: a silent miss
        ("b", 6000),  # after b@4000, told
        ("c", 4000),  # c was never told anything: a silent miss
        ("d", 2000),
    ]
    assert missed.reported(missing, ran, told) == 4
    assert missed.reported(missing, ran, set()) == 0
    # Told by one instance, run by another: the run counts, what follows is not reported.
    assert missed.reported([("a", 3000)], ran | {("a", 2000)}, told) == 0


def test_the_missed_lines_of_instances_logs_are_read(tmp_path: Path) -> None:
    (tmp_path / "one.log").write_text(
        "[...: WARNING/MainProcess] anarchon: missed job@7@1796641818000 attempt - on vm:1:beat"
        " (skipped)\n[...: INFO] anarchon: won job@7@1796641820000 attempt 1 on vm:1:beat\n"
    )
    (tmp_path / "two.log").write_text("anarchon: missed other@1000 attempt - on i1 (too late)\n")
    found = missed.from_logs(sorted(tmp_path.glob("*.log")))
    assert found == {("job@7", 1796641818000), ("other", 1000)}
    assert missed.slot_of("job@7@1796641818000") == ("job@7", 1796641818000)


@pytest.fixture
def run() -> Iterator[CaseRun]:
    case_run = CaseRun(Case("scale", ANARCHON, 3, 2, "2", 4.0), Database())
    case_run.window = Window(1000.0, 1004.0, 2.0)  # slots at 1000 and 1002
    case_run.cpu_begun = case_run.cpu_ended = [0.0, 0.0, 0.0]
    yield case_run
    shutil.rmtree(case_run.tmp, ignore_errors=True)


def test_a_slot_sent_after_the_window_s_end_counts_as_sent(run: CaseRun) -> None:
    raw = [
        message("r00000", 1000.0, 1000.01),
        message("r00001", 1000.0, 1000.02),
        message("r00000", 1002.0, 1004.5),  # late past the end, sent before the beats stopped
        message("r00001", 1002.0, 1004.6),
    ]

    result = run.result(raw)

    assert (result.due, result.sent, result.missed, result.reported) == (4, 4, 0, 0)
    assert result.messages == 2, "the messages column counts the window's own"
    assert max(result.lateness) == pytest.approx(2.6)
    assert run.unaccounted(raw) == 0


def test_a_slot_not_sent_is_missed_and_reported_when_a_beat_said_so(run: CaseRun) -> None:
    raw = [
        message("r00000", 1000.0, 1000.01),
        message("r00001", 1000.0, 1000.02),
        message("r00000", 1002.0, 1002.01),
        message("r00000", 1002.0, 1002.03),  # a second send of one slot
    ]
    assert run.unaccounted(raw) == 1, "r00001's second slot: neither sent nor reported"
    (run.tmp / "beat-1.log").write_text(
        "[2026-12-07 11:10:21,009: WARNING/MainProcess] anarchon: missed"
        " r00001@1002000 attempt - on vm:1:beat (skipped)\n"
    )

    result = run.result(raw)

    assert (result.sent, result.twice, result.missed, result.reported) == (3, 1, 1, 1)
    assert run.unaccounted(raw) == 0
    assert "| 1 / 0 | 1 (1 reported) |" in result.row()


def test_a_slot_missed_after_a_sent_one_is_a_silent_miss(run: CaseRun) -> None:
    raw = [message("r00000", 1000.0, 1000.01), message("r00001", 1000.0, 1000.02)]
    raw.append(message("r00000", 1002.0, 1002.01))

    result = run.result(raw)

    assert (result.sent, result.missed, result.reported) == (3, 1, 0)
    assert run.unaccounted(raw) == 1
    (run.tmp / "beat-0.log").write_text("anarchon: missed r00001@998000 attempt - on i (skipped)\n")
    assert run.unaccounted(raw) == 1, "r00001 ran at 1000 since the slot told missed"


def test_the_engine_runner_reads_each_instance_s_live_file_on_from_its_last_read(
    tmp_path: Path,
) -> None:
    from benchmarks.appended import Appended
    from benchmarks.run import _unaccounted

    path = tmp_path / "i0.jsonl.live"
    live = Appended([path])
    due = [("job00000", 1000), ("job00000", 2000), ("job00001", 1000), ("job00001", 2000)]
    assert _unaccounted(due, live.poll()) == 4, "no file yet: nothing ran"
    path.write_text('{"slot": "job00000@1000"}\n{"slot": "job00001@1000"}\n{"slo')
    assert _unaccounted(due, live.poll()) == 2, "a line still being written is not read"
    with open(path, "a") as more:
        more.write('t": "job00000@2000"}\n{"missed": "job00001@2000"}\n')
    assert _unaccounted(due, live.poll()) == 0
    assert live.seen == [
        {"slot": "job00000@1000"},
        {"slot": "job00001@1000"},
        {"slot": "job00000@2000"},
        {"missed": "job00001@2000"},
    ]


def test_the_slots_due_in_a_window_are_those_after_its_start_an_interval_before_its_end() -> None:
    due = missed.due_on_grid(["a", "b"], 2.0, 1000.5, 1010.0)
    assert due == [("a", ms) for ms in (1002000, 1004000, 1006000, 1008000)] + [
        ("b", ms) for ms in (1002000, 1004000, 1006000, 1008000)
    ]
    # 1000 is the start itself, 1002 less than an interval before the end.
    assert missed.due_on_grid(["a"], 2.0, 1000.0, 1003.0) == []
