"""Property tests of user input: refused at once, or working on every store.

The rule: any job name, schedule, option value and store URL either raises
:class:`~anarchon_core.ConfigurationError` (or
:class:`~anarchon_core.MissingDependency`) when it is declared or opened, or
gives a job that claims and finishes on every store. Nothing else, nothing later.

Declarations (names over all of Unicode, ``every=``, ``cron=``, ``timezone=``,
``anchor=``, the five job options and the scheduler's defaults, each a mix of
plausible values and junk) go to ``Scheduler("memory://").add_job``: anything
but a job or a ConfigurationError fails, and so does an error when the engine
places the job on its schedule. On each store kind (memory, SQLite in
``tmp_path`` and every server of ``SERVER_STORES``), every accepted job then
claims its last and its next slot with its lease, reads each back, renews and
finishes it (on RabbitMQ, which keeps no lease, only the claim means anything),
in a namespace of its own per example.

Store URLs are built from each server's URL with random query options (known
names with random values, unknown names, empty values, duplicated keys, odd
encodings), fragments, and sometimes another scheme, userinfo, host, port or
path, malformed ones included; and anything at all is tried as a URL. Whatever
:func:`~anarchon_core.open_store` does not refuse is judged by where the URL
points (:class:`Reach`): at the live server as its fixture names it, the store
must claim and finish a slot; at the live server with something only the
server can judge (credentials, a database, a schema, TLS, replicas), it must do
so or raise :class:`~anarchon_core.StoreUnavailable`; elsewhere it is only
opened and closed. Each example uses a namespace of its own, dropped afterwards
(and RabbitMQ's probe queue deleted, whatever ``expires`` it was given).

Run (30 to 60 s on two cores; servers missing are skipped, or fail under CI=true)::

    .venv/bin/python -m pytest tests/stores/test_input_properties.py -n 2

A longer hunt, with shrinking and no time limit, for every test::

    ANARCHON_PROPERTY_EXAMPLES=2000 .venv/bin/python -m pytest \\
        tests/stores/test_input_properties.py -n 2 --hypothesis-show-statistics
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import re
import uuid
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit, urlunsplit

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from anarchon_core import (
    ClaimRequest,
    ClaimStatus,
    ConfigurationError,
    Job,
    MissingDependency,
    RunState,
    Scheduler,
    Store,
    StoreUnavailable,
    open_store,
)
from anarchon_core.roles import JobRuntime
from anarchon_core.slots import Slot
from anarchon_core.store import LeaseStore
from anarchon_core.stores.memory import MemoryStore
from anarchon_core.stores.rabbitmq import RabbitMQStore
from anarchon_core.urls import SCHEMES
from tests.cleanup import drop_namespace

# --- settings ------------------------------------------------------------------

#: Examples per test for a longer hunt (``ANARCHON_PROPERTY_EXAMPLES=2000``); 0: CI's counts.
LONG = int(os.environ.get("ANARCHON_PROPERTY_EXAMPLES") or 0)

settings.register_profile(
    "anarchon-input-properties",
    deadline=None,
    # The servers (and tmp_path) serve every example of a test, on purpose.
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
PROFILE = settings.get_profile("anarchon-input-properties")


def bounded(ci_examples: int, *, shrink_in_ci: bool = True) -> settings:
    """``ci_examples`` examples, or ``LONG``; URL tests do not shrink in CI.

    A URL the store accepts and then cannot use may wait out a connect timeout
    per example: shrinking one would outlast the test's time limit, so CI
    reports the failing URL as drawn and the longer hunt shrinks it.
    """
    phases = tuple(Phase)
    if not shrink_in_ci and not LONG:
        phases = tuple(phase for phase in Phase if phase is not Phase.shrink)
    return settings(PROFILE, max_examples=LONG or ci_examples, phases=phases)


pytestmark = [pytest.mark.timeout(0)] if LONG else []

OWNER = "prop:owner"

# --- strategies: job names ------------------------------------------------------

#: The general categories ``str.isprintable`` refuses (ASCII space aside).
Category = Literal["Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"]
NOT_PRINTABLE: tuple[Category, ...] = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs")
printable_chars = st.one_of(st.characters(exclude_categories=NOT_PRINTABLE), st.just(" "))
#: Every code point: controls, NUL, format characters, lone surrogates, unassigned.
any_chars = st.characters(exclude_categories=())
#: Four bytes each in UTF-8: 200 of them are 800 bytes.
astral_chars = st.characters(min_codepoint=0x10000, exclude_categories=NOT_PRINTABLE)

TRICKY_NAMES = [
    "a", " a", "a ", "a b", "{x}", "{", "}", "}{", "*", "?", "[", "]", "\\", "'", '"', "`",
    "%s", "%", "%00", "${x}", "a/b", "/", "a:b", ":", "a.b", ".", "..", "$KV.x", ">", "a.*",
    "a@1700000000000", "@", "@@", "j", "==", "é", "e\u0301", "\u0301", "🙂", "ﷺ",
    "\U0001d518\U0001d52b\U0001d526",
    "ß", "İ", "Σ", "; DROP TABLE x;--", "-", "--", "#", "&", "a=b&c", "+", "\u00a0", "\u200b",
    "\u2028", "\ufeff", "\ud800", "\x00", "\t", "  ", "a" * 200, "é" * 200, "🙂" * 200,
    "a" * 201,
]  # fmt: skip

valid_names = st.one_of(
    st.text(printable_chars, min_size=1, max_size=40),
    st.text(printable_chars, min_size=190, max_size=200),
    st.text(astral_chars, min_size=195, max_size=200),
    st.from_regex(r"\A[a-z][a-z0-9_.:@/-]{0,40}\Z"),
    st.sampled_from(TRICKY_NAMES),
)

#: Values of no type the API takes (a name, a schedule, an option).
junk: st.SearchStrategy[object] = st.one_of(
    st.integers(),
    st.binary(max_size=8),
    st.just(object()),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    st.decimals(allow_nan=True),
    st.fractions(),
    st.complex_numbers(max_magnitude=10),
    st.dates(),
)

wild_names = st.one_of(
    st.text(any_chars, max_size=30),
    st.text(any_chars, min_size=195, max_size=260),
    st.none(),
    st.booleans(),
    junk,
)

# --- strategies: schedules --------------------------------------------------------

MS = timedelta(milliseconds=1)
MAX_MS = timedelta.max // MS

#: Whole milliseconds, at least a second, up to the largest timedelta: all valid intervals.
every_ok = st.one_of(
    st.integers(1, 10**6),
    st.integers(1000, 10**10).map(lambda ms: timedelta(milliseconds=ms)),
    st.integers(1000, 10**8).map(lambda ms: ms / 1000),
    st.one_of(
        st.integers(10**10, MAX_MS // 1000),
        st.integers(10**13, MAX_MS).map(lambda ms: timedelta(milliseconds=ms)),
        st.sampled_from([timedelta(days=2_900_000), timedelta(days=999_999_999), MAX_MS * MS]),
    ),
)
every_wild = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.integers(min_value=10**8, max_value=10**400),
    st.integers(min_value=-(10**400), max_value=0),
    st.timedeltas(),
    st.integers(10**10, MAX_MS).map(lambda ms: timedelta(milliseconds=ms)),
    st.booleans(),
    st.text(max_size=6),
    st.none(),
    junk,
)


def cron_field(low: int, high: int, *extra: str) -> st.SearchStrategy[str]:
    """One cron field in ``low..high``: ``*``, a value, a step, a range, a list."""
    value = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        value.map(str),
        st.integers(1, high - low + 1).map(lambda n: f"*/{n}"),
        st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.tuples(value, value, st.integers(1, 9)).map(
            lambda v: f"{min(v[:2])}-{max(v[:2])}/{v[2]}"
        ),
        st.lists(value, min_size=2, max_size=4, unique=True).map(
            lambda v: ",".join(map(str, sorted(v)))
        ),
        st.sampled_from(extra) if extra else st.nothing(),
    )


five_fields = st.tuples(
    cron_field(0, 59),
    cron_field(0, 23),
    cron_field(1, 31, "L", "15W", "?", "1W"),
    cron_field(1, 12, "jan", "jan-jun", "dec"),
    cron_field(0, 7, "mon-fri", "sun", "5#3", "?"),
)
cron_ok = st.one_of(
    five_fields.map(" ".join),
    st.tuples(five_fields, cron_field(0, 59)).map(lambda f: " ".join([*f[0], f[1]])),
    st.sampled_from(
        ["@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@midnight",
         " @Daily ", "0 0 29 2 *", "0 0 29 2 1", "* * * * * */1", "0 0 1 1 *", "59 23 31 12 *"]
    ),
)  # fmt: skip
CRON_TOKENS = [
    "*", "0", "59", "60", "24", "32", "13", "8", "-1", "*/0", "*/61", "1-", "-", "/", ",",
    "R", "H", "H(0-5)", "h", "r/2", "L", "W", "15W", "#", "5#6", "?", "jan", "foo", "mon-sun",
    "@hourly", "@reboot", "\uff11", "\u00a0", "*\t*", "0,", "1-2-3", "2-1", "*/1/2",
]  # fmt: skip
cron_wild = st.one_of(
    st.text(max_size=20),
    st.lists(st.sampled_from(CRON_TOKENS), min_size=1, max_size=7).map(" ".join),
    st.text(any_chars, max_size=20),
    st.none(),
    junk,
)

ZONES = sorted(zoneinfo.available_timezones())
tz_ok = st.one_of(st.none(), st.sampled_from(ZONES))
tz_wild = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        ["", "utc", "UTC ", "Etc/GMT+14", "Etc/GMT+15", "../etc/passwd", "/etc/localtime",
         "Europe/../UTC", "\x00", "EST5EDT", "posixrules", "Factory", "localtime", "Z"]
    ),
    junk,
)  # fmt: skip

fixed_offsets = st.integers(-1439, 1439).map(lambda m: timezone(timedelta(minutes=m)))


def whole_ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


#: Aware datetimes on whole milliseconds (what ``anchor=`` takes), the extremes included.
anchor_ok = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(1970, 1, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.just(timezone.utc),
    ).map(whole_ms),
    st.datetimes(timezones=st.one_of(fixed_offsets, st.timezones())).map(whole_ms),
    st.tuples(st.sampled_from([datetime.min, datetime.max]), fixed_offsets).map(
        lambda m: whole_ms(m[0]).replace(tzinfo=m[1])
    ),
)
anchor_wild = st.one_of(
    st.datetimes(timezones=st.one_of(st.timezones(), fixed_offsets)),
    st.datetimes(),
    st.dates(),
    st.text(max_size=5),
    junk,
)

# --- strategies: options ----------------------------------------------------------


def duration_ok(low: float, high: float) -> st.SearchStrategy[object]:
    """A duration in ``[low, high]`` seconds, as a number, a timedelta or a string."""
    seconds = st.floats(low, high)
    return st.one_of(
        seconds,
        st.integers(int(-(-low // 1)), int(high)),
        seconds.map(lambda s: timedelta(seconds=s)),
        seconds.map(lambda s: f"{s:.3f}s"),
        seconds.map(lambda s: f"{s * 1000:.0f}ms"),
        seconds.map(lambda s: f"{s / 60:.4f}m"),
    )


OPTION_OK: dict[str, st.SearchStrategy[object]] = {
    "lease": duration_ok(1, 86400),
    "renew": duration_ok(0.1, 3.3),
    "jitter": duration_ok(0, 5),
    "catch_up": duration_ok(0, 7 * 86400),
    "watch": duration_ok(0.05, 3600),
}
option_wild = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.integers(min_value=2**1023, max_value=10**400),
    st.integers(min_value=-(10**400), max_value=-(2**1023)),
    st.timedeltas(),
    st.text(max_size=8),
    st.from_regex(r"\A\s*\d{1,400}(\.\d{1,20})?\s*(ms|s|m|h|d)?\s*\Z"),
    st.booleans(),
    st.sampled_from(["٣s", "²s", "1e3", "inf", "nan", "-1s", "1.s", ".5s", "10 S", "10sec", "0"]),
    junk,
)

# --- declarations ------------------------------------------------------------------

HANDLERS_OK = ("function", "lambda", "async", "takes_run", "builtin")
HANDLERS_WILD = ("partial", "callable_object", "not_callable")
#: Handlers whose ``__qualname__`` names the job when no name is given.
RENAMABLE = ("function", "lambda", "async", "takes_run")


class _CallableObject:
    def __call__(self) -> None:
        """A callable without a ``__qualname__`` of its own."""


def make_handler(kind: str, qualname: str | None) -> Any:
    """A fresh handler of ``kind``; its ``__qualname__`` set to ``qualname`` if given."""

    def function() -> None:
        pass

    async def coroutine() -> None:
        pass

    def takes_run(run: object) -> None:
        pass

    handlers: dict[str, Any] = {
        "function": function,
        "lambda": lambda: None,
        "async": coroutine,
        "takes_run": takes_run,
        "builtin": print,
        "partial": functools.partial(takes_run, None),
        "callable_object": _CallableObject(),
        "not_callable": 42,
    }
    handler = handlers[kind]
    if qualname is not None:
        handler.__qualname__ = qualname
    return handler


@dataclass(frozen=True)
class Declaration:
    """One ``Scheduler(..., **defaults).add_job(handler, name=..., **schedule, **options)``."""

    name: object
    #: The name is given as the handler's ``__qualname__`` (``name=None``), not as ``name=``.
    by_qualname: bool
    handler: str
    schedule: dict[str, Any]
    options: dict[str, Any]
    defaults: dict[str, Any] = field(default_factory=dict)

    def expected_name(self, handler: Any) -> str:
        if self.by_qualname or self.name is None:
            return str(getattr(handler, "__qualname__", None) or getattr(handler, "__name__", ""))
        return str(self.name)


#: The parts of a declaration that may be drawn as junk.
PARTS = (
    "handler", "name", "kind", "every", "anchor", "cron", "timezone", *OPTION_OK, "defaults",
)  # fmt: skip


@st.composite
def declarations(draw: st.DrawFn, modes: tuple[str, ...]) -> Declaration:
    """A declaration whose parts are plausible, or junk: none, one of them, or any (by ``modes``).

    One junk part at a time keeps most declarations otherwise valid, so that the
    junk is what decides; ``any`` mixes them.
    """
    mode = draw(st.sampled_from(modes))
    if mode == "plausible":
        wild: set[str] = set()
    elif mode == "one":
        wild = {draw(st.sampled_from(PARTS))}
    else:
        wild = {part for part in PARTS if draw(st.booleans())}

    def pick(part: str, ok: st.SearchStrategy[Any], junk: st.SearchStrategy[Any]) -> Any:
        return draw(junk if part in wild else ok)

    handler = pick("handler", st.sampled_from(HANDLERS_OK), st.sampled_from(HANDLERS_WILD))
    name = pick("name", valid_names, wild_names)
    by_qualname = isinstance(name, str) and handler in RENAMABLE and draw(st.booleans())
    which = pick("kind", st.sampled_from(["every", "cron"]), st.sampled_from(["both", "neither"]))
    schedule: dict[str, Any] = {}
    if which in ("every", "both"):
        schedule["every"] = pick("every", every_ok, every_wild)
        schedule["anchor"] = pick("anchor", anchor_ok, anchor_wild)
    if which in ("cron", "both"):
        schedule["cron"] = pick("cron", cron_ok, cron_wild)
        schedule["timezone"] = pick("timezone", tz_ok, tz_wild)
    if which == "neither":
        schedule["timezone"] = pick("timezone", tz_ok, tz_wild)
    if "kind" in wild and draw(st.booleans()):  # what belongs to the other kind of schedule
        schedule.setdefault("timezone", draw(tz_ok))
        schedule.setdefault("anchor", draw(anchor_ok))
    options = {
        key: pick(key, st.one_of(st.none(), ok), option_wild) for key, ok in OPTION_OK.items()
    }
    sometimes = st.one_of(*[st.none()] * 7, st.just("value"))
    defaults = {
        key: pick("defaults", ok, option_wild)
        for key, ok in OPTION_OK.items()
        if "defaults" in wild or draw(sometimes) is not None
    }
    return Declaration(name, by_qualname, handler, schedule, options, defaults)


def declare(decl: Declaration) -> Job | None:
    """The job declared, or ``None`` if refused with ConfigurationError (anything else raises)."""
    try:
        scheduler = Scheduler("memory://", **decl.defaults)
    except ConfigurationError:
        return None
    try:
        qualname = decl.name if decl.by_qualname else None
        assert qualname is None or isinstance(qualname, str)
        handler = make_handler(decl.handler, qualname)
        name = None if decl.by_qualname else decl.name
        try:
            job = scheduler.add_job(handler, name=name, **decl.schedule, **decl.options)  # type: ignore[arg-type]
        except ConfigurationError:
            return None
        assert job.name == decl.expected_name(handler)
        assert scheduler.jobs[job.name] is job
        return job
    finally:
        scheduler.store.close()


def engine_slots(job: Job, now: datetime) -> list[Slot]:
    """What the engine computes for ``job`` when it places it: its last and next slot.

    Every step the scheduler takes before its first claim, so none may raise.
    """
    runtime = JobRuntime(job)
    previous = runtime.slot_at_or_before(now)
    following = runtime.slot_after(now)
    assert following.time > now, (following, now)
    assert previous is None or previous.time <= now, (previous, now)
    runtime.next_slot = following
    runtime.place(0.0)
    runtime.place(1.0)
    runtime.too_late(following, job.jitter)
    runtime.won_kind(job.jitter)
    job.catch_up_for(following.time)
    assert job.options.renew_every > 0
    job.schedule.describe()
    assert isinstance(job.takes_run, bool)
    parsed = Slot.from_id(following.id)
    assert (parsed.job, parsed.ms) == (job.name, following.ms)
    return [slot for slot in (previous, following) if slot is not None]


@bounded(500)
@given(decl=declarations(modes=("plausible", "one", "one", "any")))
def test_a_declaration_is_refused_or_gives_a_job_the_engine_can_place(decl: Declaration) -> None:
    job = declare(decl)
    event("declared" if job is not None else "refused")
    if job is not None:
        engine_slots(job, datetime.now(timezone.utc))


# --- accepted jobs on every store --------------------------------------------------


@contextlib.contextmanager
def fresh_store(kind: str, store_url: str) -> Iterator[Store]:
    """A store of ``kind`` in a namespace of its own, closed and dropped afterwards."""
    namespace = f"d{uuid.uuid4().hex[:16]}"
    store: Store
    if kind == "memory":
        store = MemoryStore(namespace=namespace)
    else:
        store = open_store(store_url, namespace=namespace)
    try:
        yield store
    finally:
        store.close()
        drop_namespace(store_url, namespace)


def claim_and_finish(store: Store, job: Job, slots: list[Slot]) -> None:
    """Claim each of ``slots`` (oldest first) with the job's lease; read back, renew, finish."""
    name, lease = job.name, job.options.lease
    for slot in slots:
        where = f"job {name!r}, slot {slot.ms}, lease {lease!r}s on {store!r}"
        [claim] = store.claim_many([ClaimRequest(name, slot.ms, lease)], OWNER)
        assert claim.status is ClaimStatus.WON, f"{where}: {claim}"
        holder = claim.holder
        assert holder is not None, where
        assert (holder.job, holder.slot_ms, holder.owner) == (name, slot.ms, OWNER), where
        if isinstance(store, LeaseStore):
            assert holder.state is RunState.RUNNING, where
            assert 0 < holder.lease_remaining <= lease + 0.01, f"{where}: {holder}"
            state = store.states([name]).get(name)
            assert state is not None, f"{where}: no state read back"
            assert (state.job, state.token, state.slot_ms) == (name, holder.token, slot.ms), where
            assert name in store.jobs(), f"{where}: not listed"
            assert store.renew(name, holder.token, lease), f"{where}: renewal refused"
            assert store.finish(name, holder.token, RunState.DONE), f"{where}: finish refused"
            state = store.state(name)
            assert state is not None and state.state is RunState.DONE, f"{where}: {state}"
            runs = store.history(name, 1)
            assert runs, f"{where}: no history"
            assert (runs[0].job, runs[0].token, runs[0].state) == (
                name,
                holder.token,
                RunState.DONE,
            ), where


