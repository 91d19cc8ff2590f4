"""Control entries: versioned compare-and-set of small JSON texts, on every store.

``Store.set_control(key, value, expected)`` writes (or, with ``None``, removes)
an entry only if its version is ``expected`` (0: only if absent), returns the
new version (0 once removed) and otherwise raises ``Conflict`` having written
nothing; ``Store.controls(prefix)`` reads them back. Versions never repeat for
a key of a namespace. RabbitMQ keeps no control entries and says so.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from anarchon_core import ConfigurationError, Store
from anarchon_core.errors import Conflict
from anarchon_core.store import MAX_CONTROL_KEY, MAX_CONTROL_VALUE, ControlStore
from tests.stores.conftest import StoreFactory

RACERS = 8
ROUNDS = 4


@pytest.fixture
def controls_store(kind: str, make_store: StoreFactory) -> Store:
    """The namespace's store, on every kind that keeps control entries."""
    if kind == "rabbitmq":
        pytest.skip("RabbitMQ is claim-only: it keeps no control entries")
    return make_store()


def _conflict(store: Store, key: str, value: str | None, expected: int) -> Conflict:
    """The Conflict that ``set_control`` must raise; the test fails if it returns."""
    with pytest.raises(Conflict) as caught:
        store.set_control(key, value, expected)
    return caught.value


def _assert_conflict(error: Conflict, key: str, expected: int, found: int) -> None:
    assert (error.key, error.expected, error.found) == (key, expected, found)


# -- 1. the life of one entry -------------------------------------------------


def test_create_read_update_remove_compare_and_set(
    controls_store: Store, make_store: StoreFactory
) -> None:
    store = controls_store
    key = "run/nightly/1"
    assert store.controls() == {}

    # Create: only while absent (expected 0).
    v1 = store.set_control(key, '{"n": 1}', 0)
    assert isinstance(v1, int) and v1 > 0
    assert store.controls() == {key: (v1, '{"n": 1}')}
    # Another store object of the namespace (another connection) sees the same.
    assert make_store().controls() == {key: (v1, '{"n": 1}')}

    # Creating again: Conflict naming the version there, nothing written.
    _assert_conflict(_conflict(store, key, '{"n": 2}', 0), key, 0, v1)
    assert store.controls() == {key: (v1, '{"n": 1}')}

    # Update with the version read: a new version.
    v2 = store.set_control(key, '{"n": 3}', v1)
    assert isinstance(v2, int) and v2 > 0 and v2 != v1
    assert store.controls() == {key: (v2, '{"n": 3}')}

    # Update with a stale version: Conflict, value and version unchanged.
    _assert_conflict(_conflict(store, key, '{"n": 4}', v1), key, v1, v2)
    assert store.controls() == {key: (v2, '{"n": 3}')}
    # A version that never was: Conflict too.
    _assert_conflict(_conflict(store, key, '{"n": 5}', v2 + 1000), key, v2 + 1000, v2)
    assert store.controls() == {key: (v2, '{"n": 3}')}

    # Remove with a stale version: Conflict, entry kept.
    _assert_conflict(_conflict(store, key, None, v1), key, v1, v2)
    assert store.controls() == {key: (v2, '{"n": 3}')}
    # Remove while claiming it absent: Conflict, entry kept.
    _assert_conflict(_conflict(store, key, None, 0), key, 0, v2)
    assert store.controls() == {key: (v2, '{"n": 3}')}

    # Remove with the right version: 0, and gone (for every store object).
    assert store.set_control(key, None, v2) == 0
    assert store.controls() == {}
    assert make_store().controls() == {}

    # The removed entry's last version no longer matches anything.
    _assert_conflict(_conflict(store, key, None, v2), key, v2, 0)
    _assert_conflict(_conflict(store, key, '{"n": 6}', v2), key, v2, 0)
    assert store.controls() == {}

    # Removing an absent entry with expected 0 is a no-op answering 0, both for
    # the entry just removed and for a key never written.
    assert store.set_control(key, None, 0) == 0
    assert store.set_control("never/written", None, 0) == 0
    assert store.controls() == {}
    # ... and a never-written key has no version but 0.
    _assert_conflict(_conflict(store, "never/written", None, v1), "never/written", v1, 0)
    _assert_conflict(_conflict(store, "never/written", "{}", v1), "never/written", v1, 0)
    assert store.controls() == {}


