"""Django settings of the benchmark's project: django-celery-beat's models, nothing else.

From the environment: ``BENCH_DJ_DATABASE`` (a ``postgresql://`` URL),
``BENCH_DJ_BROKER`` (the Redis broker), ``BENCH_DJ_QUEUE`` (the queue the
beats send to, the benchmark's own) and ``BENCH_DJ_NAMESPACE`` (anarchon's
namespace). Everything else is Django's, Celery's, django-celery-beat's and
anarchon's default (``CONN_MAX_AGE`` 0, a lease of 10 s, a change-marker poll
every 2 s), but execution tracking, off: no worker runs.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ["BENCH_DJ_DATABASE"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or ""),
    }
}
SECRET_KEY = "benchmark-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_celery_beat"]

# Celery, read by celery_app.py (namespace CELERY).
CELERY_BROKER_URL = os.environ.get("BENCH_DJ_BROKER", "redis://127.0.0.1:6379/0")
CELERY_TIMEZONE = "UTC"
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("BENCH_DJ_QUEUE", "celery")
CELERY_ANARCHON_NAMESPACE = os.environ.get("BENCH_DJ_NAMESPACE", "bench-dj")
# No worker answers beat's ``inspect conf``: slots are sent without tracking either way,
# and no broadcast is left on the shared broker.
CELERY_ANARCHON_TRACKING = False
