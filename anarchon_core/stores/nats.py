"""NATS JetStream key-value: a full lease through compare-and-set on revisions.

URL: ``nats://[user:password@]host:4222[,host2:4222]?timeout=3&connect_timeout=2&replicas=1``:
``timeout`` bounds each request, ``connect_timeout`` each connection attempt,
``replicas`` is the replication of a bucket this store creates. Tested with
NATS 2.9 and 2.15; no per-key TTL is used (2.9 has none).

One KV bucket per namespace (``anarchon-`` plus the namespace with ``_ . :``
escaped as ``__ _d _c``: injective, and only characters bucket names allow),
history 1, file storage. One key per job: ``j`` plus the name in unpadded
URL-safe base64. The value is one JSON record (``slot_ms, owner, attempt,
token, state, lease, ended_at``) with ``runs``, the last 50 attempts newest first,
and ``counts`` (the job's counts), so a single write covers the record, its
history and its counts.

Pause marks are the keys ``p`` plus the job's name as in its key (``p`` alone:
the whole namespace); a claim reads them with the record, in each
compare-and-set round. Control entries are the keys ``c.`` plus the entry's
key in the same base64, versioned by their revision.

Every step is a compare-and-set: read the value and its revision, decide as
the contract says (a claim's limit by the counts of the value read), then
``create`` (only if the key does not exist) or
``update(key, value, last=revision)`` (only if nobody wrote since). A lost
compare-and-set is never overwritten: the step reads and decides again.
``renew`` and ``dispatch`` write the state (``running``, ``dispatched``) and
lease of the token's holder, running or dispatched; ``finish``/``release``
end it, and an end the record already has with the token is answered yes
with nothing written (a re-sent end).

The lease clock: NATS has no clock a client can read, and comparing a
message's server time with this machine's wall clock would break under clock
skew. So the **observer's monotonic clock** judges. This store object
remembers per job the revision it last saw and when it first saw it; every
renewal (and dispatch) writes a new revision; a running or dispatched record
whose revision has not changed for ``lease`` seconds of this process's clock
has lapsed
(``lease_remaining = lease - (now - first seen)``). The runner's own writes
count from just before they were sent, so it believes its lease ends before
any observer does. Hence a fresh observer (a restarted instance) waits a full
lease before calling a record lapsed: a takeover comes up to one lease after
the observer first saw the record, and a restarted instance cannot tell that
an old run lapsed long ago (it watches it for one lease). Only for a record
that has *ended* (done, failed, released) is ``lease_remaining`` minus the
time since it ended by the finishing writer's wall clock against this one's:
the engine only uses it to catch up a slot missed after that end, and skew
there can at most skip or add the catch-up of a slot that never ran, never
take a live lease. The history's ``started_at``/``ended_at`` are the
writer's wall clock too.

nats-py is asyncio-only: each store runs one private event loop in one daemon
thread; the synchronous methods submit coroutines to it and wait at most
``connect_timeout + 2 * timeout``; ``close()`` closes the connection, stops the
loop and joins the thread. While the server is down calls fail at once with
``StoreUnavailable`` (nothing is buffered to be sent later) and the client
reconnects in the background. A step that timed out may still have been
applied: the compare-and-set keeps the record consistent, and a claim won
unknowingly is taken over like a crashed run, one lease later. An
existing client may be passed as ``client=`` with the ``loop=`` it runs on (in
another thread): the store then neither closes it nor starts a thread.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.kv import KeyValue

from .. import decide
from ..clock import Clock, SystemClock
from ..decide import Decision, Record
from ..durations import store_timeout
from ..errors import ConfigurationError, Conflict, DamagedRecord, StoreUnavailable
from ..store import (
    HELD_STATES,
    HISTORY,
    Change,
    Claim,
    ClaimRequest,
    ClaimStatus,
    ControlStore,
    InstanceRecord,
    JobState,
    JobStats,
    LeasesByObservation,
    OnceEntry,
    OnceStore,
    RegistryStore,
    RunRecord,
    RunState,
    TakeoverRequest,
    refused_if_any,
)
from ..urls import redact, scrub, secrets_in, url_options

#: The version of the layout this store writes in the server (keys, tables, records),
#: as docs/upgrading.md lists it: raised with every change of that layout.
LAYOUT_VERSION = 2

log = logging.getLogger(__name__)
T = TypeVar("T")
#: Compare-and-set rounds before a step gives up (each lost round means another writer won).
_ROUNDS = 20
_UNAVAILABLE = (nats.errors.Error, OSError, asyncio.TimeoutError)
_Record = dict[str, Any]
_HELD = {state.value for state in HELD_STATES}
#: A step's decision from the record read: the record to write (None: write
#: nothing) and the answer, given once the write (if any) succeeded.
_Decide = Callable[[_Record | None, JobState | None], tuple[_Record | None, T]]


def _each_answered(answers: list[T | BaseException]) -> list[T]:
    """The answers of a batch's steps run together: a damaged record is its step's
    refusal; any other error (an outage, a cancelled step, a bug) is raised."""
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, DamagedRecord):
            raise answer
    return refused_if_any(answers)


#: The fields of a job's record, and the types each must have.
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "slot_ms": int,
    "owner": str,
    "attempt": int,
    "token": int,
    "state": str,
    "lease": (int, float),
    "runs": list,
}


def _decoded(job: str, value: bytes) -> _Record:
    """The record of ``job`` from its value, or DamagedRecord if no store step wrote it."""
    try:
        record = json.loads(value)
    except ValueError as exc:
        raise DamagedRecord(f"the record of {job!r} is not JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise DamagedRecord(f"the record of {job!r} is not a JSON object")
    for name, kind in _FIELDS.items():
        if not isinstance(record.get(name), kind) or isinstance(record.get(name), bool):
            raise DamagedRecord(f"the record of {job!r} has no valid {name!r}")
    if record["state"] not in {state.value for state in RunState}:
        raise DamagedRecord(f"the record of {job!r} has an unknown state {record['state']!r}")
    if record["state"] not in _HELD and not isinstance(record.get("ended_at"), (int, float)):
        raise DamagedRecord(f"the record of {job!r} has ended with no valid 'ended_at'")
    return record


#: A record's counts (``counts``): runs, takeovers, done, failed, last done, last failed.
_COUNTS = {"runs": 0, "takeovers": 1, "done": 2, "failed": 3}


def _counted(record: _Record | None, what: str, at: float | None = None) -> list[Any]:
    """``record``'s counts with one more ``what`` (and, for an end, its time)."""
    counts = list((record or {}).get("counts") or [0, 0, 0, 0, None, None])
    counts[_COUNTS[what]] += 1
    if at is not None:
        counts[_COUNTS[what] + 2] = at
    return counts


