"""Growth curves, drawn from the tables of docs/benchmarks.md as PNG images.

The engine's rows of every part that runs the engine alone (``engine``,
``overload``, ``scale``) are read back from the page, so that the plots show
exactly the figures its tables hold: lateness p50 and p99, CPU per instance and
store calls per instance per tick, against the number of jobs (one line per
store and number of instances) and against the number of instances (1,000 and
10,000 jobs on Redis). Run by ``benchmarks.run --write`` after the tables, or::

    .venv/bin/python -m benchmarks.plots docs/benchmarks.md

Needs matplotlib (the ``bench`` dependency group).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: The parts whose tables hold the engine's own rows.
PARTS = ("engine", "overload", "scale")
#: Where the images go, beside the page, and their names.
IMAGES = "img"
BY_JOBS = "growth-jobs.png"
BY_INSTANCES = "growth-instances.png"


@dataclass(frozen=True)
class Row:
    """One case of a table: what the plots use of it."""

    store: str
    jobs: int
    instances: int
    every: str
    p50_ms: float
    p99_ms: float
    calls: float
    cpu: float


def rows(page: str) -> list[Row]:
    """The engine's rows of the tables of :data:`PARTS` in ``page``."""
    found: list[Row] = []
    for part in PARTS:
        start, end = f"<!-- {part} -->", f"<!-- /{part} -->"
        if start not in page or end not in page:
            continue
        table = page[page.index(start) : page.index(end)]
        lines = [x for x in table.splitlines() if x.startswith("|")]
        if len(lines) < 3:
            continue
        head = [c.strip() for c in lines[0].strip("|").split("|")]
        for line in lines[2:]:
            cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=False))
            late = re.findall(r"\d+", cells["Lateness p50 / p99 / max (ms)"])
            found.append(
                Row(
                    store=cells["Store"],
                    jobs=int(cells["Jobs"].replace(",", "")),
                    instances=int(cells["Instances"]),
                    every=cells["Every"],
                    p50_ms=float(late[0]),
                    p99_ms=float(late[1]),
                    calls=float(cells["Store calls per instance per tick"]),
                    cpu=float(cells["CPU per instance"].rstrip("%")),
                )
            )
    return found


#: What each plot shows: (title, the row's value, on a log scale).
METRICS: tuple[tuple[str, Callable[[Row], float], bool], ...] = (
    ("Lateness p99 (ms)", lambda r: r.p99_ms, True),
    ("Lateness p50 (ms)", lambda r: r.p50_ms, True),
    ("CPU per instance (% of a core)", lambda r: r.cpu, True),
    ("Store calls per instance per tick", lambda r: r.calls, False),
)


def draw(page: Path) -> list[Path]:
    """Draw the growth curves of ``page``'s tables beside it; the images written."""
    import matplotlib

    matplotlib.use("Agg")

    found = [r for r in rows(page.read_text()) if not r.every.startswith("`")]  # not cron
    folder = page.parent / IMAGES
    folder.mkdir(exist_ok=True)
    by_jobs = _figure(
        found,
        key=lambda r: (r.store, r.instances),
        label=lambda k: f"{k[0]} x {k[1]}",
        x=lambda r: r.jobs,
        xlabel="jobs",
        title="Growth with jobs (every 10 s; 100,000 jobs: every 60 s)",
        path=folder / BY_JOBS,
    )
    by_instances = _figure(
        found,
        key=lambda r: (r.store, r.jobs),
        label=lambda k: f"{k[0]}, {k[1]:,} jobs",
        x=lambda r: r.instances,
        xlabel="instances",
        title="Growth with instances",
        path=folder / BY_INSTANCES,
        ticks=[1, 3, 10],
        alone=False,
    )
    return [by_jobs, by_instances]


def _figure(
    found: list[Row],
    *,
    key: Callable[[Row], tuple[str, int]],
    label: Callable[[tuple[str, int]], str],
    x: Callable[[Row], int],
    xlabel: str,
    title: str,
    path: Path,
    ticks: list[int] | None = None,
    alone: bool = True,
) -> Path:
    """One image: a plot per metric of :data:`METRICS` against ``x``, a line per ``key``
    (a case of its own drawn as a point if ``alone``, else left out)."""
    import matplotlib.pyplot as plt

    series: dict[tuple[str, int], list[Row]] = defaultdict(list)
    for r in found:
        series[key(r)].append(r)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.2 * len(METRICS), 3.8))
    for ax, (name, value, log) in zip(axes, METRICS, strict=True):
        for k, points in sorted(series.items()):
            if len(points) < 2 and not alone:
                continue
            points = sorted(points, key=x)
            style = "o-" if len(points) > 1 else "s"
            ax.plot([x(p) for p in points], [value(p) for p in points], style, label=label(k))
        ax.set_xscale("log")
        if ticks:
            ax.set_xticks(ticks, [str(t) for t in ticks])
        if log:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(name, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:  # a page may hold no row yet
        axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="docs/benchmarks.md")
    args = parser.parse_args(argv)
    for path in draw(args.page):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
