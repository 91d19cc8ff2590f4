"""``anarchon add|change --start --end`` (and ``celery anarchon``'s), run as a user runs them.

Against the machine's Redis and a SQLite file, each test in a namespace of its
own. The bounds are ISO 8601 with an offset, stored in UTC, shown wherever the
stored schedule is; ``--start none`` / ``--end none`` clear one on ``change``.
A bad bound exits 2 naming the job and the field, and writes nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon_core import Control
from tests.cli.command import ROOT, Target, shown, target_store

EXIT_OK, EXIT_EMPTY, EXIT_CONFIG = 0, 1, 2
START = "2030-01-01T08:00:00+00:00"
END = "2030-06-30T00:00:00+00:00"


@pytest.fixture(params=["redis", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    with target_store(request, tmp_path, "bounds") as target:
        yield target


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == EXIT_OK, shown(done)
    return done.stdout


def test_add_and_change_set_keep_and_clear_the_bounds(target: Target) -> None:
    # Any offset (or Z) is read; the bounds are stored, and shown, in UTC.
    bounds = ["--start", "2030-01-01T09:00:00+01:00", "--end", "2030-06-30T00:00:00Z"]
    out = ok(target.run("add", "report", "--handler", "work", "--every", "60", *bounds))
    version = target.definitions()["report"].version
    assert out == (
        f"added job 'report' v{version}: every 60s, starting {START}, ending {END} -> work\n"
    )
    stored = target.definitions()["report"]
    assert (stored.start, stored.end) == (START, END)
    jobs = ok(target.run("jobs"))
    assert f"stored schedule: report v{version} every 60s, starting {START}, ending {END}" in jobs

    # Another field changed: the bounds stay.
    out = ok(target.run("change", "report", "--every", "120"))
    assert f"=> every 120s, starting {START}, ending {END} -> work" in out, out
    # One bound moved, the other kept.
    out = ok(target.run("change", "report", "--end", "2030-12-31T00:00:00+00:00"))
    assert out.endswith(
        f"=> every 120s, starting {START}, ending 2030-12-31T00:00:00+00:00 -> work\n"
    ), out
    # Cleared, one then the other.
    out = ok(target.run("change", "report", "--start", "none"))
    assert out.endswith("=> every 120s, ending 2030-12-31T00:00:00+00:00 -> work\n"), out
    out = ok(target.run("change", "report", "--end", "None"))
    assert out.endswith("=> every 120s -> work\n"), out
    stored = target.definitions()["report"]
    assert (stored.start, stored.end, stored.every) == (None, None, 120)
    assert "start" not in stored.to_json() and "end" not in stored.to_json()


@pytest.mark.parametrize(
    ("bounds", "said"),
    [
        (["--start", "2030-01-01T08:00:00"], "job 'report': start=2030-01-01T08:00:00: give its"
                                             " time zone"),
        (["--end", "next tuesday"], "job 'report': end='next tuesday': not an ISO 8601 date"),
        (["--start", END, "--end", START],
         f"job 'report': end={START} is before start={END}"),
        (["--start", "2030-01-01T08:00:10Z", "--end", "2030-01-01T08:00:50Z"],
         "job 'report': every 60s has no slot from start=2030-01-01T08:00:10+00:00"),
    ],
)  # fmt: skip
def test_a_bad_bound_exits_2_naming_the_job_and_the_field_and_writes_nothing(
    target: Target, bounds: list[str], said: str
) -> None:
    refused = target.run("add", "report", "--handler", "work", "--every", "60", *bounds)
    assert (refused.returncode, refused.stdout) == (EXIT_CONFIG, ""), shown(refused)
    assert said in refused.stderr, shown(refused)
    assert target.definitions() == {}

    ok(target.run("add", "report", "--handler", "work", "--every", "60"))
    before = target.definitions()
    refused = target.run("change", "report", *bounds)
    assert (refused.returncode, refused.stdout) == (EXIT_CONFIG, ""), shown(refused)
    assert said in refused.stderr, shown(refused)
    assert target.definitions() == before  # not one version moved


def test_celery_anarchon_add_and_change_take_the_bounds(tmp_path: Path) -> None:
    url, namespace = f"sqlite:///{tmp_path / 'celery.db'}", "celery-bounds"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        E2E_BROKER="memory://",
        E2E_STORE=url,
        E2E_NAMESPACE=namespace,
    )
    celery = str(Path(sys.executable).parent / "celery")

    def verb(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [celery, "-A", "tests.celery.e2e_app", "anarchon", *args]
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in done.stderr, shown(done)
        return done

    out = ok(verb("add", "nightly", "--handler", "tasks.report", "--cron", "0 3 * * *",
                  "--start", START, "--end", END))  # fmt: skip
    assert re.fullmatch(
        rf"added job 'nightly' v\d+: cron '0 3 \* \* \*', starting {re.escape(START)},"
        rf" ending {re.escape(END)} -> tasks.report\n",
        out,
    ), out
    out = ok(verb("change", "nightly", "--end", "none"))
    assert out.endswith(f"=> cron '0 3 * * *', starting {START} -> tasks.report\n"), out
    with Control(url, namespace=namespace) as control:
        stored = control.definitions()["nightly"]
    assert (stored.start, stored.end) == (START, None)
    refused = verb("change", "nightly", "--start", "2030-01-01")
    assert refused.returncode == EXIT_CONFIG, shown(refused)
    assert "job 'nightly': start=2030-01-01T00:00:00: give its time zone" in refused.stderr
