"""Tallies: each instance's word on the slots it won and finished, so that the instances
that waited for it need not read each of those slots' records.

For each slot of each job one instance claims first, its preferred instance
(:mod:`anarchon_core.peers`); the others wait a deferral, read the job's
record, and claim only a slot nobody claimed (:meth:`.claims.Claims._send`).
In a fleet that keeps up, nearly every such read finds the slot won and its
run ended: with many jobs, those reads are most of what a waiting instance
does, and every instance makes them for nearly every slot.

A **tally** is one control entry per instance (``tally/<instance>``), written
at most once per step. For each group of its recent scheduled claims (the
jobs of one slot time claimed at one offset: same jitter, deferral and
look-ahead, so that the instances that wait for them claim them together)
it says which it won *and whose run's end the store recorded* (their number
and a digest of their names: **settled**), names the runs it won that are
still going (**going**: running, or handed off and not seen ended) and the
others (**open**: lost, refused). An instance whose deferred claims come due
reads the tallies in one call; for a group whose settled digest is that of
exactly the jobs it waited for, less the going and open ones, it takes each
of those records as read (the slot won and its run ended: a claim would be
refused and there is no run to back up). It reads the open ones at once. The
going ones (all of the group's, when too many go to be named) it looks at
once more, one peer margin later (:func:`wait_until`): those the tally then
shows ended are settled, the others read. A run its writer won holds the
slot's lease, so nobody could claim the slot meanwhile, and a backup could
not take it over before that lease lapses. Every other job is read and
claimed as before.

A tally only ever says what its own writer did, and only once the store
recorded it: it cannot make a slot run twice (the store's atomic claim still
decides every slot claimed) nor go missing (a slot is left alone only once
its run's end is recorded). A tally that is missing, late, or that does not
match the jobs waited for (the instances see different peers or declare
different jobs, a group was claimed over several steps) costs the reads it
would have saved, nothing else.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..clock import Clock
from ..errors import Conflict, is_bug
from ..jobs import Overlap
from ..peers import Peers
from ..slots import is_own_record
from ..store import MAX_CONTROL_VALUE
from .gateway import Gateway, describe

if TYPE_CHECKING:
    from ..roles import JobRuntime

log = logging.getLogger(__name__)

#: The control entries of the tallies: ``tally/<instance>``.
TALLIES = "tally/"
#: How long a group stays in its writer's tally after its first claim (seconds).
KEPT_FOR = 120.0
#: The most groups a tally keeps (the newest).
MAX_GROUPS = 64
#: The most jobs a group names as open; a group with more says nothing (all are read).
MAX_OPEN = 256
#: A tally not written for this long is its writer's last (gone): swept by its readers.
STALE_AFTER = 600.0
#: How often a reader sweeps the stale tallies, at most (seconds).
SWEEP_EVERY = 60.0
#: Seconds before a tally the store did not take is written again.
RETRY = 1.0

_MASK = (1 << 128) - 1


@functools.lru_cache(maxsize=1 << 17)
def name_hash(name: str) -> int:
    """A job name's 128-bit hash; a group's digest is the sum of its jobs' (mod 2**128)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=16).digest(), "big")


def digest(names: Iterable[str]) -> int:
    """The digest of a set of job names: the same whatever their order."""
    return sum(name_hash(name) for name in names) & _MASK


def eligible(rt: JobRuntime) -> bool:
    """Whether ``rt``'s scheduled slots may be settled by a tally: a job whose slots are
    claimed in its own record, one at a time, with no limit to count (the others'
    claims read or count more than whether the slot was won)."""
    job = rt.job
    return job.rules.overlap is Overlap.SKIP and job.rules.limit is None and is_own_record(job.name)


#: A group: the slot time (ms), and the job's jitter, deferral and look-ahead (seconds).
Key = tuple[int, float, float, float]


def group_key(slot_ms: int, rt: JobRuntime, lookahead: float) -> Key:
    """The group of ``rt``'s claim of ``slot_ms``: the slot time and what sets the offset
    of the claims that wait for it (the job's jitter and deferral, and the look-ahead)."""
    return (slot_ms, rt.job.jitter, rt.deferral, lookahead)


def wait_until(key: Key) -> float:
    """Until when the instances that wait for group ``key`` wait for its runs still going
    (wall-clock): the latest time they would have read their records (the slot time,
    its whole jitter and deferral, less the look-ahead) plus one peer margin more (the
    deferral less the jitter: 1 s, or a tenth of the interval)."""
    slot_ms, _jitter, deferral, lookahead = key
    return slot_ms / 1000 + 2 * deferral - lookahead


def early_at(key: Key) -> float:
    """When a group's tally is written with runs still going (wall-clock): half a peer
    margin before the instances that wait for it read, at the earliest."""
    slot_ms, jitter, deferral, lookahead = key
    return slot_ms / 1000 + (jitter + deferral) / 2 - lookahead


def encode_key(key: Key) -> str:
    """A group's key as its tally writes it (each float as its shortest exact text)."""
    return "/".join(repr(part) for part in key)