#: How :func:`bucket_name` escapes the namespace characters bucket names do not allow
#: (``_`` too, so that the escape is injective).
_ESCAPES = {"_": "__", ".": "_d", ":": "_c"}


def bucket_name(namespace: str) -> str:
    """The namespace's bucket: an injective escape into ``[A-Za-z0-9_-]``."""
    return "anarchon-" + "".join(_ESCAPES.get(c, c) for c in namespace)


_UNESCAPES = {escape: c for c, escape in _ESCAPES.items()}


def bucket_namespace(bucket: str) -> str | None:
    """The namespace of a bucket :func:`bucket_name` made, or ``None`` for any other."""
    if not bucket.startswith("anarchon-"):
        return None
    escaped, namespace, i = bucket[len("anarchon-") :], [], 0
    while i < len(escaped):
        if escaped[i] != "_":
            namespace.append(escaped[i])
            i += 1
            continue
        unescaped = _UNESCAPES.get(escaped[i : i + 2])
        if unescaped is None:
            return None
        namespace.append(unescaped)
        i += 2
    return "".join(namespace) or None


def job_key(job: str) -> str:
    """The job's key: URL-safe base64 is reversible and uses only key characters."""
    return "j" + base64.urlsafe_b64encode(job.encode()).decode().rstrip("=")


def job_name(key: str) -> str | None:
    """The job of a key, or ``None`` for keys this store did not write."""
    try:
        raw = key[1:] + "=" * (-(len(key) - 1) % 4)
        return base64.urlsafe_b64decode(raw.encode()).decode() if key[:1] == "j" else None
    except (binascii.Error, UnicodeDecodeError):
        return None


def pause_key(mark: str) -> str:
    """A pause mark's key: ``p`` and the job's name as :func:`job_key` writes it
    (``p`` alone for the whole namespace's mark, whose name is empty)."""
    return "p" + job_key(mark)[1:]


#: JetStream's error code for a write whose expected last sequence differs.
_WRONG_LAST_SEQUENCE = 10071


def control_key(key: str) -> str:
    """A control entry's key: ``c.`` and the key in unpadded URL-safe base64."""
    return "c." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def instance_key(instance: str) -> str:
    """An instance's registry key: ``i`` and its name, as :func:`job_key` does."""
    return "i" + job_key(instance)[1:]


def _end(runs: list[list[Any]], state: RunState, at: float | None) -> list[list[Any]]:
    """``runs`` with the newest attempt, if still open, ended as ``state``.

    At ``None`` it stays open, in ``state`` (between running and dispatched).
    """
    if runs and runs[0][6] is None:
        return [[*runs[0][:4], state.value, runs[0][5], at], *runs[1:]]
    return runs