def test_entries_of_one_namespace_are_independent(controls_store: Store) -> None:
    store = controls_store
    a = store.set_control("a", '"a"', 0)
    b = store.set_control("b", '"b"', 0)
    assert a != b
    # Changing (and removing) one leaves the other's version and value alone.
    a2 = store.set_control("a", '"a2"', a)
    assert store.controls() == {"a": (a2, '"a2"'), "b": (b, '"b"')}
    # One key's version does not pass for another's.
    _assert_conflict(_conflict(store, "b", '"x"', a2), "b", a2, b)
    assert store.set_control("a", None, a2) == 0
    assert store.controls() == {"b": (b, '"b"')}


# -- 2. versions never repeat ---------------------------------------------------


def test_a_recreated_entry_gets_a_new_version(
    controls_store: Store, make_store: StoreFactory
) -> None:
    store = controls_store
    editor = make_store()  # an editor that read the entry before it was removed
    key = "manual/report/7"
    seen: list[int] = []
    for cycle in range(3):
        created = store.set_control(key, f'{{"cycle": {cycle}}}', 0)
        held = editor.controls(key)[key][0]  # the editor reads it
        assert held == created
        updated = store.set_control(key, f'{{"cycle": {cycle}, "edited": true}}', created)
        assert store.set_control(key, None, updated) == 0
        recreated = store.set_control(key, f'{{"cycle": {cycle}, "again": true}}', 0)
        seen += [created, updated, recreated]
        # The versions the editor may hold are all gone: its writes conflict.
        for old in (created, updated):
            _assert_conflict(_conflict(editor, key, '"stale"', old), key, old, recreated)
            _assert_conflict(_conflict(editor, key, None, old), key, old, recreated)
        assert store.controls() == {key: (recreated, f'{{"cycle": {cycle}, "again": true}}')}
        assert store.set_control(key, None, recreated) == 0
    assert len(set(seen)) == len(seen), f"a version was given twice: {seen}"
    assert 0 not in seen


def test_an_absent_entry_matches_no_version_but_0(controls_store: Store) -> None:
    """Once removed, an entry is absent: no version of any kind lets a write through.

    (A store that remembers removals as writes of their own, with a version of
    their own, such as NATS's delete markers, must still answer Conflict for
    that version.)
    """
    store = controls_store
    key = "run/gone/1"
    created = store.set_control(key, '"x"', 0)
    assert store.set_control(key, None, created) == 0
    for expected in range(created + 1, created + 4):
        _assert_conflict(_conflict(store, key, '"back"', expected), key, expected, 0)
        assert store.controls() == {}
        _assert_conflict(_conflict(store, key, None, expected), key, expected, 0)
        assert store.controls() == {}


# -- 3. prefix filtering and namespaces -------------------------------------------


def test_controls_filters_by_prefix_and_namespace(
    controls_store: Store, make_store: StoreFactory
) -> None:
    store = controls_store
    r1 = store.set_control("run/a/1", '{"job": "a"}', 0)
    r2 = store.set_control("run/b/2", '{"job": "b"}', 0)
    m5 = store.set_control("manual/a/5", '{"job": "a", "manual": true}', 0)
    run = {"run/a/1": (r1, '{"job": "a"}'), "run/b/2": (r2, '{"job": "b"}')}
    manual = {"manual/a/5": (m5, '{"job": "a", "manual": true}')}

    assert store.controls("run/") == run
    assert store.controls("") == {**run, **manual}
    assert store.controls() == {**run, **manual}
    assert store.controls("manual/") == manual
    assert store.controls("run/a") == {"run/a/1": run["run/a/1"]}
    assert store.controls("run/a/1") == {"run/a/1": run["run/a/1"]}
    assert store.controls("run/a/1/") == {}
    assert store.controls("run/c") == {}
    assert store.controls("RUN/") == {}  # case matters
    assert store.controls("un/") == {}  # a prefix, not a substring

    # Another namespace sees none of them and keeps its own.
    other = make_store("other")
    assert other.controls() == {}
    assert other.controls("run/") == {}
    mine = other.set_control("run/a/1", '"other"', 0)  # absent there: creating works
    assert other.controls() == {"run/a/1": (mine, '"other"')}
    assert other.set_control("run/a/1", None, mine) == 0
    assert store.controls() == {**run, **manual}


