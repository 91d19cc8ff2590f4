"""Rules the suite keeps about itself, so that it stays fast and its waits explain themselves."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterator
from pathlib import Path

TESTS = Path(__file__).parent
#: The most that literal sleeps of a second or more may add up to, across the suite.
SLEEP_BUDGET = 60.0

_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _constants(tree: ast.Module) -> dict[str, float]:
    """The module's top-level numeric constants (``LEASE = 3``), by name."""
    found: dict[str, float] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = _value(node.value, found)
            for target in targets:
                if isinstance(target, ast.Name) and value is not None:
                    found[target.id] = value
    return found


def _value(node: ast.expr, names: dict[str, float]) -> float | None:
    """The number a constant expression stands for, else ``None`` (it depends on run time)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left, names), _value(node.right, names)
        if left is None or right is None:
            return None
        return _OPERATORS[type(node.op)](left, right)
    return None


def literal_sleeps(path: Path) -> Iterator[tuple[int, float]]:
    """``(line, seconds)`` of each ``time.sleep(N)`` or ``sleep(N)`` with a constant N >= 1."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _constants(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or len(node.args) != 1:
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called != "sleep" or (
            isinstance(func, ast.Attribute)
            and not (isinstance(func.value, ast.Name) and func.value.id == "time")
        ):
            continue
        seconds = _value(node.args[0], names)
        if seconds is not None and seconds >= 1:
            yield node.lineno, seconds


def test_literal_sleeps_of_a_second_or_more_stay_under_the_budget() -> None:
    """Tests wait on conditions (tests/waiting.py); a fixed sleep only where the assertion
    is that nothing happens for a while, and then as short as that allows."""
    sleeps = [
        (f"{path.relative_to(TESTS)}:{line}", seconds)
        for path in sorted(TESTS.rglob("*.py"))
        for line, seconds in literal_sleeps(path)
    ]
    total = sum(seconds for _, seconds in sleeps)
    assert total < SLEEP_BUDGET, sorted(sleeps, key=lambda s: -s[1])


def test_the_rule_counts_what_it_should() -> None:
    source = (
        "import time\nLEASE = 3\nfrom time import sleep\n"
        "time.sleep(2)\ntime.sleep(LEASE * 2)\nsleep(1.5)\n"
        "time.sleep(0.5)\ntime.sleep(max(0.0, 1 - time.time()))\nclock.sleep(9)\n"
    )
    path = TESTS / "__rule_sample__.py"
    try:
        path.write_text(source, encoding="utf-8")
        assert list(literal_sleeps(path)) == [(4, 2.0), (5, 6.0), (6, 1.5)]
    finally:
        path.unlink()


def test_every_worker_begins_with_its_share_of_the_long_tests() -> None:
    """As pytest-xdist's worksteal cuts the collection into one contiguous share per
    worker, each share begins with long tests, and none is lost or repeated."""
    from tests.conftest import deal

    long, rest = [f"long{k}" for k in range(11)], [f"short{k}" for k in range(40)]
    for workers in (1, 2, 8):
        order = deal(long, rest, workers)
        assert sorted(order) == sorted(long + rest)
        sizes, left, start = [], len(order), 0
        for k in range(workers):
            sizes.append(left // (workers - k))
            left -= sizes[-1]
        for size in sizes:
            share = order[start : start + size]
            start += size
            firsts = [name.startswith("long") for name in share]
            assert firsts == sorted(firsts, reverse=True)  # the long ones first
            assert sum(firsts) >= len(long) // workers


def test_no_test_counts_the_threads_of_the_whole_process() -> None:
    """The process's thread count also counts threads that earlier tests in the same
    worker left ending, so a test comparing two counts passes or fails by their timing;
    tests/threads.py tells the threads a test started apart from the rest."""
    found = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "active_count(" in line
    ]
    assert found == []


def test_reports_that_processes_append_to_are_read_by_whole_lines_only() -> None:
    """A report read while a process writes to it can end in half a line (a write is not
    atomic for a concurrent read); json.loads of each line of it fails now and then.
    Reports are read with tests/fleet.py's ``report_lines``, which leaves such a line out."""
    # report_lines itself, and a reader that keeps its offset and whole lines.
    whole_lines = {"fleet.py", "scenarios/test_overload.py", Path(__file__).name}
    found = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        if str(path.relative_to(TESTS)) not in whole_lines
        and path.parent.name not in ("unit", "docs")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "json.loads(" in line and ("splitlines()" in line or "in handle" in line)
    ]
    assert found == []


def test_a_half_written_last_line_of_a_report_is_left_for_the_next_read(tmp_path: Path) -> None:
    from tests.fleet import report_lines

    report = tmp_path / "report.jsonl"
    assert report_lines(report) == []
    report.write_text('{"kind": "start", "slot": "a@1"}\n{"kind": "st')
    assert report_lines(report) == [{"kind": "start", "slot": "a@1"}]
    with open(report, "a") as more:
        more.write('art", "slot": "a@2"}\n')
    assert [x["slot"] for x in report_lines(report)] == ["a@1", "a@2"]