@bounded(80)
@given(decl=declarations(modes=("plausible", "plausible", "one")))
def test_an_accepted_job_claims_and_finishes_on_every_store(
    decl: Declaration, kind: str, store_url: str
) -> None:
    job = declare(decl)
    event("declared" if job is not None else "refused")
    if job is None:
        return
    slots = engine_slots(job, datetime.now(timezone.utc))
    with fresh_store(kind, store_url) as store:
        claim_and_finish(store, job, slots)


# --- store URLs --------------------------------------------------------------------


class Reach(enum.IntEnum):
    """Where a URL the store accepted points, and so what its store must do."""

    #: The live server, as its fixture names it: the store claims and finishes a slot.
    LIVE = 0
    #: The live server, with what only the server can judge (credentials, database,
    #: schema, TLS, replicas): the store claims and finishes, or raises StoreUnavailable.
    SERVER = 1
    #: Another host or port: the store is opened and closed (it may raise
    #: StoreUnavailable at open if it connects then), never used.
    ELSEWHERE = 2


@dataclass(frozen=True)
class UrlPlan:
    url: str
    reach: Reach
    #: The parts changed from the server's own URL.
    changed: tuple[str, ...] = ()


#: URL scheme (lower case) -> the family of URLs it belongs to; any other is "generic".
FAMILY = {
    "memory": "memory",
    "sqlite": "sqlite",
    **{scheme: "redis" for scheme in ("redis", "rediss", "valkey", "valkeys")},
    **{f"{s}+cluster": "redis-cluster" for s in ("redis", "rediss", "valkey", "valkeys")},
    **{f"{s}+sentinel": "redis-sentinel" for s in ("redis", "rediss", "valkey", "valkeys")},
    "postgresql": "postgres",
    "postgres": "postgres",
    "http": "libsql",
    "https": "libsql",
    "libsql": "libsql",
    "nats": "nats",
    "amqp": "amqp",
    "amqps": "amqp",
}


