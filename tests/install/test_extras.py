"""Each documented install, alone in an empty virtual environment, runs real workers.

For each extra set the docs tell users to install, a virtual environment
without system site packages gets the project, built as a wheel as users get
it, with that extra only: no test tools, nothing from this checkout. Its own
``celery`` or ``dramatiq`` command then runs a periodic task every second on
a real broker, and the task must run once per slot. A dependency that the
extra forgets (a broker transport's library, the store's driver) makes the
worker die at start, and the test fail with its log.

The wheel is built once per test run, and each extra set gets one virtual
environment per run, shared by the tests (and the xdist workers) that use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cleanup import drop_namespace
from tests.fleet import per_slot, report_lines, slot_seconds
from tests.processes import OWN_GROUP
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent
#: Redis databases of these tests, apart from those of the other end-to-end tests.
REDIS_DB = {"celery": 13, "celery,redis": 14, "dramatiq": 15, "celery,mysql": 11, "django": 12}
SLOTS = 5
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _clean_env(venv: Path | None) -> dict[str, str]:
    """The environment of a process of ``venv``: nothing points back at this checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    }
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


def _run(argv: list[str], env: dict[str, str], what: str, cwd: Path, timeout: float = 180) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{output[-4000:]}"
    return output


def _build_wheel(outdir: Path) -> Path:
    """The project's wheel, as ``pip install`` builds it from this checkout."""
    argv = [*PIP, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(outdir), str(ROOT)]
    _run(argv, _clean_env(None), "building the wheel", cwd=outdir)
    (wheel,) = outdir.glob("anarchon-*.whl")
    return wheel


