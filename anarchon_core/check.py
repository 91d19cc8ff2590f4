"""``anarchon check``: a health probe run beside an instance (a Kubernetes exec probe).

Three checks, each printed on a line of its own:

- **store**: the store answers a ping.
- **loop**: an instance of this host (or the one named) recorded itself in
  the store's registry within :data:`LIVE_WITHIN` seconds. Instances do so
  every :data:`~anarchon_core.peers.ANNOUNCE_EVERY` seconds from their
  scheduling loop, so a frozen, hung or stopped loop fails it within
  :data:`LIVE_WITHIN` seconds. Skipped on a store without a registry
  (RabbitMQ) and with ``host=None``. With ``fail_behind``, it also fails
  while that instance runs behind by more than that many seconds: its own
  renewals and finishes late, so that it defers its claims (see
  :mod:`anarchon_core.engine.pacing`).
- **job** (each one named): its last run that ended ``done`` is no older
  than ``max_late``; by default, twice the gap between its two most recent
  slots (its interval plus the default catch-up window, which is that
  interval). A job with fewer than two slots recorded is not judged yet; one
  with none passes while a live instance declares it (or its schedule is
  stored), and fails otherwise: a name nothing knows.

The verdict is healthy only if every check passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from .control import Control
from .peers import ANNOUNCE_EVERY
from .schedules import NEVER
from .store import ControlStore, RegistryStore, Store

#: An instance whose registry record is older than this (seconds) counts as stalled.
LIVE_WITHIN = 2 * ANNOUNCE_EVERY + 2.0


@dataclass(frozen=True)
class Finding:
    """One check's outcome."""

    check: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{'ok' if self.ok else 'FAIL'}  {self.check}: {self.detail}"


def check(
    store: Store,
    now: float,
    *,
    host: str | None,
    instance: str | None = None,
    jobs: tuple[str, ...] = (),
    max_late: float | None = None,
    fail_behind: float | None = None,
) -> list[Finding]:
    """The findings of every check on ``store`` at ``now`` (Unix seconds).

    Raises what ``store.ping()`` raises when the store does not answer: the
    caller reports it (with the URL redacted) as the store check's failure.
    """
    store.ping()
    found = [Finding("store", True, "answers")]
    if (host is not None or instance is not None) and isinstance(store, RegistryStore):
        found.append(_loop(store, host, instance, fail_behind))
    for job in jobs:
        found.append(_job(store, job, now, max_late))
    return found


def _loop(
    store: Store, host: str | None, instance: str | None, fail_behind: float | None
) -> Finding:
    records = store.instances()
    if instance is not None:
        mine = [r for r in records if r.instance == instance]
        who = f"instance {instance!r}"
    else:
        mine = [r for r in records if r.info.get("host") == host]
        who = f"an instance on host {host!r}"
    if not mine:
        return Finding(
            "loop", False, f"no record of {who} in the registry (it expires 15s after the last)"
        )
    freshest = min(mine, key=lambda r: r.age)
    if freshest.age > LIVE_WITHIN:
        return Finding(
            "loop", False, f"{freshest.instance} last recorded itself {freshest.age:.1f}s ago"
        )
    behind = float(freshest.info.get("behind") or 0.0)
    if fail_behind is not None and behind > fail_behind:
        deferred = int(freshest.info.get("deferred") or 0)
        return Finding(
            "loop",
            False,
            f"{freshest.instance} runs {behind:.1f}s behind (more than {fail_behind:g}s):"
            f" its renewals and finishes are late; {deferred} claims deferred so far",
        )
    return Finding("loop", True, f"{freshest.instance} recorded itself {freshest.age:.1f}s ago")


def _job(store: Store, job: str, now: float, max_late: float | None) -> Finding:
    what = f"job {job!r}"
    if store.state(job) is None:
        return _unrecorded(store, job, now)
    # Newest first; a slot taken over shows once per attempt.
    slots = sorted({r.slot_ms for r in store.history(job, 10)}, reverse=True)
    bound = max_late
    if bound is None:
        if len(slots) < 2:
            return Finding(what, True, "too few slots recorded to judge yet (give --max-late)")
        bound = 2 * (slots[0] - slots[1]) / 1000
    stats = store.stats([job]).get(job)
    last = stats.last_success if stats is not None else None
    if last is None:
        first = slots[-1] / 1000 if slots else now
        if now - first > bound:
            return Finding(what, False, f"no run ever succeeded; bound {bound:g}s")
        return Finding(what, True, "no success yet, within the bound")
    late = max(0.0, now - last)  # a success stamped a hair ahead of this clock is now
    if late > bound:
        return Finding(what, False, f"last success {late:.1f}s ago, more than {bound:g}s")
    return Finding(what, True, f"last success {late:.1f}s ago (bound {bound:g}s)")


def _unrecorded(store: Store, job: str, now: float) -> Finding:
    """A job with no record: not judged while live instances declare it (or its schedule is
    stored), its first slot to come; a name nothing knows fails."""
    what = f"job {job!r}"
    control = Control(store)
    declared = control.declarations().jobs.get(job)
    stored = isinstance(store, ControlStore) and job in control.definitions()
    if declared is None and not stored:
        return Finding(what, False, "not recorded in the store")
    who = f"declared by {declared.instances} live instance(s)" if declared else "stored"
    schedule = declared.schedule if declared else control.definitions()[job].schedule()
    if schedule is None:
        return Finding(what, True, f"no slot recorded yet ({who})")
    nxt = schedule.next_after(datetime.fromtimestamp(now, timezone.utc))
    if nxt == NEVER:
        return Finding(what, True, f"no slot recorded, and it has ended ({who})")
    return Finding(
        what, True, f"no slot recorded yet ({who}); next slot {nxt:%Y-%m-%d %H:%M:%S} UTC"
    )
