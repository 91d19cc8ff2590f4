"""django-celery-beat's rows read as schedules (no Django), and ``anarchon_store = "django"``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from anarchon_celery.rows import CLOCKED_EVERY, Row, RowSchedule, expiry, read_row, skipped
from anarchon_celery.settings import django_store_url
from anarchon_core import ConfigurationError
from anarchon_core.schedules import make_schedule

UTC = timezone.utc
T0 = datetime(2030, 3, 4, 5, 6, 7, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def row(**columns: Any) -> Row:
    columns.setdefault("interval", (10, "seconds"))
    return Row(id=7, name=columns.pop("name", "report"), task="tasks.report", **columns)


def refused(**columns: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        read_row(row(**columns))
    return str(caught.value)


def grid(schedule: RowSchedule) -> Any:
    """The slots anarchon computes for the row's entry."""
    entry = schedule.entry
    anchor = None if entry.anchor is None else datetime.fromtimestamp(entry.anchor, UTC)
    return make_schedule(every=entry.every, cron=entry.cron, timezone=entry.timezone, anchor=anchor)


# -- the schedule kinds ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("every", "period", "seconds"),
    [(3, "days", 259200.0), (2, "hours", 7200.0), (5, "minutes", 300.0), (30, "seconds", 30.0)],
)
def test_an_interval_row_runs_every_n_of_its_period_on_the_epoch_grid(
    every: int, period: str, seconds: float
) -> None:
    schedule = read_row(row(interval=(every, period)))
    assert schedule.entry.every == seconds
    assert (schedule.entry.cron, schedule.entry.anchor) == (None, None)
    assert (schedule.start, schedule.expires, schedule.clocked, schedule.one_off) == (
        None,
        None,
        None,
        False,
    )
    slot = grid(schedule).next_after(T0)
    assert slot.timestamp() % seconds == 0  # the same grid on every beat


def test_an_interval_row_with_a_start_time_runs_from_it() -> None:
    schedule = read_row(row(interval=(1, "hours"), start_time=T0))
    assert schedule.start == T0
    slots = grid(schedule)
    assert slots.next_after(T0 - SECOND) == T0  # its first slot is start_time
    assert slots.next_after(T0) == T0 + timedelta(hours=1)


def test_a_start_time_off_the_millisecond_still_runs_from_it() -> None:
    # Rows made in code often carry timezone.now()'s microseconds.
    start = T0 + timedelta(microseconds=123456)
    for columns in ({"start_time": start}, {"interval": None, "clocked": start}):
        schedule = read_row(row(**columns))
        first = grid(schedule).next_after(start - SECOND)
        assert start <= first < start + timedelta(milliseconds=1), columns
        assert skipped(schedule, first) is None


@pytest.mark.parametrize(
    ("interval", "said"),
    [((10, "fortnights"), "interval period 'fortnights'"), ((0, "minutes"), "every=0 minutes")],
)
def test_an_interval_row_with_a_bad_interval_is_refused(
    interval: tuple[int, str], said: str
) -> None:
    message = refused(interval=interval)
    assert message.startswith("PeriodicTask 'report': ")
    assert said in message


def test_a_crontab_row_is_its_five_fields_in_its_own_timezone() -> None:
    schedule = read_row(
        row(interval=None, crontab=("*/15", "9-17", "*", "*", "1-5", "Europe/Paris"))
    )
    assert (schedule.entry.cron, schedule.entry.timezone) == ("*/15 9-17 * * 1-5", "Europe/Paris")
    assert (schedule.entry.every, schedule.one_off) == (None, False)
    # 09:00 in Paris on a Monday (CET, UTC+1).
    monday = datetime(2030, 1, 7, 7, 0, tzinfo=UTC)
    assert grid(schedule).next_after(monday) == datetime(2030, 1, 7, 8, 0, tzinfo=UTC)


def test_a_crontab_row_without_a_timezone_is_in_utc() -> None:
    schedule = read_row(row(interval=None, crontab=("0", "4", "*", "*", "*", "")))
    assert (schedule.entry.cron, schedule.entry.timezone) == ("0 4 * * *", "UTC")


def test_a_crontab_row_restricting_both_days_is_refused_naming_it() -> None:
    message = refused(name="payday", interval=None, crontab=("0", "9", "1", "*", "mon", "UTC"))
    assert message.startswith("PeriodicTask 'payday': ")
    assert "day_of_month and day_of_week" in message


def test_a_crontab_row_with_a_bad_field_is_refused_naming_it() -> None:
    message = refused(interval=None, crontab=("61", "*", "*", "*", "*", "UTC"))
    assert message.startswith("PeriodicTask 'report': crontab: ")