def test_prefix_is_matched_literally(controls_store: Store) -> None:
    """No pattern characters: ``%``, ``_``, ``*``, ``.`` and ``[`` are themselves."""
    store = controls_store
    keys = ["a%b/1", "axb/1", "a_c/1", "abc/1", "a*d/1", "a.e/1", "a[f]/1", "a\\g/1"]
    versions = {key: store.set_control(key, f'"{key[:3]}"', 0) for key in keys}
    for prefix, expected in [
        ("a%", ["a%b/1"]),
        ("a_", ["a_c/1"]),
        ("a*", ["a*d/1"]),
        ("a.", ["a.e/1"]),
        ("a[", ["a[f]/1"]),
        ("a\\", ["a\\g/1"]),
        ("a", keys),
    ]:
        found = store.controls(prefix)
        assert set(found) == set(expected), prefix
        assert all(found[key][0] == versions[key] for key in expected)


# -- 4. editors racing ---------------------------------------------------------

#: Answers of a racer: the version it wrote, or the Conflict it got (as a tuple,
#: so that it crosses a process boundary).
Answer = tuple[str, int, int, int]


def _read_then_set(store: Store, key: str, value: str | None, barrier: Any) -> Answer:
    """One editor: read the entry's version, wait for the others, compare-and-set it."""
    read = store.controls(key).get(key, (0, ""))[0]
    barrier.wait()
    try:
        return ("won", store.set_control(key, value, read), read, 0)
    except Conflict as error:
        named = "conflict" if error.key == key else f"conflict on {error.key!r}"
        return (named, error.expected, error.found, read)


def _racer_process(url: str, namespace: str, key: str, value: str | None, barrier: Any) -> Answer:
    """An editor in a process of its own (see :func:`_race`)."""
    from anarchon_core import open_store

    store = open_store(url, namespace=namespace)
    try:
        return _read_then_set(store, key, value, barrier)
    finally:
        store.close()


class _Racers:
    """``RACERS`` editors of one namespace, each with a store object of its own.

    Threads, each with its own store (its own connection); on libSQL each
    editor is a process with its own connection, as instances are.
    """

    def __init__(self, kind: str, store_url: str, make_store: StoreFactory) -> None:
        self.stores = [make_store("x") for _ in range(RACERS)]
        self.namespace = self.stores[0].namespace
        self.url = store_url
        self.processes = kind == "libsql"

    def race(self, key: str, values: Sequence[str | None]) -> list[Answer]:
        """Every editor reads ``key``, then all write (``values[i]``) at once."""
        assert len(values) == RACERS
        if self.processes:
            context = multiprocessing.get_context("spawn")
            with context.Manager() as manager, context.Pool(RACERS) as pool:
                barrier = manager.Barrier(RACERS, timeout=60)
                args = [(self.url, self.namespace, key, v, barrier) for v in values]
                return pool.starmap(_racer_process, args)
        barrier = threading.Barrier(RACERS, timeout=60)
        answers: list[Any] = [None] * RACERS

        def run(index: int) -> None:
            try:
                answers[index] = _read_then_set(self.stores[index], key, values[index], barrier)
            except BaseException as exc:  # the test inspects every answer
                answers[index] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(RACERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads), "a racer hung"
        failed = [a for a in answers if isinstance(a, BaseException)]
        assert not failed, f"racers failed otherwise than with Conflict: {failed!r}"
        return answers


def _one_winner(answers: list[Answer], expected: int) -> tuple[int, int]:
    """The index and new version of the one editor that won; every other got Conflict.

    Every editor read version ``expected``, and nothing but the winner wrote:
    each loser's Conflict names the winner's version.
    """
    won = [(i, answer[1]) for i, answer in enumerate(answers) if answer[0] == "won"]
    assert len(won) == 1, f"{len(won)} editors won: {answers!r}"
    ((index, version),) = won
    reads = {answer[2] if answer[0] == "won" else answer[3] for answer in answers}
    assert reads == {expected}, f"the editors read versions {reads}, not {expected}"
    for i, answer in enumerate(answers):
        if i != index:
            assert answer == ("conflict", expected, version, expected), answers
    return index, version


