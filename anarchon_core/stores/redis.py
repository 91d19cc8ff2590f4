"""Redis and Valkey: every step is one Lua script, timed by the server's ``TIME``.

URL: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` for TLS,
and ``valkey://`` / ``valkeys://`` alike (Valkey speaks the same protocol;
the scheme is translated for redis-py). Query options: ``socket_timeout``
and ``socket_connect_timeout`` (durations, 0.5 s to 5 min),
``health_check_interval`` (whole seconds), ``replicas`` and ``replica_timeout``
(see Durability below) and, for ``rediss://``, redis-py's ``ssl_*`` options;
any other is refused when the store is opened. Keyword
options to :meth:`RedisStore.from_url` go to ``redis.Redis.from_url``.
Defaults: 3 s to connect, 3 s per operation, no driver-level retry (see below).

Keys. Every key of a job carries the hash tag ``{<namespace>/<job>}``
(namespaces cannot contain ``/``, so no two jobs or namespaces share a tag):
``anarchon:{ns/job}:rec`` is a hash with the record (slot, owner, attempt,
token, state, lease end in server milliseconds; and the job's counts,
``n_runs``, ``n_takeovers``, ``n_done``, ``n_failed``, ``last_done``,
``last_failed``, kept by the same scripts, and read by the claim script for
a claim's limit) and ``anarchon:{ns/job}:runs``
a list of JSON attempts, newest first, 50 kept. Each script touches
only these two keys, one hash slot, so the layout works on Redis Cluster.
``anarchon:{ns}:jobs`` is a set of job names for :meth:`RedisStore.jobs`.

Controls. A job's pause mark is the field ``paused`` of its record's hash
(a hash without ``slot`` is a pause alone, not a record); the set
``anarchon:{ns}:paused`` lists the marks, ``''`` for the whole namespace.
Outside a cluster the claim script reads that set too (its key ends the
call's keys); on a cluster each claim call reads it just before, and a
namespace pause also sets ``npaused`` in every recorded job's hash.
``anarchon:{ns}:controls`` is a hash of control entries, ``version|value``,
changed by one script each (compare-and-set), and read by prefix by one script
that answers only the entries asked for (the declarations' copies there are
large, and read rarely).

Steps. ``claim``, ``takeover``, ``renew``, ``dispatch``, ``finish``/``release``
each run one script (EVALSHA; on ``NOSCRIPT`` after ``SCRIPT FLUSH`` or a
server restart the script is sent again whole, with EVAL). ``renew`` and
``dispatch`` set the state (``running``, ``dispatched``) and lease of the
token's holder, running or dispatched; ``finish``/``release`` end it, and
answer yes unchanged when the record already carries the token with that end
(an end re-sent after its reply was lost). A script reads ``TIME``
first and judges and writes leases by it; Redis 7 and Valkey replicate a
script's effects, not the script, so that is allowed before writes. Each
step reads the record's hash once and writes it once. An attempt's history
entry is pushed when it starts and never rewritten: it carries how the
attempt before it ended (``prev``), and the newest entry's state is the
record's (read together with it); the list is cut back to 50 entries once
it holds 16 more.

Batches. ``claim_many`` is one pipeline: an ``SADD`` of the job names to the
jobs set, then the claims, up to 500 jobs per script call (one ``TIME`` for
the call); on a cluster, one call per job, one pipeline per primary. A
script runs its jobs one after the other, each an atomic step answered on
its own: an error on one job's keys (a key of the wrong type) is that job's
answer, raised as :class:`~anarchon_core.BatchRefused` with the others'.
A call runs alone on the server but is not all-or-nothing (the jobs before
an error keep their changes), nor is the pipeline, and the ``SADD`` is
not part of any claim's atomic step (so :meth:`jobs` keeps only names
whose record exists). ``change_many`` (renewals and ends in a batch) is
the same with the change script. ``states`` is one pipeline of ``TIME`` and
one ``HMGET`` per job. Error replies about the whole server (``BUSY``,
``NOREPLICAS``, ``MISCONF``, ``READONLY``, ``OOM``...) are outages
(:class:`~anarchon_core.StoreUnavailable`).

Guarantees: one winner per slot and token compare-and-set against one
primary; lease expiry judged by that primary's clock alone.

Caveats:

- Nothing outlives the data. A server restarted without persistence (or a
  ``FLUSHDB``) forgets every record: leases vanish and a slot already run
  may be claimed and run again (its tokens go on rising: they follow the
  server's clock). Run Redis with AOF
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
from ..errors import ConfigurationError, Conflict, StoreUnavailable
from ..store import (
    HISTORY,
    NAMESPACE_PAUSE,
    Change,
    Claim,
    ClaimRequest,
    ClaimStatus,
    ControlStore,
    InstanceRecord,
    JobState,
    JobStats,
    LeaseStore,
    OnceEntry,
    OnceStore,
    RegistryStore,
    RunRecord,
    RunState,
    TakeoverRequest,
    refused_if_any,
)
from ..urls import redact, scrub, url_options

#: The version of the layout this store writes in the server (keys, tables, records),
#: as docs/upgrading.md lists it: raised with every change of that layout.
LAYOUT_VERSION = 2

CONNECT_TIMEOUT = 3.0
OPERATION_TIMEOUT = 3.0
#: URL options read as durations by the store itself (bounded like every store's).
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")
#: The URL's durability options (see the module docstring).
_DURABILITY = ("replicas", "replica_timeout")
#: How long a step waits for its replicas' acknowledgement, by default (seconds).
REPLICA_TIMEOUT = 1.0


def _durability(url: str, key: str, value: str) -> Any:
    """``replicas`` (a whole number) or ``replica_timeout`` (seconds) from the URL."""
    try:
        parsed = int(value) if key == "replicas" else float(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed < 0 or (key == "replica_timeout" and parsed == 0):
        what = "a whole number, 0 or more" if key == "replicas" else "seconds, more than 0"
        raise ConfigurationError(f"Redis URL {redact(url)!r}: {key} must be {what}, not {value!r}")
    return parsed


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

#: How many entries past :data:`HISTORY` a job's history may hold before it is cut
#: back (one ``LTRIM`` per this many attempts, not one per attempt).
_HISTORY_SLACK = 16
#: The states in which a run holds its lease.
_HELD_STATES = ("running", "dispatched")

#: Shared by the job scripts: the server's clock, read once per call, and
#: the steps on one job's record (``rk``) and history list (``hk``). Each step
#: reads the record's hash once (``load``: the record, its pause marks and its
#: counts) and writes it once; a new attempt is one push to the history, which
#: carries how the record's previous attempt ended (``prev``), so that no entry
#: is ever rewritten (see :func:`_history`); the list is cut back to HISTORY
#: entries once it holds SLACK more.
_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function load(key)
  local r = redis.call('HMGET', key, 'slot', 'owner', 'attempt', 'token', 'state', 'expires',
                       'paused', 'npaused', 'n_runs', 'n_takeovers', 'n_done', 'n_failed')
  local rec = {paused = r[7] ~= false or r[8] ~= false,
               n_runs = tonumber(r[9]) or 0, n_takeovers = tonumber(r[10]) or 0,
               n_done = tonumber(r[11]) or 0, n_failed = tonumber(r[12]) or 0}
  if not r[1] then return rec end
  rec.exists = true
  rec.slot, rec.owner, rec.attempt = tonumber(r[1]), r[2], tonumber(r[3])
  rec.token, rec.state, rec.expires = tonumber(r[4]), r[5], tonumber(r[6])
  return rec
end
local function reply(status, rec)
  if not rec.exists then return {status} end
  return {status, rec.slot, rec.owner, rec.attempt, rec.token, rec.state, rec.expires - now}
end
local function held(state) return state == 'running' or state == 'dispatched' end
-- A new attempt: the record's, and its history entry (with how the attempt it
-- replaces ended: ``ended`` names a state it ended in just now, else the
-- record's own end).
local function start(rk, hk, rec, slot, owner, attempt, token, lease_ms, ended)
  local entry = {slot = slot, attempt = attempt, token = token, owner = owner,
                 state = 'running', started = now}
  if rec.exists then
    entry.prev = {token = rec.token, state = ended or rec.state,
                  ended = ended and now or rec.expires}
  end
  if redis.call('LPUSH', hk, cjson.encode(entry)) > HISTORY + SLACK then
    redis.call('LTRIM', hk, 0, HISTORY - 1)
  end
  local takeovers = rec.n_takeovers
  if attempt > 1 then takeovers = takeovers + 1 end
  redis.call('HSET', rk, 'slot', slot, 'owner', owner, 'attempt', attempt, 'token', token,
             'state', 'running', 'expires', now + lease_ms,
             'n_runs', rec.n_runs + 1, 'n_takeovers', takeovers)
  rec.exists, rec.slot, rec.owner, rec.attempt = true, slot, owner, attempt
  rec.token, rec.state, rec.expires = token, 'running', now + lease_ms
  return reply('won', rec)
end
""".replace("HISTORY", str(HISTORY)).replace("SLACK", str(_HISTORY_SLACK))