class NatsStore(LeasesByObservation, RegistryStore, ControlStore, OnceStore):
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
        super().__init__(namespace=namespace)
        if (client is None) != (loop is None):
            raise ConfigurationError("NatsStore: pass client= together with the loop= it runs on")
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        #: Credentials in the server URLs, kept out of every message.
        self._secrets = [secret for server in self.servers for secret in secrets_in(server)]
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 5:
            raise ConfigurationError(f"replicas={replicas!r}: expected a whole number from 1 to 5")
        self.timeout = store_timeout("timeout", timeout)
        self.connect_timeout = store_timeout("connect_timeout", connect_timeout)
        self.replicas = replicas
        self.bucket = bucket_name(self.namespace)
        self._clock = clock or SystemClock()
        self._own_client = client is None
        self._nc = client
        self._kv: KeyValue | None = None
        self._setup = asyncio.Lock()
        #: job -> (revision, token, monotonic time this store first saw that revision)
        self._seen: dict[str, tuple[int, int, float]] = {}
        #: Per registry key: the revision last seen, and when it was first seen.
        self._announced: dict[str, tuple[int, float]] = {}
        self._closed = False
        self._thread: threading.Thread | None = None
        if loop is None:
            loop = asyncio.new_event_loop()
            name = f"anarchon-nats:{self.namespace}"
            self._thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
            self._thread.start()
        self._loop = loop

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> NatsStore:
        parts = urlsplit(url)
        if not parts.netloc:
            raise ConfigurationError(f"NATS URL {redact(url)!r}: expected nats://host:port")
        for key, value in url_options(url, "NATS", ("timeout", "connect_timeout", "replicas")):
            if key != "replicas":
                options.setdefault(key, value)
            elif value.isascii() and value.isdigit():
                options.setdefault(key, int(value))
            else:
                raise ConfigurationError(
                    f"NATS URL {redact(url)!r}: replicas={value!r}: expected a whole number"
                )
        servers = [f"{parts.scheme}://{host}" for host in parts.netloc.split(",")]
        return cls(servers, namespace=namespace, **options)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = scrub(text, secret)
        return text

    # -- the bridge from synchronous callers to the loop --------------------

    def _run(self, step: Callable[[], Awaitable[T]]) -> T:
        """Run ``step()`` on the loop; every failure to reach NATS is StoreUnavailable."""
        if self._closed:
            raise StoreUnavailable(f"{self!r} is closed")
        try:
            inside = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            inside = False
        if inside:
            raise RuntimeError("NatsStore: a synchronous call from inside its client's own loop")
        deadline = self.connect_timeout + 2 * self.timeout

        async def guarded() -> T:
            try:
                return await asyncio.wait_for(step(), deadline)
            except _UNAVAILABLE as exc:
                self._kv = None  # look the bucket up again next time: it may have been deleted
                said = self._scrub(f"{type(exc).__name__} {exc}")
                raise StoreUnavailable(f"NATS {self.bucket}: {said}") from exc

        call = guarded()
        try:
            future = asyncio.run_coroutine_threadsafe(call, self._loop)
        except RuntimeError as exc:  # the loop closed under us: close() from another thread
            call.close()
            raise StoreUnavailable(f"{self!r} is closed") from exc
        try:
            return future.result(deadline + 1)
        except concurrent.futures.TimeoutError as exc:  # a stuck loop: a backstop, not the rule
            future.cancel()
            raise StoreUnavailable(f"NATS {self.bucket}: no answer in {deadline}s") from exc
        except concurrent.futures.CancelledError as exc:  # close() from another thread
            raise StoreUnavailable(f"{self!r} was closed during the call") from exc

    async def _bucket(self) -> KeyValue:
        async with self._setup:
            if self._own_client and (self._nc is None or self._nc.is_closed):
                self._nc, self._kv = await self._connect(), None
            assert self._nc is not None
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
                        direct=False,  # reads go to the stream leader, never a lagging follower
                    )
                    self._kv = await js.create_key_value(config)
            return self._kv

    async def _connect(self) -> Client:
        async def note(exc: Exception) -> None:
            log.debug("anarchon: NATS %s: %s", self.bucket, self._scrub(str(exc)))

        nc = Client()
        # Reconnects go on in the background for ever; with no pending buffer a
        # publish while disconnected fails at once instead of being sent later.
        options: dict[str, Any] = dict(reconnect_time_wait=0.5, max_reconnect_attempts=-1)
        options.update(ping_interval=5, pending_size=0, connect_timeout=self.connect_timeout)
        try:
            connecting = nc.connect(
                self.servers, name=f"anarchon:{self.namespace}", error_cb=note, **options
            )
            await asyncio.wait_for(connecting, self.connect_timeout)
        except BaseException:
            await nc.close()
            raise
        return nc

    # -- records, the observer's clock, and compare-and-set ----------------

    async def _read(self, job: str) -> tuple[_Record, int] | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(job_key(job))
        except nats.js.errors.KeyNotFoundError:
            return None
        assert entry.value is not None and entry.revision is not None
        return _decoded(job, entry.value), entry.revision

    def _state(self, job: str, record: _Record, revision: int) -> JobState:
        seen = self._seen.get(job)
        if seen is None or seen[:2] != (revision, record["token"]):
            seen = self._seen[job] = (revision, record["token"], self._clock.monotonic())
        r = record
        if r["state"] in _HELD:
            remaining = r["lease"] - (self._clock.monotonic() - seen[2])
        else:  # ended: minus the time since, only to place catch-ups (see above)
            remaining = min(0.0, r["ended_at"] - self._clock.time())
        state = RunState(r["state"])
        return JobState(job, r["slot_ms"], r["owner"], r["attempt"], r["token"], state, remaining)

    async def _has(self, key: str) -> bool:
        kv = await self._bucket()
        try:
            await kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # deleted marks too
            return False
        return True

    async def _cas(
        self, job: str, decide: _Decide[T], paused: Callable[[JobState | None], T] | None = None
    ) -> T:
        """Read, decide, then ``create`` (no record yet) or ``update`` on the revision read.

        When someone else wrote in between, read and decide again: never overwrite.
        With ``paused``, the job's and the namespace's pause marks are read in
        each round with the record; if either is set, ``paused`` answers.
        """
        for _ in range(_ROUNDS):
            if paused is None:
                found = await self._read(job)
            else:
                found, *marks = await asyncio.gather(
                    self._read(job), self._has(pause_key(job)), self._has(pause_key(""))
                )
                if any(marks):
                    return paused(self._state(job, *found) if found else None)
            old, revision = found if found else (None, 0)
            new, answer = decide(old, self._state(job, old, revision) if old else None)
            if new is None:
                return answer
            kv = await self._bucket()
            sent_at = self._clock.monotonic()
            data = json.dumps(new, separators=(",", ":")).encode()
            try:
                if old is None:
                    written = await kv.create(job_key(job), data)
                else:
                    written = await kv.update(job_key(job), data, last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            # Our own lease counts from before the write was sent: we believe it
            # ends before any observer does.
            self._seen[job] = (written, new["token"], sent_at)
            return answer
        raise StoreUnavailable(f"NATS {self.bucket}: {job!r} changed {_ROUNDS} times in a row")

    def _deciding(
        self, job: str, rule: Callable[[Record | None, float], Decision[T]]
    ) -> _Decide[T]:
        """The compare-and-set decision of ``rule`` (one of :mod:`anarchon_core.decide`).

        The lease is judged by this observer's monotonic clock (the module
        docstring says why); the history's and counts' times are its wall clock.
        """

        def decide_(old: _Record | None, current: JobState | None) -> tuple[_Record | None, T]:
            now = self._clock.monotonic()
            decision = rule(Record.of(current, now) if current is not None else None, now)
            if decision.record is None:
                return None, decision.answer
            return self._written(old, decision, now), decision.answer

        return decide_

    def _written(self, old: _Record | None, decision: Decision[Any], now: float) -> _Record:
        """The value to write for ``decision``: the record, its history and its counts."""
        new = decision.record
        assert new is not None
        wall = self._clock.time()
        runs: list[list[Any]] = list(old["runs"]) if old else []
        counts = (old or {}).get("counts")
        if decision.previous is not None:
            held = decision.previous.value in _HELD
            runs = _end(runs, decision.previous, None if held else wall)
        if decision.started:
            runs.insert(
                0, [new.slot_ms, new.attempt, new.token, new.owner, new.state.value, wall, None]
            )
            counts = _counted(old, "runs")
            if new.attempt > 1:
                counts = _counted({"counts": counts}, "takeovers")
        if decision.ended is not None:
            counts = _counted(old, decision.ended.value, wall)
        holding = new.state.value in _HELD
        record = {"job": new.job, "slot_ms": new.slot_ms, "owner": new.owner,
                  "attempt": new.attempt, "token": new.token, "state": new.state.value,
                  "lease": new.lease_until - now if holding else 0.0,
                  "ended_at": None if holding else wall, "runs": runs[:HISTORY]}  # fmt: skip
        if counts is not None:
            record["counts"] = counts
        return record

    # -- the steps ----------------------------------------------------------

    @staticmethod
    def _paused(current: JobState | None) -> Claim:
        return Claim(ClaimStatus.PAUSED, current)

    def _claiming(self, r: ClaimRequest, owner: str) -> _Decide[Claim]:
        """The claim's decision; its limit judged by the counts of the very value read."""

        def decide_(old: _Record | None, current: JobState | None) -> tuple[_Record | None, Claim]:
            counts = (old or {}).get("counts") or [0, 0]
            claims = counts[_COUNTS["runs"]] - counts[_COUNTS["takeovers"]]
            return self._deciding(
                r.job,
                lambda rec, now: decide.claim(
                    rec,
                    r.job,
                    r.slot_ms,
                    owner,
                    r.lease,
                    now,
                    limit=r.limit,
                    claims=claims,
                    clock_token=decide.first_token(self._clock.time()),
                ),
            )(old, current)

        return decide_

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        """Every claim at once on the loop: the batch waits for one round trip, not many."""

        async def batch() -> list[Claim]:
            rules = (self._claiming(r, owner) for r in requests)
            steps = (
                self._cas(r.job, d, self._paused) for r, d in zip(requests, rules, strict=True)
            )
            return _each_answered(await asyncio.gather(*steps, return_exceptions=True))

        return self._run(batch) if requests else []

    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        """Every takeover at once on the loop, as :meth:`claim_many`."""

        def rule(r: TakeoverRequest) -> _Decide[Claim]:
            return self._deciding(
                r.job,
                lambda old, now: decide.takeover(
                    old,
                    r.job,
                    r.slot_ms,
                    owner,
                    r.lease,
                    r.seen_token,
                    now,
                    clock_token=decide.first_token(self._clock.time()),
                ),
            )

        async def batch() -> list[Claim]:
            steps = (self._cas(r.job, rule(r)) for r in requests)
            return _each_answered(await asyncio.gather(*steps, return_exceptions=True))

        return self._run(batch) if requests else []

    def _changing(self, change: Change) -> _Decide[bool]:
        return self._deciding(change.job, lambda old, now: decide.change(old, change, now))

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        """The changes of different jobs at once on the loop; those of one job in order.

        A renewal then a finish of one run, in one batch, is applied as listed.
        """

        async def in_order(indexes: list[int]) -> list[tuple[int, Any]]:
            answers: list[tuple[int, Any]] = []
            for i in indexes:
                c = changes[i]
                try:
                    answer: Any = await self._cas(c.job, self._changing(c))
                except DamagedRecord as exc:  # this change's refusal, as claim_many answers it
                    answer = exc
                answers.append((i, answer))
            return answers

        async def batch() -> list[bool]:
            by_job: dict[str, list[int]] = {}
            for i, change in enumerate(changes):
                by_job.setdefault(change.job, []).append(i)
            done = await asyncio.gather(*(in_order(ix) for ix in by_job.values()))
            answers: list[Any] = [None] * len(changes)
            for i, answer in (pair for group in done for pair in group):
                answers[i] = answer
            return _each_answered(answers)

        return self._run(batch) if changes else []

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(dict.fromkeys(jobs))

        async def read_all() -> dict[str, JobState]:
            found = await asyncio.gather(*(self._read(job) for job in names))
            return {job: self._state(job, *f) for job, f in zip(names, found, strict=True) if f}

        return self._run(read_all) if names else {}

    def stats(self, jobs: Iterable[str]) -> dict[str, JobStats]:
        names = list(dict.fromkeys(jobs))

        async def read_all() -> list[tuple[_Record, int] | None]:
            return list(await asyncio.gather(*(self._read(job) for job in names)))

        found = self._run(read_all) if names else []
        return {
            job: JobStats(job, *f[0]["counts"])
            for job, f in zip(names, found, strict=True)
            if f and f[0].get("counts")
        }

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        found = self._run(lambda: self._read(job))
        runs = found[0]["runs"][:limit] if found else []
        return [RunRecord(job, s, a, t, o, RunState(st), b, e) for s, a, t, o, st, b, e in runs]

    def jobs(self) -> list[str]:
        async def subjects() -> dict[str, int]:
            await self._bucket()
            assert self._nc is not None
            # One request: the bucket's stream lists its subjects, one per key.
            js = self._nc.jetstream(timeout=self.timeout)
            info = await js.stream_info(f"KV_{self.bucket}", subjects_filter=f"{prefix}>")
            return info.state.subjects or {}

        prefix = f"$KV.{self.bucket}."
        names = (job_name(subject[len(prefix) :]) for subject in self._run(subjects))
        return sorted(name for name in names if name is not None)

    def namespaces(self) -> list[str]:
        """The namespaces of the server's anarchon buckets (a stream ``KV_anarchon-...``
        each), read a page of streams at a time."""

        async def streams() -> list[str]:
            await self._bucket()
            assert self._nc is not None
            js = self._nc.jetstream(timeout=self.timeout)
            names: list[str] = []
            while page := await js.streams_info(offset=len(names)):
                names += [info.config.name or "" for info in page]
            return names

        found = (bucket_namespace(name[3:]) for name in self._run(streams) if name[:3] == "KV_")
        return sorted(namespace for namespace in found if namespace is not None)

    def _set_pause(self, key: str, on: bool) -> bool:
        async def mark() -> bool:
            kv = await self._bucket()
            if on:
                try:
                    await kv.create(pause_key(key), b"1")
                except nats.js.errors.KeyWrongLastSequenceError:  # set already
                    return False
                return True
            if not await self._has(pause_key(key)):
                return False
            await kv.delete(pause_key(key))
            return True

        return self._run(mark)

    def _pause_marks(self) -> set[str]:
        async def marks() -> set[str]:
            await self._bucket()
            assert self._nc is not None
            js = self._nc.jetstream(timeout=self.timeout)
            info = await js.stream_info(f"KV_{self.bucket}", subjects_filter=f"{prefix}>")
            keys = [subject[len(prefix) :] for subject in info.state.subjects or {}]
            keys = [key for key in keys if key[:1] == "p"]
            found = await asyncio.gather(*(self._has(key) for key in keys))
            names = (job_name("j" + key[1:]) for key, on in zip(keys, found, strict=True) if on)
            return {name for name in names if name is not None}

        prefix = f"$KV.{self.bucket}."
        return self._run(marks)

    def _controls(self, prefixes: tuple[str, ...]) -> dict[str, tuple[int, str]]:
        async def read() -> dict[str, tuple[int, str]]:
            kv = await self._bucket()
            assert self._nc is not None
            js = self._nc.jetstream(timeout=self.timeout)
            info = await js.stream_info(f"KV_{self.bucket}", subjects_filter=f"{subjects}c.>")
            keys = [subject[len(subjects) :] for subject in info.state.subjects or {}]
            names = {key: job_name("j" + key[2:]) for key in keys}
            keys = [key for key in keys if (names[key] or "\0").startswith(prefixes)]

            async def get(key: str) -> Any:
                try:
                    return await kv.get(key)
                except nats.js.errors.KeyNotFoundError:  # removed
                    return None

            found = {}
            for key, entry in zip(keys, await asyncio.gather(*map(get, keys)), strict=True):
                name = names[key]
                if entry is not None and entry.value is not None and name is not None:
                    found[name] = (int(entry.revision or 0), entry.value.decode())
            return found

        subjects = f"$KV.{self.bucket}."
        return self._run(read)

    def _set_control(self, key: str, value: str | None, expected: int) -> int:
        async def cas() -> int:
            kv = await self._bucket()
            name = control_key(key)
            if expected:
                # A removed entry leaves a delete marker with a revision of its
                # own: no version matches an absent entry but 0. (The marker
                # cannot appear between this read and the write below without
                # changing the revision the write expects.)
                try:
                    await kv.get(name)
                except nats.js.errors.KeyNotFoundError:
                    raise Conflict(key, expected, 0) from None
            try:
                if value is None and expected:
                    await kv.delete(name, last=expected)
                    return 0
                if value is not None and expected == 0:
                    return int(await kv.create(name, value.encode()))
                if value is not None:
                    return int(await kv.update(name, value.encode(), last=expected))
            except nats.js.errors.KeyWrongLastSequenceError:
                pass
            except nats.js.errors.BadRequestError as exc:  # a delete's wrong last sequence
                if exc.err_code != _WRONG_LAST_SEQUENCE:
                    raise
            try:
                entry = await kv.get(name)
                found = int(entry.revision or 0)
            except nats.js.errors.KeyNotFoundError:
                found = 0
            if value is None and expected == found == 0:
                return 0  # removing what is absent
            raise Conflict(key, expected, found)

        return self._run(cas)

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        return self._run(lambda: self._registry(instance, info, ttl))

    def withdraw(self, instance: str) -> None:
        async def delete() -> None:
            kv = await self._bucket()
            await kv.delete(instance_key(instance))

        self._run(delete)

    def instances(self) -> list[InstanceRecord]:
        return self._run(lambda: self._registry(None, "", 0.0))

    async def _registry(self, instance: str | None, info: str, ttl: float) -> list[InstanceRecord]:
        """Announce ``instance`` (unless None), then read the registry's live records.

        Expiry is judged as leases are, by this process's monotonic clock: a
        record lives ``ttl`` seconds from when this store first saw its
        revision. Records found expired are deleted.
        """
        kv = await self._bucket()
        if instance is not None:
            key = instance_key(instance)
            sent = self._clock.monotonic()
            revision = await kv.put(key, json.dumps({"info": info, "ttl": ttl}).encode())
            self._announced[key] = (revision, sent)
        assert self._nc is not None
        prefix = f"$KV.{self.bucket}."
        js = self._nc.jetstream(timeout=self.timeout)
        stream = await js.stream_info(f"KV_{self.bucket}", subjects_filter=f"{prefix}>")
        keys = [s[len(prefix) :] for s in stream.state.subjects or {}]
        keys = [k for k in keys if k[:1] == "i"]

        async def get(key: str) -> Any:
            try:
                return await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return None

        now, live = self._clock.monotonic(), []
        for key, entry in zip(keys, await asyncio.gather(*map(get, keys)), strict=True):
            if entry is None or entry.value is None or entry.revision is None:
                continue
            seen = self._announced.get(key)
            if seen is None or seen[0] != entry.revision:
                seen = self._announced[key] = (entry.revision, now)
            value = json.loads(entry.value)
            age = now - seen[1]
            if age >= value["ttl"]:
                with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                    await kv.delete(key, last=entry.revision)
                continue
            name = job_name("j" + key[1:])
            if name is not None:
                live.append(self._instance_record((name, value["info"], age, value["ttl"] - age)))
        return sorted(live, key=lambda record: record.instance)

    def close(self) -> None:
        """Close the connection this store opened, stop its loop and join its thread."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return  # the caller's client and loop: not ours to close
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(self.timeout + 1)
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

    # -- one-off runs: a stream of their own, a subject per entry, read by the minute -------

    @property
    def _once_stream(self) -> str:
        """The one-offs' stream (no ``KV_`` name: :meth:`namespaces` passes it by)."""
        return "ONCE_" + self.bucket

    @property
    def _once_prefix(self) -> str:
        return f"anarchon.once.{self.bucket}"

    def _once_subject(self, due_ms: int, job: str) -> str:
        """An entry's subject: its minute, its due time, its job (as in its key)."""
        return f"{self._once_prefix}.{due_ms // _MINUTE}.{due_ms}.{job_key(job)[1:]}"

    def _once_entry(self, subject: str) -> tuple[int, str] | None:
        """The (due ms, job) of an entry's subject; ``None`` for any other subject."""
        parts = subject[len(self._once_prefix) + 1 :].split(".")
        name = job_name("j" + parts[2]) if len(parts) == 3 and parts[1].isdigit() else None
        return None if name is None else (int(parts[1]), name)

    async def _once_js(self) -> Any:
        """JetStream, the one-offs' stream made first if this store has not seen it yet."""
        await self._bucket()
        assert self._nc is not None
        js = self._nc.jetstream(timeout=self.timeout)
        if not getattr(self, "_once_ready", False):
            try:
                await js.stream_info(self._once_stream)
            except nats.js.errors.NotFoundError:
                config = api.StreamConfig(
                    name=self._once_stream,
                    subjects=[f"{self._once_prefix}.>"],
                    max_msgs_per_subject=1,  # an entry written again replaces its value
                    storage=api.StorageType.FILE,
                    num_replicas=self.replicas,
                )
                with contextlib.suppress(nats.js.errors.BadRequestError):  # made meanwhile
                    await js.add_stream(config)
            self._once_ready = True
        return js

    async def _once_low(self, js: Any) -> tuple[int, int | None]:
        """The low mark (its sequence, 0 if none; the oldest minute that may hold entries)."""
        try:
            msg = await js.get_msg(self._once_stream, subject=f"{self._once_prefix}.low")
        except nats.js.errors.NotFoundError:
            return 0, None
        return int(msg.seq or 0), int(msg.data.decode())

    async def _once_mark(self, js: Any, seq: int, minute: int) -> bool:
        """Write the low mark, only if it is still at ``seq``; ``False`` if it moved."""
        headers = {"Nats-Expected-Last-Subject-Sequence": str(seq)}
        try:
            await js.publish(
                f"{self._once_prefix}.low",
                str(minute).encode(),
                stream=self._once_stream,
                headers=headers,
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code != _WRONG_LAST_SEQUENCE:
                raise
            return False
        return True

    def _add_once(self, entries: list[OnceEntry]) -> None:
        def publish(chunk: list[OnceEntry]) -> Callable[[], Awaitable[None]]:
            async def step() -> None:
                js = await self._once_js()
                stream = self._once_stream
                sent = (
                    js.publish(self._once_subject(e.due_ms, e.job), e.value.encode(), stream=stream)
                    for e in chunk
                )
                await asyncio.gather(*sent)

            return step

        async def mark() -> None:
            # After the entries, always (a new sequence even when unchanged): a reader
            # raising the mark meanwhile fails its compare-and-set.
            js = await self._once_js()
            lowest = min(e.due_ms for e in entries) // _MINUTE
            for _ in range(_ROUNDS):
                seq, low = await self._once_low(js)
                if await self._once_mark(js, seq, lowest if low is None else min(low, lowest)):
                    return
            raise StoreUnavailable(
                f"NATS {self._once_stream}: the low mark changed {_ROUNDS} times"
            )

        for i in range(0, len(entries), _ONCE_CHUNK):  # each chunk a call of its own
            self._once_run(publish(entries[i : i + _ONCE_CHUNK]))
        self._once_run(mark)

    def _once_run(self, step: Callable[[], Awaitable[T]]) -> T:
        """``step`` on the loop; the stream is looked up again after any failure."""
        try:
            return self._run(step)
        except BaseException:
            self._once_ready = False
            raise

    async def _once_values(self, js: Any, keys: list[tuple[int, str]]) -> list[OnceEntry]:
        """The entries of ``keys`` with their values; those removed meanwhile left out."""

        async def get(key: tuple[int, str]) -> OnceEntry | None:
            try:
                msg = await js.get_msg(self._once_stream, subject=self._once_subject(*key))
            except nats.js.errors.NotFoundError:
                return None
            return OnceEntry(key[0], key[1], msg.data.decode())

        found = await asyncio.gather(*map(get, keys))
        return [entry for entry in found if entry is not None]

    async def _once_listed(self, js: Any, subjects: str) -> list[tuple[int, str]]:
        """The (due ms, job) of the entries whose subjects match ``subjects``, in order."""
        info = await js.stream_info(self._once_stream, subjects_filter=subjects)
        keys = (self._once_entry(subject) for subject in info.state.subjects or {})
        return sorted(key for key in keys if key is not None)

    def _once_due(
        self, until_ms: int, limit: int, after: tuple[int, str] | None
    ) -> list[OnceEntry]:
        """The minutes from the low mark (or the cursor's) to ``until_ms``'s, each listed by
        the server (a subject filter); the low mark is raised past the minutes found empty."""

        async def due() -> list[OnceEntry]:
            js = await self._once_js()
            seq, low = await self._once_low(js)
            if low is None:
                return []
            last = until_ms // _MINUTE
            minute = start = low if after is None else max(low, after[0] // _MINUTE)
            found: list[tuple[int, str]] = []
            first: int | None = None
            while minute <= last and len(found) < limit and minute < start + _ONCE_MINUTES:
                minutes = range(minute, min(last + 1, minute + _ONCE_AT_ONCE))
                listed = await asyncio.gather(
                    *(self._once_listed(js, f"{self._once_prefix}.{m}.>") for m in minutes)
                )
                for m, keys in zip(minutes, listed, strict=True):
                    if keys and first is None:
                        first = m
                    found += [k for k in keys if k[0] <= until_ms and (after is None or k > after)]
                minute = minutes[-1] + 1
            raised = minute if first is None else first
            if after is None and raised > low:
                await self._once_mark(js, seq, raised)  # lost to a writer: read again next time
            return await self._once_values(js, found[:limit])

        return self._once_run(due)

    def _remove_once(self, job: str, due_ms: int) -> bool:
        async def remove() -> bool:
            js = await self._once_js()
            subject = self._once_subject(due_ms, job)
            try:
                await js.get_msg(self._once_stream, subject=subject)
            except nats.js.errors.NotFoundError:
                return False
            # A purge leaves no marker: removed entries cost the listings nothing.
            await js.purge_stream(self._once_stream, subject=subject)
            return True

        return self._once_run(remove)

    def _pending_once(self, job: str | None, limit: int) -> list[OnceEntry]:
        """For status: every entry's subject listed (of ``job``'s alone, by a filter)."""

        async def pending() -> list[OnceEntry]:
            js = await self._once_js()
            token = "*" if job is None else job_key(job)[1:]
            keys = await self._once_listed(js, f"{self._once_prefix}.*.*.{token}")
            return await self._once_values(js, keys[:limit])

        return self._once_run(pending)


#: Milliseconds in a minute: the entries' subjects are grouped by the minute they are due.
_MINUTE = 60_000
#: Entries published at once, each awaiting its acknowledgement within the request
#: timeout: a few hundred in flight keep the last one's wait short on a busy server.
_ONCE_CHUNK = 250
#: Minutes listed at once, and at most by one read (the low mark catches up after a long
#: outage over several reads).
_ONCE_AT_ONCE, _ONCE_MINUTES = 30, 240