def family_of(url: str) -> str:
    return FAMILY.get(url.partition(":")[0].lower(), "generic")


#: Schemes that reach the same server as the fixture's own, and TLS ones (SERVER).
SCHEMES_LIVE = {
    "redis": ["redis", "REDIS", "Redis", "valkey", "VALKEY"],
    "redis-cluster": ["redis+cluster", "REDIS+CLUSTER", "valkey+cluster"],
    "redis-sentinel": ["redis+sentinel", "Redis+Sentinel", "valkey+sentinel"],
    "postgres": ["postgresql", "postgres", "POSTGRESQL", "PostgreSQL"],
    "libsql": ["http", "HTTP"],
    "nats": ["nats", "NATS"],
    "amqp": ["amqp", "AMQP"],
    "memory": ["memory", "MEMORY"],
}
SCHEMES_TLS = {
    "redis": ["rediss", "valkeys"],
    "redis-cluster": ["rediss+cluster", "valkeys+cluster"],
    "redis-sentinel": ["rediss+sentinel"],
    "libsql": ["https", "libsql"],
    "amqp": ["amqps"],
}
SCHEMES_BAD = ["redis+unix", "unix", "tcp", "", "ws", "tls", "file", "sqlite3", "mem", "nats+tls"]

USERINFO_SERVER = [
    "", ":", "user", "user:", ":pw", "user:pw", "default:", "guest:wrong", "guest", "postgres",
    "postgres:pw", "nobody", "gu%65st:guest", "%70ostgres", "a:b:c", "ü:ß",
]  # fmt: skip
USERINFO_BAD = ["%zz", "a%", "%", "%00", "user name", "a\tb", "@", "[::1]"]
HOSTS_ELSEWHERE = ["localhost", "[::1]", "127.0.0.2", "0.0.0.0", ""]
#: Malformed hosts only: a name that would need DNS is never drawn.
HOSTS_BAD = [
    "[::1", "::1]", "[", "]", "[zz]", "[127.0.0.1]", "[::1]x", "[::1]]", "127.0.0.1]", "a" * 300,
]  # fmt: skip
PORTS_ELSEWHERE: list[str | None] = [None, "", "0", "1", "65535"]
PATHS_SERVER = {
    "redis": ["", "/", "/00", "/0/", "//0", "/99", "/16", "/²", "/%30"],
    "redis-cluster": ["", "/", "/0", "//0", "/00", "/1", "/x"],
    "postgres": ["/nope_db", "/%zz", "/%00", "/a%2Fb"],
    "libsql": ["/", "/db", "/%zz", "/v2"],
    "nats": ["/", "/x", "/%zz"],
    "amqp": ["", "/", "/%2F", "/nope", "/%2Fx", "/%zz"],
    "memory": ["", "/", "/x", "/%zz", "//"],
}
PATHS_BAD = ["/%", "/%zz", "/%00", "/é", "/a b", "/..", "/%2e%2e", "/?", "/#"]

