"""RabbitMQ: a claim-only store. It picks the one winner of each slot, nothing more.

URL: ``amqp://user:password@host:5672/vhost`` (``amqps://`` for TLS; the
default vhost ``/`` is written ``//``), optionally with ``?expires=24h`` (how
long each slot's queue lives, default 24 h, at least 1 minute) and
``?timeout=5s`` (connect, socket and publisher-confirm timeout, default 5 s).
Or pass ``connection=`` an existing :class:`kombu.Connection` using the
``amqp``/``pyamqp`` transport (e.g. one built with TLS options); the store
then opens one channel of its own on it and closes only that channel.

**A claim** is one small classic queue per (namespace, job, slot), named
``anarchon.<namespace>.<sha256(job)[:32]>.<slot_ms>`` and declared durable
with ``x-max-length=1``, ``x-overflow=reject-publish``,
``x-queue-type=classic`` and ``x-expires``; then one persistent JSON message
(``{"owner", "job", "slot"}``) is published to it with ``mandatory`` and
publisher confirms. The broker accepts exactly one message into the queue: an
``ack`` means this instance won, a ``nack`` means another one did (8 racing
publishers give 1 ack and 7 nacks; quorum queues may overshoot the limit, so
never those). ``claim_many`` does this per slot on one channel, each claim
atomic on its own. A won claim reports attempt 1, ``token == slot_ms`` (so
tokens still rise with every claim of a job) and ``lease_remaining`` 0; a lost
one reports TAKEN with no holder (the broker does not say who won).

**There is no lease.** The store is a :class:`~anarchon_core.store.ClaimOnlyStore`,
no :class:`~anarchon_core.store.LeaseStore`: it has no lease step (renew,
dispatch, finish, release, takeover), and the engine sends it none: a run's
end is told by its event alone; ``states``, ``history`` and ``jobs`` are
empty: nothing is recorded but the queues. The failure scenarios of
``docs/failure-scenarios.md`` on RabbitMQ:

- normal slot, N instances: exactly one runs it. **Holds.**
- rolling deploy: claims are by slot id, no slot runs twice. **Holds.**
- clock skew: no double run (claims are by slot id); an instance with a fast
  clock merely claims early. **Holds.**
- store unreachable: the scheduler backs off and never runs a slot it could
  not claim. **Holds.** A claim whose confirm was lost with the connection,
  or that the broker nacked for an error of its own, counts as not won: the
  slot may then run nowhere, never twice.
- job longer than its interval: **does not hold.** Nothing marks a run as
  still going, so the next slot starts while the previous run continues.
- winner killed, frozen, stopped gracefully, or all instances restarted
  mid-run: **does not hold.** The run is lost; nothing takes it over.
- all instances down when a slot was due: **does not hold.** No record of past
  runs is kept, so nothing is caught up after a total downtime.

**Queues accumulate.** Each slot leaves one queue (holding one message) that
lives until ``x-expires`` after its last use: a job every 10 s keeps about
8,640 queues with the 24 h default. On RabbitMQ 3.10 an idle queue of this
kind measured about 30 KB of broker memory, so that is some 250 MB for that
one job. ``expires`` trades this memory for safety: once a slot's queue has
expired, a late instance could win that slot again. It must exceed the
longest time after its slot that any instance may still claim it (the job's
catch-up window, at most 1 h by default, plus jitter and clock skew): 2 h is
plenty for frequent jobs with default settings. All instances of a namespace
should use the same value; where they differ (during a deploy that changes
it), the queue keeps the arguments of its first declaration and the others
claim it as it is.

Queues and messages are durable, so a broker restart forgets no claim (each
won claim waits for the broker's disk write, about 3 ms on a local broker).
Connection errors, timeouts and broker restarts raise
:class:`~anarchon_core.errors.StoreUnavailable`; a call that fails on a reused
connection is retried once at once on a new one (unless it timed out), and
later calls reconnect by themselves.
No AMQP heartbeats are used (a synchronous store cannot send them between
slots); a connection dropped while idle is noticed and replaced on its next
use.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from amqp import Message
from amqp.exceptions import (
    AMQPError,
    MessageNacked,
    PreconditionFailed,
)
from kombu.connection import Connection
from kombu.exceptions import KombuError
from kombu.transport.pyamqp import Transport as PyAMQPTransport

from ..durations import Duration, parse_duration, store_timeout
from ..errors import ConfigurationError, StoreUnavailable
from ..store import Claim, ClaimOnlyStore, ClaimRequest, ClaimStatus, JobState, RunState
from ..urls import redact, scrub, url_options
from ._lock import CallLock

#: The version of the layout this store writes in the server (keys, tables, records),
#: as docs/upgrading.md lists it: raised with every change of that layout.
LAYOUT_VERSION = 1

log = logging.getLogger(__name__)

DEFAULT_EXPIRES = 24 * 3600.0
DEFAULT_TIMEOUT = 5.0
MIN_EXPIRES = 60.0
#: The longest a slot's queue may be kept (seconds): a year.
MAX_EXPIRES = 365 * 86400.0

#: What the driver raises when the broker is unreachable, slow or gone.
_UNAVAILABLE = (OSError, AMQPError, KombuError)

T = TypeVar("T")


class RabbitMQStore(ClaimOnlyStore):
    """Claims slots as single-message RabbitMQ queues. See the module docstring."""

    def __init__(
        self,
        *,
        namespace: str = "default",
        url: str | None = None,
        connection: Connection | None = None,
        expires: Duration = DEFAULT_EXPIRES,
        timeout: Duration = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(namespace=namespace)
        if (url is None) == (connection is None):
            raise ConfigurationError("RabbitMQStore: pass either url= or connection=")
        self.expires = parse_duration("expires", expires)
        self.timeout = store_timeout("timeout", timeout)
        if self.expires > MAX_EXPIRES:
            raise ConfigurationError(
                f"expires={expires!r}: at most {MAX_EXPIRES / 86400:.0f} days (RabbitMQ's limit"
                " for a queue's expiry is 3650 days)"
            )
        if self.expires < MIN_EXPIRES:
            raise ConfigurationError(
                f"expires={expires!r}: a slot's queue must outlive any late claim of it"
                f" (at least {MIN_EXPIRES:.0f}s; see the RabbitMQ store docs)"
            )
        self._owns = connection is None
        if connection is None:
            assert url is not None
            self._shown = redact(url)
            connection = Connection(  # type: ignore[no-untyped-call]
                url,
                connect_timeout=self.timeout,
                heartbeat=0,
                transport_options={
                    "confirm_publish": True,
                    # Socket timeouts bound every synchronous AMQP method.
                    "read_timeout": self.timeout,
                    "write_timeout": self.timeout,
                    "client_properties": {"connection_name": f"anarchon {namespace}"},
                },
            )
        else:
            self._shown = redact(connection.as_uri())
        # Scrubbed from error messages too, in case a driver ever quotes it.
        password = connection.password
        self._password = password if isinstance(password, str) else ""
        if not isinstance(connection.transport, PyAMQPTransport):
            raise ConfigurationError(
                f"RabbitMQStore needs kombu's py-amqp transport, not {connection.transport_cls!r}"
            )
        self._conn: Any = connection
        self._channel: Any = None
        self._calls = CallLock()
        self._arguments = {
            "x-max-length": 1,
            "x-overflow": "reject-publish",
            "x-queue-type": "classic",
            "x-expires": int(self.expires * 1000),
        }

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> RabbitMQStore:
        """``amqp://user:password@host:port/vhost?expires=24h&timeout=5s``."""
        parts = urlsplit(url)
        for key, value in url_options(url, "AMQP", ("expires", "timeout")):
            options.setdefault(key, value)
        bare = urlunsplit(parts._replace(query=""))
        return cls(url=bare, namespace=namespace, **options)

    def queue_name(self, job: str, slot_ms: int) -> str:
        """The queue that stands for ``slot_ms`` of ``job`` (under 170 of the 255 bytes allowed)."""
        # A fixed-width digest keeps any job name short, safe and unambiguous.
        digest = hashlib.sha256(job.encode()).hexdigest()[:32]
        return f"anarchon.{self.namespace}.{digest}.{slot_ms}"

    @property
    def queue_arguments(self) -> dict[str, Any]:
        """The arguments every claim queue is declared with."""
        return dict(self._arguments)

    # -- the connection ---------------------------------------------------

    def _open_channel(self) -> Any:
        if self._channel is None:
            # One attempt, no kombu retry loop: the engine does the backing off.
            self._conn.ensure_connection(max_retries=0, timeout=self.timeout)
            self._channel = self._conn.channel()
        return self._channel

    def _drop(self) -> None:
        channel, self._channel = self._channel, None
        # Already failing: the original error is the one to report.
        if channel is not None:
            with contextlib.suppress(Exception):
                channel.collect()
        if self._owns:
            with contextlib.suppress(Exception):
                self._conn.collect()

    def _call(self, step: Callable[[Any], T]) -> T:
        """Run ``step`` on the channel; a reused connection that fails gets one fresh retry.

        A retry is safe: publishing to a slot's queue twice can never make two
        winners, at worst a claim won before the failure reports TAKEN.
        """
        with self._calls.held():
            while True:
                fresh = self._channel is None
                try:
                    return step(self._open_channel())
                except _UNAVAILABLE as exc:
                    self._drop()
                    # A timeout is not retried: the call would only wait as long again.
                    if not fresh and not isinstance(exc, TimeoutError):
                        log.debug("anarchon: RabbitMQ connection lost (%s), reconnecting", exc)
                        continue
                    message = scrub(str(exc) or type(exc).__name__, self._password)
                    raise StoreUnavailable(f"RabbitMQ at {self._shown}: {message}") from exc

    def ping(self) -> None:
        """Connect (credentials and virtual host checked) and open a channel."""
        self._call(lambda channel: None)

    # -- claims -------------------------------------------------------------

    def _publish(self, channel: Any, name: str, body: str) -> bool:
        """True if the broker took the message into the queue (ack), False if not (nack)."""
        message = Message(body, content_type="application/json", delivery_mode=2)
        try:
            # mandatory: a vanished queue is an error, never a silent "ack".
            channel.basic_publish_confirm(
                message,
                exchange="",
                routing_key=name,
                mandatory=True,
                timeout=self.timeout,
                confirm_timeout=self.timeout,
            )
        except MessageNacked:
            return False
        return True

    def _claim(self, channel: Any, job: str, slot_ms: int, owner: str) -> Claim:
        name = self.queue_name(job, slot_ms)
        body = json.dumps({"owner": owner, "job": job, "slot": slot_ms})
        # The declare is not waited for: the broker handles a channel's methods
        # in order, so the publish's confirm answers for both (one round trip).
        channel.queue_declare(
            queue=name, durable=True, auto_delete=False, arguments=self._arguments, nowait=True
        )
        try:
            won = self._publish(channel, name, body)
        except PreconditionFailed:
            # Declared first by an instance configured with another expiry. The
            # broker closed the channel, discarding the publish, and py-amqp
            # reopened it: claim the queue as it is (a passive declare only
            # checks that it exists).
            log.warning("anarchon: queue %s has other arguments; claiming it as it is", name)
            channel.queue_declare(queue=name, passive=True)
            won = self._publish(channel, name, body)
        if not won:
            log.debug("anarchon: %s slot %d taken", job, slot_ms)
            return Claim(ClaimStatus.TAKEN, None)
        log.debug("anarchon: %s slot %d won by %s", job, slot_ms, owner)
        return Claim(
            ClaimStatus.WON, JobState(job, slot_ms, owner, 1, slot_ms, RunState.RUNNING, 0.0)
        )

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """Win each slot no one has, in turn on one channel; a retry resumes where it failed.

        ``lease`` is ignored (no lease).
        """
        claims: list[Claim] = []

        def step(channel: Any) -> list[Claim]:
            for r in requests[len(claims) :]:
                claims.append(self._claim(channel, r.job, r.slot_ms, owner))
            return claims

        return self._call(step) if requests else []

    def close(self) -> None:
        """Close this store's channel, and the connection if the store opened it.

        A call still using them (hung, or interrupted by the signal handler that
        closes the store) closes them when it ends.
        """
        self._calls.close(self._close_now)

    def _close_now(self) -> None:
        channel, self._channel = self._channel, None
        with contextlib.suppress(*_UNAVAILABLE):
            if channel is not None:
                channel.close()
            if self._owns:
                self._conn.release()

    def __repr__(self) -> str:
        return f"<RabbitMQStore {self._shown} namespace={self.namespace!r}>"
