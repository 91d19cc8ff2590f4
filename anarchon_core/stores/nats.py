"""NATS JetStream key-value: a full lease through compare-and-set on revisions.

URL: ``nats://[user:password@]host:4222[,host2:4222]`` with the options
``?timeout=3&connect_timeout=2&replicas=1``: ``timeout`` bounds each request
to the server, ``connect_timeout`` each connection attempt, ``replicas`` is the
replication of a bucket this store creates. Tested with NATS 2.9 and 2.15.

Layout: one KV bucket per namespace (``anarchon-`` plus the namespace with
``_`` ``.`` ``:`` escaped as ``__`` ``_d`` ``_c``: injective, and only the
characters bucket names allow), history 1, file storage. One key per job
(``j`` plus the job name in unpadded URL-safe base64). The value is one JSON
record: ``slot_ms, owner, attempt, token, state, lease`` and ``runs``, the last
50 attempts, newest first, so one write covers the record and its history.

Every step is a compare-and-set: read the value and its revision, decide what
the contract allows, then ``create`` (only if the key does not exist) or
``update(key, value, last=revision)`` (only if nobody wrote since). A failed
compare-and-set is never overwritten: the step re-reads and decides again,
which ends at once as taken, busy, stale or refused once someone else won.

The lease clock: NATS has no clock a client can read, and comparing a
message's server timestamp with this machine's wall clock would break under
clock skew. So the **observer's monotonic clock** judges: this store object
remembers, per job, the revision it last saw and when (monotonic) it first
saw it. Every renewal writes a new revision; a running record whose revision
has not changed for ``lease`` seconds of this process's clock has lapsed.
``lease_remaining`` is ``lease - (now - first seen)``. The runner's own
writes count from just before they were sent, so the runner believes its
lease ends before any observer does. Caveats: a fresh observer (a restarted
instance) waits a full lease before it calls a record lapsed, so a takeover
comes up to one lease after the observer first saw the record, and a restarted
instance cannot know that an old run's lease lapsed long ago (it watches it
for one lease instead of catching up at once). ``started_at``/``ended_at`` in
the history are the writer's wall clock, for display only.

nats-py is asyncio-only: each store runs one private event loop in one daemon
thread; the synchronous methods submit coroutines to it and wait at most
``connect_timeout + 2 * timeout``. ``close()`` closes the connection, stops
the loop and joins the thread. While the server is down, calls fail at once
with ``StoreUnavailable`` (no publish is buffered for later) and the client
reconnects in the background; a step that timed out may still have been
applied, and its compare-and-set keeps the record consistent either way.
An existing client can be passed as ``client=`` with the ``loop=`` it runs
on (in another thread); the store then never closes it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import json
import logging
import threading
from collections.abc import Awaitable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.kv import KeyValue

from ..clock import Clock, SystemClock
from ..errors import ConfigurationError, StoreUnavailable
from ..jobs import parse_duration
from ..store import Claim, ClaimRequest, ClaimStatus, JobState, RunRecord, RunState, Store
from ..urls import check_namespace, redact

log = logging.getLogger(__name__)
T = TypeVar("T")
HISTORY = 50
#: Compare-and-set rounds before a step gives up (each lost round means another writer won).
_ROUNDS = 20
_UNAVAILABLE = (nats.errors.Error, OSError, asyncio.TimeoutError)
_Record = dict[str, Any]


def bucket_name(namespace: str) -> str:
    """The namespace's bucket: an injective escape into ``[A-Za-z0-9_-]``."""
    escaped = namespace.replace("_", "__").replace(".", "_d").replace(":", "_c")
    return f"anarchon-{escaped}"


def job_key(job: str) -> str:
    """The job's key: URL-safe base64 is reversible and uses only key characters."""
    return "j" + base64.urlsafe_b64encode(job.encode()).decode().rstrip("=")


def job_name(key: str) -> str | None:
    """The job of a key, or ``None`` for keys this store did not write."""
    if not key.startswith("j"):
        return None
    try:
        raw = key[1:] + "=" * (-(len(key) - 1) % 4)
        return base64.urlsafe_b64decode(raw.encode()).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


