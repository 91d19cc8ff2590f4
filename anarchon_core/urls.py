"""Store URLs: a scheme table, lazy imports, and an install hint per extra.

Each scheme maps to ``"module:Class"`` plus the extra that installs its
driver, so importing anarchon never imports a driver it does not use.
"""

from __future__ import annotations

import importlib
import re
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from .errors import ConfigurationError, MissingDependency
from .store import Store

#: scheme -> (module:Class, extra that installs its driver or None)
SCHEMES: dict[str, tuple[str, str | None]] = {
    "memory": ("anarchon_core.stores.memory:MemoryStore", None),
    "sqlite": ("anarchon_core.stores.sqlite:SQLiteStore", None),
    "redis": ("anarchon_core.stores.redis:RedisStore", "redis"),
    "rediss": ("anarchon_core.stores.redis:RedisStore", "redis"),
    "valkey": ("anarchon_core.stores.redis:RedisStore", "valkey"),
    "valkeys": ("anarchon_core.stores.redis:RedisStore", "valkey"),
    "postgresql": ("anarchon_core.stores.postgres:PostgresStore", "postgres"),
    "postgres": ("anarchon_core.stores.postgres:PostgresStore", "postgres"),
    "libsql": ("anarchon_core.stores.libsql:LibSQLStore", "libsql"),
    "http": ("anarchon_core.stores.libsql:LibSQLStore", "libsql"),
    "https": ("anarchon_core.stores.libsql:LibSQLStore", "libsql"),
    "nats": ("anarchon_core.stores.nats:NatsStore", "nats"),
    "amqp": ("anarchon_core.stores.rabbitmq:RabbitMQStore", "rabbitmq"),
    "amqps": ("anarchon_core.stores.rabbitmq:RabbitMQStore", "rabbitmq"),
}


_SECRET_PARAMS = re.compile(r"(?i)(token|password|passwd|secret|key)")


def redact(url: str) -> str:
    """``url`` with any password or token replaced by ``***``, safe to log or print."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret = [k for k, _ in query if _SECRET_PARAMS.search(k)]
    if parts.password is None and not secret:
        return url
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    if secret:
        hidden = [(k, "***" if k in secret else v) for k, v in query]
        parts = parts._replace(query=urlencode(hidden, safe="*"))
    return urlunsplit(parts)


def scrub(text: str, secret: str | None) -> str:
    """``text`` (a driver's message) with ``secret`` replaced by ``***``.

    The secret is replaced as given and as it may appear percent-encoded or
    decoded, the longest form first.
    """
    if secret:
        forms = {secret, unquote(secret), quote(secret, safe="")}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, "***")
    return text


_NAMESPACE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


def check_namespace(namespace: str) -> str:
    """Namespaces end up in keys and table names: keep them plain."""
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise ConfigurationError(
            f"namespace {namespace!r}: use 1-100 letters, digits, '_', '-', '.' or ':'"
        )
    return namespace


def store_class(url: str) -> type[Store]:
    """The store class for ``url``'s scheme, imported on demand."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise ConfigurationError(
            f"unsupported store URL {redact(url)!r}: the scheme must be one of {known}"
        )
    target, extra = SCHEMES[scheme]
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'anarchon[{extra}]'" if extra else "reinstall anarchon"
        raise MissingDependency(
            f"the {scheme}:// store needs a driver that is not installed ({exc.name}): {hint}"
        ) from exc
    cls: type[Store] = getattr(module, class_name)
    return cls


def open_store(url: str, *, namespace: str = "default", **options: Any) -> Store:
    """A store for ``url``, bound to ``namespace``. Options go to the store class."""
    if not isinstance(url, str):
        raise ConfigurationError(f"store URL {url!r}: expected a string")
    cls = store_class(url)
    return cls.from_url(url, namespace=check_namespace(namespace), **options)
