"""How the suite starts the processes it tests, and how it keeps its heavy tests from starving them.

A process under test (an instance, a beat, a worker, the CLI) runs in a
process group of its own, so that a signal reaches it and whatever it forks,
as a container runtime's does for a pod: ``subprocess.Popen(..., **OWN_GROUP)``.
It stays in the suite's session. Linux's autogroup scheduling
(``/proc/sys/kernel/sched_autogroup_enabled``) gives every session an equal
share of the CPU, so a process in a session of its own would weigh as much as
every pytest worker together: a test of sixteen processes would leave the
tests that run inside the workers a seventeenth of the machine. The servers
the suite starts (:mod:`tests.servers`) keep sessions of their own, as the
machine's servers have.

A test that only burns CPU and asserts nothing about time (the simulation's
seeds in virtual time, the racing claimers' rounds) runs with :func:`yielding`:
at a lower CPU priority, it uses the CPU that the tests timing a stop, a
takeover or a slot leave free, instead of stretching their seconds.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

#: ``subprocess.Popen`` arguments: a new process group in the suite's session.
OWN_GROUP: dict[str, Any] = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
)

#: The niceness a :func:`yielding` test runs at (0 is the default, 19 the lowest
#: priority): a tenth of the weight of a process at 0 when both want the CPU.
NICE = 10


@contextlib.contextmanager
def yielding() -> Iterator[None]:
    """Run the block (and what it starts) at :data:`NICE`, then at the priority before.

    Linux keeps a niceness per thread: this lowers the calling thread's, which the
    threads and processes it starts inherit. Raising it back needs the privilege to
    (root, as CI runs); without it the block runs at the priority it had.
    """
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if before >= NICE or not _may_raise_priority():
        yield
        return
    os.setpriority(os.PRIO_PROCESS, 0, NICE)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def _may_raise_priority() -> bool:
    return os.geteuid() == 0
