"""A libSQL client over HTTP (sqld's Hrana pipeline protocol), bounded in time.

The subset of a DB-API connection the SQLite dialect store uses:
``execute(sql, params)`` returning a cursor with ``fetchone``, ``fetchall``
and ``rowcount``, then ``commit``, ``rollback`` and ``close``. Each
``execute`` is one ``POST /v2/pipeline``; the statements of one transaction
share a server-side stream, named by the baton each answer carries, and
``commit``/``rollback`` close it.

Every socket operation (connect, send, each read) waits at most ``timeout``
seconds, and Python's sockets release the global interpreter lock while they
wait: a server that stops answering costs one call its timeout, never the
process its other threads.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from ..urls import scrub

PIPELINE = "/v2/pipeline"


class HranaError(Exception):
    """The server refused a statement or the request, or could not be reached in time."""


class Cursor:
    """The rows of one statement's result."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows


def _arg(value: Any) -> dict[str, Any]:
    if value is None:
        return {"type": "null"}
    if isinstance(value, bool | int):
        return {"type": "integer", "value": str(int(value))}
    if isinstance(value, float):
        return {"type": "float", "value": value}
    if isinstance(value, str):
        return {"type": "text", "value": value}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"type": "blob", "base64": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"libSQL: cannot bind a value of type {type(value).__name__}")


def _value(cell: dict[str, Any]) -> Any:
    kind = cell.get("type")
    if kind == "null":
        return None
    if kind == "integer":
        return int(cell["value"])
    if kind == "float":
        return float(cell["value"])
    if kind == "text":
        return str(cell["value"])
    if kind == "blob":
        return base64.b64decode(cell.get("base64", ""))
    raise HranaError(f"libSQL: unexpected value type {kind!r} in an answer")


def _rows(result: dict[str, Any]) -> tuple[list[tuple[Any, ...]], int]:
    """A statement result's rows, and how many rows it changed."""
    rows = [tuple(_value(cell) for cell in row) for row in result["rows"]]
    return rows, int(result.get("affected_row_count") or 0)


class HranaConnection:
    """One HTTP connection to a sqld server; see the module docstring."""

    def __init__(self, url: str, *, auth_token: str = "", timeout: float) -> None:
        parts = urlsplit(url)
        self._tls = parts.scheme in ("https", "libsql")
        self._host = parts.hostname or ""
        self._port = parts.port
        self._auth_token = auth_token
        self.timeout = timeout
        self._http: http.client.HTTPConnection | None = None
        #: The open stream of the transaction under way, if any.
        self._baton: str | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._http is None:
            kind = http.client.HTTPSConnection if self._tls else http.client.HTTPConnection
            self._http = kind(self._host, self._port, timeout=self.timeout)
        return self._http

    def _pipeline(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send ``requests`` on the current stream; each one's answer, in order."""
        body = json.dumps({"baton": self._baton, "requests": requests}).encode()
        headers = {"Content-Type": "application/json"}
        if self._auth_token:
            headers["Authorization"] = f"Bearer {self._auth_token}"
        connection = self._connection()
        try:
            connection.request("POST", PIPELINE, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            # Whatever was sent may or may not have run: the stream is gone.
            self._reset()
            said = "timed out" if isinstance(exc, socket.timeout) else str(exc) or repr(exc)
            raise self._error(said) from None
        if response.status != 200:
            self._baton = None
            text = data.decode("utf-8", "replace").strip()[:500]
            raise self._error(f"HTTP {response.status}: {text}")
        try:
            answer = json.loads(data)
            self._baton = answer.get("baton")
            if answer.get("base_url"):
                raise self._error("the server redirects streams (base_url), not supported")
            results = answer["results"]
            assert isinstance(results, list) and len(results) == len(requests)
        except (ValueError, KeyError, TypeError, AssertionError, AttributeError):
            self._reset()
            raise self._error("the server's answer is not a Hrana pipeline answer") from None
        return results

    def _refused(self, error: Any, what: str) -> HranaError:
        """The server's ``error`` of a request or step, saying its message, else ``what``."""
        said = error.get("message") if isinstance(error, dict) else None
        return self._error(str(said or what))

    def _error(self, said: str) -> HranaError:
        """An error saying ``said`` (a server's text may quote the token: never shown)."""
        return HranaError(f"libSQL: {scrub(said, self._auth_token)}")

    def _reset(self) -> None:
        self._baton = None
        http_connection, self._http = self._http, None
        if http_connection is not None:
            http_connection.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        stmt = {"sql": sql, "args": [_arg(v) for v in params], "want_rows": True}
        (result,) = self._pipeline([{"type": "execute", "stmt": stmt}])
        if result.get("type") != "ok":
            raise self._refused(result.get("error"), "the statement failed")
        try:
            return Cursor(*_rows(result["response"]["result"]))
        except (KeyError, TypeError, ValueError):
            raise self._error("the server's answer is not a statement result") from None

    def batch(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[tuple[list[Any], int]]:
        """Run ``statements`` in one write transaction, sent as one request.

        The server runs ``BEGIN IMMEDIATE``, each statement while the previous
        one succeeded, ``COMMIT`` after the last, ``ROLLBACK`` unless the
        commit succeeded, and closes the stream: SQLite's write lock is held
        for the server's work alone, never across a round trip. Each
        statement's rows and count of rows changed; the first error raised.
        """
        if self._baton is not None:
            raise self._error("a batch cannot run inside an open transaction")
        steps: list[dict[str, Any]] = [{"stmt": {"sql": "BEGIN IMMEDIATE"}}]
        for sql, params in statements:
            stmt = {"sql": sql, "args": [_arg(v) for v in params], "want_rows": True}
            steps.append({"stmt": stmt, "condition": {"type": "ok", "step": len(steps) - 1}})
        commit = len(steps)
        steps.append({"stmt": {"sql": "COMMIT"}, "condition": {"type": "ok", "step": commit - 1}})
        undo = {"type": "not", "cond": {"type": "ok", "step": commit}}
        steps.append({"stmt": {"sql": "ROLLBACK"}, "condition": undo})
        result, _closed = self._pipeline(
            [{"type": "batch", "batch": {"steps": steps}}, {"type": "close"}]
        )
        self._baton = None
        if result.get("type") != "ok":
            raise self._refused(result.get("error"), "the batch failed")
        try:
            answer = result["response"]["result"]
            outcomes, errors = answer["step_results"], answer["step_errors"]
            for error in errors[: commit + 1]:
                if error:
                    raise self._refused(error, "a statement failed")
            if outcomes[commit] is None:
                raise self._error("the batch was not committed")
            return [_rows(outcome) for outcome in outcomes[1:commit]]
        except (KeyError, TypeError, ValueError, IndexError):
            raise self._error("the server's answer is not a batch result") from None

    def _end(self, sql: str) -> None:
        # Without a stream a COMMIT fails on the server ("no transaction is
        # active"): a transaction whose stream was lost never reads as committed.
        results = self._pipeline([{"type": "execute", "stmt": {"sql": sql}}, {"type": "close"}])
        self._baton = None
        for result in results:
            if result.get("type") != "ok":
                raise self._refused(result.get("error"), f"{sql} failed")

    def commit(self) -> None:
        self._end("COMMIT")

    def rollback(self) -> None:
        if self._baton is not None:  # else the server ends the lost stream's transaction
            self._end("ROLLBACK")

    def close(self) -> None:
        """Close the HTTP connection; an open stream lapses on the server."""
        self._reset()
