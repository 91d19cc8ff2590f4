"""A Django project as django-celery-beat's users have one: its models, admin and Celery app.

Configured from the environment: ``DJ_DATABASE`` (a ``postgresql://`` or
``mysql://`` URL of the project's database), and the ``E2E_*`` settings of
the Celery test apps (broker, store, namespace, lease, report file).
``E2E_STORE=django`` makes the project's database the claim store.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

import pymysql

pymysql.install_as_MySQLdb()  # Django's MySQL backend, on PyMySQL (no compiler needed)

_url = urlsplit(os.environ["DJ_DATABASE"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql"
        if _url.scheme.startswith("postgres")
        else "django.db.backends.mysql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or ""),
    }
}
SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.django.project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_celery_beat",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# Celery, read by tests/django/project/celery_app.py (namespace CELERY).
CELERY_BROKER_URL = os.environ.get("E2E_BROKER", "redis://127.0.0.1:6379/0")
CELERY_BEAT_SCHEDULER = os.environ.get("DJ_SCHEDULER", "anarchon_celery:DatabaseScheduler")
CELERY_ANARCHON_STORE = os.environ.get("E2E_STORE") or None
CELERY_ANARCHON_NAMESPACE = os.environ.get("E2E_NAMESPACE", "dj")
CELERY_ANARCHON_LEASE = float(os.environ.get("E2E_LEASE", "3"))
CELERY_ANARCHON_DJANGO_POLL = 1
CELERY_TIMEZONE = "UTC"
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Tests share the broker: each keeps to a queue of its own.
CELERY_TASK_DEFAULT_QUEUE = CELERY_ANARCHON_NAMESPACE