def test_editors_racing_one_wins_the_others_conflict(
    kind: str, store_url: str, make_store: StoreFactory
) -> None:
    """Two (here eight) editors racing on one job's schedule: one wins, the others get
    a conflict error; nothing half-written."""
    if kind == "rabbitmq":
        pytest.skip("RabbitMQ is claim-only: it keeps no control entries")
    racers = _Racers(kind, store_url, make_store)
    key = "schedule/report"

    def value(round_: int, index: int) -> str:
        note = "\u00e9" * index  # values of different lengths
        return f'{{"round": {round_}, "editor": {index}, "note": "{note}"}}'

    version = 0
    for round_ in range(ROUNDS):  # round 0 races to create, the others to update
        answers = racers.race(key, [value(round_, i) for i in range(RACERS)])
        index, new = _one_winner(answers, version)
        assert new > 0 and new != version
        for store in (racers.stores[0], make_store("x")):
            assert store.controls() == {key: (new, value(round_, index))}
        version = new

    # Removers race with updaters: one of them wins, whole.
    values = [None if i % 2 else f'{{"last": {i}}}' for i in range(RACERS)]
    index, new = _one_winner(racers.race(key, values), version)
    if values[index] is None:
        assert new == 0
        assert make_store("x").controls() == {}
    else:
        assert new not in (0, version)
        assert make_store("x").controls() == {key: (new, values[index])}


def test_racing_creators_of_a_removed_entry(
    kind: str, store_url: str, make_store: StoreFactory
) -> None:
    """Re-creating a removed entry is a compare-and-set too: one creator wins."""
    if kind == "rabbitmq":
        pytest.skip("RabbitMQ is claim-only: it keeps no control entries")
    racers = _Racers(kind, store_url, make_store)
    store = racers.stores[0]
    key = "run/again/1"
    for round_ in range(ROUNDS):
        before = store.set_control(key, '"to remove"', 0)
        assert store.set_control(key, None, before) == 0
        values = [f'"{round_}/{i}"' for i in range(RACERS)]
        index, new = _one_winner(racers.race(key, values), 0)
        assert new not in (0, before)
        assert make_store("x").controls() == {key: (new, values[index])}
        assert store.set_control(key, None, new) == 0


# -- 5. text round-trips ---------------------------------------------------------

VALUES = [
    '{"msg": "h\u00e9llo \\"w\u00f6rld\\" \U0001f600 \u2014 \'single\' | pipe"}',
    '12|34|{"not": "a version"}',
    '"line\\nbreak", real\nbreak\r\nand\ttab',
    '{"escaped": "\\u0000\\u001f", "back\\\\slash": "\\\\"}',
    '["\u65e5\u672c\u8a9e", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\U0001d11e"]',
    "   spaces around   ",
    "{}",
]

KEYS = [
    "run/nightly report/2024-01-01T00:00:00Z",
    "manual/\u00fcn\u00ef\u00e7\u00f8d\u00e9/\U0001f600",
    "a b c",
    'quote\'s "key"',
    "x|y",
    "c.j/pipe|and=equals+plus",
    "/leading/and/trailing/",
    "\u65e5\u672c\u8a9e/\u30b8\u30e7\u30d6/1",
]


def test_values_round_trip_exactly(controls_store: Store, make_store: StoreFactory) -> None:
    store = controls_store
    versions = {}
    for i, value in enumerate(VALUES):
        versions[f"v/{i}"] = store.set_control(f"v/{i}", value, 0)
    expected = {f"v/{i}": (versions[f"v/{i}"], value) for i, value in enumerate(VALUES)}
    assert store.controls() == expected
    assert make_store().controls("v/") == expected
    # Updating to another odd value round-trips too.
    new = store.set_control("v/0", VALUES[1], versions["v/0"])
    assert store.controls("v/0") == {"v/0": (new, VALUES[1])}


def test_an_empty_value_is_refused_before_anything_is_written(controls_store: Store) -> None:
    """The empty text is no JSON value: refused, as every other bad input, naming it."""
    store = controls_store
    with pytest.raises(ValueError, match="empty"):
        store.set_control("empty", "", 0)
    assert store.controls() == {}
    assert store.set_control("empty", "{}", 0) > 0  # nothing was written under the key