#: Runs ``one`` (defined by the script before it) for each job of the call:
#: KEYS are each job's record and history keys in pairs; ARGV the number of
#: arguments per job, then each job's arguments. Each job is its own atomic
#: step and answers alone: an error on one job's keys is that job's answer.
_EACH = """
local n, out = tonumber(ARGV[1]), {}
for i = 1, #KEYS / 2 do
  local a = {}
  for j = 1, n do a[j] = ARGV[1 + (i - 1) * n + j] end
  local ok, answer = pcall(one, KEYS[2 * i - 1], KEYS[2 * i], a)
  if ok then
    out[i] = answer
  elseif type(answer) == 'table' and answer.err then
    out[i] = answer
  else
    out[i] = redis.error_reply(tostring(answer))
  end
end
return out
"""

# Per job: slot, owner, lease_ms, limit ('' for none). A job is paused by the fields
# ``paused`` (by name) or ``npaused`` (with its namespace, on a cluster) of its
# record's hash, or, outside a cluster, by the namespace's mark in the set of pause
# marks, passed as the call's last key (an odd one out of the pairs). Its limit is
# reached once its claims won (n_runs - n_takeovers) are as many.
_CLAIM = """
local ns_paused = #KEYS % 2 == 1 and redis.call('SISMEMBER', KEYS[#KEYS], '') == 1
local function one(rk, hk, a)
  local rec, slot = load(rk), tonumber(a[1])
  if ns_paused or rec.paused then return reply('paused', rec) end
  if rec.exists and rec.slot == slot then return reply('taken', rec) end
  if rec.exists and rec.slot > slot then return reply('stale', rec) end
  local limit = tonumber(a[4])
  if limit and rec.n_runs - rec.n_takeovers >= limit then return reply('ended', rec) end
  -- A token no lower than the server's clock in ms (decide.next_token).
  local token, ended = now, nil
  if rec.exists then
    if held(rec.state) then
      if rec.expires > now then return reply('busy', rec) end
      ended = 'abandoned'
    end
    token = math.max(rec.token + 1, now)
  end
  return start(rk, hk, rec, slot, a[2], 1, token, tonumber(a[3]), ended)
end
"""