def _make_venv(venv: Path, wheel: Path, extras: str) -> None:
    """An empty virtual environment with the project and ``extras`` only.

    The venv has no pip of its own: this interpreter's pip installs into it
    (``pip --python``), as the venv's own pip would.
    """
    subprocess.run(
        [sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True
    )
    env = _clean_env(venv)
    python = str(venv / "bin" / "python")
    into = [*PIP, "--python", python]
    _run([*into, "install", "--quiet", f"{wheel}[{extras}]"], env, f"pip install [{extras}]", venv)
    _run([*into, "check"], env, f"pip check after [{extras}]", venv)
    # The project comes from the venv's site-packages, not from this checkout.
    code = "import anarchon_core; print(anarchon_core.__file__)"
    where = _run([python, "-c", code], env, "import anarchon_core", venv)
    assert where.strip().startswith(str(venv)), where


def _once(root: Path, name: str, make: Callable[[], None]) -> None:
    """``make()`` once per test run, whichever xdist worker comes first; the others wait."""
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = root / f"{name}.ready"
        if not ready.exists():
            make()
            ready.touch()


@pytest.fixture(scope="session")
def venv_with(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``venv_with("celery,redis")``: the virtual environment of that extra set, made once."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's directory, shared by its xdist workers
    root = base / "install-venvs"
    root.mkdir(exist_ok=True)
    wheels = root / "wheel"

    def build() -> None:
        wheels.mkdir(exist_ok=True)
        _build_wheel(wheels)

    def get(extras: str) -> Path:
        _once(root, "wheel", build)
        (wheel,) = wheels.glob("anarchon-*.whl")
        venv = root / extras.replace(",", "-")
        _once(root, venv.name, lambda: _make_venv(venv, wheel, extras))
        return venv

    return get


@dataclass
class Pod:
    """One worker command of a virtual environment, in its own process group."""

    workdir: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.workdir / "worker.log"

    @property
    def report(self) -> Path:
        return self.workdir / "report.jsonl"

    def start(self, argv: list[str]) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                **OWN_GROUP,
            )

    def lines(self) -> list[dict[str, object]]:
        if not self.report.exists():
            return []
        return report_lines(self.report)

    def ran(self, count: int) -> bool:
        """Whether ``count`` slots ran; a worker that exited first fails the wait at once."""
        assert self.proc is not None
        if len(per_slot(self.lines())) >= count:
            return True
        if self.proc.poll() is not None:
            raise AssertionError(f"the worker exited ({self.proc.returncode}):\n{self.tail()}")
        return False

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM to the group, then SIGKILL to whatever of it is left."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Callable[[Path, str, dict[str, str]], Pod]]:
    """``pod(venv, app, env)``: a worker of ``venv`` running ``app`` from an empty directory."""
    made: list[Pod] = []

    def make(venv: Path, app: str, env: dict[str, str]) -> Pod:
        workdir = tmp_path / f"pod{len(made)}"
        workdir.mkdir()
        shutil.copy(APPS / f"{app}.py", workdir)
        made.append(Pod(workdir, {**_clean_env(venv), **env}))
        return made[-1]

    yield make
    for each in made:
        each.stop()


def _assert_each_slot_once(pod: Pod) -> None:
    lines = pod.lines()
    counts = per_slot(lines)
    assert None not in counts, f"a run without an anarchon slot: {lines}"
    assert {s: n for s, n in counts.items() if n > 1} == {}, "a slot ran twice"
    seconds = sorted(int(slot_seconds(str(s))) for s in counts)
    assert len(seconds) >= SLOTS
    # A slot due while the one before still runs is skipped, as the overlap rule says,
    # and the pod says so (a cold worker's first task may outlast its second).
    said = pod.log.read_text(errors="replace")
    skipped = {int(found) // 1000 for found in re.findall(r"anarchon: overlap \S+@(\d+) ", said)}
    missed = sorted(set(range(seconds[0], seconds[-1] + 1)) - set(seconds) - skipped)
    assert missed == [], f"slots missed: {missed}, run: {seconds}"
    assert {x["attempt"] for x in lines} == {1}
    assert len({x["id"] for x in lines}) == len(lines)


def _redis_broker(redis_url: str, extras: str) -> str:
    return f"{redis_url.rsplit('/', 1)[0]}/{REDIS_DB[extras]}"


def _drop_redis_keys(url: str, namespace: str) -> None:
    """Best effort: every key of this test (the store's, the broker's) names its namespace."""
    import redis

    with contextlib.suppress(Exception):
        client = redis.Redis.from_url(url, socket_timeout=3)
        try:
            keys = list(client.scan_iter(match=f"*{namespace}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def _drop_amqp_queues(url: str, *names: str) -> None:
    """Best effort: the durable queues of this test (claim queues expire by themselves)."""
    from kombu import Connection

    with contextlib.suppress(Exception), Connection(url, connect_timeout=3) as conn:
        channel = conn.default_channel
        for name in names:
            with contextlib.suppress(Exception):
                channel.queue_delete(name)


def _amqp(amqp_url: str) -> tuple[str, str]:
    """The broker URL (no query string) and the store URL (the same server, short expiry)."""
    return amqp_url.split("?", 1)[0], amqp_url


# -- Celery -----------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("extras", "broker"),
    [
        ("celery,redis", "redis"),
        ("celery", "redis"),
        ("celery", "rabbitmq"),
        # A Django shop's install: the schedule's slots claimed in its MySQL database.
        ("celery,mysql", "redis"),
    ],
)
def test_celery_worker_with_beat_runs_each_slot_once(
    venv_with: Callable[[str], Path],
    pod: Callable[[Path, str, dict[str, str]], Pod],
    request: pytest.FixtureRequest,
    extras: str,
    broker: str,
) -> None:
    namespace = f"i{uuid.uuid4().hex[:10]}"
    if broker == "redis":
        url, store = _redis_broker(request.getfixturevalue("redis_url"), extras), ""
    else:
        url, store = _amqp(request.getfixturevalue("amqp_url"))
    if "mysql" in extras:
        store = request.getfixturevalue("mysql_url")
    venv = venv_with(extras)
    worker = pod(venv, "celery_app", {"APP_BROKER": url, "APP_STORE": store})
    worker.env.update(APP_NAMESPACE=namespace, APP_REPORT=str(worker.report))
    argv = [str(venv / "bin" / "celery"), "-A", "celery_app", "worker", "-B", "-c", "1"]
    argv += ["-n", f"w.{namespace}@%h", "--loglevel", "INFO", "--without-gossip"]
    argv += ["--without-mingle"]
    try:
        worker.start(argv)
        wait_until(lambda: worker.ran(SLOTS), 60, f"{SLOTS} slots to run", seen=worker.tail)
        worker.stop()
        _assert_each_slot_once(worker)
        assert all(str(x["id"]).startswith(f"anarchon:{namespace}:") for x in worker.lines())
    finally:
        worker.stop()
        if store.startswith("mysql"):
            drop_namespace(store, namespace)
        if broker == "redis":
            _drop_redis_keys(url, namespace)
        else:
            _drop_amqp_queues(url, namespace)


@pytest.mark.timeout(240)
def test_django_celery_beat_rows_run_each_slot_once(
    venv_with: Callable[[str], Path],
    pod: Callable[[Path, str, dict[str, str]], Pod],
    redis_url: str,
) -> None:
    """``anarchon[django]`` alone: a Django project's PeriodicTask row, sent by
    ``anarchon_celery:DatabaseScheduler`` from ``celery worker -B``, once per slot."""
    namespace = f"i{uuid.uuid4().hex[:10]}"
    url = _redis_broker(redis_url, "django")
    venv = venv_with("django")
    worker = pod(venv, "django_app", {"APP_BROKER": url, "APP_NAMESPACE": namespace})
    worker.env.update(APP_REPORT=str(worker.report))
    python = str(venv / "bin" / "python")
    _run([python, "django_app.py", "setup"], worker.env, "the project's setup", worker.workdir)
    argv = [str(venv / "bin" / "celery"), "-A", "django_app", "worker", "-B", "-c", "1"]
    argv += ["-n", f"w.{namespace}@%h", "--loglevel", "INFO", "--without-gossip"]
    argv += ["--without-mingle"]
    try:
        worker.start(argv)
        wait_until(lambda: worker.ran(SLOTS), 60, f"{SLOTS} slots to run", seen=worker.tail)
        worker.stop()
        _assert_each_slot_once(worker)
        assert "anarchon: 1 entry (tick)" in worker.log.read_text()  # the row, read by beat
    finally:
        worker.stop()
        _drop_redis_keys(url, namespace)


# -- Dramatiq ---------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_dramatiq_worker_runs_each_slot_once(
    venv_with: Callable[[str], Path],
    pod: Callable[[Path, str, dict[str, str]], Pod],
    request: pytest.FixtureRequest,
    broker: str,
) -> None:
    namespace = f"i{uuid.uuid4().hex[:10]}"
    if broker == "redis":
        url, store = _redis_broker(request.getfixturevalue("redis_url"), "dramatiq"), ""
    else:
        url, store = _amqp(request.getfixturevalue("amqp_url"))
        url = url[:-2] + "/%2F" if url.endswith("//") else url  # pika spells vhost "/" so
    venv = venv_with("dramatiq")
    worker = pod(venv, "dramatiq_app", {"APP_BROKER": url, "APP_STORE": store})
    worker.env.update(APP_NAMESPACE=namespace, APP_REPORT=str(worker.report))
    argv = [str(venv / "bin" / "dramatiq"), "dramatiq_app", "--processes", "1", "--threads", "2"]
    argv += ["--queues", namespace]
    try:
        worker.start(argv)
        wait_until(lambda: worker.ran(SLOTS), 60, f"{SLOTS} slots to run", seen=worker.tail)
        worker.stop()
        _assert_each_slot_once(worker)
    finally:
        worker.stop()
        if broker == "redis":
            _drop_redis_keys(url, namespace)
        else:
            _drop_amqp_queues(url, namespace, f"{namespace}.DQ", f"{namespace}.XQ")