#: Digits of other scripts: some ``str.isdigit``, ``int`` and ``float`` take, some not (``²``).
unicode_digits = st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=3)
durations = st.one_of(
    st.sampled_from(
        ["0.5", "1", "2.5", "3s", "500ms", "1m", "5m", "300", "300s", " 2 s ", "٣s", "0.4",
         "301", "0", "-1", "", "abc", "nan", "inf", "1e3", "1h", "²", "1.5.5", "10x", "+1", "%"]
    ),
    st.from_regex(r"\A\d{1,3}(\.\d{1,3})?(ms|s|m|h|d)?\Z"),
    st.text(max_size=6),
    st.tuples(unicode_digits, st.sampled_from(["", "s", "ms", "m"])).map("".join),
)  # fmt: skip
integers = st.one_of(
    unicode_digits,
    st.sampled_from(
        ["0", "1", "2", "5", "30", "-1", "-5", "1.5", "abc", "", "²", "①", "١٢", "01",
         "99999999999999999999999"]
    ),
    st.integers(-10, 10**6).map(str),
)  # fmt: skip

REDIS_OPTIONS = {
    "socket_timeout": durations,
    "socket_connect_timeout": durations,
    "health_check_interval": integers,
}
#: Family -> the options its URLs take (libpq's parameters too), each with its values.
OPTIONS: dict[str, dict[str, st.SearchStrategy[str]]] = {
    "memory": {},
    "sqlite": {"busy_timeout": durations},
    "redis": REDIS_OPTIONS,
    "redis-cluster": REDIS_OPTIONS,
    "redis-sentinel": {**REDIS_OPTIONS, "sentinel_password": st.text(max_size=8)},
    "generic": {},
    "postgres": {
        "schema": st.one_of(
            st.sampled_from(["public", "", "nope", "Public"]), st.text(max_size=10)
        ),
        "timeout": durations,
        "pool_size": integers,
        "application_name": st.text(max_size=20),
        "connect_timeout": integers,
        "keepalives": integers,
        "keepalives_idle": integers,
        "tcp_user_timeout": integers,
        "sslmode": st.sampled_from(
            ["disable", "allow", "prefer", "require", "verify-ca", "verify-full", "bogus", ""]
        ),
        "target_session_attrs": st.sampled_from(
            ["any", "read-write", "primary", "prefer-standby", "read-only", "standby", "x", ""]
        ),
        "options": st.sampled_from(["-c statement_timeout=5s", "", "-c foo=1", "junk"]),
        "client_encoding": st.sampled_from(["UTF8", "LATIN1", "bogus"]),
        "dbname": st.just("nope_db"),
        "user": st.just("nobody"),
    },
    "nats": {
        "timeout": durations,
        "connect_timeout": durations,
        "replicas": st.one_of(
            st.sampled_from(["1", "2", "3", "5", "0", "6", "01", "1.0", "²", "①"]), integers
        ),
    },
    "amqp": {
        "expires": st.one_of(
            durations,
            st.sampled_from(
                ["1m", "60", "59", "2h", "24h", "50d", "3650d", "3651d", "100000d", "9" * 40 + "d"]
            ),
        ),
        "timeout": durations,
    },
    "libsql": {"authToken": st.text(max_size=12), "timeout": durations},
}
OTHER_NAMES = sorted({name for options in OPTIONS.values() for name in options})
unknown_names = st.one_of(
    st.text(max_size=10),
    st.sampled_from(
        ["Timeout", "socket-timeout", "authtoken", "auth_token", "busy-timeout", "replica",
         "expire", "db", "password", "ssl", "x", "", *OTHER_NAMES]
    ),
)  # fmt: skip

