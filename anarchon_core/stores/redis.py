"""Redis and Valkey: every step is one Lua script, timed by the server's ``TIME``.

URL: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` for TLS,
and ``valkey://`` / ``valkeys://`` alike (Valkey speaks the same protocol;
the scheme is translated for redis-py). Query options: ``socket_timeout``
and ``socket_connect_timeout`` (durations, 0.5 s to 5 min),
``health_check_interval`` (whole seconds) and, for ``rediss://``, redis-py's
``ssl_*`` options; any other is refused when the store is opened. Keyword
options to :meth:`RedisStore.from_url` go to ``redis.Redis.from_url``.
Defaults: 3 s to connect, 3 s per operation, no driver-level retry (see below).

Keys. Every key of a job carries the hash tag ``{<namespace>/<job>}``
(namespaces cannot contain ``/``, so no two jobs or namespaces share a tag):
``anarchon:{ns/job}:rec`` is a hash with the record (slot, owner, attempt,
token, state, lease end in server milliseconds) and ``anarchon:{ns/job}:runs``
a list of JSON attempts, newest first, capped at 50. Each script touches
only these two keys, one hash slot, so the layout works on Redis Cluster.
``anarchon:{ns}:jobs`` is a set of job names for :meth:`RedisStore.jobs`.

Steps. ``claim``, ``takeover``, ``renew``, ``dispatch``, ``finish``/``release``
each run one script (EVALSHA; on ``NOSCRIPT`` after ``SCRIPT FLUSH`` or a
server restart the script is loaded again and re-sent). ``renew`` and
``dispatch`` set the state (``running``, ``dispatched``) and lease of the
token's holder, running or dispatched; ``finish``/``release`` end it, and
answer yes unchanged when the record already carries the token with that end
(an end re-sent after its reply was lost). A script reads ``TIME``
first and judges and writes leases by it; Redis 7 and Valkey replicate a
script's effects, not the script, so that is allowed before writes. The
history list is pushed, closed and trimmed by the same scripts. ``claim_many``
is one pipeline: an ``SADD`` of the job names to the jobs set, then one
EVALSHA per claim; each script is atomic, the pipeline as a whole is not,
and the ``SADD`` is not part of any claim's atomic step (so :meth:`jobs`
keeps only names whose record exists). ``states`` is one pipeline of
``TIME`` and one ``HMGET`` per job.

Guarantees: one winner per slot and token compare-and-set against one
primary; lease expiry judged by that primary's clock alone.

Caveats:

- Nothing outlives the data. A server restarted without persistence (or a
  ``FLUSHDB``) forgets every record: leases vanish, tokens start again at 1
  and a slot already run may be claimed and run again. Run Redis with AOF
  (``appendfsync everysec`` loses up to a second) if that matters.
- Replication is asynchronous: after a failover the promoted replica may lack
  the last claims, with the same effect as above. ``WAIT`` does not make it
  safe. Keys must never be evicted: use ``maxmemory-policy noeviction``.
- A step whose reply is lost (connection cut mid-call) raises
  :class:`StoreUnavailable` and is not re-sent by the driver: a re-sent claim
  would tell its own winner "taken". The run then waits for the lease to lapse.
  (The caller may re-send an end itself: ends are idempotent.)
- Records are kept until deleted by hand (a few hundred bytes per job).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..durations import store_timeout
from ..errors import ConfigurationError, StoreUnavailable
from ..store import HISTORY, Claim, ClaimRequest, ClaimStatus, JobState, RunRecord, RunState, Store
from ..urls import redact, scrub, url_options

CONNECT_TIMEOUT = 3.0
OPERATION_TIMEOUT = 3.0
#: URL options read as durations by the store itself (bounded like every store's).
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")
#: redis-py's TLS options a ``rediss://`` URL may carry.
_TLS_OPTIONS = [
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_check_hostname",
    "ssl_password",
    "ssl_min_version",
    "ssl_ciphers",
]

#: Errors that mean "not now": the engine backs off and retries.
_UNAVAILABLE = (
    redis.exceptions.ConnectionError,  # includes BusyLoadingError, AuthenticationError
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,  # a replica, e.g. during a failover
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.OutOfMemoryError,
    # Cluster: keys moved to another primary (failover, resharding), no node for a slot.
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.MasterDownError,
    redis.exceptions.RedisClusterException,  # e.g. no node of the cluster answers
)

#: Shared by every script: reads the server clock and the record first.
_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function load(key)
  local r = redis.call('HMGET', key, 'slot', 'owner', 'attempt', 'token', 'state', 'expires')
  if not r[1] then return nil end
  return {slot = tonumber(r[1]), owner = r[2], attempt = tonumber(r[3]),
          token = tonumber(r[4]), state = r[5], expires = tonumber(r[6])}
end
local function reply(status, rec, now)
  if not rec then return {status} end
  return {status, rec.slot, rec.owner, rec.attempt, rec.token, rec.state, rec.expires - now}
end
local function held(state) return state == 'running' or state == 'dispatched' end
-- The newest attempt is the record's own: if it is still open, set its state,
-- and close it at ``ended`` unless that is nil (running <-> dispatched).
local function mark_run(runs, token, state, ended)
  local head = redis.call('LINDEX', runs, 0)
  if not head then return end
  local run = cjson.decode(head)
  if run.token == token and run.ended == nil then
    run.state, run.ended = state, ended
    redis.call('LSET', runs, 0, cjson.encode(run))
  end
end
local function end_run(runs, token, state, now) mark_run(runs, token, state, now) end
local function start(rec, now)
  rec.state = 'running'
  redis.call('HSET', KEYS[1], 'slot', rec.slot, 'owner', rec.owner, 'attempt', rec.attempt,
             'token', rec.token, 'state', 'running', 'expires', rec.expires)
  redis.call('LPUSH', KEYS[2], cjson.encode({slot = rec.slot, attempt = rec.attempt,
             token = rec.token, owner = rec.owner, state = 'running', started = now}))
  redis.call('LTRIM', KEYS[2], 0, HISTORY - 1)
  return reply('won', rec, now)
end
local now, rec = now_ms(), load(KEYS[1])
""".replace("HISTORY", str(HISTORY))

