"""``anarchon import``, run as a user runs it (a subprocess), from each source it reads.

The sources are real: a ``beat_schedule`` module (tests/cli/import_beat.py),
redbeat's entries saved by redbeat's own API in the machine's Redis (under a
key prefix of their own), and django-celery-beat's tables made by its
migrations and filled through its models (tests/cli/import_django_rows.py) in
a schema of PostgreSQL, a database of MariaDB, or an SQLite file read through
Django. The stores are real too: an SQLite file, or the machine's Redis in a
namespace of its own. Each source is imported three times: a dry run (it
says what it would do and writes nothing), ``--apply`` (the stored schedules
are those expected), ``--apply`` again (nothing to do: exit 1, no version
moved); the entries that cannot be carried are named with their reason.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import unquote, urlsplit
from zoneinfo import ZoneInfo

import pytest

from anarchon_core.control import Control, Definition
from anarchon_core.urls import secrets_in
from tests.cleanup import drop_namespace
from tests.cli.command import ROOT, anarchon, shown

EXIT_OK, EXIT_EMPTY, EXIT_CONFIG, EXIT_UNREACHABLE = 0, 1, 2, 3
#: The password in the URLs of these tests (in a source's arguments too): never shown.
SECRET = "s3cr3t"
#: The verbs that begin the line of one entry.
VERBS = ("create", "change", "created", "changed", "skip", "conflict")


@dataclass(frozen=True)
class Target:
    """The store the command writes to: its URL and namespace."""

    url: str
    namespace: str

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = anarchon("import", *args, "--store", self.url, "--namespace", self.namespace)
        secrets = [SECRET, *secrets_in(self.url), *(s for arg in args for s in secrets_in(arg))]
        for secret in secrets:
            assert secret not in done.stdout + done.stderr, shown(done)
        return done

    def definitions(self) -> dict[str, Definition]:
        with Control(self.url, namespace=self.namespace) as control:
            return control.definitions()


def steps(out: str) -> dict[str, tuple[str, str]]:
    """Each entry's line: ``{name: (verb, what follows the name's colon)}``."""
    found = {}
    for line in out.splitlines():
        verb, _, rest = line.partition(" ")
        if verb in VERBS:
            head, _, said = rest.strip().partition(": ")
            found[head.split(" ")[0]] = (verb, said)
    return found


def stored(definitions: dict[str, Definition]) -> dict[str, str]:
    """The stored schedules as their JSON, by name (versions aside)."""
    return {name: d.to_json() for name, d in definitions.items()}


def expected(*definitions: Definition) -> dict[str, str]:
    return {d.name: d.to_json() for d in definitions}


def imported(
    target: Target, source: list[str], carried: dict[str, str], skipped: dict[str, str]
) -> dict[str, Definition]:
    """Import ``source`` three times (dry run, --apply, --apply again), checking each:
    ``carried`` (the stored schedules' JSON by name) are created, each of ``skipped`` is
    named with its reason (a part of it). The stored schedules."""
    before = target.definitions()
    dry = target.run(*source)
    assert dry.returncode == EXIT_OK, shown(dry)
    said = steps(dry.stdout)
    assert sorted(said) == sorted([*carried, *skipped]), shown(dry)
    assert {n for n, (verb, _) in said.items() if verb == "create"} == set(carried), shown(dry)
    for name, reason in skipped.items():
        assert said[name][0] == "skip" and reason in said[name][1], shown(dry)
    assert "(dry run: nothing is written; --apply writes)" in dry.stdout, shown(dry)
    assert f"would create {len(carried)}, change 0;" in dry.stdout, shown(dry)
    assert target.definitions() == before  # nothing written

    applied = target.run(*source, "--apply")
    assert applied.returncode == EXIT_OK, shown(applied)
    said = steps(applied.stdout)
    assert {n for n, (verb, _) in said.items() if verb == "created"} == set(carried)
    assert f"done: created {len(carried)}, changed 0; 0 already the same," in applied.stdout
    after = target.definitions()
    assert stored(after) == carried

    again = target.run(*source, "--apply")
    assert again.returncode == EXIT_EMPTY, shown(again)
    said = steps(again.stdout)
    for name in carried:
        assert said[name] == ("skip", f"already the same (v{after[name].version})"), shown(again)
    for name, reason in skipped.items():
        assert said[name][0] == "skip" and reason in said[name][1], shown(again)
    assert "nothing to create or change" in again.stdout, shown(again)
    assert target.definitions() == after  # not one version moved
    return after


@pytest.fixture
def namespace() -> str:
    return f"import-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def sqlite_target(tmp_path: Path, namespace: str) -> Target:
    return Target(f"sqlite:///{tmp_path / 'store.db'}", namespace)


# -- beat_schedule ---------------------------------------------------------------------

BEAT = "tests.cli.import_beat"
NIGHTLY = Definition(
    name="nightly-cleanup",
    handler="tasks.cleanup",
    cron="0 3 * * *",
    timezone="UTC",
    kwargs={"dsn": "postgresql://app:s3cr3t-in-kwargs@db/app"},
    options={"queue": "slow"},
    job_options={"lease": 120.0},
)
BEAT_CARRIED = expected(
    Definition(name="report-every-minute", handler="tasks.report", every=60.0, args=(1, "a")),
    NIGHTLY,
    Definition(name="quarter-hourly", handler="tasks.poll", every=900.0),
    Definition(
        name="first-week-of-2030",
        handler="tasks.poll",
        every=3600.0,
        start="2029-12-31T23:00:00+00:00",
        end="2030-01-07T23:00:00+00:00",
    ),
)
BEAT_SKIPPED = {
    "sunrise": "cannot be carried: beat_schedule['sunrise']: solar schedules are not supported",
    "relative": "cannot be carried: beat_schedule['relative']: schedule(..., relative=True)",
}


def test_a_beat_schedule_imported_then_changed(sqlite_target: Target) -> None:
    source = ["--beat-schedule", f"{BEAT}:beat_schedule"]
    # The password in an entry's kwargs is stored, and never shown (Target.run checks).
    first = imported(sqlite_target, source, BEAT_CARRIED, BEAT_SKIPPED)

    # The source changed: one crontab moved, one entry added. A dry run says so...
    changed = ["--beat-schedule", f"{BEAT}:changed"]
    dry = sqlite_target.run(*changed)
    assert dry.returncode == EXIT_OK, shown(dry)
    version = first["nightly-cleanup"].version
    said = steps(dry.stdout)
    assert said["nightly-cleanup"] == ("change", 'cron "0 3 * * *" -> "0 4 * * *"'), shown(dry)
    assert said["weekly"] == ("create", "cron '0 6 * * mon' (UTC) -> tasks.weekly"), shown(dry)
    assert f"\nchange   nightly-cleanup v{version}: cron" in dry.stdout, shown(dry)
    assert sqlite_target.definitions() == first
    # ...and --apply writes it, by compare-and-set on the version read.
    applied = sqlite_target.run(*changed, "--apply")
    assert applied.returncode == EXIT_OK, shown(applied)
    now = sqlite_target.definitions()
    assert steps(applied.stdout)["nightly-cleanup"][0] == "changed", shown(applied)
    assert f"changed  nightly-cleanup v{version} -> v{now['nightly-cleanup'].version}:" in (
        applied.stdout
    )
    assert (now["nightly-cleanup"].cron, now["weekly"].cron) == ("0 4 * * *", "0 6 * * mon")
    assert now["report-every-minute"] == first["report-every-minute"]
    again = sqlite_target.run(*changed, "--apply")
    assert again.returncode == EXIT_EMPTY, shown(again)
    assert sqlite_target.definitions() == now


def test_a_celery_apps_beat_schedule_is_read_in_its_time_zone(sqlite_target: Target) -> None:
    dry = sqlite_target.run("--beat-schedule", f"{BEAT}:app")
    assert dry.returncode == EXIT_OK, shown(dry)
    said = steps(dry.stdout)["nightly-cleanup"]
    assert said[1].startswith("cron '0 3 * * *' (Europe/Paris) -> tasks.cleanup"), shown(dry)
    # --timezone overrides it; one not known is refused by the parser.
    dry = sqlite_target.run("--beat-schedule", f"{BEAT}:app", "--timezone", "Asia/Tokyo")
    assert "(Asia/Tokyo)" in steps(dry.stdout)["nightly-cleanup"][1], shown(dry)
    bad = sqlite_target.run("--beat-schedule", f"{BEAT}:app", "--timezone", "Mars/Olympus")
    assert bad.returncode == EXIT_CONFIG and "Mars/Olympus" in bad.stderr, shown(bad)


def test_a_source_that_cannot_be_read_is_a_usage_error(sqlite_target: Target) -> None:
    for source, said in (
        (f"{BEAT}:nope", "has no attribute 'nope'"),
        ("tests.cli.no_such_module:x", "cannot import it"),
        (f"{BEAT}:Celery", "a type, not a dict of beat_schedule entries or a Celery app"),
        (BEAT, "expected module:attribute"),
    ):
        done = sqlite_target.run("--beat-schedule", source)
        assert done.returncode == EXIT_CONFIG and said in done.stderr, shown(done)
    assert sqlite_target.definitions() == {}


# -- redbeat ---------------------------------------------------------------------------


@pytest.fixture
def redbeat(redis_url: str) -> Iterator[str]:
    """redbeat's entries, saved by redbeat in the machine's Redis under a prefix of
    their own (removed afterwards); the prefix."""
    import redis
    from celery import Celery
    from celery.schedules import crontab, schedule
    from redbeat import RedBeatSchedulerEntry
    from redbeat.schedules import rrule

    prefix = f"anarchon-test-{uuid.uuid4().hex[:10]}:"
    app = Celery("redbeat-import", set_as_current=False)
    app.conf.update(redbeat_redis_url=redis_url, redbeat_key_prefix=prefix, broker_url=redis_url)
    # Not long ago: redbeat steps an rrule through every occurrence since its start.
    start = datetime.now(timezone.utc) - timedelta(minutes=5)
    client = redis.Redis.from_url(redis_url)
    try:
        for name, task, when, extra in (
            ("every-ten", "tasks.tick", timedelta(seconds=10),
             {"args": [1], "kwargs": {"x": 2}, "options": {"queue": "q"}}),
            ("workhours", "tasks.poll", crontab(minute="*/5", hour="9-17", day_of_week="1-5"),
             {}),
            ("off", "tasks.off", timedelta(minutes=1), {"enabled": False}),
            ("relative", "tasks.rel", schedule(timedelta(hours=1), relative=True), {}),
            ("recurring", "tasks.rr", rrule("MINUTELY", dtstart=start), {}),
            ("from-code", "tasks.code", timedelta(minutes=5), {}),
            ("dated", "tasks.dated", timedelta(minutes=5), {"kwargs": {"since": start}}),
            # A datetime in anarchon_start is encoded by redbeat, and read back.
            ("bounded", "tasks.bounded", timedelta(minutes=5), {"options": {
                "anarchon_start": datetime(2030, 1, 1, tzinfo=ZoneInfo("Europe/Paris")),
                "anarchon_end": "2031-01-01T00:00:00+00:00", "expires": 30}}),
        ):  # fmt: skip
            RedBeatSchedulerEntry(name, task, when, app=app, **extra).save()
        # What redbeat's beat records of the app's beat_schedule entries.
        client.sadd(prefix + ":statics", "from-code")
        yield prefix
    finally:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
        connection = getattr(app, "redbeat_redis", None)
        if connection is not None:
            connection.close()


def test_redbeat_entries(redis_url: str, redbeat: str, namespace: str) -> None:
    target = Target(redis_url, namespace)  # the store: the same Redis, a namespace of its own
    source = ["--redbeat", redis_url, "--redbeat-prefix", redbeat, "--timezone", "Europe/Paris"]
    carried = expected(
        Definition(
            name="every-ten",
            handler="tasks.tick",
            every=10.0,
            args=(1,),
            kwargs={"x": 2},
            options={"queue": "q"},
        ),
        Definition(
            name="workhours",
            handler="tasks.poll",
            cron="*/5 9-17 * * 1-5",
            timezone="Europe/Paris",
        ),
        Definition(
            name="bounded",
            handler="tasks.bounded",
            every=300.0,
            start="2029-12-31T23:00:00+00:00",
            end="2031-01-01T00:00:00+00:00",
            options={"expires": 30},
        ),
    )
    skipped = {
        "off": "disabled",
        "relative": "cannot be carried: redbeat entry 'relative': schedule(..., relative=True)",
        "recurring": "cannot be carried: redbeat entry 'recurring': an rrule schedule",
        "from-code": "an entry of the app's beat_schedule (redbeat's statics): it stays in code",
        "dated": "cannot be carried: redbeat entry 'dated': its kwargs hold a datetime value",
    }
    try:
        first = imported(target, source, carried, skipped)

        # Changed by hand meanwhile: a dry run shows what differs, --apply puts it back.
        with Control(redis_url, namespace=namespace) as control:
            control.change("every-ten", every=20.0)
        edited = target.definitions()["every-ten"]
        dry = target.run(*source)
        assert dry.returncode == EXIT_OK, shown(dry)
        said = steps(dry.stdout)["every-ten"]
        assert said == ("change", "every 20.0 -> 10.0"), shown(dry)
        assert f"change   every-ten v{edited.version}: every 20.0 -> 10.0" in dry.stdout
        assert target.definitions()["every-ten"] == edited
        applied = target.run(*source, "--apply")
        assert applied.returncode == EXIT_OK, shown(applied)
        now = target.definitions()
        assert stored(now) == carried
        assert now["every-ten"].version > edited.version > first["every-ten"].version
        assert now["workhours"] == first["workhours"]
    finally:
        drop_namespace(redis_url, namespace)


def test_redbeat_unreachable(sqlite_target: Target) -> None:
    done = sqlite_target.run("--redbeat", "redis://:s3cr3t@127.0.0.1:1/0")
    assert done.returncode == EXIT_UNREACHABLE, shown(done)
    assert "cannot reach redbeat's Redis redis://:***@127.0.0.1:1/0" in done.stderr, shown(done)


# -- django-celery-beat ----------------------------------------------------------------

#: 2024-01-01 00:30 UTC, the start_time of the row "since-2024": its grid's anchor.
SINCE = datetime(2024, 1, 1, 0, 30, tzinfo=timezone.utc).timestamp()
#: The start_time of the row "later" is 250 us past this millisecond: its grid's anchor
#: and its start are the next one.
LATER = datetime(2090, 1, 1, 8, tzinfo=timezone.utc)
#: The expires of the row "ending".
ENDING = datetime(2090, 7, 1, tzinfo=timezone.utc)


def _headers(name: str, **more: str) -> dict[str, object]:
    return {"headers": {"periodic_task_name": name, **more}}


ROWS_CARRIED = expected(
    Definition(
        name="every-minute",
        handler="tasks.every-minute",
        every=60.0,
        args=(1,),
        kwargs={"a": 1},
        options={"queue": "reports", "priority": 3, **_headers("every-minute")},
    ),
    Definition(
        name="nightly",
        handler="tasks.nightly",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        options=_headers("nightly", team="ops"),
    ),
    Definition(
        name="weekdays",
        handler="tasks.weekdays",
        cron="*/15 9-17 * * 1-5",
        timezone="UTC",
        options=_headers("weekdays"),
    ),
    Definition(
        name="since-2024",
        handler="tasks.since-2024",
        every=7200.0,
        anchor=SINCE,
        start="2024-01-01T00:30:00+00:00",
        options=_headers("since-2024"),
    ),
    # start_time still to come: the start (rounded up to the millisecond, as the anchor).
    Definition(
        name="later",
        handler="tasks.later",
        every=60.0,
        anchor=(LATER + timedelta(milliseconds=1)).timestamp(),
        start="2090-01-01T08:00:00.001000+00:00",
        options=_headers("later"),
    ),
    # expires: the last millisecond before it is the end; each task sent expires then.
    Definition(
        name="ending",
        handler="tasks.ending",
        cron="*/15 9-17 * * 1-5",
        timezone="UTC",
        end="2090-06-30T23:59:59.999000+00:00",
        options={"expires": ENDING.isoformat(), **_headers("ending")},
    ),
    # expire_seconds: each task sent expires 30 s after its slot's time.
    Definition(
        name="short-lived",
        handler="tasks.short-lived",
        every=60.0,
        options={"expires": 30, **_headers("short-lived")},
    ),
)
ROWS_SKIPPED = {
    "off": "disabled",
    "sun": "cannot be carried: PeriodicTask 'sun': solar schedule (sunset) is not supported",
    "once": "cannot be carried: a clocked row (one run at ",
    "one-off": "cannot be carried: one_off: stored schedules have no one-off runs yet",
    "expired": "expired: its expires 2020-01-01T00:00:00+00:00 has passed, so no slot of it",
}


def django_rows(database: str, schema: str = "") -> None:
    """Make django-celery-beat's tables in ``database`` (a URL; for PostgreSQL, in
    ``schema``) with its migrations, and fill them through its models."""
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        DJANGO_SETTINGS_MODULE="tests.cli.import_django_settings",
        IMPORT_DJANGO_DB=database,
        IMPORT_DJANGO_SCHEMA=schema,
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.cli.import_django_rows"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, shown(done)


@pytest.fixture
def postgres_tables(postgres_url: str) -> Iterator[str]:
    """django-celery-beat's tables in a schema of their own (dropped afterwards); the URL
    that reaches them."""
    import psycopg

    schema = f"import_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        django_rows(postgres_url, schema)
        yield (
            postgres_url
            + ("&" if "?" in postgres_url else "?")
            + f"options=-csearch_path%3D{schema}"
        )
    finally:
        with psycopg.connect(postgres_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def mysql_tables(mysql_url: str) -> Iterator[str]:
    """django-celery-beat's tables in a database of their own (dropped afterwards); its URL."""
    import pymysql

    parts = urlsplit(mysql_url)
    database = f"import_{uuid.uuid4().hex[:10]}"

    def execute(statement: str) -> None:
        conn = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            connect_timeout=5,
        )
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()

    execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    try:
        url = parts._replace(path=f"/{database}", query="").geturl()
        django_rows(url)
        yield url
    finally:
        execute(f"DROP DATABASE IF EXISTS `{database}`")