#: Options put first in a URL that points at the live server with what the server may
#: refuse: they bound how long the refusal takes (the first of duplicated keys wins).
FAST_FAIL = {
    "postgres": "timeout=1",
    **dict.fromkeys(
        ["redis", "redis-cluster", "redis-sentinel"], "socket_connect_timeout=0.5&socket_timeout=1"
    ),
}
#: libpq parameters that point elsewhere, or that only the server judges.
PG_ELSEWHERE = {"host", "hostaddr", "port", "service", "servicefile"}
PG_SERVER = {
    "dbname", "user", "password", "passfile", "client_encoding", "channel_binding",
    "require_auth", "requirepeer", "krbsrvname", "gssencmode", "sslnegotiation",
}  # fmt: skip
PG_SAFE_OPTIONS = {"", "-c statement_timeout=5s"}


def query_reach(family: str, url: str) -> Reach:
    """Where the options of ``url`` take it, as its store reads them."""
    try:
        pairs = parse_qsl(urlsplit(url).query, keep_blank_values=True)
    except ValueError:
        return Reach.LIVE  # open_store must refuse it
    reach = Reach.LIVE
    for key, value in pairs:
        if family == "postgres":
            if key in PG_ELSEWHERE:
                reach = max(reach, Reach.ELSEWHERE)
            elif (
                key in PG_SERVER
                or (key.startswith("ssl") and key != "sslmode")
                or (key == "schema" and value not in ("", "public"))
                or (key == "sslmode" and value in ("require", "verify-ca", "verify-full"))
                or (key == "target_session_attrs" and value in ("read-only", "standby"))
                or (key == "options" and value not in PG_SAFE_OPTIONS)
            ):
                reach = max(reach, Reach.SERVER)
        elif family == "redis-sentinel" and key == "sentinel_password":
            reach = max(reach, Reach.SERVER)
        elif family == "nats" and key == "replicas":
            with contextlib.suppress(ValueError):
                if int(value) != 1:
                    reach = max(reach, Reach.SERVER)
    return reach


