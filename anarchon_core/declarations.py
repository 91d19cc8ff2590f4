"""Which jobs the live instances declare: one copy per digest, in control entries.

Each instance announces in the registry (:meth:`Store.announce
<anarchon_core.store.Store.announce>`) the digest of its declarations, under
``decl``: every job's name and schedule in its written form
(:func:`~anarchon_core.schedules.spec`; ``null`` for a schedule that cannot
be written down). The list itself is kept once per digest, in control
entries, so that identical instances share one copy and the registry's
records stay small:

``decl/<digest>/<i>``
    part ``i`` of ``n`` of the copy: the list as compact JSON (jobs grouped
    by schedule), zlib-compressed, in base64 pieces of :data:`PART_CHARS`
    characters, each entry ``{"part": i, "parts": n, "jobs": N, "data": ...}``.
    The digest is a SHA-256 of the compressed bytes (and of :data:`FORMAT`),
    so a copy is never changed once written: parts are created (compare-and-set
    on absence), part 0 last; they are removed part 0 first. A copy whose
    parts are not all there reads as absent.
``decl-index``
    every digest kept, with when an instance last wrote or found its copy:
    what the sweep reads to remove the copies no live instance announces.

An instance writes a copy only when its digest is new to the store (at its
start, or when its jobs change), checks every :data:`VERIFY_EVERY` seconds
that its copy is still there (part 0 alone: one small read) and every
:data:`WHOLE_EVERY` seconds that it is whole, and writes what is missing. The copies of a
digest that no live instance announces, and that nobody wrote or found for
:data:`STALE_AFTER` seconds, are removed by the next instance that sweeps
(each sweeps after writing a copy and every :data:`VERIFY_EVERY` seconds).
At most :data:`MAX_COPIES` digests are kept at a time: past that an
instance announces no digest (readers treat it as an instance of a version
that says nothing of its jobs).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from .errors import ConfigurationError, Conflict
from .jobs import Overlap, Rules
from .schedules import Schedule, from_spec, spec
from .store import InstanceRecord, Store

#: The prefix of a copy's parts, and the key of the index of digests.
PARTS, INDEX = "decl/", "decl-index"
#: The layout of a copy; part of its digest. A change of :data:`PART_CHARS` is one too.
FORMAT = 1
#: Base64 characters per part: with its JSON around it, well within a control entry.
PART_CHARS = 15_000
#: Hex digits of a digest.
DIGEST_LEN = 24
#: Seconds after its last write or check that a copy no live instance announces is removed.
STALE_AFTER = 60.0
#: Seconds between an instance's checks of its own copy's part 0 (and its sweeps).
VERIFY_EVERY = 60.0
#: Seconds between an instance's reads of its whole copy: a sweep that raced with
#: an instance writing the same copy again may have left it short of a part.
WHOLE_EVERY = 600.0
#: The most digests kept at a time (the index stays one control entry).
MAX_COPIES = 200
#: The largest list a copy may hold once decompressed, in bytes.
MAX_LIST = 64 * 1024 * 1024

#: A schedule's written form as JSON text (sorted keys), or ``"null"``.
SpecText = str


def written(schedule: Schedule, rules: Rules | None = None) -> SpecText:
    """``schedule``'s written form as compact JSON text, with the job's rules that are
    not the default (``overlap``, ``limit``, ``pause_on_failure``); ``"null"`` if the
    schedule has no written form."""
    try:
        value: dict[str, object] | None = spec(schedule)
    except ConfigurationError:  # a schedule of the user's own kind
        value = None
    if value is not None and rules is not None:
        if rules.overlap is not Overlap.SKIP:
            value["overlap"] = rules.overlap.value
        if rules.limit is not None:
            value["limit"] = rules.limit
        if rules.pause_on_failure:
            value["pause_on_failure"] = True
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Copy:
    """The control entries of one declarations list, ready to write."""

    digest: str
    #: The parts' values, part 0 first.
    parts: tuple[str, ...]
    #: How many jobs it lists.
    jobs: int

    def key(self, part: int) -> str:
        return part_key(self.digest, part)


def part_key(digest: str, part: int) -> str:
    return f"{PARTS}{digest}/{part}"


def _digest(raw: bytes, layout: int = FORMAT) -> str:
    return hashlib.sha256(b"anarchon-decl-%d:" % layout + raw).hexdigest()[:DIGEST_LEN]


def encode(declared: Mapping[str, SpecText]) -> Copy:
    """The copy of ``declared`` (job name -> :func:`written` schedule)."""
    groups: dict[SpecText, list[str]] = {}
    for name, text in declared.items():
        groups.setdefault(text, []).append(name)
    listed = ",".join(
        f"[{text},{json.dumps(sorted(names), separators=(',', ':'))}]"
        for text, names in sorted(groups.items())
    )
    raw = zlib.compress(f'{{"format":{FORMAT},"schedules":[{listed}]}}'.encode(), 6)
    data = base64.b64encode(raw).decode()
    pieces = [data[i : i + PART_CHARS] for i in range(0, len(data), PART_CHARS)]
    parts = tuple(
        json.dumps({"part": i, "parts": len(pieces), "jobs": len(declared), "data": piece})
        for i, piece in enumerate(pieces)
    )
    return Copy(_digest(raw), parts, len(declared))


def decode(digest: str, entries: Mapping[str, tuple[int, str]]) -> dict[str, SpecText] | None:
    """The list the parts ``entries`` (as :meth:`Store.controls` reads them) hold:
    job name -> written schedule; ``None`` unless every part is there, and whole."""
    pieces: dict[int, str] = {}
    counts = set()
    try:
        for _, text in entries.values():
            value = json.loads(text)
            pieces[int(value["part"])] = str(value["data"])
            counts.add(int(value["parts"]))
        if len(counts) != 1 or set(pieces) != set(range(counts.pop())):
            return None
        raw = base64.b64decode("".join(pieces[i] for i in range(len(pieces))), validate=True)
        if _digest(raw) != digest:
            return None
        inflate = zlib.decompressobj()
        listed = inflate.decompress(raw, MAX_LIST)
        if inflate.unconsumed_tail or not inflate.eof:
            return None
        body = json.loads(listed)
        if body.get("format") != FORMAT:
            return None
        found: dict[str, SpecText] = {}
        for schedule, names in body["schedules"]:
            said = json.dumps(schedule, sort_keys=True, separators=(",", ":"))
            for name in names:
                found[str(name)] = said
        return found
    except (ValueError, KeyError, TypeError, binascii.Error, zlib.error):
        return None


def read(store: Store, digest: str) -> dict[str, SpecText] | None:
    """The list of ``digest`` as ``store`` keeps it (one read); ``None`` if not whole."""
    if not _is_digest(digest):
        return None
    return decode(digest, store.controls(f"{PARTS}{digest}/"))


def _is_digest(value: object) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and len(value) == DIGEST_LEN
        and all(c in "0123456789abcdef" for c in value)
    )


# -- reading (Control, the commands, the dashboard) ------------------------------


@dataclass(frozen=True)
class Declared:
    """A job as the live instances declare it."""

    job: str
    #: Its schedule as most of the instances that declare it declare it; ``None``
    #: for a schedule that cannot be written down (a kind of the user's own), or
    #: one this version cannot read.
    schedule: Schedule | None
    #: That schedule's written form (:func:`~anarchon_core.schedules.spec`), or ``None``.
    spec: Mapping[str, Any] | None
    #: How many live instances declare it.
    instances: int
    #: Every written form it is declared with, with how many instances declare
    #: each, most first: more than one while the instances disagree (a deploy
    #: under way).
    forms: tuple[tuple[Mapping[str, Any] | None, int], ...] = ()


@dataclass(frozen=True)
class DeclaredJobs:
    """What the registry says of the jobs the live instances declare."""

    #: Per job name, sorted.
    jobs: Mapping[str, Declared] = field(default_factory=dict)
    #: The live instances that run jobs but say nothing readable of them (an
    #: anarchon older than this one, or a copy not in the store yet): their jobs
    #: are known once recorded or stored.
    silent: tuple[str, ...] = ()


class Reader:
    """Reads the declarations of the live instances, each digest's copy once.

    A copy never changes once written, so each is read when its digest first
    shows in the registry, and kept while a live instance announces it; the
    jobs are worked out again only when the digests announced change. Not for
    use by several threads at once.
    """

    def __init__(self) -> None:
        self._copies: dict[str, dict[str, SpecText]] = {}
        self._forms: dict[SpecText, tuple[Schedule | None, Mapping[str, Any] | None]] = {}
        self._last: tuple[tuple[tuple[str, int], ...], DeclaredJobs] | None = None

    def read(self, store: Store, records: Sequence[InstanceRecord]) -> DeclaredJobs:
        """The jobs the live instances of ``records`` declare, their copies read from ``store``."""
        counts: Counter[str] = Counter()
        silent: list[str] = []
        by_digest: dict[str, list[str]] = {}
        for record in records:
            digest = record.info.get("decl")
            if _is_digest(digest):
                by_digest.setdefault(digest, []).append(record.instance)
            elif record.info.get("jobs") != 0:
                silent.append(record.instance)
        copies: dict[str, dict[str, SpecText]] = {}
        for digest, instances in by_digest.items():
            found = self._copies.get(digest)
            if found is None:
                found = read(store, digest)
            if found is None:
                silent += instances  # being written, or gone: said nothing readable yet
            else:
                copies[digest] = found
                counts[digest] = len(instances)
        self._copies = copies
        key = tuple(sorted(counts.items()))
        if self._last is not None and self._last[0] == key:
            return DeclaredJobs(self._last[1].jobs, tuple(sorted(silent)))
        jobs = DeclaredJobs(self._jobs(counts), tuple(sorted(silent)))
        self._last = (key, jobs)
        return jobs

    def _jobs(self, counts: Counter[str]) -> dict[str, Declared]:
        forms: dict[str, Counter[SpecText]] = {}
        for digest, n in counts.items():
            for name, text in self._copies[digest].items():
                forms.setdefault(name, Counter())[text] += n
        jobs = {}
        for name in sorted(forms):
            ranked = sorted(forms[name].items(), key=lambda item: (-item[1], item[0]))
            schedule, written_form = self._form(ranked[0][0])
            others = tuple((self._form(text)[1], n) for text, n in ranked)
            jobs[name] = Declared(name, schedule, written_form, sum(n for _, n in ranked), others)
        return jobs

    def _form(self, text: SpecText) -> tuple[Schedule | None, Mapping[str, Any] | None]:
        known = self._forms.get(text)
        if known is None:
            value = json.loads(text)
            try:
                schedule = from_spec(value) if isinstance(value, dict) else None
            except ConfigurationError:  # a zone this machine's tzdata lacks, say
                schedule = None
            known = self._forms[text] = (schedule, value if isinstance(value, dict) else None)
        return known


# -- writing (the engine's registry part) --------------------------------------


def publish(store: Store, copy: Copy, now: float) -> str | None:
    """Make sure ``store`` keeps ``copy`` whole; ``None`` once done, else why not
    (the index is full, or kept changing).

    The digest is noted in the index first (so that no sweep removes the
    copy being written), then the parts missing are created, part 0 last.
    A part another instance created meanwhile holds the same text (the
    digest says so): its :class:`Conflict` is taken as done.
    """
    refused = _note(store, copy, now)
    if refused:
        return refused
    found = store.controls(f"{PARTS}{copy.digest}/")
    if copy.key(0) in found and decode(copy.digest, found) is not None:
        return None
    for part in [*range(1, len(copy.parts)), 0]:
        if copy.key(part) not in found:
            with contextlib.suppress(Conflict):  # the same text, written by another
                store.set_control(copy.key(part), copy.parts[part], 0)
    return None


def whole(store: Store, copy: Copy) -> bool:
    """Whether ``store`` keeps every part of ``copy`` (one read of them all)."""
    return decode(copy.digest, store.controls(f"{PARTS}{copy.digest}/")) is not None


def present(store: Store, copy: Copy) -> bool:
    """Whether ``store`` keeps part 0 of ``copy`` (one small read): written last and
    removed first, it is there while the copy is."""
    return copy.key(0) in store.controls(copy.key(0))  # no other part's index starts with 0


def _index(store: Store) -> tuple[int, dict[str, dict[str, Any]]]:
    """The index of digests, and its version (0: none yet)."""
    found = store.controls(INDEX).get(INDEX)
    if found is None:
        return 0, {}
    try:
        value = json.loads(found[1])
        kept = {str(d): dict(v) for d, v in value.items() if _is_digest(d)}
    except (ValueError, TypeError, AttributeError):
        kept = {}  # unreadable: written again whole by the next change
    return found[0], kept


def _change_index(
    store: Store, change: Callable[[dict[str, dict[str, Any]]], bool], tries: int = 8
) -> bool:
    """Apply ``change`` to the index by compare-and-set (it says whether to write);
    ``False`` if the index kept changing under it."""
    for _ in range(tries):
        version, kept = _index(store)
        if not change(kept):
            return True
        text = json.dumps(kept, sort_keys=True, separators=(",", ":")) if kept else None
        try:
            if text is None and version == 0:
                return True
            store.set_control(INDEX, text, version)
            return True
        except Conflict:
            continue
    return False


def _note(store: Store, copy: Copy, now: float) -> str | None:
    """Note ``copy``'s digest in the index (again, if noted over half :data:`STALE_AFTER`
    ago); ``None`` once done, else why not."""
    full = False

    def change(kept: dict[str, dict[str, Any]]) -> bool:
        nonlocal full
        entry = kept.get(copy.digest)
        if entry is not None and now - float(entry.get("at", 0)) < STALE_AFTER / 2:
            return False
        if entry is None and len(kept) >= MAX_COPIES:
            full = True
            return False
        kept[copy.digest] = {"at": round(now, 3), "parts": len(copy.parts), "jobs": copy.jobs}
        return True

    if not _change_index(store, change):
        return "the index of copies kept changing (too many instances writing at once)"
    if full:
        return f"the store keeps {MAX_COPIES} copies already, each announced or recent"
    return None


def sweep(store: Store, announced: set[str], now: float) -> list[str]:
    """Remove the copies no live instance announces (``announced``: the digests the
    registry's records carry) and nobody noted for :data:`STALE_AFTER` seconds;
    the digests removed.

    Each is first taken out of the index by compare-and-set (an instance
    noting it meanwhile keeps it), then its parts are removed, part 0 first.
    """
    stale: list[str] = []

    def change(kept: dict[str, dict[str, Any]]) -> bool:
        stale.clear()
        for digest, entry in kept.items():
            if digest not in announced and now - float(entry.get("at", 0)) > STALE_AFTER:
                stale.append(digest)
        for digest in stale:
            del kept[digest]
        return bool(stale)

    if not _change_index(store, change):
        return []
    for digest in stale:
        parts = store.controls(f"{PARTS}{digest}/")
        first = part_key(digest, 0)
        for key in sorted(parts, key=lambda k: (k != first, k)):
            with contextlib.suppress(Conflict):  # removed by another sweep meanwhile
                store.set_control(key, None, parts[key][0])
    return stale
