"""Why a job is paused: the reason kept beside its pause mark.

``anarchon pause`` pauses for whatever reason its operator has; a job
declared with ``pause_on_failure=True`` is paused by anarchon itself after a
run ends failed, by the instance (or the Celery/Dramatiq worker) that
records the failure. That pause is the store's own (every instance's next
claim of the job is refused, as with ``anarchon pause``), and its reason is
kept in a control entry ``why/<job>``: which slot failed, on which instance,
when. ``anarchon status``, the dashboard and the metrics show it;
``anarchon resume`` clears it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass

from .errors import Conflict
from .store import ControlStore, Store

log = logging.getLogger(__name__)

#: The control entries holding why a job was paused.
WHY = "why/"


@dataclass(frozen=True)
class PauseReason:
    """Why ``job`` was paused: ``reason`` (a sentence), ``by`` (the instance or worker that
    paused it), ``at`` (Unix seconds) and the ``slot_id`` whose run ended failed."""

    job: str
    reason: str
    by: str
    at: float
    slot_id: str = ""


def failed_reason(slot_id: str, attempt: int) -> str:
    """The reason recorded when a run ended failed under ``pause_on_failure``."""
    return f"paused on failure: {slot_id} attempt {attempt} ended failed"


def pause_for(store: Store, reason: PauseReason) -> bool:
    """Pause ``reason.job`` on every instance, recording why; True if it was not paused yet.

    The reason is written first: a reader shows a reason only for a job that
    is paused, so a pause whose reason could not be written still pauses, and
    a reason whose pause failed (the error is raised) shows nowhere.
    """
    if isinstance(store, ControlStore):
        key = WHY + reason.job
        value = json.dumps(
            {"reason": reason.reason, "by": reason.by, "at": reason.at, "slot_id": reason.slot_id}
        )
        found = store.controls(key).get(key)
        # Another failure's reason written at the same moment says as much: kept.
        with contextlib.suppress(Conflict):
            store.set_control(key, value, found[0] if found else 0)
    return store.pause(reason.job)


def reasons(store: Store) -> dict[str, PauseReason]:
    """Per paused job, why it was paused (jobs paused by ``anarchon pause`` have none)."""
    if not isinstance(store, ControlStore):
        return {}
    paused = set(store.paused().jobs)
    found: dict[str, PauseReason] = {}
    for key, (_, text) in store.controls(WHY).items():
        job = key[len(WHY) :]
        if job not in paused:
            continue
        try:
            value = json.loads(text)
            found[job] = PauseReason(
                job,
                str(value["reason"]),
                str(value.get("by") or ""),
                float(value.get("at") or 0.0),
                str(value.get("slot_id") or ""),
            )
        except (ValueError, KeyError, TypeError):
            continue  # not one of ours: shown as a plain pause
    return found


def clear(store: Store, job: str) -> None:
    """Forget why ``job`` was paused (it was resumed)."""
    if not isinstance(store, ControlStore):
        return
    key = WHY + job
    found = store.controls(key).get(key)
    if found is not None:
        try:
            store.set_control(key, None, found[0])
        except Exception as exc:  # a newer reason was written meanwhile: it stays
            log.debug("anarchon: pause reason of %s kept: %s", job, exc)