@st.composite
def query_strings(draw: st.DrawFn, family: str, base: str | None) -> str | None:
    """A query: the base URL's own segments and drawn options, in any order and encoding.

    Half the queries are tidy (options the store takes, percent-encoded), so that
    their values decide; the others add unknown names, raw text and stray separators.
    """
    known = OPTIONS[family]
    tidy = draw(st.booleans())
    pairs: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, 3))):
        if known and (tidy or draw(st.integers(0, 3)) < 3):
            key = draw(st.sampled_from(sorted(known)))
            pairs.append((key, draw(known[key])))
        else:
            pairs.append((draw(unknown_names), draw(st.text(max_size=8))))
    duplicate = draw(st.booleans())
    if pairs and duplicate:  # a duplicated key, with another value
        key = pairs[0][0]
        pairs.append((key, draw(known.get(key, st.text(max_size=8)))))
    own = [] if base is None else [s for s in base.split("&") if s]
    segments: list[str] = []
    for key, value in pairs:
        encoding = draw(st.sampled_from(["quote", "plus"] if tidy else ["quote", "raw", "bare"]))
        if encoding == "quote":
            segments.append(f"{quote(key, safe='')}={quote(value, safe='')}")
        elif encoding == "plus":
            segments.append(f"{quote_plus(key)}={quote_plus(value)}")
        elif encoding == "raw":
            segments.append(f"{key}={value}")
        else:
            segments.append(quote(key, safe=""))
    # The first of duplicated keys counts: the drawn options mostly come before the URL's own.
    order = draw(st.sampled_from(["drawn first", "drawn first", "own first", "shuffled"]))
    if order == "drawn first":
        segments += own
    elif order == "own first":
        segments = own + segments
    else:
        segments = list(draw(st.permutations(own + segments)))
    if segments and not tidy and draw(st.booleans()):
        segments.insert(draw(st.integers(0, len(segments))), draw(st.sampled_from(["", ";", "="])))
    if not segments:
        return draw(st.sampled_from([None, None, None, ""]))
    return "&".join(segments)


