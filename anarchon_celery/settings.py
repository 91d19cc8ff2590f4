"""The ``anarchon_*`` settings of a Celery app: where they are read, their defaults, their refusals.

All are optional but the store, which defaults to the broker itself when the
broker is Redis/Valkey or RabbitMQ:

``anarchon_store``      store URL (``redis://``, ``postgresql://``, ``mysql://``, ...), or
                        ``django`` (``django:ALIAS``): Django's database (see django.py)
``anarchon_namespace``  default: the app's name (``app.main``), else ``celery``
``anarchon_lease``      seconds a claim holds without renewal (default 10)
``anarchon_jitter``     bound of the random delay before claiming (default 0)
``anarchon_catch_up``   how late a slot may still be sent (default: one interval, at most 1 h)
``anarchon_lookahead``  send claims that much ahead, each slot then sent at its time
                        (default 0: off; see the engine's ``lookahead``)
``anarchon_tracking``   whether workers track execution (default True, see tracking.py)
``anarchon_pickup``     how long a sent task may wait in the queue for a worker
                        (default 300 s); one never picked up is not sent again
``anarchon_metrics_port``  serve Prometheus metrics, /healthz and /readyz from
                        beat on this port (default: none served; 0: any free
                        port, logged)
``anarchon_metrics_host``  the address they are served on (default 0.0.0.0)
``anarchon_django_poll``  with ``DatabaseScheduler``: how often each beat reads
                        django-celery-beat's change marker (default 2 s)

Beat settings that could not take effect with anarchon are refused rather
than ignored: a loop interval longer than the engine's longest sleep, and
``beat_cron_starting_deadline``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from celery import Celery

from anarchon_core import ConfigurationError, JobOptions
from anarchon_core.durations import parse_duration
from anarchon_core.engine.claims import check_lookahead
from anarchon_core.handoff import DEFAULT_PICKUP
from anarchon_core.jobs import DISPATCH_JITTER
from anarchon_core.probes import check_port
from anarchon_core.scheduler import MAX_SLEEP
from anarchon_core.urls import redact

#: Broker URL schemes whose server can also serve as the store.
BROKER_STORES = {
    "redis": "redis",
    "rediss": "rediss",
    "valkey": "valkey",
    "valkeys": "valkeys",
    "amqp": "amqp",
    "amqps": "amqps",
    "pyamqp": "amqp",
    "librabbitmq": "amqp",
}


def store_url(app: Celery) -> str:
    """``anarchon_store``, else the broker's URL when the broker can serve as a store."""
    configured = app.conf.get("anarchon_store")
    if configured:
        if str(configured).partition("://")[0].lower() == "memory":
            # Each process (each beat, each worker) would open a store of its own.
            raise ConfigurationError(
                "anarchon_store=memory:// is private to one process: beats and workers would"
                " share no slot; use a shared store (a sqlite:/// file in tests)"
            )
        if str(configured).lower() == "django" or str(configured).lower().startswith("django:"):
            return django_store_url(str(configured).partition(":")[2] or "default")
        return str(configured)
    broker = app.conf.broker_url or "amqp://guest:guest@localhost:5672//"
    if isinstance(broker, (list, tuple)):
        broker = broker[0]
    broker = str(broker).split(";", 1)[0].strip()
    scheme, _, rest = broker.partition("://")
    if scheme.lower() in BROKER_STORES:
        return f"{BROKER_STORES[scheme.lower()]}://{rest}"
    raise ConfigurationError(
        f"anarchon_store is not set and the broker ({redact(broker)}) cannot serve as the"
        " store: set anarchon_store to a store URL (redis://, postgresql://, nats://, ...)"
    )


#: Django's database engines, and the store URL scheme of each.
DJANGO_ENGINES = {
    "django.db.backends.postgresql": "postgresql",
    "django.db.backends.postgresql_psycopg2": "postgresql",
    "django.db.backends.mysql": "mysql",
}


