"""tests/celery/e2e_app.py's app, its entries given options: ``E2E_OPTIONS``.

``E2E_OPTIONS`` (JSON) maps an entry's name to its ``options`` (``apply_async``
options, and ``anarchon_*`` overrides). The processes run it with
``celery -A tests.celery.expiry_app``.
"""

from __future__ import annotations

import json
import os

from tests.celery.e2e_app import app

for _name, _options in json.loads(os.environ.get("E2E_OPTIONS", "{}")).items():
    app.conf.beat_schedule[_name]["options"] = _options

__all__ = ["app"]