# KEYS: rec, runs. ARGV: slot, owner, lease_ms.
_CLAIM = """
local slot, token = tonumber(ARGV[1]), 1
if rec then
  if rec.slot == slot then return reply('taken', rec, now) end
  if rec.slot > slot then return reply('stale', rec, now) end
  if held(rec.state) then
    if rec.expires > now then return reply('busy', rec, now) end
    end_run(KEYS[2], rec.token, 'abandoned', now)
  end
  token = rec.token + 1
end
return start({slot = slot, owner = ARGV[2], attempt = 1, token = token,
              expires = now + tonumber(ARGV[3])}, now)
"""

# KEYS: rec, runs. ARGV: slot, owner, lease_ms, seen token.
_TAKEOVER = """
if not rec then return {'taken'} end
local lapsed = rec.state == 'released' or (rec.state == 'running' and rec.expires <= now)
if rec.slot ~= tonumber(ARGV[1]) or rec.token ~= tonumber(ARGV[4]) or not lapsed then
  return reply('taken', rec, now)
end
if rec.state == 'running' then end_run(KEYS[2], rec.token, 'lost', now) end
return start({slot = rec.slot, owner = ARGV[2], attempt = rec.attempt + 1,
              token = rec.token + 1, expires = now + tonumber(ARGV[3])}, now)
"""

# KEYS: rec, runs. ARGV: token, new state, lease_ms. Only the holder of the token,
# running or dispatched, gets through. 'running' renews (and picks a dispatched
# run up), 'dispatched' hands off, both for lease_ms; done/failed/released end the
# run and its lease, and an end the record already has is answered 1 unchanged.
_HELD = """
local state = ARGV[2]
if not rec or rec.token ~= tonumber(ARGV[1]) then return 0 end
if rec.state == state and not held(state) then return 1 end
if not held(rec.state) then return 0 end
if held(state) then
  redis.call('HSET', KEYS[1], 'state', state, 'expires', now + tonumber(ARGV[3]))
  if rec.state ~= state then mark_run(KEYS[2], rec.token, state, nil) end
else
  redis.call('HSET', KEYS[1], 'state', state, 'expires', now)
  end_run(KEYS[2], rec.token, state, now)
end
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _job_state(job: str, *fields: Any) -> JobState:
    slot, owner, attempt, token, state, remaining_ms = fields
    owner, state = _text(owner), RunState(_text(state))
    return JobState(
        job, int(slot), owner, int(attempt), int(token), state, int(remaining_ms) / 1000
    )


def _run(job: str, run: dict[str, Any]) -> RunRecord:
    ended = run["ended"] / 1000 if "ended" in run else None
    state, started = RunState(run["state"]), run["started"] / 1000
    return RunRecord(
        job, run["slot"], run["attempt"], run["token"], run["owner"], state, started, ended
    )


def _check_tls_option(url: str, key: str, value: str) -> None:
    """Refuse a TLS option value redis-py would only reject at the first connection."""
    problem = ""
    if key == "ssl_cert_reqs" and value not in ("none", "optional", "required"):
        problem = "expected none, optional or required"
    elif key in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs") and not os.path.isfile(value):
        problem = "no such file"
    elif key == "ssl_ca_path" and not os.path.isdir(value):
        problem = "no such directory"
    elif key == "health_check_interval" and not (value.isascii() and value.isdigit()):
        problem = "expected whole seconds"
    if problem:
        raise ConfigurationError(f"Redis URL {redact(url)!r}: {key}={value!r}: {problem}")


def _hosts(parts: Any) -> list[tuple[str, int]]:
    """The ``host:port`` pairs of a URL's comma-separated host part."""
    netloc = parts.netloc.rpartition("@")[2]
    pairs = []
    for host in netloc.split(","):
        name, _, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if not name:
            name, port = port, ""
        if port and not (port.isascii() and port.isdigit()):
            raise ValueError(f"port {port!r} is not a number")
        pairs.append((name.strip("[]") or "localhost", int(port or 6379)))
    return pairs