def test_keys_with_slashes_spaces_and_unicode(controls_store: Store) -> None:
    store = controls_store
    versions = {key: store.set_control(key, f'{{"i": {i}}}', 0) for i, key in enumerate(KEYS)}
    assert store.controls() == {key: (versions[key], f'{{"i": {i}}}') for i, key in enumerate(KEYS)}
    assert set(store.controls("manual/\u00fcn")) == {KEYS[1]}
    assert set(store.controls("\u65e5\u672c")) == {KEYS[7]}
    assert set(store.controls("quote's")) == {KEYS[3]}
    for i, key in enumerate(KEYS):  # each is its own entry for compare-and-set
        _assert_conflict(_conflict(store, key, "{}", 0), key, 0, versions[key])
        assert store.set_control(key, None, versions[key]) == 0
        assert set(store.controls()) == set(KEYS[i + 1 :])


def test_the_largest_key_and_value_are_accepted(controls_store: Store) -> None:
    store = controls_store
    ascii_key = "k" * MAX_CONTROL_KEY
    wide_key = "\U0001d11e" * MAX_CONTROL_KEY  # 300 characters, 1200 bytes
    ascii_value = "v" * MAX_CONTROL_VALUE
    wide_value = "\u00e9" * (MAX_CONTROL_VALUE // 2)  # 16384 bytes
    a = store.set_control(ascii_key, ascii_value, 0)
    w = store.set_control(wide_key, wide_value, 0)
    assert store.controls() == {ascii_key: (a, ascii_value), wide_key: (w, wide_value)}
    assert store.controls("k") == {ascii_key: (a, ascii_value)}


# -- 6. bad input ------------------------------------------------------------------

BAD_KEYS = [
    "",
    "k" * (MAX_CONTROL_KEY + 1),
    "\u00e9" * (MAX_CONTROL_KEY + 1),
    "line\nbreak",
    "tab\there",
    "nul\x00",
    "del\x7f",
    "zero\u200bwidth",
    "lone\ud800surrogate",
]


@pytest.mark.parametrize("bad_key", BAD_KEYS, ids=range(len(BAD_KEYS)))
def test_bad_keys_are_refused_before_writing(controls_store: Store, bad_key: str) -> None:
    store = controls_store
    version = store.set_control("kept", '"kept"', 0)
    before = {"kept": (version, '"kept"')}
    for value, expected in [('"new"', 0), (None, 0), ('"new"', version), (None, version)]:
        with pytest.raises(ValueError):
            store.set_control(bad_key, value, expected)
        assert store.controls() == before
    # The bad key was not half-written: a valid write of "kept" still needs its version.
    assert store.set_control("kept", '"still"', version) != version


def test_oversized_values_are_refused_before_writing(controls_store: Store) -> None:
    store = controls_store
    version = store.set_control("k", '"small"', 0)
    too_big = [
        "v" * (MAX_CONTROL_VALUE + 1),
        "\u00e9" * (MAX_CONTROL_VALUE // 2 + 1),  # 8193 characters, 16386 bytes
        "\U0001f600" * (MAX_CONTROL_VALUE // 4 + 1),  # 4097 characters, 16388 bytes
    ]
    for value in too_big:
        for key, expected in [("k", version), ("new", 0)]:
            with pytest.raises(ValueError):
                store.set_control(key, value, expected)
            assert store.controls() == {"k": (version, '"small"')}


def test_negative_expected_versions_are_refused_before_writing(controls_store: Store) -> None:
    store = controls_store
    version = store.set_control("k", '"v"', 0)
    for key, value in [("k", '"w"'), ("k", None), ("new", '"w"'), ("new", None)]:
        for expected in (-1, -version, -(2**40)):
            with pytest.raises(ValueError):
                store.set_control(key, value, expected)
            assert store.controls() == {"k": (version, '"v"')}
    assert store.set_control("k", None, version) == 0


# -- 7. RabbitMQ keeps no control entries -------------------------------------------


def test_rabbitmq_refuses_control_entries(kind: str, make_store: StoreFactory) -> None:
    if kind != "rabbitmq":
        pytest.skip("only RabbitMQ is claim-only")
    store = make_store()
    assert not isinstance(store, ControlStore)
    calls: list[Callable[[], object]] = [
        lambda: store.controls(),
        lambda: store.controls("run/"),
        lambda: store.set_control("run/a/1", '{"a": 1}', 0),
        lambda: store.set_control("run/a/1", None, 0),
        # Refused as a store without controls, before the input is even looked at.
        lambda: store.set_control("", '"x"', -1),
    ]
    for call in calls:
        with pytest.raises(ConfigurationError, match="lease store") as caught:
            call()
        assert "RabbitMQStore" in str(caught.value)
