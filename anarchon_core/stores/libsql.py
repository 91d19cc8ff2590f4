"""libSQL: a sqld server (or Turso) reached over HTTP with the ``libsql`` client.

URL: ``http://host:port`` for a plain sqld, ``https://...`` or ``libsql://...``
for TLS (Turso); an auth token may be given as ``?authToken=...`` or the
``auth_token=`` option, and is never printed.

The statements are the SQLite store's, shared in ``_sql``: the server runs
SQLite, each step is one statement in its own ``BEGIN IMMEDIATE`` transaction
(sqld keeps it on one stream), the history follows by triggers, and lease
expiry is judged by the server's ``julianday('now')``. Unlike a local SQLite
file, instances on many machines can share one sqld.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import libsql

from ..durations import store_timeout
from ..errors import ConfigurationError
from ..urls import redact, url_options
from .sqlite import SQLDialectStore


class LibSQLStore(SQLDialectStore):
    """The store contract on a libSQL server."""

    # The libsql client reports transport and server errors as ValueError ("Hrana: ...").
    _unavailable = (ValueError,)

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "default",
        auth_token: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(namespace=namespace)
        self.url = url
        if auth_token and not (auth_token.isascii() and auth_token.isprintable()):
            raise ConfigurationError(
                "libSQL authToken: expected printable ASCII (it is sent in an HTTP header)"
            )
        self._auth_token = auth_token or ""
        self._secrets = [auth_token] if auth_token else []
        self.timeout = store_timeout("timeout", timeout)
        # No call here: like the other network stores, the first call connects
        # (an unreachable server is then an outage the engine rides out).

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> LibSQLStore:
        parts = urlsplit(url)
        if not parts.hostname:
            raise ConfigurationError(f"libSQL URL {redact(url)!r}: expected a host")
        for key, value in url_options(url, "libSQL", ("authToken", "timeout")):
            options.setdefault("auth_token" if key == "authToken" else key, value)
        plain = urlunsplit(parts._replace(query=""))
        return cls(plain, namespace=namespace, **options)

    def _connect(self) -> Any:
        return libsql.connect(
            self.url, isolation_level=None, auth_token=self._auth_token, timeout=self.timeout
        )

    def _begin(self, write: bool) -> Any:
        reused = self._conn is not None
        try:
            return super()._begin(write)
        except ValueError:
            if not reused:
                raise
            # sqld closes idle streams: one retry on a fresh connection, since a
            # failed BEGIN had no effect.
            self._drop_connection()
            return super()._begin(write)

    def __repr__(self) -> str:
        return f"<LibSQLStore {redact(self.url)!r} namespace={self.namespace!r}>"