def _credentials(parts: Any) -> dict[str, Any]:
    userinfo, at, _ = parts.netloc.rpartition("@")
    if not at:
        return {}
    user, colon, password = userinfo.partition(":")
    found = {"username": unquote(user) or None} if user else {}
    if colon:
        found["password"] = unquote(password)
    return found


def _cluster_client(
    parts: Any, query: list[tuple[str, str]], options: dict[str, Any]
) -> Callable[[], RedisCluster]:
    """``redis+cluster://[user:password@]host:port[,host:port...]``: any node(s) of the cluster.

    Checked now; connected by the store's first call (a cluster client reads
    the cluster's layout when it is built).
    """
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("Redis Cluster has one database, 0")
    extra: dict[str, Any] = {k: int(v) if k == "health_check_interval" else v for k, v in query}
    if parts.scheme == "rediss":
        extra["ssl"] = True
    nodes = [ClusterNode(host, port) for host, port in _hosts(parts)]  # type: ignore[no-untyped-call]
    credentials = _credentials(parts)
    return lambda: RedisCluster(
        startup_nodes=nodes,
        **credentials,
        **extra,
        **options,  # retry: none; errors surface at once, the engine retries the step
    )


def _sentinel_client(parts: Any, query: list[tuple[str, str]], options: dict[str, Any]) -> Any:
    """``redis+sentinel://[user:password@]host:26379[,host:port...]/MASTER[/db]``."""
    path = [p for p in parts.path.split("/") if p]
    db = path[1] if len(path) == 2 else "0"
    if not path or len(path) > 2 or not (db.isascii() and db.isdigit()):
        raise ValueError("expected the master's name, and a database number: /mymaster/0")
    extra: dict[str, Any] = dict(query)
    sentinel_password = extra.pop("sentinel_password", None)
    if "health_check_interval" in extra:
        extra["health_check_interval"] = int(extra["health_check_interval"])
    timeouts = {k: options[k] for k in _TIMEOUTS if k in options}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        _hosts(parts),
        # No retry by the driver, for the sentinels too: the engine retries the step.
        sentinel_kwargs={"password": sentinel_password, "retry": Retry(NoBackoff(), 0), **timeouts},
        **timeouts,
    )
    client = sentinel.master_for(  # type: ignore[no-untyped-call]
        unquote(path[0]),
        db=int(db),
        ssl=parts.scheme == "rediss",
        **_credentials(parts),
        **extra,
        **options,
    )
    client._anarchon_sentinel = sentinel
    return client


