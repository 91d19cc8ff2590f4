"""The checks of names and namespaces: what a job, handler or instance may be called.

A leaf of the import graph: it imports nothing of anarchon's but the error
it raises (``errors.py`` imports nothing of anarchon's either), so the store
contract, the values and the integrations can all check names without an
import cycle.
"""

from __future__ import annotations

import hashlib
import re

from .errors import ConfigurationError

#: The longest job name, in characters (and four times that in UTF-8 bytes at most).
MAX_NAME = 200

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


def check_name(name: object, what: str = "job name") -> str:
    """``name`` if it is a valid job (or ``what``) name, else ConfigurationError naming it.

    A job name is 1 to :data:`MAX_NAME` printable characters (``str.isprintable``:
    letters, marks, digits, punctuation, symbols and the ASCII space; no
    control or format characters, no other whitespace, no lone surrogates),
    not all spaces. Every store keeps any such name as it is.
    """
    if not isinstance(name, str):
        raise ConfigurationError(f"{what} {name!r}: expected a string")
    if not name.strip(" "):
        raise ConfigurationError(f"{what} {name!r}: must not be empty or only spaces")
    if len(name) > MAX_NAME:
        raise ConfigurationError(
            f"{what} {name[:40]!r}...: {len(name)} characters, at most {MAX_NAME}"
        )
    for index, char in enumerate(name):
        if not char.isprintable():
            raise ConfigurationError(
                f"{what} {name!r}: character {index} ({char!a}) is not printable;"
                " use letters, digits, punctuation, symbols and spaces"
            )
    return name


def check_namespace(namespace: str) -> str:
    """``namespace`` if it is 1-100 letters, digits, ``_``, ``-``, ``.`` or ``:``.

    Namespaces end up in keys, table, bucket and queue names: they are kept
    plain. Any other raises ConfigurationError naming it.
    """
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise ConfigurationError(
            f"namespace {namespace!r}: use 1-100 letters, digits, '_', '-', '.' or ':'"
        )
    return namespace


def table_prefix(namespace: str) -> str:
    """``anarchon_<readable namespace>_<hash>``, the prefix of a namespace's SQL tables.

    ``<readable>`` is the namespace lower-cased with other characters as ``_``,
    cut to 24, for people reading the tables; ``<hash>`` (SHA-256 of the exact
    namespace) keeps namespaces that read alike apart. The longest table name
    made from it stays within MySQL's 64 characters and PostgreSQL's 63 bytes.
    """
    readable = re.sub(r"[^a-z0-9_]", "_", namespace.lower())[:24]
    return f"anarchon_{readable}_{hashlib.sha256(namespace.encode()).hexdigest()[:10]}"
