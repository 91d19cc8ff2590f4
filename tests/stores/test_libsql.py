"""The libSQL store's own HTTP client: bounded in time, and never stopping the process."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from anarchon_core import StoreUnavailable, open_store
from tests.scenarios.faults import TcpProxy

SLOT = 1_700_000_000_000
TIMEOUT = 1.0


class Spinner:
    """A thread counting 10 ms steps: it stops counting while another thread holds the GIL."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.count += 1
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def spinner() -> Iterator[Spinner]:
    spin = Spinner()
    yield spin
    spin.stop()


def timed_failure(call: object) -> float:
    """Seconds until ``call()`` raised StoreUnavailable (it must)."""
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as raised:
        call()  # type: ignore[operator]
    assert "libSQL" in str(raised.value)
    return time.monotonic() - began


def test_a_server_that_accepts_and_never_answers_fails_the_call_in_time(
    spinner: Spinner,
) -> None:
    """A frozen sqld (its kernel still accepts): the call fails after the timeout."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        store = open_store(f"http://127.0.0.1:{port}?timeout={TIMEOUT}", namespace="silent")
        try:
            before = spinner.count
            took = timed_failure(lambda: store.claim("job", SLOT, "a", 10))
            counted = spinner.count - before
        finally:
            store.close()
    assert TIMEOUT - 0.1 < took < TIMEOUT + 2
    # The other thread went on while the call waited (about 100 steps a second).
    assert counted > took * 30, f"{counted} steps in {took:.2f} s"


def test_a_link_gone_silent_mid_session_fails_each_call_in_time_then_recovers(
    libsql_url: str, spinner: Spinner
) -> None:
    """A real sqld behind a link that goes silent, then comes back.

    Every call while silent raises within the timeout (the claim, a renewal,
    a read), other threads run meanwhile, and once the link is back the
    store answers again, with the lease the claim took intact.
    """
    host, port = libsql_url.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port))
    url = f"http://127.0.0.1:{proxy.port}?timeout={TIMEOUT}"
    store = open_store(url, namespace=f"l{uuid.uuid4().hex[:10]}")
    try:
        won = store.claim("job", SLOT, "a", 30)
        assert won.won and won.holder is not None
        proxy.blackhole()
        before = spinner.count
        took = [
            timed_failure(lambda: store.renew("job", won.holder.token, 30)),  # type: ignore[union-attr]
            timed_failure(lambda: store.state("job")),
            timed_failure(lambda: store.claim("other", SLOT, "a", 30)),
        ]
        counted = spinner.count - before
        assert all(t < TIMEOUT + 2 for t in took), took
        assert counted > sum(took) * 30, f"{counted} steps in {sum(took):.2f} s"
        proxy.restore()
        deadline = time.monotonic() + 15
        while True:
            try:
                state = store.state("job")
                break
            except StoreUnavailable:
                # New connections are forwarded again; one cut mid-answer may fail once.
                assert time.monotonic() < deadline, (
                    "the store did not answer after the link came back"
                )
                time.sleep(0.2)
        assert state is not None and state.token == won.holder.token
        assert store.renew("job", won.holder.token, 30)
    finally:
        store.close()
        proxy.close()
