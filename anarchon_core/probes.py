"""An HTTP endpoint beside a scheduler: ``/metrics``, ``/healthz`` and ``/readyz``.

:func:`serve` starts it in a thread of the scheduler's process:

- ``/healthz`` answers 200 while the scheduling loop steps (a step began
  within :data:`~anarchon_core.scheduler.LOOP_STALL` seconds), else 503:
  a Kubernetes liveness probe. A frozen process does not answer at all,
  which the probe counts as a failure too.
- ``/readyz`` answers 200 while the loop steps and the store answered its
  last step, else 503: a readiness probe.
- ``/metrics``: the :class:`~anarchon_core.metrics.Metrics` of the
  scheduler, in Prometheus' text format (needs the ``metrics`` extra).

Each answer is one short line of text; nothing else is served (404).
"""

from __future__ import annotations

import logging
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .metrics import Metrics
    from .scheduler import Scheduler

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def check_port(port: object, what: str = "port") -> int:
    """``port`` if it is a TCP port to serve on, else ConfigurationError naming ``what``.

    The one rule of every setting that says where the probes and metrics are
    served (:func:`serve`'s ``port``, Celery's ``anarchon_metrics_port``, the
    Dramatiq middleware's ``metrics_port``, ``--metrics-port``): an ``int``
    from 0 to 65535, where 0 asks for any free port, as a socket's bind
    does (the port picked is logged; Prometheus and probes need a fixed one).
    Not a ``bool``, a ``float`` or a string.
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigurationError(
            f"{what}={port!r}: expected a TCP port, 0 to 65535 (0: any free port)"
        )
    return port


def probe_app(
    scheduler: Scheduler, metrics: Metrics | None = None
) -> Callable[..., Iterable[bytes]]:
    """The WSGI app answering ``/healthz``, ``/readyz`` and (with ``metrics``) ``/metrics``."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", "GET only\n")
        if path in ("/healthz", "/readyz"):
            health = scheduler.health()
            ok = health.live if path == "/healthz" else health.ready
            status = "200 OK" if ok else "503 Service Unavailable"
            return _answer(
                start_response, status, f"{'ok' if ok else 'failing'}: {health.detail}\n"
            )
        if path == "/metrics" and metrics is not None:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            body = generate_latest(metrics.registry)
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [body]
        return _answer(start_response, "404 Not Found", "not found\n")

    return app


def _answer(start_response: StartResponse, status: str, text: str) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [text.encode()]


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("anarchon probes: " + format, *args)


class ProbeServer:
    """The endpoint's server, running in a daemon thread until :meth:`close`."""

    def __init__(self, server: WSGIServer) -> None:
        self._server = server
        self.port: int = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, name="anarchon-probes", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve(
    scheduler: Scheduler,
    port: int,
    host: str = "0.0.0.0",  # noqa: S104 - Prometheus and the kubelet scrape the pod
    *,
    metrics: bool | Metrics = True,
) -> ProbeServer:
    """Serve the probes (and the metrics, unless ``metrics=False``) on ``host:port``.

    ``port=0`` picks a free port (see :attr:`ProbeServer.port`). ``host``
    defaults to every interface, so that Prometheus and the kubelet reach
    the pod; the endpoint shows job names and counts, and changes nothing.
    """
    check_port(port)
    chosen: Metrics | None
    if metrics is True:
        from .metrics import Metrics

        chosen = Metrics(scheduler)
    else:
        chosen = metrics or None
    try:
        server = make_server(
            host, port, probe_app(scheduler, chosen), server_class=_Server, handler_class=_Quiet
        )
    except OSError as exc:
        raise ConfigurationError(f"cannot serve probes on {host}:{port}: {exc.strerror}") from exc
    return ProbeServer(server)


def serve_beside(scheduler: Scheduler, port: int, host: str) -> ProbeServer:
    """:func:`serve` as the integrations' settings ask for it: with the metrics when
    ``prometheus_client`` is installed, else the probes alone (said once, as a warning).

    Port 0 serves on a free port, and says which in a warning: nothing
    else can find it.
    """
    try:
        import prometheus_client  # noqa: F401 - only whether it is there
    except ImportError:
        log.warning(
            "anarchon: prometheus_client is not installed: serving /healthz and /readyz"
            " only on port %s (pip install 'anarchon[metrics]' for /metrics)",
            port,
        )
        server = serve(scheduler, port, host, metrics=False)
    else:
        server = serve(scheduler, port, host)
    if port == 0:
        log.warning("anarchon: metrics port 0: serving on %s:%d, a free port", host, server.port)
    return server