def django_store_url(alias: str, databases: Mapping[str, Any] | None = None) -> str:
    """The store URL of Django's database ``alias`` (``anarchon_store = "django"``).

    anarchon's tables are then made in the project's own database (PostgreSQL,
    MySQL or MariaDB) at first use, beside django-celery-beat's. The
    database's ``OPTIONS`` are not carried over: for TLS or other connection
    options, set ``anarchon_store`` to the database's URL with them.
    """
    if databases is None:
        try:
            from django.conf import settings
        except ImportError:
            raise ConfigurationError(
                'anarchon_store = "django" needs Django (pip install "anarchon[django]")'
            ) from None
        databases = getattr(settings, "DATABASES", {}) or {}
    if alias not in databases:
        raise ConfigurationError(
            f"anarchon_store = {('django:' + alias)!r}: Django has no database {alias!r}"
            f" (DATABASES has {', '.join(map(repr, databases)) or 'none'})"
        )
    database = databases[alias]
    engine = str(database.get("ENGINE", ""))
    scheme = DJANGO_ENGINES.get(engine)
    if scheme is None:
        raise ConfigurationError(
            f"anarchon_store = {('django:' + alias)!r}: Django's database {alias!r} uses"
            f" {engine or 'no ENGINE'}; anarchon can share a PostgreSQL, MySQL or MariaDB"
            " database only: set anarchon_store to a store URL instead"
        )
    user = quote(str(database.get("USER") or ""), safe="")
    password = quote(str(database.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(database.get("HOST") or "localhost")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    port = str(database.get("PORT") or "")
    name = quote(str(database.get("NAME") or ""), safe="")
    return f"{scheme}://{credentials}{host}{':' + port if port else ''}/{name}"


def namespace_of(app: Celery) -> str:
    """``anarchon_namespace``, else the app's name, else ``celery``."""
    return str(app.conf.get("anarchon_namespace") or app.main or "celery")


def timezone_of(app: Celery) -> str:
    """The app's time zone, in which ``crontab`` entries are read."""
    return str(app.conf.timezone or "UTC")


@dataclass(frozen=True)
class BeatSettings:
    """The settings beat reads at setup, validated.

    ``defaults``: every entry's job options (``anarchon_lease``,
    ``anarchon_jitter``, ``anarchon_catch_up``); ``pickup``: the pickup lease
    of a tracked send; ``tracking``: whether beat may hand slots off to workers.
    """

    defaults: JobOptions
    pickup: float = DEFAULT_PICKUP
    tracking: bool = True
    #: Where beat serves its metrics and probes (``anarchon_metrics_port``), if anywhere.
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"  # noqa: S104 - Prometheus and the kubelet scrape the pod
    #: Claims sent that much ahead of their slots (``anarchon_lookahead``).
    lookahead: float = 0.0


def read_settings(app: Celery, loop_interval: Any = None) -> BeatSettings:
    """The app's settings for beat, or a ConfigurationError naming the wrong one.

    ``loop_interval``: the loop interval the user chose (``--max-interval`` or
    ``beat_max_loop_interval``), if any.
    """
    refuse_ineffective(app, loop_interval)
    conf = app.conf
    pickup = parse_duration("anarchon_pickup", conf.get("anarchon_pickup", DEFAULT_PICKUP))
    defaults = JobOptions.build(
        lease=conf.get("anarchon_lease"),
        jitter=conf.get("anarchon_jitter", DISPATCH_JITTER),
        catch_up=conf.get("anarchon_catch_up"),
    )
    port = conf.get("anarchon_metrics_port")
    if port is not None:
        port = check_port(port, "anarchon_metrics_port")
    host = conf.get("anarchon_metrics_host", "0.0.0.0")  # noqa: S104 - as above
    if not isinstance(host, str) or not host:
        raise ConfigurationError(f"anarchon_metrics_host={host!r}: expected an address")
    tracking = bool(conf.get("anarchon_tracking", True))
    lookahead = check_lookahead(conf.get("anarchon_lookahead", 0.0), "anarchon_lookahead")
    return BeatSettings(defaults, pickup, tracking, port, host, lookahead)


def refuse_ineffective(app: Celery, loop_interval: Any = None) -> None:
    """Refuse the beat settings that the user set and that could not take effect."""
    if loop_interval and float(loop_interval) > MAX_SLEEP:
        raise ConfigurationError(
            f"a loop interval of {float(loop_interval):g}s (beat_max_loop_interval or"
            f" --max-interval) cannot take effect: beat checks the schedule at least every"
            f" {MAX_SLEEP:g}s with anarchon_celery; remove the setting"
        )
    if app.conf.get("beat_cron_starting_deadline") is not None:
        raise ConfigurationError(
            "beat_cron_starting_deadline is not supported: how late a missed slot may"
            " still be sent is set by anarchon_catch_up (for one entry, its"
            " anarchon_catch_up option); remove beat_cron_starting_deadline"
        )
