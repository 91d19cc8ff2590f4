"""Django settings of a project with django-celery-beat, for ``anarchon import``'s tests.

The database is ``IMPORT_DJANGO_DB``: a ``postgresql://`` URL (its tables in
the schema ``IMPORT_DJANGO_SCHEMA``), a ``mysql://`` URL, or
``sqlite:///PATH``.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql

pymysql.install_as_MySQLdb()  # Django's MySQL backend, on PyMySQL (no compiler needed)

_url = urlsplit(os.environ["IMPORT_DJANGO_DB"])
_database: dict[str, Any]
if _url.scheme == "sqlite":
    _database = {"ENGINE": "django.db.backends.sqlite3", "NAME": _url.path}
else:
    postgres = _url.scheme.startswith("postgres")
    _database = {
        "ENGINE": f"django.db.backends.{'postgresql' if postgres else 'mysql'}",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or ""),
    }
    if postgres:
        _database["OPTIONS"] = {"options": f"-c search_path={os.environ['IMPORT_DJANGO_SCHEMA']}"}
DATABASES = {"default": _database}
SECRET_KEY = "tests-only"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_celery_beat"]
