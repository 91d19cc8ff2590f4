"""A scheduling step, and what must wait for its end: a stop, a close, a signal's handler.

A step may hold the store's connection. A stop or a close asked for from
inside the step (by a signal handler, which runs in the stepping thread
between two of its instructions; by a handler the step called) must not
tear that connection down under it, nor wait for the step to end (it is
the same thread: it would wait forever). It is deferred instead, and runs
as the step ends. One mechanism, for the engine's loop and for Celery beat:
pure threading, nothing of the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Action = Callable[[], object]


class StepGuard:
    """Marks the step under way; runs what was deferred during it when it ends.

    ``holds``, if given, is asked too by :attr:`inside` (Celery beat: whether
    the thread holds the lock of the step, see :attr:`inside`).
    """

    def __init__(self, holds: Callable[[], bool] | None = None) -> None:
        self._holds = holds
        #: The thread inside a step, if any.
        self._stepping: int | None = None
        #: Deferred until the step's end: whatever its outcome, and only if it returned.
        self._always: list[Action] = []
        self._if_returned: list[Action] = []

    @property
    def inside(self) -> bool:
        """Whether the calling thread is inside a step (and ``holds()``, if given).

        ``holds`` is there for a step that may be abandoned half-way: a signal
        whose handler raised SystemExit on the step's first or last line
        leaves the mark set with no step under way, and an action deferred
        to that step's end would never come; holding the step's lock tells
        the two apart.
        """
        if self._stepping != threading.get_ident():
            return False
        return self._holds() if self._holds is not None else True

    @contextmanager
    def step(self) -> Iterator[None]:
        """One step. As it ends, the mark is cleared, then the deferred actions run.

        Those deferred with ``if_returned=False`` run first, whatever the step's
        outcome; then, only if the step returned (did not raise), those deferred
        with ``if_returned=True``. Each runs once, in the order deferred.
        """
        returned = False
        self._stepping = threading.get_ident()
        try:
            yield
            returned = True
        finally:
            self._stepping = None
            always, self._always = self._always, []
            if_returned, self._if_returned = self._if_returned, []
            for action in always:
                action()
        if returned:
            for action in if_returned:
                action()

    def defer(self, action: Action, *, if_returned: bool = False) -> bool:
        """Run ``action`` at the end of the step the calling thread is inside.

        Returns False, deferring nothing, when the thread is not inside a step:
        the caller then acts at once. An action already deferred (an equal
        one: the same bound method) is not deferred twice.
        """
        if not self.inside:
            return False
        actions = self._if_returned if if_returned else self._always
        if action not in actions:
            actions.append(action)
        return True

    def deferred(self, action: Action) -> bool:
        """Whether ``action`` waits for the end of the step under way."""
        return action in self._always or action in self._if_returned