@dataclass(frozen=True)
class Parts:
    """A URL cut into the parts the strategies replace."""

    scheme: str
    userinfo: str | None
    host: str
    port: str | None
    path: str
    query: str | None
    fragment: str | None

    @classmethod
    def of(cls, url: str) -> Parts:
        match = re.match(
            r"^(?P<scheme>[^:]+)://(?P<netloc>[^/?#]*)(?P<path>[^?#]*)"
            r"(?:\?(?P<query>[^#]*))?(?:#(?P<fragment>.*))?$",
            url,
        )
        assert match, url
        userinfo, at, hostport = match["netloc"].rpartition("@")
        host = re.match(r"^(\[[^\]]*\]|[^:]*)(?::(.*))?$", hostport)
        assert host, url
        return cls(
            match["scheme"],
            userinfo if at else None,
            host[1],
            host[2],
            match["path"],
            match["query"],
            match["fragment"],
        )

    def url(self) -> str:
        userinfo = "" if self.userinfo is None else f"{self.userinfo}@"
        port = "" if self.port is None else f":{self.port}"
        query = "" if self.query is None else f"?{self.query}"
        fragment = "" if self.fragment is None else f"#{self.fragment}"
        return f"{self.scheme}://{userinfo}{self.host}{port}{self.path}{query}{fragment}"


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) - ord("0") + ord("\uff10")) if c.isdigit() else c for c in text)


fragments = st.one_of(
    *[st.none()] * 5,
    st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=6),
)


@st.composite
def server_urls(draw: st.DrawFn, kind: str, base_url: str) -> UrlPlan:
    """A URL built from a server's (or ``memory://``): mostly its own, with random options."""
    family = family_of(base_url)
    base = Parts.of(base_url)
    mode = draw(st.sampled_from(["live"] * 4 + ["server"] * 2 + ["elsewhere", "malformed"]))
    tls = family in SCHEMES_TLS and base.scheme.lower() in SCHEMES_TLS[family]
    live_schemes = [base.scheme, base.scheme.upper()]
    if not tls:
        live_schemes += SCHEMES_LIVE.get(family, [])
    ports: list[str | None] = [base.port]
    if base.port:
        ports.append("0" + base.port)  # a leading zero: the same port
    parts = replace(
        base,
        scheme=draw(st.sampled_from(live_schemes)),
        port=draw(st.sampled_from(ports)),
        fragment=draw(fragments),
        query=draw(query_strings(family, base.query)),
    )
    reach, changed = Reach.LIVE, ["query", "fragment"]
    if mode == "server":
        choices = ["userinfo", "path", *(["scheme"] if family in SCHEMES_TLS and not tls else [])]
        if family == "redis-sentinel":  # /MASTER[/db], from the fixture's own
            master = base.path.strip("/").split("/")[0]
            paths = [f"/{master}", f"/{master}/", "/nope/0", f"/{master}/99", f"/{master}/x"]
            paths += ["", "/", f"/{master}/0/1", f"/%{ord(master[:1] or 'a'):02X}{master[1:]}/0"]
        else:
            paths = PATHS_SERVER.get(family, ["/", "/x", "/%zz"])
        part = draw(st.sampled_from(choices))
        changed.append(part)
        reach = Reach.SERVER
        if part == "userinfo":
            userinfo = draw(
                st.one_of(
                    st.sampled_from(USERINFO_SERVER),
                    st.text(
                        st.characters(
                            exclude_categories=NOT_PRINTABLE, exclude_characters="/?#@[]"
                        ),
                        max_size=12,
                    ),
                )
            )
            parts = replace(parts, userinfo=userinfo)
        elif part == "path":
            parts = replace(parts, path=draw(st.sampled_from(paths)))
        else:
            parts = replace(parts, scheme=draw(st.sampled_from(SCHEMES_TLS[family])))
    elif mode == "elsewhere":
        part = draw(st.sampled_from(["host", "port"]))
        changed.append(part)
        reach = Reach.ELSEWHERE
        if part == "host":
            parts = replace(parts, host=draw(st.sampled_from(HOSTS_ELSEWHERE)))
        else:
            parts = replace(parts, port=draw(st.sampled_from(PORTS_ELSEWHERE)))
    elif mode == "malformed":
        part = draw(st.sampled_from(["scheme", "userinfo", "host", "port", "path"]))
        changed.append(part)
        if part == "scheme":
            parts = replace(parts, scheme=draw(st.sampled_from(SCHEMES_BAD)))
            reach = Reach.ELSEWHERE  # if a store takes it after all, it is not the server's
        elif part == "userinfo":
            parts = replace(parts, userinfo=draw(st.sampled_from(USERINFO_BAD)))
            reach = Reach.SERVER
        elif part == "host":
            parts = replace(parts, host=draw(st.sampled_from(HOSTS_BAD)))
            reach = Reach.ELSEWHERE
        elif part == "port":
            bad = ["65536", "-1", "abc", "99999999999999999999", "0x10", "1e3", "٣", " 1"]
            if base.port:
                bad += [_fullwidth(base.port), f"+{base.port}", f"{base.port}.0"]
            parts = replace(parts, port=draw(st.sampled_from(bad)))
            reach = Reach.ELSEWHERE
        else:
            parts = replace(parts, path=draw(st.sampled_from(PATHS_BAD)))
            reach = Reach.SERVER
    if family == "memory":
        reach = Reach.LIVE  # the memory store is wherever its URL says
    url = parts.url()
    reach = max(reach, query_reach(family, url))
    if reach is Reach.SERVER and family in FAST_FAIL:
        query = FAST_FAIL[family] + (f"&{parts.query}" if parts.query else "")
        url = replace(parts, query=query).url()
    return UrlPlan(url, reach, tuple(changed))