class NatsStore(Store):
    """The store contract on a NATS JetStream key-value bucket (see the module docstring)."""

    def __init__(
        self,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        *,
        namespace: str = "default",
        timeout: float = 3.0,
        connect_timeout: float = 2.0,
        replicas: int = 1,
        client: Client | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(namespace=check_namespace(namespace))
        if (client is None) != (loop is None):
            raise ConfigurationError("NatsStore: pass client= together with the loop= it runs on")
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.timeout, self.connect_timeout, self.replicas = timeout, connect_timeout, replicas
        self.bucket = bucket_name(self.namespace)
        self._clock = clock or SystemClock()
        self._client, self._nc = client, client
        self._kv: KeyValue | None = None
        self._setup = asyncio.Lock()
        #: job -> (revision, token, monotonic time this store first saw that revision)
        self._seen: dict[str, tuple[int, int, float]] = {}
        self._closed = False
        self._thread: threading.Thread | None = None
        if loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=loop.run_forever, name=f"anarchon-nats:{self.namespace}", daemon=True
            )
            self._thread.start()
        self._loop = loop

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> NatsStore:
        parts = urlsplit(url)
        if not parts.netloc:
            raise ConfigurationError(f"NATS URL {redact(url)!r}: expected nats://host:port")
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in ("timeout", "connect_timeout"):
                options.setdefault(key, parse_duration(key, value))
            elif key == "replicas" and value.isdigit():
                options.setdefault(key, int(value))
            else:
                raise ConfigurationError(f"NATS URL {redact(url)!r}: bad option {key!r}")
        servers = [f"{parts.scheme}://{host}" for host in parts.netloc.split(",")]
        return cls(servers, namespace=namespace, **options)

    # -- the bridge from synchronous callers to the private loop ------------

    def _run(self, step: Coroutine[Any, Any, T]) -> T:
        try:
            inside = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            inside = False
        if self._closed or inside:
            step.close()
            if inside:
                raise RuntimeError("NatsStore: a synchronous call from its own client's loop")
            raise StoreUnavailable(f"{self!r} is closed")
        deadline = self.connect_timeout + 2 * self.timeout
        future = asyncio.run_coroutine_threadsafe(self._guard(step, deadline), self._loop)
        try:
            return future.result(deadline + 1)
        except TimeoutError as exc:  # the loop itself is stuck: a backstop, not the rule
            future.cancel()
            raise StoreUnavailable(f"NATS: no answer within {deadline}s") from exc
        except concurrent.futures.CancelledError as exc:  # close() from another thread
            raise StoreUnavailable(f"{self!r} was closed during the call") from exc

    async def _guard(self, step: Awaitable[T], deadline: float) -> T:
        try:
            return await asyncio.wait_for(step, deadline)
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"NATS {self.bucket}: {type(exc).__name__} {exc}") from exc

    async def _bucket(self) -> KeyValue:
        async with self._setup:
            if self._nc is not None and self._nc.is_closed and self._client is None:
                self._nc = self._kv = None  # gave up reconnecting (or closed): start afresh
            if self._nc is None:
                self._nc = await self._connect()
            if self._kv is None:
                js = self._nc.jetstream(timeout=self.timeout)
                try:
                    self._kv = await js.key_value(self.bucket)
                except nats.js.errors.BucketNotFoundError:
                    config = api.KeyValueConfig(
                        bucket=self.bucket,
                        history=1,
                        storage=api.StorageType.FILE,
                        replicas=self.replicas,
                        # Reads go to the stream leader: a follower could lag behind.
                        direct=False,
                    )
                    self._kv = await js.create_key_value(config)
            return self._kv

    async def _connect(self) -> Client:
        async def note(exc: Exception) -> None:
            log.debug("anarchon: NATS %s: %s", self.bucket, exc)

        nc = Client()
        try:
            # Reconnects go on forever in the background; without pending_size a
            # publish while disconnected fails at once instead of being replayed later.
            connecting = nc.connect(
                self.servers,
                name=f"anarchon:{self.namespace}",
                connect_timeout=self.connect_timeout,  # type: ignore[arg-type]
                reconnect_time_wait=0.5,  # type: ignore[arg-type]
                max_reconnect_attempts=-1,
                ping_interval=5,
                pending_size=0,
                error_cb=note,
            )
            await asyncio.wait_for(connecting, self.connect_timeout)
        except BaseException:
            await nc.close()
            raise
        return nc

    # -- records and the observer's clock -----------------------------------

    async def _read(self, job: str) -> tuple[_Record, int] | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(job_key(job))
        except nats.js.errors.KeyNotFoundError:
            return None
        assert entry.value is not None and entry.revision is not None
        return json.loads(entry.value), entry.revision

    async def _write(self, job: str, record: _Record, revision: int | None) -> bool:
        """Compare-and-set; on success the observation starts from before the send."""
        kv = await self._bucket()
        sent_at = self._clock.monotonic()
        data = json.dumps(record, separators=(",", ":")).encode()
        try:
            if revision is None:
                new = await kv.create(job_key(job), data)
            else:
                new = await kv.update(job_key(job), data, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        self._seen[job] = (new, record["token"], sent_at)
        return True

    def _state(self, job: str, record: _Record, revision: int) -> JobState:
        seen = self._seen.get(job)
        if seen is None or seen[:2] != (revision, record["token"]):
            seen = self._seen[job] = (revision, record["token"], self._clock.monotonic())
        remaining = record["lease"] - (self._clock.monotonic() - seen[2])
        state = RunState(record["state"])
        return JobState(
            job, record["slot_ms"], record["owner"], record["attempt"], record["token"], state,
            remaining,
        )  # fmt: skip

    def _mine(self, job: str, record: _Record) -> JobState:
        return JobState(
            job, record["slot_ms"], record["owner"], record["attempt"], record["token"],
            RunState.RUNNING, float(record["lease"]),
        )  # fmt: skip

    def _started(
        self, old: _Record | None, ended: RunState, job: str, slot_ms: int, owner: str,
        attempt: int, lease: float,
    ) -> _Record:  # fmt: skip
        """The record of a new attempt; a still-open previous attempt ends as ``ended``."""
        runs = list(old["runs"]) if old else []
        now = self._clock.time()
        if runs and runs[0][6] is None:
            runs[0] = [*runs[0][:4], ended.value, runs[0][5], now]
        token = old["token"] + 1 if old else 1
        runs.insert(0, [slot_ms, attempt, token, owner, RunState.RUNNING.value, now, None])
        return {
            "job": job, "slot_ms": slot_ms, "owner": owner, "attempt": attempt, "token": token,
            "state": RunState.RUNNING.value, "lease": lease, "runs": runs[:HISTORY],
        }  # fmt: skip

    # -- the steps ----------------------------------------------------------

    async def _claim(self, job: str, slot_ms: int, owner: str, lease: float) -> Claim:
        for _ in range(_ROUNDS):
            found = await self._read(job)
            old, revision = found if found else (None, None)
            if old is not None and revision is not None:
                current = self._state(job, old, revision)
                if current.slot_ms == slot_ms:
                    return Claim(ClaimStatus.TAKEN, current)
                if current.slot_ms > slot_ms:
                    return Claim(ClaimStatus.STALE, current)
                if current.state is RunState.RUNNING and current.lease_remaining > 0:
                    return Claim(ClaimStatus.BUSY, current)
            new = self._started(old, RunState.ABANDONED, job, slot_ms, owner, 1, lease)
            if await self._write(job, new, revision):
                return Claim(ClaimStatus.WON, self._mine(job, new))
        raise StoreUnavailable(f"NATS {self.bucket}: claim of {job!r} lost {_ROUNDS} races")

    async def _takeover(
        self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int
    ) -> Claim:
        for _ in range(_ROUNDS):
            found = await self._read(job)
            if found is None:
                return Claim(ClaimStatus.TAKEN, None)
            old, revision = found
            current = self._state(job, old, revision)
            if current.slot_ms != slot_ms or current.token != seen_token or not current.lapsed:
                return Claim(ClaimStatus.TAKEN, current)
            attempt = current.attempt + 1
            new = self._started(old, RunState.LOST, job, slot_ms, owner, attempt, lease)
            if await self._write(job, new, revision):
                return Claim(ClaimStatus.WON, self._mine(job, new))
        raise StoreUnavailable(f"NATS {self.bucket}: takeover of {job!r} lost {_ROUNDS} races")

    async def _change(self, job: str, token: int, lease: float, state: RunState) -> bool:
        for _ in range(_ROUNDS):
            found = await self._read(job)
            if found is None:
                return False
            old, revision = found
            if old["token"] != token or old["state"] != RunState.RUNNING.value:
                return False
            runs = list(old["runs"])
            if state is not RunState.RUNNING and runs and runs[0][2] == token:
                runs[0] = [*runs[0][:4], state.value, runs[0][5], self._clock.time()]
            new = {**old, "state": state.value, "lease": lease, "runs": runs}
            if await self._write(job, new, revision):
                return True
        raise StoreUnavailable(f"NATS {self.bucket}: update of {job!r} lost {_ROUNDS} races")

    async def _states(self, jobs: list[str]) -> dict[str, JobState]:
        found = await asyncio.gather(*(self._read(job) for job in jobs))
        return {job: self._state(job, *f) for job, f in zip(jobs, found, strict=True) if f}

    async def _jobs(self) -> list[str]:
        await self._bucket()
        assert self._nc is not None
        # One request: the stream's subjects are the bucket's keys.
        js = self._nc.jetstream(timeout=self.timeout)
        prefix = f"$KV.{self.bucket}."
        info = await js.stream_info(f"KV_{self.bucket}", subjects_filter=f"{prefix}>")
        names = (job_name(subject[len(prefix) :]) for subject in info.state.subjects or {})
        return sorted(name for name in names if name is not None)

    def claim(self, job: str, slot_ms: int, owner: str, lease: float) -> Claim:
        return self._run(self._claim(job, slot_ms, owner, lease))

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """All claims at once on the loop: one round trip's wait for the whole batch."""

        async def batch() -> list[Claim]:
            steps = (self._claim(r.job, r.slot_ms, owner, r.lease) for r in requests)
            return list(await asyncio.gather(*steps))

        return self._run(batch()) if requests else []

    def takeover(self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int) -> Claim:
        return self._run(self._takeover(job, slot_ms, owner, lease, seen_token))

    def renew(self, job: str, token: int, lease: float) -> bool:
        return self._run(self._change(job, token, lease, RunState.RUNNING))

    def finish(self, job: str, token: int, outcome: RunState) -> bool:
        if outcome not in (RunState.DONE, RunState.FAILED):
            raise ValueError(f"a run finishes as done or failed, not {outcome.value}")
        return self._run(self._change(job, token, 0.0, outcome))

    def release(self, job: str, token: int) -> bool:
        return self._run(self._change(job, token, 0.0, RunState.RELEASED))

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(dict.fromkeys(jobs))
        return self._run(self._states(names)) if names else {}

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        found = self._run(self._read(job))
        runs = found[0]["runs"][:limit] if found else []
        return [RunRecord(job, s, a, t, o, RunState(st), b, e) for s, a, t, o, st, b, e in runs]

    def jobs(self) -> list[str]:
        return self._run(self._jobs())

    def close(self) -> None:
        """Close the connection this store opened, stop its loop and join its thread."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return  # the caller's client and loop: not ours to close
        try:
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            future.result(self.timeout + 1)
        except Exception as exc:  # closing must not fail; the loop still stops below
            log.debug("anarchon: closing NATS %s: %s", self.bucket, exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout + 1)
        if not self._thread.is_alive():
            self._loop.close()

    async def _shutdown(self) -> None:
        nc, self._nc, self._kv = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                await asyncio.wait_for(nc.close(), self.timeout)
            except _UNAVAILABLE as exc:
                log.debug("anarchon: closing NATS %s: %s", self.bucket, exc)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_asyncgens()

    def __repr__(self) -> str:
        return f"<NatsStore {self.bucket} namespace={self.namespace!r}>"
