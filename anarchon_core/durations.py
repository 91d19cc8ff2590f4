"""Durations: seconds from a number, a :class:`~datetime.timedelta` or a string like ``"30s"``.

Job options, store options in URLs and integration settings all take
durations in these forms, and all read them with :func:`parse_duration`.
"""

from __future__ import annotations

import re
from datetime import timedelta

from .errors import ConfigurationError

#: What a duration may be given as: seconds, a timedelta, or a string such as ``"30s"``.
Duration = float | int | str | timedelta

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(name: str, value: float | int | str | timedelta) -> float:
    """Seconds from a number, a :class:`timedelta` or a string like ``"30s"``, ``"1h"``."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{name}={value!r}: expected a duration, not a bool")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ConfigurationError(f"{name}={value!r}: too large for a duration") from None
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ConfigurationError(
                f"{name}={value!r}: expected a duration such as 10, '30s', '5m', '1h' or '2d'"
            )
        try:
            seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
        except OverflowError:
            raise ConfigurationError(f"{name}={value!r}: too large for a duration") from None
    else:
        raise ConfigurationError(f"{name}={value!r}: expected a duration in seconds")
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ConfigurationError(f"{name}={value!r}: a duration must be finite and not negative")
    return seconds


#: The shortest and longest timeout a store takes for one call or connection
#: (seconds): shorter fails every call on a healthy network, longer leaves a
#: blocked call holding the scheduling loop for minutes.
MIN_STORE_TIMEOUT = 0.5
MAX_STORE_TIMEOUT = 300.0


def within(
    name: str, seconds: float, low: float, high: float | None = None, why: str = ""
) -> float:
    """``seconds`` if ``low <= seconds <= high``; else ConfigurationError naming ``name``.

    ``why`` says what the bound protects against, for the message.
    """
    if seconds < low or (high is not None and seconds > high):
        bounds = f"at least {low:g}s" if high is None else f"between {low:g}s and {high:g}s"
        reason = f" ({why})" if why else ""
        raise ConfigurationError(f"{name}={seconds:g}s: must be {bounds}{reason}")
    return seconds


def store_timeout(name: str, value: Duration) -> float:
    """A store's call or connection timeout, read and bounded alike for every store."""
    return within(
        name,
        parse_duration(name, value),
        MIN_STORE_TIMEOUT,
        MAX_STORE_TIMEOUT,
        "a store call's time limit",
    )
