"""Every error of the library is an AnarchonError, defined in errors.py and importable as before."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import anarchon_core
import anarchon_core.errors
from anarchon_core import AnarchonError

#: Errors private to one store's wire protocol, turned into StoreUnavailable at
#: the store's boundary: never raised to a caller of the library.
PRIVATE = {"anarchon_core.stores._hrana.HranaError"}


def _core_modules() -> list[str]:
    names = ["anarchon_core"]
    for info in pkgutil.walk_packages(anarchon_core.__path__, "anarchon_core."):
        names.append(info.name)
    return names


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:  # a store whose optional driver is not installed
        return False
    return True


def test_every_exception_class_is_an_anarchon_error_from_errors_py() -> None:
    found = {}
    for name in _core_modules():
        if not _importable(name):
            continue
        for obj in vars(importlib.import_module(name)).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__.startswith("anarchon_core")
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    assert "anarchon_core.errors.SkipWork" in found
    outside = sorted(
        name
        for name, cls in found.items()
        if name not in PRIVATE
        and (cls.__module__ != "anarchon_core.errors" or not issubclass(cls, AnarchonError))
    )
    assert outside == []


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("anarchon_core", "UnknownJob"),
        ("anarchon_core", "JobPaused"),
        ("anarchon_core.control", "UnknownJob"),
        ("anarchon_core.control", "JobPaused"),
        ("anarchon_core.handoff", "SkipWork"),
    ],
)
def test_errors_keep_their_former_locations(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(anarchon_core.errors, name)


def test_skip_work_says_whether_the_attempt_is_stale() -> None:
    skip = anarchon_core.errors.SkipWork("stale anarchon attempt", stale=True)
    assert skip.stale and str(skip) == "stale anarchon attempt"
    assert isinstance(skip, AnarchonError)


@pytest.mark.parametrize(
    ("exc", "bug"),
    [
        (TypeError("unexpected keyword"), True),
        (AttributeError("no attribute"), True),
        (KeyError("job"), True),
        (AssertionError(), True),
        (anarchon_core.errors.StoreUnavailable("down"), False),
        (anarchon_core.errors.UnknownJob("no job"), False),  # a LookupError, but ours
        (ConnectionError("reset"), False),
        (RuntimeError("MISCONF"), False),
    ],
)
def test_is_bug_tells_a_bug_from_an_outage(exc: BaseException, bug: bool) -> None:
    assert anarchon_core.errors.is_bug(exc) is bug
