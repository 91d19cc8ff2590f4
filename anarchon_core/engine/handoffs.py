"""HandOffs: the hand-offs of the handler threads, sent to the store together.

A handler that dispatches its slot's work (Celery, Dramatiq) records the
hand-off (:meth:`Run.hand_off <anarchon_core.Run.hand_off>`) before it sends,
each in its own thread, all at about the same time when many slots are due
together. Each hand-off still waits for its own answer before its send, but
they share store calls (a group commit): the first goes at once; those asked
while a call is in flight go together in the next one, sent by one of them.
A call waits for the handlers started with it to ask too: the runner of a
job whose handler handed a run off before is *expected*
(:meth:`HandOffs.expect`) when its handler is started, the engine holds the
call back while it starts a batch's handlers (:meth:`HandOffs.gathering`),
and a call is sent once no expected handler is still on its way (it asked,
or returned without asking), or :data:`GATHER` seconds after the hand-off
waiting, if sooner. So a tick's won slots cost one call, or a few, not one per slot, and
no hand-off waits more than :data:`GATHER` plus the call before it. A job's
hand-offs go one per call, in the order asked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..clock import Clock
from ..errors import BatchRefused
from ..store import Change, LeaseStore, RunState

#: The longest a hand-off waits for the handlers expected to ask with it, in seconds.
GATHER = 0.005
#: How often a hand-off waiting for another handler's call looks again, at most (seconds):
#: it wakes as that call ends.
SEND_POLL = 0.1


@dataclass(eq=False)
class _Asked:
    change: Change
    answered: bool = False
    accepted: bool = False
    error: BaseException | None = None


class HandOffs:
    """Sends the hand-offs asked by any thread, those asked meanwhile in one call."""

    def __init__(self, leases: LeaseStore, clock: Clock) -> None:
        self._leases = leases
        self._clock = clock
        self._cond = threading.Condition()
        self._asked: list[_Asked] = []
        self._sending = False
        #: Set once the call on its way (``_sending``) ended: a new one for each call.
        self._sent = threading.Event()
        #: The runs (job, token) whose handler is expected to hand off, not asked yet.
        self._expected: set[tuple[str, int]] = set()
        #: Open while the engine starts the handlers of a batch's won slots.
        self._gates = 0
        #: How many times a hand-off waited for others (for tests).
        self.waits = 0

    @contextmanager
    def gathering(self) -> Iterator[None]:
        """While the handlers of a batch are started: their expected hand-offs are not
        all known yet, so a call waits (at most :data:`GATHER`)."""
        with self._cond:
            self._gates += 1
        try:
            yield
        finally:
            with self._cond:
                self._gates -= 1
                self._cond.notify_all()

    def expect(self, job: str, token: int) -> None:
        """The handler of the run carrying ``token`` starts, and hands off, as before."""
        with self._cond:
            self._expected.add((job, token))

    def left(self, job: str, token: int) -> None:
        """The handler of that run returned: if it did not ask, no call waits for it."""
        with self._cond:
            if (job, token) in self._expected:
                self._expected.discard((job, token))
                self._cond.notify_all()

    def dispatch(self, job: str, token: int, lease: float) -> bool:
        """Hand the run carrying ``token`` off for ``lease`` seconds: the store's answer.

        Raises what the store raised for this hand-off (the whole call's error,
        or this item's refusal).
        """
        me = _Asked(Change(job, token, RunState.DISPATCHED, lease))
        with self._cond:
            self._asked.append(me)
            self._expected.discard((job, token))
            self._cond.notify_all()
        deadline = time.monotonic() + GATHER
        while True:
            with self._cond:
                if me.answered:
                    return self._answer(me)
                in_flight = self._sent if self._sending else None
                if in_flight is None:
                    wait = deadline - time.monotonic()
                    if (self._expected or self._gates) and wait > 0:
                        self.waits += 1
                        self._cond.wait(wait)
                        continue
                    self._sending, self._sent = True, threading.Event()
                    batch = self._take()
            if in_flight is not None:
                # Another handler's call is on its way: waited for through the clock, as
                # every wait of the engine, so that a test's clock knows this thread
                # waits (and may move on to the end of that call).
                self._clock.wait(in_flight, SEND_POLL)
                continue
            try:
                self._send(batch)
            finally:
                with self._cond:
                    self._sending = False
                    self._sent.set()
                    self._cond.notify_all()

    def _take(self) -> list[_Asked]:
        """The hand-offs of the next call, one per job, the oldest first (lock held)."""
        batch: list[_Asked] = []
        left: list[_Asked] = []
        jobs: set[str] = set()
        for asked in self._asked:
            if asked.change.job in jobs:
                left.append(asked)
            else:
                jobs.add(asked.change.job)
                batch.append(asked)
        self._asked = left
        return batch

    def _send(self, batch: list[_Asked]) -> None:
        try:
            answers: list[object] = list(self._leases.change_many([a.change for a in batch]))
        except BatchRefused as refused:
            answers = refused.answers
        except BaseException as exc:  # the whole call: every hand-off of it failed
            answers = [exc] * len(batch)
        for asked, answer in zip(batch, answers, strict=True):
            if isinstance(answer, BaseException):
                asked.error = answer
            else:
                asked.accepted = bool(answer)
            asked.answered = True

    @staticmethod
    def _answer(me: _Asked) -> bool:
        if me.error is not None:
            raise me.error
        return me.accepted