# Per job: slot, owner, lease_ms, seen token.
_TAKEOVER = """
local function one(rk, hk, a)
  local rec = load(rk)
  if not rec.exists then return {'taken'} end
  local lapsed = rec.state == 'released' or (rec.state == 'running' and rec.expires <= now)
  if rec.slot ~= tonumber(a[1]) or rec.token ~= tonumber(a[4]) or not lapsed then
    return reply('taken', rec)
  end
  local ended = nil
  if rec.state == 'running' then ended = 'lost' end
  return start(rk, hk, rec, rec.slot, a[2], rec.attempt + 1, math.max(rec.token + 1, now),
               tonumber(a[3]), ended)
end
"""

# Per job: token, new state, lease_ms. Only the holder of the token, running or
# dispatched, gets through. 'running' renews (and picks a dispatched run up),
# 'dispatched' hands off, both for lease_ms; done/failed/released end the run and
# its lease (the lease's end is then the run's), and an end the record already has
# is answered 1 unchanged. The history entry is left as it is: it takes the
# record's state while it is the newest, and its successor's ``prev`` after.
_HELD = """
local function one(rk, hk, a)
  local rec, state = load(rk), a[2]
  if not rec.exists or rec.token ~= tonumber(a[1]) then return 0 end
  if rec.state == state and not held(state) then return 1 end
  if not held(rec.state) then return 0 end
  if held(state) then
    redis.call('HSET', rk, 'state', state, 'expires', now + tonumber(a[3]))
  elseif state == 'done' or state == 'failed' then
    redis.call('HSET', rk, 'state', state, 'expires', now,
               'n_' .. state, rec['n_' .. state] + 1, 'last_' .. state, now)
  else
    redis.call('HSET', rk, 'state', state, 'expires', now)
  end
  return 1
end
"""

#: The newest entries of a job's history and the record's state, in one atomic read
#: (KEYS: record, history; ARGV: how many entries).
_HISTORY_READ = """
local entries = redis.call('LRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1)
local r = redis.call('HMGET', KEYS[1], 'token', 'state', 'expires')
return {entries, r}
"""

#: Jobs per script call outside a cluster: a call holds the server while it
#: runs (some microseconds a job), so a larger batch is cut into several
#: calls, sent in the same pipeline.
_PER_CALL = 500


# KEYS: the registry's hash (instance -> "seen_ms|info") and sorted set (instance by
# expiry ms), one hash slot. ARGV: mode (announce, withdraw, read), instance, info,
# ttl_ms. Answers the server's now, then (instance, expiry, "seen_ms|info") of each
# live instance.
_REGISTRY = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'withdraw' then
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return {}
end
if ARGV[1] == 'announce' then
  redis.call('HSET', KEYS[1], ARGV[2], now .. '|' .. ARGV[3])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[2])
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
    redis.call('HDEL', KEYS[1], gone)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
