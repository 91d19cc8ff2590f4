"""anarchon's log output as JSON lines, in one line of setup.

Every event's log record carries the event's fields as ``extra`` attributes
(:data:`~anarchon_core.events.LOG_FIELDS`: ``event``, ``job``, ``slot_id``,
``attempt``, ``token``, ``instance``, ``namespace``, ``detail``), so any
structured formatter (python-json-logger, structlog's stdlib bridge, a
Kubernetes log shipper's) emits them as fields. :func:`json_logs` is the
one-line setting for those who have none: anarchon's own loggers write one
JSON object per line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import TextIO

from .events import LOG_FIELDS

#: The loggers of the three packages.
LOGGERS = ("anarchon_core", "anarchon_celery", "anarchon_dramatiq")


class JsonLines(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the
    event's fields present on the record, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in LOG_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def json_logs(level: int | str = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Write anarchon's own log records as JSON lines to ``stream`` (default stderr).

    One handler on anarchon's loggers (which then no longer pass their records
    up to the root logger, so nothing is written twice), at ``level``.
    Returns the handler, to remove it again.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLines())
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
    return handler
