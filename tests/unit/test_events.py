"""Events: kinds that are strings and carry their log level, and the emitter."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest

from anarchon_core import Event, EventKind
from anarchon_core.events import Emitter
from anarchon_core.slots import Slot

SLOT = Slot("job", datetime(2024, 1, 1, tzinfo=timezone.utc))


def test_a_kind_is_its_string() -> None:
    assert EventKind.WON == "won"
    assert f"{EventKind.CATCH_UP}" == str(EventKind.CATCH_UP) == "catch_up"
    assert {"lost": 1}[EventKind.LOST] == 1
    assert EventKind("takeover") is EventKind.TAKEOVER


def test_every_kind_has_a_level() -> None:
    assert EventKind.WON.level == logging.DEBUG
    assert EventKind.TAKEOVER.level == logging.INFO
    assert EventKind.LOST.level == logging.WARNING
    assert all(kind.level in (logging.DEBUG, logging.INFO, logging.WARNING) for kind in EventKind)


def test_the_emitter_counts_logs_and_tells_the_listeners(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("anarchon_core.scheduler")
    emit = Emitter(instance="a", namespace="billing", logger=log)
    seen: list[Event] = []
    emit.add_listener(seen.append)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        emit(EventKind.TAKEOVER, slot=SLOT, attempt=2, detail="hand-over")
        emit(EventKind.STORE_RECOVERED)
    assert seen == [
        Event(EventKind.TAKEOVER, "job", "job@1704067200000", 2, "a", "hand-over"),
        Event(EventKind.STORE_RECOVERED, None, None, None, "a"),
    ]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "anarchon: takeover job@1704067200000 attempt 2 on a (hand-over)"),
        (logging.INFO, "anarchon: store_recovered billing attempt - on a"),
    ]
    assert emit.counts == {"takeover": 1, "store_recovered": 1}


def test_a_failing_listener_is_logged_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    emit = Emitter(instance="a", namespace="n", logger=logging.getLogger("anarchon_core.scheduler"))
    seen: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("broken")

    emit.add_listener(broken)
    emit.add_listener(seen.append)
    emit(EventKind.MISSED, slot=SLOT, detail="too late")
    assert [e.kind for e in seen] == ["missed"]
    assert "event listener" in caplog.text