def decode_key(text: str) -> Key | None:
    """A group's key as a tally wrote it; None if it is not one."""
    parts = text.split("/")
    if len(parts) != 4:
        return None
    try:
        return (int(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]))
    except ValueError:
        return None


@dataclass
class _Group:
    """One group of this instance's own claims, as its tally will tell it."""

    #: When its first claim was answered, and when it is written with runs still
    #: going (:func:`early_at`; wall-clock).
    first: float
    early_at: float
    settled: int = 0
    sum: int = 0
    open: set[str] = field(default_factory=set)
    #: The runs won and not ended yet, by (token, job).
    pending: set[tuple[int, str]] = field(default_factory=set)
    #: Changed since the tally was last written.
    changed: bool = False
    #: Written once with runs still going (at its early time).
    early: bool = False

    def ready(self, now: float) -> bool:
        """Whether the tally is to be written for this group's sake: it changed, and
        either its runs all ended, some settled, or runs still go and its early time
        (:func:`early_at`) came and it was not written so yet (the instances that wait
        wait for those runs a little): one write per group with runs still going at
        most, and one once its runs all ended."""
        if not self.changed:
            return False
        if not self.pending:
            return self.settled > 0
        return not self.early and now >= self.early_at

    @property
    def told(self) -> bool:
        """Whether the tally says anything of this group: runs settled or still going."""
        return bool(self.settled or self.pending)

    def encoded(self) -> list[object]:
        going = {name for _, name in self.pending}
        return [
            self.settled,
            format(self.sum, "x"),
            sorted(self.open) if len(self.open) <= MAX_OPEN else None,
            sorted(going) if len(going) <= MAX_OPEN else None,
        ]


class Tallies:
    """This instance's tally (written) and the tallies of the instances it waits for (read)."""

    def __init__(self, instance: str, clock: Clock, gateway: Gateway, peers: Peers) -> None:
        self._instance = instance
        self._clock = clock
        self._gateway = gateway
        self._peers = peers
        self._key = TALLIES + instance
        #: Whether this store keeps control entries (else tallies are neither kept nor read).
        self.kept = gateway.controls
        self._groups: dict[Key, _Group] = {}
        #: Each run won and not ended, by (token, job): the key of its group.
        self._runs: dict[tuple[int, str], Key] = {}
        self._changed = False
        #: The version of this instance's tally in the store (0: none written).
        self._version = 0
        self._swept_at = 0.0
        #: After a write the store did not take, none is tried before this time.
        self._retry_at = 0.0

    # -- writing ------------------------------------------------------------

    def claimed(self, rt: JobRuntime, token: int | None, won: bool, key: Key) -> None:
        """This instance claimed ``rt``'s scheduled slot of group ``key`` first (it is
        preferred): won (the run ``token`` begins) or not."""
        if not self.kept or not eligible(rt):
            return
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(self._clock.time(), early_at(key))
        name = rt.job.name
        if won and token is not None:
            group.pending.add((token, name))
            self._runs[token, name] = key
        else:
            group.open.add(name)
        group.changed = self._changed = True

    def ended(self, name: str, token: int, settled: bool) -> None:
        """The run ``token`` of job ``name`` ended: ``settled`` if the store recorded its
        end and nobody is to take it over (not released or lost). A run handed off is
        settled once this instance's backup of it reads its record ended."""
        key = self._runs.pop((token, name), None)
        group = None if key is None else self._groups.get(key)
        if group is None or (token, name) not in group.pending:
            return
        group.pending.discard((token, name))
        if settled:
            group.settled += 1
            group.sum = (group.sum + name_hash(name)) & _MASK
        else:
            group.open.add(name)
        group.changed = self._changed = True

    @property
    def peers_wait(self) -> bool:
        """Whether any instance waits for this one's claims (it has live peers)."""
        return self.kept and bool(self._peers.names())

    def write(self) -> None:
        """Write this instance's tally, once a group changed and either its runs all
        ended or its early time came (the runs still going named). A tally the store
        did not take is written again at a later step."""
        now = self._clock.time()
        if not self._changed or not self.kept or now < self._retry_at:
            return
        for key in [k for k, g in self._groups.items() if now - g.first > KEPT_FOR]:
            for run in self._groups.pop(key).pending:
                self._runs.pop(run, None)
        while len(self._groups) > MAX_GROUPS:
            oldest = min(self._groups, key=lambda k: self._groups[k].first)
            for run in self._groups.pop(oldest).pending:
                self._runs.pop(run, None)
        if not any(group.ready(now) for group in self._groups.values()):
            return
        kept = sorted(
            (key for key, group in self._groups.items() if group.told),
            key=lambda k: self._groups[k].first,
        )
        while True:
            groups = {encode_key(key): self._groups[key].encoded() for key in kept}
            value = json.dumps({"at": round(now, 3), "groups": groups}, separators=(",", ":"))
            if len(value.encode()) <= MAX_CONTROL_VALUE or not kept:
                break
            kept.pop(0)  # the oldest group goes first
        if self._set(value):
            for group in self._groups.values():
                group.early = group.early or bool(group.pending)
                group.changed = False
            self._changed = False
        else:  # written again at a step after a pause, with what changed since
            self._retry_at = now + RETRY

    def next_at(self) -> float | None:
        """When a group waiting for its runs to end is to be written all the same (its
        early time), if any: the loop wakes for it."""
        if not self._changed:
            return None
        times = [
            group.early_at
            for group in self._groups.values()
            if group.changed and group.pending and not group.early
        ]
        at = min(times, default=None)
        return None if at is None else max(at, self._retry_at)

    def _set(self, value: str | None) -> bool:
        """Write (``None``: remove) this instance's tally; whether the store took it."""
        store = self._gateway.store
        for _ in range(2):
            try:
                self._version = store.set_control(self._key, value, self._version)
                return True
            except Conflict as exc:  # an earlier process of this name left its tally
                self._version = exc.found
            except Exception as exc:
                if is_bug(exc):
                    raise
                log.debug("anarchon: could not write this instance's tally: %s", describe(exc))
                return False
        return False

    def withdraw(self) -> None:
        """Remove this instance's tally (on stop), if it wrote one."""
        if self._version:
            self._set(None)

    # -- reading -------------------------------------------------------------

    def read(self, waited: Sequence[tuple[JobRuntime, Key]]) -> Told:
        """What the tallies say of the jobs ``waited`` for (each with its group's key), in
        one read of the tallies."""
        if not self.kept or not waited:
            return Told()
        try:
            entries = self._gateway.store.controls(TALLIES)
        except Exception as exc:
            if is_bug(exc):
                raise
            log.debug("anarchon: could not read the tallies: %s", describe(exc))
            return Told()
        tallies: dict[str, dict[Key, object]] = {}
        now = self._clock.time()
        stale: list[tuple[str, int]] = []
        for key, (version, text) in entries.items():
            try:
                tally = json.loads(text)
                at = float(tally["at"])
            except (ValueError, KeyError, TypeError):
                continue
            if now - at > STALE_AFTER:
                stale.append((key, version))
                continue
            groups = tally.get("groups")
            if isinstance(groups, dict):
                decoded = {decode_key(text): told for text, told in groups.items()}
                tallies[key[len(TALLIES) :]] = {k: v for k, v in decoded.items() if k is not None}
        if stale and now - self._swept_at >= SWEEP_EVERY:
            self._sweep(stale, now)
        return _match(waited, tallies, now)

    def _sweep(self, stale: list[tuple[str, int]], now: float) -> None:
        """Remove the tallies of instances gone for long (each by compare-and-set)."""
        self._swept_at = now
        store = self._gateway.store
        for key, version in stale:
            try:
                store.set_control(key, None, version)
            except Conflict:
                pass  # written again meanwhile, or swept by another instance
            except Exception as exc:
                if is_bug(exc):
                    raise
                log.debug("anarchon: could not sweep %s: %s", key, describe(exc))
                return


