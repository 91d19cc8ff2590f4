"""Missed slots told apart: those anarchon reported, and those it did not.

An instance held up past a job's next slot (its loop or its process could not
run: a loaded machine, a frozen process) reports the slot it was waiting for
as ``missed`` and moves to the most recent slot; the slots in between are
not reported (docs/concepts.md, "Catch-up in detail"). So a slot due that no
instance ran is *reported* when an instance reported it missed, or when it
follows a reported slot of the same job with no run of that job between
them. A slot missed and not reported is a silent miss: the benchmarks' smokes
allow none, and allow reported ones (the machine's load, not a defect).
Instances are stopped once every slot due is accounted for (:func:`drain`),
so that a run late past the window counts as run.

Each slot is ``(job, unix ms)``, as in a slot id ``<job>@<unix ms>``.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

#: An instance's ``missed`` report in its log (anarchon's WARNING line).
LOG_LINE = re.compile(r"anarchon: missed (?P<job>\S+)@(?P<ms>\d+) attempt")

Slot = tuple[str, int]


def slot_of(slot_id: str) -> Slot:
    """``(job, unix ms)`` of a slot id ``<job>@<unix ms>``."""
    job, ms = slot_id.rsplit("@", 1)
    return job, int(ms)


def due_on_grid(jobs: Iterable[str], every: float, start: float, end: float) -> list[Slot]:
    """The slots of the epoch-anchored ``every``-second grid due in a window: after its
    ``start``, at least one interval before its ``end``; for each of ``jobs``."""
    first = math.floor(start / every) + 1
    last = math.floor((end - every) / every)
    return [(job, round(k * every * 1000)) for job in jobs for k in range(first, last + 1)]


def from_logs(paths: Iterable[Path]) -> set[Slot]:
    """The slots the instances' logs report missed."""
    told = set()
    for path in paths:
        for line in LOG_LINE.finditer(path.read_text(errors="replace")):
            told.add((line["job"], int(line["ms"])))
    return told


def reported(missing: Iterable[Slot], ran: Iterable[Slot], told: Iterable[Slot]) -> int:
    """How many of the ``missing`` slots were reported: told missed themselves, or
    after a slot of the same job told missed with no slot of it ``ran`` since."""
    # Per job, the slots told and run, in time order; a slot both told and run counts run.
    marks: dict[str, dict[int, bool]] = defaultdict(dict)
    for job, ms in told:
        marks[job].setdefault(ms, True)
    for job, ms in ran:
        marks[job][ms] = False
    ordered = {job: sorted(by_ms.items()) for job, by_ms in marks.items()}
    count = 0
    for job, ms in missing:
        seen = ordered.get(job, [])
        at = bisect.bisect_right(seen, (ms, True))  # the marks at or before the slot
        count += at > 0 and seen[at - 1][1]
    return count


#: How long a benchmark's instances may run past its window for the last runs (or
#: missed reports) of the slots due in it, late on a loaded machine, before they stop.
DRAIN_TIMEOUT = 60.0


def unaccounted(due: Iterable[Slot], ran: Iterable[Slot], told: Iterable[Slot]) -> int:
    """How many slots ``due`` neither ran nor were reported missed (yet)."""
    ran = set(ran)
    missing = [slot for slot in due if slot not in ran]
    return len(missing) - reported(missing, ran, told)


def drain(count: Callable[[], int], timeout: float = DRAIN_TIMEOUT) -> int:
    """Wait until ``count()`` (slots due unaccounted for) is 0, at most ``timeout``;
    what it was last."""
    deadline = time.monotonic() + timeout
    while (left := count()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
