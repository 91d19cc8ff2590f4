"""libSQL: a sqld server (or Turso) reached over HTTP (Hrana, in ``_hrana``).

URL: ``http://host:port`` for a plain sqld, ``https://...`` or ``libsql://...``
for TLS (Turso); an auth token may be given as ``?authToken=...`` or the
``auth_token=`` option, and is never printed.

The statements are the SQLite store's, shared in ``_sql``: the server runs
SQLite; each write step is one request holding its whole ``BEGIN IMMEDIATE``
transaction (``_write``), reads run on one stream; the history follows by
triggers, and lease expiry is judged by the server's ``julianday('now')``.
Unlike a local SQLite file, instances on many machines can share one sqld.
Every socket operation waits at most ``timeout`` seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..durations import store_timeout
from ..errors import ConfigurationError
from ..urls import redact, url_options
from ._hrana import HranaConnection, HranaError
from .sqlite import Rows, SQLDialectStore


class LibSQLStore(SQLDialectStore):
    """The store contract on a libSQL server."""

    _unavailable = (HranaError,)

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

    def _connect(self) -> HranaConnection:
        return HranaConnection(self.url, auth_token=self._auth_token, timeout=self.timeout)

    def _write(self, statements: Sequence[tuple[str, dict[str, Any]]]) -> list[Rows]:
        """The whole transaction in one request (see ``HranaConnection.batch``).

        Not retried on a fresh connection when it fails: it may have run.
        """
        with self._guarded():
            if self._conn is None:
                self._conn = self._connect()
            bound = [self._bind(sql, values) for sql, values in statements]
            return [Rows(rows, count) for rows, count in self._conn.batch(bound)]

    def _begin(self, write: bool) -> Any:
        reused = self._conn is not None
        try:
            return super()._begin(write)
        except HranaError:
            if not reused:
                raise
            # A server closes idle connections: one retry on a fresh connection,
            # since a failed BEGIN had no effect.
            self._drop_connection()
            return super()._begin(write)

    def __repr__(self) -> str:
        return f"<LibSQLStore {redact(self.url)!r} namespace={self.namespace!r}>"