@dataclass
class Told:
    """What the tallies say of the jobs waited for."""

    #: ``id(rt)`` -> the instance whose tally shows its slot won and its run ended.
    settled: dict[int, str] = field(default_factory=dict)
    #: ``id(rt)`` -> when to look again at the run its preferred instance won, still
    #: going (wall-clock; :func:`wait_until`): the tallies again, then its record.
    going: dict[int, float] = field(default_factory=dict)


def _match(
    waited: Sequence[tuple[JobRuntime, Key]], tallies: dict[str, dict[Key, object]], now: float
) -> Told:
    by_group: dict[tuple[str, Key], list[JobRuntime]] = {}
    for rt, key in waited:
        if rt.preferred is not None and rt.preferred in tallies:
            by_group.setdefault((rt.preferred, key), []).append(rt)
    told = Told()
    for (writer, key), jobs in by_group.items():
        group = tallies[writer].get(key)
        if not isinstance(group, list) or len(group) != 4:
            continue  # not a tally this version reads: all read
        count, total, open_names, going_names = group
        if not isinstance(open_names, list) or not isinstance(total, str):
            continue  # too many lost or refused to name: all read
        shut = set(open_names)
        jobs = [rt for rt in jobs if rt.job.name not in shut]  # the open ones: read
        until = wait_until(key)
        if not isinstance(going_names, list):
            # Too many runs still going to name them: none settles yet, all are waited
            # for (a little), then read.
            if now < until:
                told.going.update((id(rt), until) for rt in jobs)
            continue
        going = set(going_names)
        settled = [rt for rt in jobs if rt.job.name not in going]
        try:
            matches = count == len(settled) and int(total, 16) == digest(
                rt.job.name for rt in settled
            )
        except ValueError:
            continue
        if not matches:
            continue  # the writer's view of the group is not this instance's: all read
        for rt in settled:
            told.settled[id(rt)] = writer
        if now < until:
            told.going.update((id(rt), until) for rt in jobs if rt.job.name in going)
    return told
