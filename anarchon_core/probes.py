"""An HTTP endpoint beside a scheduler: ``/metrics``, ``/healthz`` and ``/readyz``.

:func:`serve` starts it in a thread of the scheduler's process:

- ``/healthz`` answers 200 while the scheduling loop steps (a step began
  within :data:`~anarchon_core.scheduler.LOOP_STALL` seconds), else 503:
  a Kubernetes liveness probe. A frozen process does not answer at all,
  which the probe counts as a failure too.
- ``/readyz`` answers 200 while the loop steps and the store answered its
  last step, else 503: a readiness probe. While the store is down,
  ``/healthz`` still answers 200 and says so (``ok: live; store down``):
  restarting the process would not bring the store back.
- ``/metrics``: the :class:`~anarchon_core.metrics.Metrics` of the
  scheduler, in Prometheus' text format (needs the ``metrics`` extra).

Each answer is one short line of text; nothing else is served (404).

:class:`OutageLog` says, at ERROR every minute while it lasts, that the store
does not answer: a scheduler rides out a store that is down (at start too: a
store may come up after the pods), and sends nothing meanwhile.
"""

from __future__ import annotations

import logging
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .errors import ConfigurationError
from .urls import redact

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
    scheduler: Scheduler, metrics: Metrics | None = None, fail_behind: float | None = None
) -> Callable[..., Iterable[bytes]]:
    """The WSGI app answering ``/healthz``, ``/readyz`` and (with ``metrics``) ``/metrics``.

    With ``fail_behind``, ``/readyz`` also fails while the instance runs
    behind by more than that many seconds (:attr:`~anarchon_core.events.Health.behind`).
    """

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", "GET only\n")
        if path in ("/healthz", "/readyz"):
            health = scheduler.health()
            ok = health.live if path == "/healthz" else health.ready
            status = "200 OK" if ok else "503 Service Unavailable"
            said = f"{'ok' if ok else 'failing'}: {health.detail}"
            if ok and path == "/readyz" and fail_behind is not None and health.behind > fail_behind:
                status = "503 Service Unavailable"
                said = (
                    f"failing: behind by {health.behind:.1f}s (more than {fail_behind:g}s):"
                    f" claims deferred ({health.deferred} so far)"
                )
            if ok and not health.ready:
                # Alive while the store is down: "ok" must not read as the store's answer.
                said = "ok: live; store down: no slot is claimed until it answers"
            return _answer(start_response, status, said + "\n")
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
    fail_behind: float | None = None,
) -> ProbeServer:
    """Serve the probes (and the metrics, unless ``metrics=False``) on ``host:port``.

    ``fail_behind``: ``/readyz`` fails while the instance's own renewals and
    finishes run later than this many seconds (it defers its claims then).

    ``port=0`` picks a free port (see :attr:`ProbeServer.port`). ``host``
    defaults to every interface, so that Prometheus and the kubelet reach
    the pod; the endpoint shows job names and counts, and changes nothing.
    """
    check_port(port)
    if fail_behind is not None and (
        not isinstance(fail_behind, (int, float))
        or isinstance(fail_behind, bool)
        or not fail_behind > 0
    ):
        raise ConfigurationError(
            f"fail_behind={fail_behind!r}: expected a number of seconds above 0, or None"
        )
    chosen: Metrics | None
    if metrics is True:
        from .metrics import Metrics

        chosen = Metrics(scheduler)
    else:
        chosen = metrics or None
    try:
        server = make_server(
            host,
            port,
            probe_app(scheduler, chosen, fail_behind),
            server_class=_Server,
            handler_class=_Quiet,
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


#: How often, in seconds, :class:`OutageLog` says that the store still does not answer.
OUTAGE_REPORT = 60.0


class OutageLog:
    """Says at ERROR, every ``every`` seconds while it lasts, that the store does not answer.

    A scheduler waits a store out rather than stop (the store may come up
    after the pods, or come back after a failover), and claims and sends
    nothing meanwhile; the engine warns once per outage. This keeps saying
    it, with the store's URL (its password redacted) and how long it has
    lasted: at once when the store has not answered since the scheduler
    started (a wrong URL or port looks like this), else once it has lasted
    ``every`` seconds. Call :meth:`check` after each scheduling step, or
    every second or so from the thread that watches the scheduler.
    """

    def __init__(self, scheduler: Scheduler, url: str, every: float = OUTAGE_REPORT) -> None:
        self.scheduler = scheduler
        self.url = redact(url)
        self.every = every
        self._answered = False  # the store answered a step since the start
        self._since: float | None = None  # when the outage under way began (monotonic)
        self._said: float | None = None  # when it was last said

    def check(self) -> None:
        """Log the outage under way if it is time to, or its end."""
        health = self.scheduler.health()
        now = self.scheduler.clock.monotonic()
        if not health.live:
            return  # not started yet, or stalled: the liveness probe's matter
        if health.ready:
            if self._said is not None and self._since is not None:
                log.info(
                    "anarchon: the store %s answers again, after %s",
                    self.url,
                    _took(now - self._since),
                )
            self._answered, self._since, self._said = True, None, None
            return
        if self._since is None:
            self._since = now
        lasted = now - self._since
        due = self._said + self.every if self._said is not None else None
        if (due is None and (not self._answered or lasted >= self.every)) or (
            due is not None and now >= due
        ):
            self._said = now
            log.error(
                "anarchon: the store %s has not answered for %s%s: no slot is claimed or sent"
                " until it does (waiting for it; check the URL and that the store is up)",
                self.url,
                _took(lasted),
                "" if self._answered else ", since this scheduler started",
            )


def _took(seconds: float) -> str:
    """A duration as a person reads it in a log: ``45s``, ``3m05s``."""
    whole = int(seconds)
    return f"{whole}s" if whole < 60 else f"{whole // 60}m{whole % 60:02d}s"