@st.composite
def sqlite_urls(draw: st.DrawFn, directory: Path) -> UrlPlan:
    """A ``sqlite:`` URL of a file in ``directory``, with an odd name and options."""
    scheme = draw(st.sampled_from(["sqlite", "sqlite", "SQLITE", "Sqlite"]))
    netloc = draw(st.sampled_from([""] * 6 + ["localhost", "h:1", "[::1", ":65536"]))
    name = draw(
        st.lists(
            st.one_of(
                st.text(st.characters(exclude_characters="/?#%"), min_size=1, max_size=8),
                st.sampled_from(
                    ["%00", "%2F", "%FF", "%ED%A0%80", "%25", "%20", "%3F", "%23", "%", "%zz",
                     ".", "..", ":memory:", "file:", ".db"]
                ),
            ),
            max_size=4,
        ).map("".join)
    )  # fmt: skip
    query = draw(query_strings("sqlite", None))
    fragment = draw(fragments)
    assert directory.is_absolute(), directory
    url = f"{scheme}://{netloc}/{directory}/{name}"  # sqlite:////abs/path
    url += ("" if query is None else f"?{query}") + ("" if fragment is None else f"#{fragment}")
    decoded = unquote(name)
    reach = Reach.LIVE
    if (
        netloc
        or "/" in decoded
        or decoded in ("", ".", "..")
        or len(decoded.encode("utf-8", "surrogatepass")) > 255
    ):
        reach = Reach.ELSEWHERE  # not a file name in ``directory``: may fail at open
    return UrlPlan(url, reach, ("path", "query", "fragment"))


PROBE_JOB, PROBE_SLOT = "probe", 1_700_000_000_000


def probe(store: Store) -> None:
    """Claim, read back and finish one slot in the store's (fresh) namespace."""
    claim = store.claim(PROBE_JOB, PROBE_SLOT, OWNER, 10)
    assert claim.status is ClaimStatus.WON, claim
    assert claim.holder is not None
    if isinstance(store, LeaseStore):
        state = store.state(PROBE_JOB)
        assert state is not None and state.token == claim.holder.token, state
        assert store.finish(PROBE_JOB, claim.holder.token, RunState.DONE)


def drop_probe_queue(base_url: str, store: RabbitMQStore) -> None:
    """Delete the probe's claim queue, which may have been given a long ``expires``."""
    from kombu.connection import Connection

    bare = urlunsplit(urlsplit(base_url)._replace(query=""))
    with contextlib.suppress(Exception), Connection(bare, connect_timeout=3) as conn:  # type: ignore[no-untyped-call]
        conn.default_channel.queue_delete(store.queue_name(PROBE_JOB, PROBE_SLOT))


def try_url(plan: UrlPlan, base_url: str) -> None:
    """Open ``plan.url``: refused, or a store that does what its reach asks."""
    namespace = f"u{uuid.uuid4().hex[:16]}"
    try:
        store = open_store(plan.url, namespace=namespace)
    except (ConfigurationError, MissingDependency):
        return
    except StoreUnavailable:
        if plan.reach is Reach.ELSEWHERE:
            return
        raise
    try:
        if plan.reach is Reach.LIVE:
            probe(store)
        elif plan.reach is Reach.SERVER:
            with contextlib.suppress(StoreUnavailable):
                probe(store)
    finally:
        store.close()
        if plan.reach is not Reach.ELSEWHERE:
            drop_namespace(base_url, namespace)
            if isinstance(store, RabbitMQStore):
                drop_probe_queue(base_url, store)


@bounded(60, shrink_in_ci=False)
@given(data=st.data())
def test_a_store_url_is_refused_or_gives_a_store_that_claims(
    kind: str, store_url: str, tmp_path: Path, data: st.DataObject
) -> None:
    if kind == "sqlite":
        plan = data.draw(sqlite_urls(tmp_path), label="plan")
    else:
        plan = data.draw(server_urls(kind, store_url), label="plan")
    try_url(plan, store_url)


#: Anything at all, as a URL; schemes whose stores would reach the network are left out.
junk_urls = st.one_of(
    st.text(any_chars, max_size=40),
    st.tuples(
        st.sampled_from(["memory:", "memory://", "MEMORY://", "memory:///", "foo://", "://", ":"]),
        st.text(any_chars, max_size=30),
    ).map("".join),
    st.tuples(st.just("sqlite:///"), st.text(any_chars, max_size=20)).map("".join),
    st.none(),
    st.booleans(),
    junk,
    st.builds(Path, st.text(max_size=5)),
)


NETWORK_SCHEMES = {scheme for scheme in SCHEMES if scheme not in ("memory", "sqlite")}


def _network(url: object) -> bool:
    """Whether ``url`` names a server store (which might connect somewhere)."""
    return isinstance(url, str) and url.partition(":")[0].lower() in NETWORK_SCHEMES


@bounded(300)
@given(url=junk_urls)
def test_any_url_is_refused_or_opens(
    url: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _network(url):
        return
    if (
        isinstance(url, str)
        and url.lower().startswith("sqlite:")
        and (url.lower().startswith("sqlite:////") or ".." in unquote(url))
    ):
        return  # a path that could lead anywhere: the others stay in tmp_path
    monkeypatch.chdir(tmp_path)  # relative SQLite paths land here
    sqlite = isinstance(url, str) and url.lower().startswith("sqlite:")
    try:
        store = open_store(url, namespace=f"j{uuid.uuid4().hex[:12]}")  # type: ignore[arg-type]
    except (ConfigurationError, MissingDependency):
        return
    except StoreUnavailable:
        assert sqlite, url  # a file SQLite cannot open (a folder, a missing one)
        return
    try:
        if sqlite and not _plain_file(str(url)):
            with contextlib.suppress(StoreUnavailable):
                probe(store)
        else:
            probe(store)
    finally:
        store.close()


def _plain_file(url: str) -> bool:
    """Whether the ``sqlite:`` URL ``url`` names a file directly in the current folder."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    name = unquote(parts.path)[1:]
    return (
        not parts.netloc
        and name not in ("", ".", "..")
        and "/" not in name
        and len(name.encode("utf-8", "surrogatepass")) <= 255
    )
