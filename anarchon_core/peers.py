"""Who claims a slot first: rendezvous hashing over the instances known to be live.

Every instance claims every slot, but not all at the same moment. For each
slot of each job, the live instance of highest rank (:func:`slot_rank` of
:func:`rank`) claims first, at the slot's time plus its jitter; the others
wait a deferral more (the jitter plus
:data:`~anarchon_core.roles.PEER_MARGIN`, at most a tenth of the
interval), read the record, and claim only a slot nobody claimed. The jobs
due together thus spread evenly over the instances, and so do the slots of
one job; each instance's claims stay one batch.

The live instances come from the store's registry (:meth:`Store.announce`,
every :data:`ANNOUNCE_EVERY` seconds; a record expires :data:`ANNOUNCE_TTL`
seconds after the last one, at once when its instance stops), less those
that run no job, and from claims' answers (an instance that holds a slot is
live). Every instance reads the same registry, so they soon agree on who is
preferred; a gone instance's share is claimed after the deferral until its
record expires. Where the store keeps no registry, an instance whose slot
this one won after deferring to it is left out until a claim's answer shows
it holding a slot again. Nothing here decides who runs a slot: the store's
atomic claim does; a wrong view only costs a deferral or a lost race.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .store import Claim, ClaimStatus, InstanceRecord

if TYPE_CHECKING:
    from .roles import JobRuntime

#: How often an instance announces itself in the store's registry, in seconds.
ANNOUNCE_EVERY = 5.0
#: How long a registry record lives without a new announcement.
ANNOUNCE_TTL = 3 * ANNOUNCE_EVERY
#: The most peers an instance keeps track of; past that, the one known longest goes.
MAX_PEERS = 1024


_MASK = (1 << 64) - 1


def rank(instance: str, job: str) -> int:
    """The base rank of ``instance`` for ``job``, the same on every instance."""
    digest = hashlib.blake2b(f"{instance}\0{job}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def slot_rank(base: int, slot_ms: int) -> int:
    """The rank for one slot, from a :func:`rank`: a 64-bit mix (SplitMix64's finaliser).

    Each slot of a job has its own order of instances, so that the slots of
    one job spread over the instances over time as the jobs of one tick do.
    """
    z = ((base ^ slot_ms) + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class Peers:
    """The other instances this one knows to be live, and each job's preferred instance.

    ``registry``: whether the store keeps a registry of live instances (see
    the module docstring).
    """

    def __init__(self, instance: str, registry: bool = True) -> None:
        self.instance = instance
        self.registry = registry
        #: The live peers, an ordered set (oldest first).
        self._live: dict[str, None] = {}
        #: Peers learned from claims since the last registry read.
        self._learned: set[str] = set()
        #: Changes whenever the live peers do: each job's preference is kept until then.
        self.version = 0

    def __contains__(self, instance: str) -> bool:
        return instance in self._live

    def names(self) -> list[str]:
        return list(self._live)

    def _ranks(self, rt: JobRuntime) -> list[tuple[int, str]]:
        """The base ranks of this instance and the live peers for ``rt``'s job (kept on it)."""
        if rt.peers_seen != self.version:
            name = rt.job.name
            rt.ranks = [(rank(peer, name), peer) for peer in (self.instance, *self._live)]
            rt.peers_seen = self.version
        return rt.ranks

    def preferred(self, rt: JobRuntime, slot_ms: int) -> str | None:
        """The instance that claims the slot ``slot_ms`` of ``rt`` first, ``None`` if this one.

        Also kept as ``rt.preferred``: the instance a deferred claim waited for.
        """
        best = max((slot_rank(base, slot_ms), peer) for base, peer in self._ranks(rt))[1]
        rt.preferred = None if best == self.instance else best
        return rt.preferred

    def learn(self, claim: Claim, waited_for: str | None) -> None:
        """What a claim's answer shows: a holder is live; without a registry, a peer
        waited for in vain (``waited_for``, and this instance won) is not."""
        holder = claim.holder
        if claim.won:
            if waited_for is not None and not self.registry:
                self._drop(waited_for)
        elif (
            holder is not None
            and holder.owner != self.instance
            and claim.status in (ClaimStatus.TAKEN, ClaimStatus.BUSY)
        ):
            self._learned.add(holder.owner)
            self._add(holder.owner)

    def refresh(self, live: Sequence[InstanceRecord]) -> None:
        """The registry's live records: they are the peers now, less those that run
        no job, with those learned from claims since the last read."""
        names = self._learned | {r.instance for r in live if r.info.get("jobs") != 0}
        names.discard(self.instance)
        self._learned.clear()
        if names != set(self._live):
            self._live = {name: None for name in self._live if name in names}
            for name in sorted(names - set(self._live)):
                self._live[name] = None
            self._trim()
            self.version += 1

    def _add(self, name: str) -> None:
        if name not in self._live:
            self._live[name] = None
            self._trim()
            self.version += 1

    def _drop(self, name: str) -> None:
        if name in self._live:
            del self._live[name]
            self.version += 1

    def _trim(self) -> None:
        while len(self._live) > MAX_PEERS:
            del self._live[next(iter(self._live))]
