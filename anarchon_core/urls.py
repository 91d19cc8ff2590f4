"""Store URLs: a scheme table, lazy imports, and an install hint per extra.

Each scheme maps to ``"module:Class"`` plus the extra that installs its
driver, so importing anarchon never imports a driver it does not use.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from .errors import ConfigurationError, MissingDependency
from .names import check_namespace as check_namespace  # importable from here as before
from .store import Store

#: scheme -> (module:Class, extra that installs its driver or None)
SCHEMES: dict[str, tuple[str, str | None]] = {
    "memory": ("anarchon_core.stores.memory:MemoryStore", None),
    "sqlite": ("anarchon_core.stores.sqlite:SQLiteStore", None),
    "redis": ("anarchon_core.stores.redis:RedisStore", "redis"),
    "rediss": ("anarchon_core.stores.redis:RedisStore", "redis"),
    "valkey": ("anarchon_core.stores.redis:RedisStore", "valkey"),
    "valkeys": ("anarchon_core.stores.redis:RedisStore", "valkey"),
    "redis+cluster": ("anarchon_core.stores.redis:RedisStore", "redis"),
    "rediss+cluster": ("anarchon_core.stores.redis:RedisStore", "redis"),
    "valkey+cluster": ("anarchon_core.stores.redis:RedisStore", "valkey"),
    "valkeys+cluster": ("anarchon_core.stores.redis:RedisStore", "valkey"),
    "redis+sentinel": ("anarchon_core.stores.redis:RedisStore", "redis"),
    "rediss+sentinel": ("anarchon_core.stores.redis:RedisStore", "redis"),
    "valkey+sentinel": ("anarchon_core.stores.redis:RedisStore", "valkey"),
    "valkeys+sentinel": ("anarchon_core.stores.redis:RedisStore", "valkey"),
    "postgresql": ("anarchon_core.stores.postgres:PostgresStore", "postgres"),
    "postgres": ("anarchon_core.stores.postgres:PostgresStore", "postgres"),
    "mysql": ("anarchon_core.stores.mysql:MySQLStore", "mysql"),
    "mariadb": ("anarchon_core.stores.mysql:MySQLStore", "mysql"),
    "libsql": ("anarchon_core.stores.libsql:LibSQLStore", None),
    "http": ("anarchon_core.stores.libsql:LibSQLStore", None),
    "https": ("anarchon_core.stores.libsql:LibSQLStore", None),
    "nats": ("anarchon_core.stores.nats:NatsStore", "nats"),
    "amqp": ("anarchon_core.stores.rabbitmq:RabbitMQStore", "rabbitmq"),
    "amqps": ("anarchon_core.stores.rabbitmq:RabbitMQStore", "rabbitmq"),
}


_SECRET_NAME = r"[\w-]*(?:token|password|passwd|secret|key)[\w-]*"  # noqa: S105
#: A query parameter whose name says it holds a secret: ``?authToken=...``.
#: Its value runs to the next parameter; a segment with no '=' after it is taken
#: as the rest of the secret (an unencoded '&' in it).
_SECRET_QUERY = re.compile(rf"(?i)([?&;]{_SECRET_NAME}=)((?:[^&;]|[&;](?=[^=&;]*(?:[&;]|$)))*)")
#: A libpq-style ``key=value`` pair holding a secret: ``password='s3 cr3t'``.
_SECRET_PAIR = re.compile(rf"(?i)(\b{_SECRET_NAME}\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<after>.*)$", re.S)
#: Schemes whose user part alone (``nats://TOKEN@host``) is a secret.
_TOKEN_IN_USER = {"nats", "tls", "ws", "wss"}


def redact(url: str) -> str:
    """``url`` with every password or token replaced by ``***``, safe to log or print.

    Reads the forms stores accept: URLs (``scheme://user:password@host``, several
    comma-separated NATS hosts, secrets in query parameters such as
    ``?password=`` or ``?authToken=``, NATS's ``nats://TOKEN@host``), and
    libpq's ``key=value`` connection strings (``password=...``). A malformed
    URL is redacted as far as it can be read, never returned with its secret.
    """
    if not isinstance(url, str):
        return "<not a string>"
    return _redact(url, [])


def secrets_in(url: str) -> list[str]:
    """The secrets ``url`` holds (passwords, tokens), to scrub from a driver's message."""
    found: list[str] = []
    _redact(url, found)
    return [secret.strip("'") for secret in found if secret.strip("'")]


def _redact(url: str, found: list[str]) -> str:
    """:func:`redact`, appending each secret it hides to ``found``."""

    def hide(match: re.Match[str]) -> str:
        found.append(match.group(2))
        return f"{match.group(1)}***"

    match = _URL.match(url)
    if match is None:  # a libpq connection string, or not a URL at all
        return _SECRET_PAIR.sub(hide, url)
    scheme, after = match["scheme"].lower(), match["after"]
    # The host part ends at the first '/', '?' or '#' after the last '@': a
    # password may hold those characters unencoded (the URL is then refused,
    # but its message must not show them). An '@' in a query value makes this
    # hide too much, never too little.
    at = after.rfind("@")
    end = len(after)
    for delimiter in "/?#":
        found_at = after.find(delimiter, at + 1)
        if found_at != -1:
            end = min(end, found_at)
    netloc, rest = after[:end], after[end:]
    # Only NATS takes several hosts; elsewhere a comma may be part of a password.
    hosts = []
    for host in netloc.split(",") if scheme in _TOKEN_IN_USER else [netloc]:
        user, at, address = host.rpartition("@")
        if at:
            name, colon, password = user.partition(":")
            if colon:
                found.append(password)
                user = f"{name}:***"
            elif scheme in _TOKEN_IN_USER:
                found.append(user)
                user = "***"
            host = f"{user}@{address}"
        hosts.append(host)
    rest = _SECRET_QUERY.sub(hide, rest)
    return f"{match['scheme']}://{','.join(hosts)}{rest}"


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


def url_options(url: str, store: str, accepted: Iterable[str]) -> list[tuple[str, str]]:
    """The query parameters of ``url``, refusing any a ``store`` URL does not take.

    The message names the parameter and lists the accepted ones, so a typo
    fails when the store is opened, not at its first call.
    """
    allowed = list(accepted)
    options = parse_qsl(urlsplit(url).query, keep_blank_values=True)
    previous = ""
    for key, _ in options:
        if key not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            # After a secret, an unknown "option" may be the rest of it, cut by an
            # unencoded '&': not named.
            named = (
                f"{key!r}"
                if not re.search(_SECRET_NAME, previous, re.I)
                else (f"after {previous!r} (percent-encode '&' in secrets as %26)")
            )
            raise ConfigurationError(
                f"{store} URL {redact(url)!r}: unknown option {named} (accepted: {known})"
            )
        previous = key
    return options


def check_url(url: object) -> str:
    """``url`` if it is a string a URL parser can read (host, port), else ConfigurationError."""
    if not isinstance(url, str):
        raise ConfigurationError(f"store URL {url!r}: expected a string")
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise ConfigurationError(
            f"store URL {redact(url)!r}: contains whitespace or control characters"
        )
    unencoded = (
        f"store URL {redact(url)!r}: percent-encode '@', '/', '?' and '#' in user names"
        " and passwords (%40, %2F, %3F, %23); a store URL has no '#' fragment"
    )
    scheme, _, after = url.partition("://")
    credentials = scheme.lower() not in ("sqlite", "memory")  # a file path may hold '@'
    if credentials and any(ch in after[: max(0, after.rfind("@"))] for ch in "/?#"):
        raise ConfigurationError(unencoded)  # before a parser quotes a piece of it
    try:
        parts = urlsplit(url)
        for host in parts.netloc.rpartition("@")[2].split(","):  # NATS, Cluster, Sentinel
            urlsplit(f"//{host}").port  # noqa: B018 - reading it checks it
        parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    except ValueError as exc:
        # Not chained, and scrubbed: the parser's error may quote the URL's secret.
        said = str(exc)
        for secret in secrets_in(url):
            said = scrub(said, secret)
        raise ConfigurationError(f"store URL {redact(url)!r}: {said}") from None
    if "#" in url:
        raise ConfigurationError(unencoded)
    return url


def open_store(url: str, *, namespace: str = "default", **options: Any) -> Store:
    """A store for ``url``, bound to ``namespace``. Options go to the store class.

    The URL is read and checked here (scheme, host, port, query parameters,
    option values), so a mistake fails now with :class:`ConfigurationError`,
    never at the first call.
    """
    cls = store_class(check_url(url))
    namespace = check_namespace(namespace)
    try:
        return cls.from_url(url, namespace=namespace, **options)
    except ConfigurationError as exc:
        shown = redact(url)
        if shown in str(exc) or shown.split("?")[0] in str(exc):
            raise
        # An option's value (``?timeout=zz``): say which URL it came from.
        raise ConfigurationError(f"store URL {shown!r}: {exc}") from None
