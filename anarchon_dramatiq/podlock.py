"""The pod lock: of the worker processes one ``dramatiq`` command forks, one runs the scheduler.

The lock is an exclusive ``flock`` on a file named after the command's
process id (the worker processes' parent), the namespace and the store. The
kernel drops the lock when its holder dies; the other processes retry it
every few seconds and take over.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import threading

#: How often worker processes without the pod lock try to take it.
LOCK_RETRY = 2.0


class PodLock:
    """An exclusive, non-blocking ``flock`` on a file: held by one process, freed on death."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @classmethod
    def of_this_command(cls, namespace: str, store_url: str) -> PodLock:
        """The lock shared by the worker processes of this ``dramatiq`` command."""
        digest = hashlib.sha256(f"{namespace}|{store_url}|{os.getppid()}".encode()).hexdigest()
        return cls(os.path.join(tempfile.gettempdir(), f"anarchon-dq-{digest[:16]}.lock"))

    def acquire(self) -> bool:
        """Take the lock if no other process holds it; False if one does."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def wait(self, stop: threading.Event) -> bool:
        """Take the lock, trying every :data:`LOCK_RETRY` seconds; False once ``stop`` is set."""
        while not self.acquire():
            if stop.wait(LOCK_RETRY):
                return False
        return True

    def release(self) -> None:
        """Let another process take the lock."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the lock
