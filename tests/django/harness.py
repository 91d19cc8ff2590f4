"""The Django project of the tests (tests/django/project) on a database of its own.

:class:`Project` makes a database on the given PostgreSQL or MySQL/MariaDB
server, applies the project's migrations (django-celery-beat's tables, the
admin's), and acts on the rows as the admin does (``project/rows.py`` in a
subprocess: the harness never configures Django in the test process, so
tests on two databases can share it). :class:`DjangoFleet` runs the project's real
``celery beat`` and ``celery worker`` processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests.celery.harness import CeleryFleet
from tests.fleet import ROOT

SETTINGS = "tests.django.project.settings"


def _admin_sql(server_url: str, statement: str) -> None:
    """Run one statement on the server's maintenance database (autocommit)."""
    parts = urlsplit(server_url)
    if parts.scheme.startswith("postgres"):
        import psycopg

        with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as c:
            c.execute(statement)  # type: ignore[arg-type]
    else:
        import pymysql

        connection = pymysql.connect(
            host=parts.hostname,
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            autocommit=True,
        )
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement)
        finally:
            connection.close()


class Project:
    """The test project on a new database of ``server_url``'s server."""

    def __init__(self, server_url: str) -> None:
        self.name = f"dj_{uuid.uuid4().hex[:12]}"
        self.server_url = server_url
        parts = urlsplit(server_url)
        self.url = urlunsplit(parts._replace(path=f"/{self.name}"))
        _admin_sql(server_url, f"CREATE DATABASE {self.name}")
        self.env = {"DJ_DATABASE": self.url, "DJANGO_SETTINGS_MODULE": SETTINGS}
        self.rows("migrate")

    def rows(self, command: str, *args: Any) -> str:
        """Run ``project/rows.py COMMAND ARGS...`` (each argument as JSON); its output."""
        import os

        done = subprocess.run(
            [sys.executable, "-m", "tests.django.project.rows", command]
            + [json.dumps(a) for a in args],
            env={**os.environ, "PYTHONPATH": str(ROOT), **self.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"rows {command}: {done.stderr}"
        return done.stdout

    def dump(self) -> dict[str, dict[str, Any]]:
        """Every row's enabled, total_run_count and last_run_at (Unix seconds)."""
        rows: dict[str, dict[str, Any]] = json.loads(self.rows("dump"))
        return rows

    def drop(self) -> None:
        suffix = " WITH (FORCE)" if urlsplit(self.server_url).scheme.startswith("postgres") else ""
        _admin_sql(self.server_url, f"DROP DATABASE IF EXISTS {self.name}{suffix}")


class DjangoFleet(CeleryFleet):
    """The project's beats and workers: ``beat_scheduler = anarchon_celery:DatabaseScheduler``."""

    prefix = "d"
    app = "tests.django.project.celery_app"
    scheduler = "anarchon_celery:DatabaseScheduler"

    def __init__(self, tmp_path: Path, broker: str, project: Project, **options: Any) -> None:
        super().__init__(tmp_path, broker, {}, **options)
        self.env.update(project.env)

    def stock_beat(self, name: str) -> None:
        """django-celery-beat's own DatabaseScheduler, as its users run it today."""
        argv = [sys.executable, "-m", "celery", "-A", self.app, "beat", "--scheduler"]
        argv += ["django_celery_beat.schedulers:DatabaseScheduler", "--loglevel", "INFO"]
        self.spawn(name, argv)
