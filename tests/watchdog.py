"""A test that hangs where no signal reaches it fails; it never stalls the whole run.

pytest-timeout's ``signal`` method interrupts a test by SIGALRM, whose
Python handler only runs once the main thread gets back to the interpreter:
a test stuck in a C call that keeps the GIL (a client blocked on a socket
the server no longer answers) is never interrupted, and the whole run waits
until the CI's own limit. This plugin arms :func:`faulthandler.dump_traceback_later`
(a C thread, no GIL needed) for every test: past :data:`HANG` seconds it
writes every thread's stack to a file and ends the process. Under xdist the
controller reports the test that crashed its worker, goes on with a new
worker, and prints the stacks at the end of the run.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

#: Seconds one test (setup, call and teardown) may take before its process
#: is ended; above pytest-timeout's limit, which interrupts it first when it can
#: (a test marked with a longer timeout gets that timeout and a minute more).
HANG = float(os.environ.get("ANARCHON_TEST_HANG_SECONDS", "300"))
_DIR = "ANARCHON_TEST_HANG_DIR"


def _dir() -> Path:
    if os.environ.get(_DIR) is None:  # the controller, or a run without xdist
        os.environ[_DIR] = tempfile.mkdtemp(prefix="anarchon-hangs-")
    return Path(os.environ[_DIR])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out: IO[str] = open(_dir() / f"{worker}.log", "w")  # noqa: SIM115 - kept open for the C thread
    # A test given a longer pytest-timeout gets as long here, and a minute more.
    marker = item.get_closest_marker("timeout")
    hang = max(HANG, float(marker.args[0]) + 60) if marker and marker.args else HANG
    out.write(f"{item.nodeid} ran past {hang:.0f} s; every thread's stack:\n")
    out.flush()
    faulthandler.dump_traceback_later(hang, exit=True, file=out)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        out.close()


def pytest_configure(config: pytest.Config) -> None:
    _dir()  # made by the controller before its workers start, so they share it


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for log in sorted(_dir().glob("*.log")):
        text = log.read_text(errors="replace")
        if "Timeout (" in text:  # faulthandler's heading: the dump was written
            terminalreporter.section(f"hung test ({log.stem})", sep="=", red=True)
            terminalreporter.write(text)