@pytest.mark.parametrize("server", ["postgres", "mysql"])
def test_django_celery_beat_tables(
    server: str, request: pytest.FixtureRequest, sqlite_target: Target
) -> None:
    url = str(request.getfixturevalue(f"{server}_tables"))
    imported(sqlite_target, ["--django-db", url], ROWS_CARRIED, ROWS_SKIPPED)


def test_django_celery_beat_through_django(
    tmp_path: Path, sqlite_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = f"sqlite:///{tmp_path / 'django.db'}"
    django_rows(database)
    monkeypatch.setenv("IMPORT_DJANGO_DB", database)  # read by the settings module
    source = ["--django-settings", "tests.cli.import_django_settings"]
    imported(sqlite_target, source, ROWS_CARRIED, ROWS_SKIPPED)


def test_django_celery_beat_without_its_tables(postgres_url: str, sqlite_target: Target) -> None:
    done = sqlite_target.run("--django-db", postgres_url + ("&" if "?" in postgres_url else "?")
                             + "options=-csearch_path%3Dno_such_schema")  # fmt: skip
    assert done.returncode == EXIT_CONFIG, shown(done)
    assert "are django-celery-beat's tables there" in done.stderr, shown(done)


# -- a race ----------------------------------------------------------------------------


def test_a_schedule_written_meanwhile_is_left_as_it_is(sqlite_target: Target) -> None:
    """Between the read and the write, someone stores the name (or changes the stored
    version): the write is refused by compare-and-set, said, and nothing is overwritten."""
    from anarchon_celery.importing.plan import Found, Source, run

    url, namespace = sqlite_target.url, sqlite_target.namespace
    with Control(url, namespace=namespace) as control:
        control.add(Definition(name="changed-meanwhile", handler="tasks.old", every=30.0))
    theirs = Definition(name="added-meanwhile", handler="tasks.theirs", every=5.0)

    class Racing(Control):
        def definitions(self) -> dict[str, Definition]:
            seen = super().definitions()
            with Control(url, namespace=namespace) as other:  # another editor, meanwhile
                other.add(theirs)
                other.change("changed-meanwhile", every=45.0)
            return seen

    found = tuple(
        Found(name, definition=Definition(name=name, handler="tasks.ours", every=60.0))
        for name in ("added-meanwhile", "changed-meanwhile")
    )
    out = io.StringIO()
    with Racing(url, namespace=namespace) as control:
        written = run(Source("a test", found), control, apply=True, out=out)
    assert written == 0, out.getvalue()
    said = steps(out.getvalue())
    assert said["added-meanwhile"][0] == said["changed-meanwhile"][0] == "conflict"
    assert "a schedule named 'added-meanwhile' is stored already" in out.getvalue()
    assert "the schedule of 'changed-meanwhile' changed meanwhile" in out.getvalue()
    assert "2 changed by someone else meanwhile, left as they are" in out.getvalue()
    now = sqlite_target.definitions()
    assert (now["added-meanwhile"].handler, now["changed-meanwhile"].every) == ("tasks.theirs", 45)