class RedisStore(Store):
    """The store contract on a Redis or Valkey server. See the module docstring.

    Pass a ``redis.Redis`` client (the store never closes it; give it socket
    timeouts) or build one with :meth:`from_url`.
    """

    def __init__(
        self,
        *,
        client: redis.Redis | RedisCluster | None = None,
        namespace: str = "default",
        connect: Callable[[], RedisCluster] | None = None,
    ) -> None:
        super().__init__(namespace=namespace)
        if (client is None) == (connect is None):
            raise ConfigurationError("RedisStore: pass either client= or connect=")
        self._client = client
        self._connect = connect
        self._owns_client = False
        #: On Redis Cluster, each step's scripts go to the primary of their keys'
        #: hash slot: one pipeline per primary (cluster pipelines refuse scripts).
        self._cluster = isinstance(client, RedisCluster) or connect is not None
        kw: dict[str, Any] = {}
        if isinstance(client, RedisCluster):
            node = client.get_default_node()  # type: ignore[no-untyped-call]
            kw = node.redis_connection.connection_pool.connection_kwargs if node else {}
        elif client is not None:
            kw = client.connection_pool.connection_kwargs
        self._where = f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
        self._password: str | None = kw.get("password")
        # Scripts know their SHA without a connection (an unconnected client encodes).
        encoder = client if client is not None else redis.Redis()
        self._claim_script = Script(encoder, _COMMON + _CLAIM)
        self._takeover_script = Script(encoder, _COMMON + _TAKEOVER)
        self._held_script = Script(encoder, _COMMON + _HELD)

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The client; a cluster's is built (and reads the cluster's layout) at first use."""
        if self._client is None:
            assert self._connect is not None
            self._client = self._connect()
        return self._client

    @classmethod
    def from_url(cls, url: str, *, namespace: str, **options: Any) -> RedisStore:
        """Connect to ``url`` (see the module docstring); the store owns the client."""
        scheme, sep, rest = url.partition("://")
        scheme = scheme.lower().replace("valkey", "redis")
        scheme, _, mode = scheme.partition("+")
        accepted = [*_TIMEOUTS, "health_check_interval"]
        accepted += _TLS_OPTIONS if scheme == "rediss" else []
        accepted += ["sentinel_password"] if mode == "sentinel" else []
        passed = []
        for key, value in url_options(url, "Redis", accepted):
            if key in _TIMEOUTS:
                options.setdefault(key, store_timeout(key, value))
            else:
                _check_tls_option(url, key, value)
                passed.append((key, value))
        options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT)
        options.setdefault("socket_timeout", OPERATION_TIMEOUT)
        options.setdefault("retry", Retry(NoBackoff(), 0))
        try:
            parts = urlsplit(f"{scheme}{sep}{rest}")
            connect = None
            if mode == "cluster":
                connect = _cluster_client(parts, passed, options)
                client: redis.Redis | RedisCluster | None = None
            elif mode == "sentinel":
                client = _sentinel_client(parts, passed, options)
            else:
                db = parts.path.strip("/")
                if db and not (db.isascii() and db.isdigit()):  # redis-py: quietly 0
                    raise ValueError(f"the database must be a number, not {db!r}")
                bare = urlunsplit(parts._replace(query=urlencode(passed)))
                client = redis.Redis.from_url(bare, **options)
        except ValueError as exc:
            message = scrub(str(exc), urlsplit(url).password)
            # Not chained: the driver's error might quote the URL, password included.
            raise ConfigurationError(f"Redis URL {redact(url)!r}: {message}") from None
        store = cls(client=client, namespace=namespace, connect=connect)
        store._owns_client = True
        store._where = redact(url)
        password = unquote(urlsplit(url).password or "") or None
        store._password = getattr(store, "_password", None) or password
        return store

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except (*_UNAVAILABLE, ResponseError) as exc:
            # BUSY (a long script hogs the server) passes, as does a reply to the
            # connection's own setup (SELECT of a database the server lacks):
            # the server, not this step, is at fault. Other replies are bugs.
            busy = str(exc).startswith(("BUSY", "DB index is out of range"))
            if not isinstance(exc, _UNAVAILABLE) and not busy:
                raise
            if isinstance(self._client, RedisCluster):
                # The next step asks the cluster where each hash slot lives now.
                with contextlib.suppress(Exception):
                    self._client.nodes_manager.initialize()
            message = scrub(str(exc), self._password)
            raise StoreUnavailable(f"Redis at {self._where}: {message}") from exc

    def _keys(self, job: str) -> list[str]:
        tag = f"anarchon:{{{self.namespace}/{job}}}"
        return [f"{tag}:rec", f"{tag}:runs"]

    def _servers(self, jobs: Sequence[str]) -> list[tuple[redis.Redis, list[int]]]:
        """The server of each job's keys, with the indexes of ``jobs`` it holds.

        One server (the client) outside a cluster; on a cluster, the primary
        of each hash slot's keys, so that each gets one pipeline.
        """
        client = self.client
        if not isinstance(client, RedisCluster):
            return [(client, list(range(len(jobs))))]
        by_node: dict[str, tuple[redis.Redis, list[int]]] = {}
        for i, job in enumerate(jobs):
            node = client.get_node_from_key(self._keys(job)[0])  # type: ignore[no-untyped-call]
            connection = client.get_redis_connection(node)
            by_node.setdefault(node.name, (connection, []))[1].append(i)
        return list(by_node.values())

    def _run_scripts(
        self, script: Script, calls: Sequence[tuple[str, list[Any]]], names: Sequence[str] = ()
    ) -> list[Any]:
        """An SADD of ``names``, then ``script`` once per (job, args): one pipeline per server."""
        results: list[Any] = [None] * len(calls)
        with self._guard():
            if names and self._cluster:
                self.client.sadd(self._jobs_key, *names)  # its own hash slot
            for server, indexes in self._servers([job for job, _ in calls]):
                pipe = server.pipeline(transaction=False)
                add = bool(names) and not self._cluster
                if add:
                    pipe.sadd(self._jobs_key, *names)
                for i in indexes:
                    job, args = calls[i]
                    pipe.evalsha(script.sha, 2, *self._keys(job), *args)
                replies = pipe.execute(raise_on_error=False)[1 if add else 0 :]
                for i, result in zip(indexes, replies, strict=True):
                    if isinstance(result, NoScriptError):
                        # Flushed or restarted server; the script did not run. Script
                        # loads itself and sends it again.
                        job, args = calls[i]
                        result = script(self._keys(job), args, client=server)
                    elif isinstance(result, Exception):
                        raise result
                    results[i] = result
        return results

    @property
    def _jobs_key(self) -> str:
        return f"anarchon:{{{self.namespace}}}:jobs"

    def _claim(self, job: str, reply: list[Any]) -> Claim:
        status = ClaimStatus(_text(reply[0]))
        return Claim(status, _job_state(job, *reply[1:]) if len(reply) > 1 else None)

    def claim(self, job: str, slot_ms: int, owner: str, lease: float) -> Claim:
        return self.claim_many([ClaimRequest(job, slot_ms, lease)], owner)[0]

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        if not requests:
            return []
        calls = [(r.job, [r.slot_ms, owner, round(r.lease * 1000)]) for r in requests]
        names = sorted({r.job for r in requests})
        replies = self._run_scripts(self._claim_script, calls, names)
        return [self._claim(r.job, reply) for r, reply in zip(requests, replies, strict=True)]

    def takeover(self, job: str, slot_ms: int, owner: str, lease: float, seen_token: int) -> Claim:
        args = [slot_ms, owner, round(lease * 1000), seen_token]
        (reply,) = self._run_scripts(self._takeover_script, [(job, args)])
        return self._claim(job, reply)

    def _held(self, job: str, token: int, state: RunState, lease: float = 0) -> bool:
        args = [token, state.value, round(lease * 1000)]
        (reply,) = self._run_scripts(self._held_script, [(job, args)])
        return int(reply) == 1

    def renew(self, job: str, token: int, lease: float) -> bool:
        return self._held(job, token, RunState.RUNNING, lease)

    def dispatch(self, job: str, token: int, pickup: float) -> bool:
        return self._held(job, token, RunState.DISPATCHED, pickup)

    def _end(self, job: str, token: int, state: RunState) -> bool:
        return self._held(job, token, state)

    def states(self, jobs: Iterable[str]) -> dict[str, JobState]:
        names = list(dict.fromkeys(jobs))
        if not names:
            return {}
        fields = ("slot", "owner", "attempt", "token", "state", "expires")
        found: dict[str, JobState] = {}
        with self._guard():
            for server, indexes in self._servers(names):
                pipe = server.pipeline(transaction=False)
                pipe.time()  # on the same server, just before its records are read
                for i in indexes:
                    pipe.hmget(self._keys(names[i])[0], fields)
                (seconds, micros), *records = pipe.execute()
                now_ms = int(seconds) * 1000 + int(micros) // 1000
                for i, rec in zip(indexes, records, strict=True):
                    if rec[0] is not None:
                        found[names[i]] = _job_state(names[i], *rec[:5], int(rec[5]) - now_ms)
        return {job: found[job] for job in names if job in found}

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        if limit <= 0:
            return []
        with self._guard():
            entries = self.client.lrange(self._keys(job)[1], 0, limit - 1)
        return [_run(job, json.loads(entry)) for entry in entries]

    def jobs(self) -> list[str]:
        with self._guard():
            members = self.client.smembers(self._jobs_key)
            names = sorted(_text(name) for name in members)
            exists = [False] * len(names)
            for server, indexes in self._servers(names):
                pipe = server.pipeline(transaction=False)
                for i in indexes:
                    pipe.exists(self._keys(names[i])[0])
                for i, found in zip(indexes, pipe.execute(), strict=True):
                    exists[i] = bool(found)
        return [job for job, found in zip(names, exists, strict=True) if found]

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            sentinel = getattr(self._client, "_anarchon_sentinel", None)
            for server in sentinel.sentinels if sentinel is not None else []:
                server.close()

    def __repr__(self) -> str:
        return f"<RedisStore {self._where} namespace={self.namespace!r}>"