end
local out = {now}
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local value = redis.call('HGET', KEYS[1], live[i])
  if value then
    table.insert(out, live[i])
    table.insert(out, live[i + 1])
    table.insert(out, value)
  end
end
return out
"""


# KEYS: the namespace's hash of control entries (key -> "version|value"; the
# field "" counts its writes). ARGV: key, expected version, 1 to write (0 to
# remove), value. Answers {1, new version}, or {0, version found}.
_SET_CONTROL = """
local found = redis.call('HGET', KEYS[1], ARGV[1])
local version = found and tonumber(string.match(found, '^(%d+)|')) or 0
if version ~= tonumber(ARGV[2]) then return {0, version} end
if ARGV[3] == '0' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return {1, 0}
end
local new = redis.call('HINCRBY', KEYS[1], '', 1)
redis.call('HSET', KEYS[1], ARGV[1], new .. '|' .. ARGV[4])
return {1, new}
"""


# KEYS: the namespace's hash of control entries; ARGV: key prefixes. Answers the
# entries whose key starts with one of them, flat: key, "version|value", ...
_CONTROLS = """
local out = {}
for _, key in ipairs(redis.call('HKEYS', KEYS[1])) do
  if key ~= '' then
    for i = 1, #ARGV do
      if string.sub(key, 1, #ARGV[i]) == ARGV[i] then
        table.insert(out, key)
        table.insert(out, redis.call('HGET', KEYS[1], key))
        break
      end
    end
  end
end
return out
"""


#: Error replies about the server, not one call: BUSY (a long script hogs the
#: server), writes refused alike (NOREPLICAS: fewer replicas than
#: ``min-replicas-to-write``; MISCONF: a failed snapshot stops writes), and a
#: reply to the connection's own setup (SELECT of a database the server lacks).
_SERVER_WIDE = ("BUSY", "NOREPLICAS", "MISCONF", "DB index is out of range")


def _outage(error: Any) -> bool:
    """Whether ``error`` is about the server, not one call: the store is unavailable."""
    return isinstance(error, _UNAVAILABLE) or (
        isinstance(error, ResponseError) and str(error).startswith(_SERVER_WIDE)
    )


#: A namespace's set of jobs is the key ``anarchon:{<namespace>}:jobs``.
_JOBS_HEAD, _JOBS_TAIL = "anarchon:{", "}:jobs"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _job_state(job: str, *fields: Any) -> JobState:
    slot, owner, attempt, token, state, remaining_ms = fields
    owner, state = _text(owner), RunState(_text(state))
    return JobState(
        job, int(slot), owner, int(attempt), int(token), state, int(remaining_ms) / 1000
    )


def _history(entries: list[dict[str, Any]], record: list[Any]) -> list[dict[str, Any]]:
    """The attempts of a history list (newest first), each with its state and end.

    An entry is written once, when its attempt starts; how it ended is told by
    the entry after it (its ``prev``, written with the next attempt) or, for the
    newest, by the record while the record holds its token (``record``: the
    record's token, state and lease end in ms). An entry an earlier release
    closed in place carries its ``ended`` already.
    """
    token, state, expires = (None if v is None else _text(v) for v in record)
    runs: list[dict[str, Any]] = []
    newer: dict[str, Any] | None = None
    for entry in entries:
        run = entry
        if "ended" not in entry:
            prev = newer.get("prev") if newer is not None else None
            if prev is not None and prev["token"] == entry["token"]:
                run = {**entry, "state": prev["state"], "ended": prev["ended"]}
            elif newer is None and token is not None and int(token) == entry["token"]:
                run = {**entry, "state": state}
                if state not in _HELD_STATES:
                    run["ended"] = int(expires or 0)
        runs.append(run)
        newer = entry
    return runs


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
    # Typed from redis 8 on, untyped before: called through Any, the same for both.
    sentinels: Any = Sentinel
    sentinel = sentinels(
        _hosts(parts),
        # No retry by the driver, for the sentinels too: the engine retries the step.
        sentinel_kwargs={"password": sentinel_password, "retry": Retry(NoBackoff(), 0), **timeouts},
        **timeouts,
    )
    client = sentinel.master_for(
        unquote(path[0]),
        db=int(db),
        ssl=parts.scheme == "rediss",
        **_credentials(parts),
        **extra,
        **options,
    )
    client._anarchon_sentinel = sentinel
    return client


class RedisStore(LeaseStore, RegistryStore, ControlStore, OnceStore):
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
        replicas: int = 0,
        replica_timeout: float = REPLICA_TIMEOUT,
    ) -> None:
        super().__init__(namespace=namespace)
        if (client is None) == (connect is None):
            raise ConfigurationError("RedisStore: pass either client= or connect=")
        if replicas < 0 or not 0 < replica_timeout < OPERATION_TIMEOUT:
            raise ConfigurationError(
                f"RedisStore: replicas must be 0 or more ({replicas!r} given) and"
                f" replica_timeout within (0, {OPERATION_TIMEOUT:g}) s ({replica_timeout!r} given)"
            )
        #: Replicas that must acknowledge a step's writes before it counts (WAIT).
        self.replicas = replicas
        self.replica_timeout = replica_timeout
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
        self._claim_script = Script(encoder, _COMMON + _CLAIM + _EACH)
        self._takeover_script = Script(encoder, _COMMON + _TAKEOVER + _EACH)
        self._held_script = Script(encoder, _COMMON + _HELD + _EACH)
        self._history_script = Script(encoder, _HISTORY_READ)
        self._registry_script = Script(encoder, _REGISTRY)
        self._control_script = Script(encoder, _SET_CONTROL)

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
        accepted = [*_TIMEOUTS, "health_check_interval", *_DURABILITY]
        accepted += _TLS_OPTIONS if scheme == "rediss" else []
        accepted += ["sentinel_password"] if mode == "sentinel" else []
        passed = []
        durable: dict[str, Any] = {}
        for key, value in url_options(url, "Redis", accepted):
            if key in _TIMEOUTS:
                options.setdefault(key, store_timeout(key, value))
            elif key in _DURABILITY:
                durable[key] = _durability(url, key, value)
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
        store = cls(client=client, namespace=namespace, connect=connect, **durable)
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
            if not _outage(exc):  # other replies are the call's
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

    def _server_of(self, key: str) -> Any:
        """The server holding ``key``: the client, or on a cluster its hash slot's primary."""
        client = self.client
        if not isinstance(client, RedisCluster):
            return client
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return client.get_redis_connection(node)

    def _run_scripts(
        self,
        script: Script,
        calls: Sequence[tuple[str, list[Any]]],
        names: Sequence[str] = (),
        last_key: str | None = None,
    ) -> list[Any]:
        """An SADD of ``names``, then ``script`` for each (job, args): one pipeline per server.

        Outside a cluster one script call runs the jobs of up to
        :data:`_PER_CALL` calls; on a cluster each job's keys have a hash slot
        of their own, so each job is a call. Each job answers alone: an error
        on one job's keys is that job's answer (see :func:`refused_if_any`);
        an outage is raised. ``last_key``, outside a cluster, ends each call's keys.
        """
        results: list[Any] = [None] * len(calls)
        per_call = 1 if self._cluster else _PER_CALL
        with self._guard():
            if names and self._cluster:
                self.client.sadd(self._jobs_key, *names)  # its own hash slot
            for server, indexes in self._servers([job for job, _ in calls]):
                chunks = [indexes[i : i + per_call] for i in range(0, len(indexes), per_call)]
                sent = [self._script_call(calls, chunk) for chunk in chunks]
                if last_key is not None and not self._cluster:
                    sent = [([*keys, last_key], args) for keys, args in sent]
                pipe = server.pipeline(transaction=False)
                add = bool(names) and not self._cluster
                if add:
                    pipe.sadd(self._jobs_key, *names)
                for keys, args in sent:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                replies = self._execute_waiting(pipe)[1 if add else 0 :]
                for chunk, (keys, args), reply in zip(chunks, sent, replies, strict=True):
                    if isinstance(reply, NoScriptError):
                        # Flushed or restarted server; the script did not run. It is sent
                        # again whole (EVAL, which also caches it): no flush between a
                        # load and its use can miss it. With its wait for the replicas,
                        # checked like the first: its writes count only once acknowledged.
                        again = server.pipeline(transaction=False)
                        again.eval(_text(script.script), len(keys), *keys, *args)
                        reply = self._execute_waiting(again)[0]
                    answers = reply if isinstance(reply, list) else [reply] * len(chunk)
                    for i, answer in zip(chunk, answers, strict=True):
                        results[i] = answer
            for answer in results:
                if _outage(answer):
                    raise answer
        return results

    def _execute_waiting(self, pipe: Any) -> list[Any]:
        """Run the step's pipeline (errors as replies), with ``replicas`` ended by a WAIT
        for them (one connection: the wait covers the writes sent before it on that
        connection), and answer its replies without the WAIT's.

        Too few replicas acknowledged: the writes were applied on the primary but are
        not known to outlive it, and the step does not count (a claim is not run; an end
        is sent again), as if the server had not answered: an outage is raised and the
        replies are left unread. Every pipeline of a step goes through here, so that
        none has its writes counted without the wait (a script sent again after
        ``NOSCRIPT`` included)."""
        if not self.replicas:
            return list(pipe.execute(raise_on_error=False))
        pipe.execute_command("WAIT", self.replicas, round(self.replica_timeout * 1000))
        replies = list(pipe.execute(raise_on_error=False))
        acknowledged = replies.pop()
        if isinstance(acknowledged, Exception):
            raise acknowledged
        if int(acknowledged) < self.replicas:
            raise StoreUnavailable(
                f"Redis at {self._where}: {acknowledged} of the {self.replicas} replica(s)"
                f" asked for acknowledged the step's writes within"
                f" {self.replica_timeout:g} s (replicas=): the step does not count"
            )
        return replies

    def _script_call(
        self, calls: Sequence[tuple[str, list[Any]]], chunk: list[int]
    ) -> tuple[list[str], list[Any]]:
        """The keys and arguments of one script call for the jobs of ``chunk``."""
        keys: list[str] = []
        args: list[Any] = [len(calls[chunk[0]][1])]
        for i in chunk:
            job, job_args = calls[i]
            keys += self._keys(job)
            args += job_args
        return keys, args

    @property
    def _jobs_key(self) -> str:
        return f"{_JOBS_HEAD}{self.namespace}{_JOBS_TAIL}"

    @property
    def _pause_key(self) -> str:
        """The set of the namespace's pause marks (job names, and '' for the namespace)."""
        return f"anarchon:{{{self.namespace}}}:paused"

    def _set_pause(self, key: str, on: bool) -> bool:
        """The mark in each record's hash (what claims read), then in the set (for listing).

        The namespace's mark: outside a cluster claims read the set itself; on
        a cluster (keys of one call share a hash slot) each job that has a
        record gets the mark in its hash.
        """
        with self._guard():
            client = self.client
            if key != NAMESPACE_PAUSE:
                names, field = [key], "paused"
            elif self._cluster:
                names = [_text(name) for name in client.smembers(self._jobs_key)]
                field = "npaused"
            else:
                names, field = [], ""
            changed = False
            for server, indexes in self._servers(names):
                pipe = server.pipeline(transaction=False)
                for i in indexes:
                    rk = self._keys(names[i])[0]
                    if on:
                        pipe.hset(rk, field, 1)
                    else:
                        pipe.hdel(rk, field)
                changed = any(pipe.execute()) or changed
            marked = client.sadd(self._pause_key, key) if on else client.srem(self._pause_key, key)
        return changed if key != NAMESPACE_PAUSE else bool(marked)

    def _pause_marks(self) -> set[str]:
        with self._guard():
            return {_text(name) for name in self.client.smembers(self._pause_key)}

    @property
    def _controls_key(self) -> str:
        return f"anarchon:{{{self.namespace}}}:controls"

    def _controls(self, prefixes: tuple[str, ...]) -> dict[str, tuple[int, str]]:
        """The entries of ``prefixes`` alone, in one script (one atomic read)."""
        with self._guard():
            server = self._server_of(self._controls_key)
            flat = Script(server, _CONTROLS)([self._controls_key], list(prefixes), server)
        found = {}
        for key, entry in zip(flat[::2], flat[1::2], strict=True):
            version, _, value = _text(entry).partition("|")
            found[_text(key)] = (int(version), value)
        return found

    def _set_control(self, key: str, value: str | None, expected: int) -> int:
        args: list[str | int] = [key, expected, 0 if value is None else 1, value or ""]
        with self._guard():
            server = self._server_of(self._controls_key)
            done, version = self._control_script([self._controls_key], args, server)
        if not done:
            raise Conflict(key, expected, int(version))
        return int(version)

    def _claim(self, job: str, reply: list[Any]) -> Claim:
        status = ClaimStatus(_text(reply[0]))
        return Claim(status, _job_state(job, *reply[1:]) if len(reply) > 1 else None)

    def _paused_on_cluster(self, jobs: Sequence[str]) -> list[Claim] | None:
        """On a cluster, the answers to claims of ``jobs`` while the namespace is paused.

        A claim script there reaches one hash slot, not the namespace's set of
        marks, and the namespace's mark is copied only into the records that
        existed when it was set: so every claim call first reads the set. A
        claim sent after the pause returned is refused; one in flight then is
        concurrent with it (as on NATS).
        """
        if not self._cluster:
            return None
        with self._guard():
            paused = self.client.sismember(self._pause_key, NAMESPACE_PAUSE)
        if not paused:
            return None
        states = self.states(jobs)
        return [Claim(ClaimStatus.PAUSED, states.get(job)) for job in jobs]

    def claim_many(self, requests: Sequence[ClaimRequest], owner: str) -> list[Claim]:
        if not requests:
            return []
        if (paused := self._paused_on_cluster([r.job for r in requests])) is not None:
            return paused
        calls = [
            (r.job, [r.slot_ms, owner, round(r.lease * 1000), "" if r.limit is None else r.limit])
            for r in requests
        ]
        names = sorted({r.job for r in requests})
        replies = self._run_scripts(self._claim_script, calls, names, self._pause_key)
        return refused_if_any(
            [
                reply if isinstance(reply, Exception) else self._claim(r.job, reply)
                for r, reply in zip(requests, replies, strict=True)
            ]
        )

    def takeover_many(self, requests: Sequence[TakeoverRequest], owner: str) -> list[Claim]:
        """One pipeline per server of the takeover script's calls."""
        if not requests:
            return []
        calls = [(r.job, [r.slot_ms, owner, round(r.lease * 1000), r.seen_token]) for r in requests]
        replies = self._run_scripts(self._takeover_script, calls)
        return refused_if_any(
            [
                reply if isinstance(reply, Exception) else self._claim(r.job, reply)
                for r, reply in zip(requests, replies, strict=True)
            ]
        )

    def change_many(self, changes: Sequence[Change]) -> list[bool]:
        """One pipeline per server of the script calls of the changes."""
        if not changes:
            return []
        calls = [(c.job, [c.token, c.state.value, round(c.lease * 1000)]) for c in changes]
        replies = self._run_scripts(self._held_script, calls)
        return refused_if_any(
            [reply if isinstance(reply, Exception) else int(reply) == 1 for reply in replies]
        )

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

    def stats(self, jobs: Iterable[str]) -> dict[str, JobStats]:
        names = list(dict.fromkeys(jobs))
        fields = ("n_runs", "n_takeovers", "n_done", "n_failed", "last_done", "last_failed")
        found: dict[str, JobStats] = {}
        with self._guard():
            for server, indexes in self._servers(names):
                pipe = server.pipeline(transaction=False)
                for i in indexes:
                    pipe.hmget(self._keys(names[i])[0], fields)
                for i, row in zip(indexes, pipe.execute(), strict=True):
                    if row[0] is None:
                        continue
                    runs, takeovers, done, failed = (int(value or 0) for value in row[:4])
                    last = [None if value is None else int(value) / 1000 for value in row[4:]]
                    found[names[i]] = JobStats(names[i], runs, takeovers, done, failed, *last)
        return found

    def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        if limit <= 0:
            return []
        keys = self._keys(job)
        with self._guard():
            server = self._server_of(keys[0])
            entries, record = self._history_script(keys, [min(limit, HISTORY)], server)
        return [_run(job, run) for run in _history([json.loads(e) for e in entries], record)]

    def ping(self) -> None:
        """One PING: the server answers and lets this client in (no record is read, so a
        record no script can use does not make the whole store look down)."""
        with self._guard():
            self.client.ping()

    def jobs(self) -> list[str]:
        with self._guard():
            members = self.client.smembers(self._jobs_key)
            names = sorted(_text(name) for name in members)
            exists = [False] * len(names)
            for server, indexes in self._servers(names):
                pipe = server.pipeline(transaction=False)
                for i in indexes:
                    pipe.hexists(self._keys(names[i])[0], "slot")  # not a pause alone
                for i, found in zip(indexes, pipe.execute(), strict=True):
                    exists[i] = bool(found)
        return [job for job, found in zip(names, exists, strict=True) if found]

    def namespaces(self) -> list[str]:
        """The namespaces with a set of jobs (``anarchon:{<namespace>}:jobs``), scanned on
        the server (on a cluster, on every primary)."""
        head, tail = _JOBS_HEAD, _JOBS_TAIL
        with self._guard():
            client = self.client
            if isinstance(client, RedisCluster):
                cluster: Any = client  # typed in some redis releases, not in others
                servers = [cluster.get_redis_connection(n) for n in cluster.get_primaries()]
            else:
                servers = [client]
            keys = {
                _text(key)
                for server in servers
                for key in server.scan_iter(match=f"{head}*{tail}", count=1000)
            }
        # A job's keys carry "<namespace>/<job>" in their tag: a namespace has no "/".
        found = {key[len(head) : -len(tail)] for key in keys}
        return sorted(ns for ns in found if ns and "/" not in ns)

    def _registry(self, mode: str, instance: str = "", info: str = "", ttl: float = 0) -> Any:
        keys = [f"anarchon:{{{self.namespace}}}:instances", f"anarchon:{{{self.namespace}}}:seen"]
        with self._guard():
            server = self._server_of(keys[0])
            return self._registry_script(keys, [mode, instance, info, round(ttl * 1000)], server)

    def _announce(self, instance: str, info: str, ttl: float) -> list[InstanceRecord]:
        return self._live(self._registry("announce", instance, info, ttl))

    def withdraw(self, instance: str) -> None:
        self._registry("withdraw", instance)

    def instances(self) -> list[InstanceRecord]:
        return self._live(self._registry("read"))

    def _live(self, reply: list[Any]) -> list[InstanceRecord]:
        now, found = int(reply[0]), []
        for i in range(1, len(reply), 3):
            seen, _, info = _text(reply[i + 2]).partition("|")
            age, left = (now - int(seen)) / 1000, (float(reply[i + 1]) - now) / 1000
            found.append(self._instance_record((_text(reply[i]), info, age, left)))
        return sorted(found, key=lambda record: record.instance)

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            sentinel = getattr(self._client, "_anarchon_sentinel", None)
            for server in sentinel.sentinels if sentinel is not None else []:
                server.close()

    def __repr__(self) -> str:
        return f"<RedisStore {self._where} namespace={self.namespace!r}>"

    # -- one-off runs: a sorted set read by range (ZRANGEBYLEX ... LIMIT), a hash beside --

    @property
    def _once_keys(self) -> list[str]:
        """The index (every score 0, members ``<due ms, 15 digits>|<job>``) and the values,
        both in the namespace's hash slot."""
        head = f"anarchon:{{{self.namespace}}}:once"
        return [head, f"{head}:v"]

    def _once_script(self, text: str, args: Sequence[Any]) -> Any:
        keys = self._once_keys
        with self._guard():
            server = self._server_of(keys[0])
            return Script(server, text)(keys, list(args), server)

    def _add_once(self, entries: list[OnceEntry]) -> None:
        for i in range(0, len(entries), _ONCE_CHUNK):
            chunk = entries[i : i + _ONCE_CHUNK]
            self._once_script(_ONCE_ADD, [v for e in chunk for v in (_once_member(e), e.value)])

    def _once_read(self, low: str, high: str, limit: int) -> list[OnceEntry]:
        flat = self._once_script(_ONCE_READ, [low, high, limit])
        found = []
        for member, value in zip(flat[::2], flat[1::2], strict=True):
            text = _text(member)
            found.append(
                OnceEntry(int(text[:15]), text[16:], "{}" if value is None else _text(value))
            )
        return found

    def _once_due(
        self, until_ms: int, limit: int, after: tuple[int, str] | None
    ) -> list[OnceEntry]:
        low = "-" if after is None else "(" + _once_member(OnceEntry(*after))
        return self._once_read(low, f"({until_ms + 1:015d}", limit)

    def _remove_once(self, job: str, due_ms: int) -> bool:
        return bool(self._once_script(_ONCE_REMOVE, [_once_member(OnceEntry(due_ms, job))]))

    def _pending_once(self, job: str | None, limit: int) -> list[OnceEntry]:
        if job is None:
            return self._once_read("-", "+", limit)
        found: list[OnceEntry] = []
        low = "-"
        while len(found) < limit:  # for status: the entries of every job, a page at a time
            page = self._once_read(low, "+", 1000)
            found += [entry for entry in page if entry.job == job]
            if len(page) < 1000:
                break
            low = "(" + _once_member(page[-1])
        return found[:limit]


#: Entries written per script call.
_ONCE_CHUNK = 1000


def _once_member(entry: OnceEntry) -> str:
    """An entry's member of the index: its due time in 15 digits (lexical order is time
    order), then its job."""
    return f"{entry.due_ms:015d}|{entry.job}"


#: KEYS: the index, the values. ARGV: member, value, member, value...
_ONCE_ADD = """
for i = 1, #ARGV, 2 do
    redis.call('ZADD', KEYS[1], 0, ARGV[i])
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return #ARGV / 2
"""
#: KEYS: the index, the values. ARGV: the range's low and high (ZRANGEBYLEX's), the limit.
#: Answers member, value, member, value... (HMGET in chunks: Lua's unpack has a limit).
_ONCE_READ = """
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, ARGV[3])
local out = {}
for i = 1, #members, 500 do
    local chunk = {}
    for j = i, math.min(i + 499, #members) do chunk[#chunk + 1] = members[j] end
    local values = redis.call('HMGET', KEYS[2], unpack(chunk))
    for j = 1, #chunk do
        out[#out + 1] = chunk[j]
        out[#out + 1] = values[j]
    end
end
return out
"""
#: KEYS: the index, the values. ARGV: the member.
_ONCE_REMOVE = """
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return removed
"""