def test_a_clocked_row_runs_once_at_its_time() -> None:
    schedule = read_row(row(interval=None, clocked=T0))
    assert (schedule.one_off, schedule.clocked, schedule.start) == (True, T0, T0)
    assert (schedule.entry.every, schedule.entry.anchor) == (CLOCKED_EVERY, T0.timestamp())
    slots = grid(schedule)
    assert slots.next_after(T0 - SECOND) == T0
    assert slots.next_after(T0) - T0 > timedelta(days=365)  # no second slot within a year


def test_a_clocked_row_starting_later_than_its_time_keeps_the_later_start() -> None:
    schedule = read_row(row(interval=None, clocked=T0, start_time=T0 + timedelta(hours=1)))
    assert schedule.start == T0 + timedelta(hours=1)


def test_a_one_off_interval_row_is_one_off() -> None:
    assert read_row(row(one_off=True)).one_off is True


def test_a_solar_row_is_refused_naming_it_and_solar() -> None:
    message = refused(name="sun", interval=None, solar=("sunset", 48.85, 2.35))
    assert message.startswith("PeriodicTask 'sun': solar schedule (sunset) is not supported")


@pytest.mark.parametrize(
    ("columns", "has"),
    [
        ({"crontab": ("0", "*", "*", "*", "*", "UTC")}, "has interval and crontab"),
        ({"interval": None}, "has none"),
        ({"interval": None, "solar": ("dawn", 0.0, 0.0), "clocked": T0}, "has solar and clocked"),
    ],
)
def test_a_row_needs_exactly_one_schedule_kind(columns: dict[str, Any], has: str) -> None:
    message = refused(**columns)
    assert message.startswith("PeriodicTask 'report': needs exactly one of interval, crontab")
    assert message.endswith(f"({has})")


# -- the send ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "text", "said"),
    [
        ("args", "[1,", "args is not JSON"),
        ("kwargs", "{'a': 1}", "kwargs is not JSON"),
        ("headers", "{", "headers is not JSON"),
        ("args", '{"a": 1}', "args must be a JSON list"),
        ("kwargs", "[1]", "kwargs must be a JSON dict"),
        ("headers", '"x"', "headers must be a JSON dict"),
    ],
)
def test_bad_json_is_refused_naming_the_row_and_the_column(
    column: str, text: str, said: str
) -> None:
    message = refused(**{column: text})
    assert message.startswith(f"PeriodicTask 'report': {said}")


@pytest.mark.parametrize("text", [None, "", "null"])
def test_empty_json_columns_are_empty(text: str | None) -> None:
    entry = read_row(row(args=text, kwargs=text, headers=text)).entry
    assert (entry.args, entry.kwargs) == ((), {})
    assert entry.options == {"headers": {"periodic_task_name": "report"}}


def test_the_send_carries_the_rows_arguments_and_options() -> None:
    entry = read_row(
        row(
            args='[1, "two"]',
            kwargs='{"k": [3]}',
            queue="reports",
            exchange="ex",
            routing_key="rk",
            priority=0,
            headers='{"x-tenant": "acme"}',
        )
    ).entry
    assert (entry.name, entry.task, entry.args, entry.kwargs) == (
        "report",
        "tasks.report",
        (1, "two"),
        {"k": [3]},
    )
    assert entry.options == {
        "queue": "reports",
        "exchange": "ex",
        "routing_key": "rk",
        "priority": 0,  # a priority of 0 is one
        "headers": {"x-tenant": "acme", "periodic_task_name": "report"},
    }


def test_empty_options_are_left_out() -> None:
    options = read_row(row(queue="", exchange=None, routing_key="", priority=None)).entry.options
    assert options == {"headers": {"periodic_task_name": "report"}}


def test_expire_seconds_count_from_the_slot() -> None:
    schedule = read_row(row(expire_seconds=30))
    assert schedule.expire_seconds == 30.0
    assert expiry(schedule, T0) == T0 + timedelta(seconds=30)
    assert expiry(schedule, T0 + SECOND) == T0 + timedelta(seconds=31)


def test_expires_is_the_same_for_every_slot() -> None:
    schedule = read_row(row(expires=T0 + timedelta(hours=1)))
    assert expiry(schedule, T0) == expiry(schedule, T0 + SECOND) == T0 + timedelta(hours=1)
    assert expiry(read_row(row()), T0) is None


def test_no_slot_before_the_start_time() -> None:
    schedule = read_row(row(start_time=T0))
    said = skipped(schedule, T0 - timedelta(milliseconds=1))
    assert said is not None and said.startswith("before its start_time 2030-03-04T05:06:07")
    assert skipped(schedule, T0) is None
    assert skipped(schedule, T0 + SECOND) is None


def test_no_slot_at_or_after_expires() -> None:
    schedule = read_row(row(expires=T0))
    assert skipped(schedule, T0 - timedelta(milliseconds=1)) is None
    for slot in (T0, T0 + SECOND):
        said = skipped(schedule, slot)
        assert said is not None and said.startswith("after it expired at 2030-03-04T05:06:07")


def test_naive_datetimes_are_utc() -> None:
    naive = T0.replace(tzinfo=None)
    schedule = read_row(row(start_time=naive, expires=naive + timedelta(hours=1)))
    assert schedule.start == T0
    assert schedule.expires == T0 + timedelta(hours=1)
    assert schedule.entry.anchor == T0.timestamp()
    clocked = read_row(row(interval=None, clocked=naive))
    assert (clocked.clocked, clocked.start) == (T0, T0)


def test_aware_datetimes_in_other_zones_keep_their_instant() -> None:
    paris = timezone(timedelta(hours=1))
    schedule = read_row(row(start_time=T0.astimezone(paris)))
    assert schedule.start == T0
    assert skipped(schedule, T0) is None


# -- anarchon_store = "django" ---------------------------------------------------------

SECRET = "s3cret-p@ss:w/rd%#?"


def database(engine: str = "django.db.backends.postgresql", **fields: Any) -> dict[str, Any]:
    return {
        "ENGINE": engine,
        "NAME": "app",
        "USER": "app",
        "PASSWORD": SECRET,
        "HOST": "db.internal",
        "PORT": "5432",
        **fields,
    }


@pytest.mark.parametrize(
    ("engine", "scheme"),
    [
        ("django.db.backends.postgresql", "postgresql"),
        ("django.db.backends.postgresql_psycopg2", "postgresql"),
        ("django.db.backends.mysql", "mysql"),
    ],
)
def test_the_store_is_djangos_database(engine: str, scheme: str) -> None:
    url = django_store_url("default", {"default": database(engine, PASSWORD="pw")})
    assert url == f"{scheme}://app:pw@db.internal:5432/app"


def test_a_password_with_special_characters_is_url_encoded() -> None:
    url = django_store_url("default", {"default": database()})
    parts = urlsplit(url)
    assert (parts.hostname, parts.port, parts.path) == ("db.internal", 5432, "/app")
    assert (unquote(parts.username or ""), unquote(parts.password or "")) == ("app", SECRET)


def test_the_store_of_another_alias() -> None:
    databases = {"default": database(), "jobs": database(NAME="jobs", PORT="", HOST="")}
    assert django_store_url("jobs", databases).endswith("@localhost/jobs")


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        ({"PASSWORD": ""}, "postgresql://app@db.internal:5432/app"),
        ({"PASSWORD": "", "USER": ""}, "postgresql://db.internal:5432/app"),
        ({"PASSWORD": "", "HOST": "::1"}, "postgresql://app@[::1]:5432/app"),
        ({"PASSWORD": "", "HOST": "[2001:db8::7]"}, "postgresql://app@[2001:db8::7]:5432/app"),
    ],
)
def test_credentials_and_hosts(fields: dict[str, Any], url: str) -> None:
    assert django_store_url("default", {"default": database(**fields)}) == url


def test_an_ipv6_host_is_bracketed() -> None:
    parts = urlsplit(django_store_url("default", {"default": database(HOST="fd00::5")}))
    assert (parts.hostname, parts.port) == ("fd00::5", 5432)


def test_an_unknown_alias_is_refused_naming_the_aliases() -> None:
    with pytest.raises(ConfigurationError) as caught:
        django_store_url("jobs", {"default": database(), "replica": database()})
    message = str(caught.value)
    assert message == (
        "anarchon_store = 'django:jobs': Django has no database 'jobs'"
        " (DATABASES has 'default', 'replica')"
    )


def test_no_databases_at_all() -> None:
    with pytest.raises(ConfigurationError, match=r"DATABASES has none\)$"):
        django_store_url("default", {})


@pytest.mark.parametrize(
    "engine", ["django.db.backends.sqlite3", "django.db.backends.oracle", "", "custom.backend"]
)
def test_a_database_anarchon_cannot_share_is_refused_saying_what_to_do(engine: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        django_store_url("default", {"default": database(engine)})
    message = str(caught.value)
    assert message.startswith("anarchon_store = 'django:default': Django's database 'default' uses")
    assert (engine or "no ENGINE") in message
    assert "PostgreSQL, MySQL or MariaDB" in message
    assert "set anarchon_store to a store URL" in message


@pytest.mark.parametrize(
    ("alias", "engine"),
    [("missing", "django.db.backends.postgresql"), ("default", "django.db.backends.sqlite3")],
)
def test_no_password_in_an_error(alias: str, engine: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        django_store_url(alias, {"default": database(engine)})
    message = str(caught.value)
    for secret in (SECRET, "s3cret", "s3cret-p%40ss"):
        assert secret not in message
