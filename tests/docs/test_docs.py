"""The documentation says what the code does.

README.md and docs/*.md are read as text; each claim that can be checked
against the code is checked here: store URL schemes, named objects and their
signatures, Celery settings, Dramatiq options, event kinds, option defaults,
CLI commands, and every Python example, which must run (see run_example.py).

Fences can carry one marker, an HTML comment on the last non-blank line before
them (docs/testing.md explains them):

- ``<!-- example-context: NAME -->``: the example runs after that context's
  setup (``CONTEXTS`` in run_example.py);
- ``<!-- not-run: reason -->``: a fragment that cannot run on its own;
- ``<!-- signature -->``: signatures, compared with the code's.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import logging
import pkgutil
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import anarchon_core
from anarchon_core.urls import SCHEMES, store_class
from tests.docs.run_example import CONTEXTS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
RUNNER = Path(__file__).with_name("run_example.py")
PACKAGES = ("anarchon_core", "anarchon_celery", "anarchon_dramatiq")

# -- reading markdown -----------------------------------------------------------

_FENCE = re.compile(
    r"^(?P<indent>[ ]*)(?P<ticks>`{3,})(?P<lang>[\w+-]*)[^\n]*\n"
    r"(?P<code>.*?)^(?P=indent)(?P=ticks)[ ]*$",
    re.M | re.S,
)
_MARKER = re.compile(r"^<!--\s*(?P<kind>[a-z-]+)\s*(?::\s*(?P<value>.*?))?\s*-->$")
MARKERS = ("example-context", "not-run", "signature")


@dataclass(frozen=True)
class Fence:
    """A fenced code block of a page, with the marker before it, if any."""

    page: Path
    line: int
    lang: str
    code: str
    marker: str = ""
    value: str = ""

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def fences(page: Path) -> list[Fence]:
    text = page.read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        before = [ln.strip() for ln in text[: m.start()].splitlines() if ln.strip()]
        marker = _MARKER.match(before[-1]) if before else None
        indent = len(m.group("indent"))
        code = "\n".join(ln[indent:] for ln in m.group("code").splitlines()) + "\n"
        found.append(
            Fence(
                page,
                text.count("\n", 0, m.start()) + 1,
                m.group("lang"),
                code,
                marker.group("kind") if marker else "",
                (marker.group("value") or "") if marker else "",
            )
        )
    return found


def prose(page: Path) -> str:
    """The page without its fences (blanked, so that line numbers hold)."""
    text = page.read_text(encoding="utf-8")
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def code_spans(text: str) -> list[str]:
    """The inline code spans of markdown prose."""
    return [m.group(2) for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, re.S)]


def cells(row: str) -> list[str]:
    """A table row's cells; a ``|`` inside a code span does not split."""
    parts, current, in_code = [], "", False
    for char in row.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def tables(text: str) -> Iterator[tuple[str, list[str], list[list[str]]]]:
    """(heading, header cells, rows) of each table in ``text``."""
    heading, block = "", []
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|"):
            block.append(line)
            continue
        if len(block) > 2:
            yield heading, cells(block[0]), [cells(row) for row in block[2:]]
        block = []


def table(page: Path, first_header: str) -> list[list[str]]:
    """The rows of the page's one table whose first header cell is ``first_header``."""
    found = [rows for _, header, rows in tables(prose(page)) if header[0] == first_header]
    assert len(found) == 1, f"{rel(page)}: expected one table headed {first_header!r}"
    return found[0]


def section(page: Path, heading: str) -> str:
    """The text of the section under ``heading``, up to the next heading of its level."""
    text = page.read_text(encoding="utf-8")
    m = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
    assert m, f"{rel(page)}: no heading {heading!r}"
    end = re.compile(rf"^#{{1,{len(m.group(1))}}} ", re.M).search(text, m.end())
    return text[m.end() : end.start() if end else len(text)]


def unquote(cell: str) -> str:
    return cell.strip().strip("`")


def seconds(text: str) -> float:
    """The first duration in ``text``: ``10 s``, ``0.5 s``, ``1 h``, ``5 min``."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*(ms|s|min|h)\b", text)
    assert m, f"no duration in {text!r}"
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "min": 60, "h": 3600}[m.group(2)]


ALL_FENCES = [fence for page in PAGES for fence in fences(page)]


# -- resolving names --------------------------------------------------------------


def has_member(obj: Any, name: str) -> bool:
    """Whether ``obj`` has ``name``: an attribute, a dataclass field or slot, or
    an attribute its ``__init__`` sets."""
    if hasattr(obj, name):
        return True
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
            return True
        for klass in obj.__mro__:
            if klass.__module__.startswith(PACKAGES):
                source = inspect.getsource(klass)
                if re.search(rf"\bself\.{re.escape(name)}\s*(:[^=\n]+)?=(?!=)", source):
                    return True
    return False


def resolve(dotted: str) -> Any:
    """The object a dotted name (``anarchon_core.Run.slot_id``) refers to."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        break
    else:
        raise LookupError(f"no module {parts[0]!r}")
    for name in parts[i:]:
        if not has_member(obj, name):
            raise LookupError(f"{dotted}: {obj!r} has no {name!r}")
        obj = getattr(obj, name, None)
    return obj


# -- store URL schemes -------------------------------------------------------------

_SCHEME = re.compile(r"(?<![\w+.-])([a-z][a-z0-9+.-]*)://")


def schemes_in(spans: list[str]) -> set[str]:
    # The error message for an unknown scheme quotes one on purpose.
    spans = [s for s in spans if not s.startswith("unsupported store URL")]
    return {m.group(1) for span in spans for m in _SCHEME.finditer(span)}


@pytest.mark.parametrize("page", ["backends.md", "api.md"])
def test_every_store_scheme_is_documented(page: str) -> None:
    documented = schemes_in(code_spans(prose(DOCS / page)))
    missing = sorted(set(SCHEMES) - documented)
    assert not missing, f"docs/{page} does not name these store URL schemes: {missing}"


def test_every_store_scheme_named_in_the_docs_exists() -> None:
    # Celery's and Dramatiq's pages also name broker URLs (sqs://, pyamqp://...):
    # there only the store setting is read.
    named: dict[str, set[str]] = {}
    for page in PAGES:
        if page.name in ("celery.md", "dramatiq.md"):
            continue
        named[rel(page)] = schemes_in(code_spans(prose(page)))
    store_row = [r for r in table(DOCS / "celery.md", "Setting") if r[0] == "`anarchon_store`"]
    named["docs/celery.md (anarchon_store)"] = schemes_in(code_spans(" ".join(store_row[0])))
    unknown = {page: sorted(s - set(SCHEMES)) for page, s in named.items() if s - set(SCHEMES)}
    assert not unknown, f"store URL schemes open_store does not accept: {unknown}"


def store_urls_with_options() -> list[str]:
    spans = code_spans(prose(DOCS / "backends.md"))
    return [s for s in spans if "?" in s and (m := _SCHEME.match(s)) and m.group(1) in SCHEMES]


@pytest.mark.parametrize("url", store_urls_with_options())
def test_store_url_options_in_backends_are_accepted(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example URL with options is read by its store without complaint."""
    cls = store_class(url)
    built: list[dict[str, Any]] = []

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(kwargs)  # connects to nothing

    monkeypatch.setattr(cls, "__init__", record)
    cls.from_url(url, namespace="docs")
    assert built, f"{url}: from_url built no store"


# -- names of the code ----------------------------------------------------------------

_REFERENCE = re.compile(
    r"(?<![\w./-])(?P<package>anarchon(?:_core|_celery|_dramatiq)?)"
    r"(?P<path>(?:\.[A-Za-z_]\w*)+)"
    r"|(?<![\w./-])(?P<module>anarchon_(?:core|celery|dramatiq)(?:\.\w+)*):(?P<attr>[A-Za-z_]\w*)"
)
#: Names the pages give objects in their examples.
_OBJECTS = {"run": anarchon_core.Run, "cron": anarchon_core.Scheduler}
_VARIABLE = re.compile(r"(?<![\w./-])(?P<var>run|cron)\.(?P<attr>[A-Za-z_]\w*)")


def references() -> list[tuple[str, str]]:
    found = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in _REFERENCE.finditer(text):
            if m.group("module"):
                found.add((rel(page), f"{m.group('module')}.{m.group('attr')}"))
            else:
                package = m.group("package")
                package = "anarchon_core" if package == "anarchon" else package
                found.add((rel(page), package + m.group("path")))
    return sorted(found)


@pytest.mark.parametrize(("page", "name"), references())
def test_named_objects_exist(page: str, name: str) -> None:
    """``anarchon.Run``, ``anarchon_core.stores.sqlite``, ``anarchon_celery:Scheduler``...

    The pages import ``anarchon_core`` as ``anarchon``.
    """
    try:
        resolve(name)
    except LookupError as exc:
        pytest.fail(f"{page} names {name}, which does not exist ({exc})")


def test_attributes_of_runs_and_schedulers_exist() -> None:
    """``run.slot_id``, ``cron.run_forever``: members of Run and Scheduler."""
    missing = set()
    for page in PAGES:
        for m in _VARIABLE.finditer(page.read_text(encoding="utf-8")):
            if not has_member(_OBJECTS[m.group("var")], m.group("attr")):
                missing.add(f"{rel(page)}: {m.group(0)}")
    assert not missing, sorted(missing)


# -- signatures ------------------------------------------------------------------------


def _closing(text: str, start: int) -> int:
    """The index of the parenthesis closing the one at ``start``."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        char = text[i]
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced parentheses in {text[start:]!r}")


def as_python(code: str) -> ast.Module:
    """Signatures such as ``Name(a: int, *, b=1) -> T`` turned into ``def`` stubs."""
    out, pos = [], 0
    for m in re.finditer(r"^([A-Za-z_]\w*)\(", code, re.M):
        if m.start() < pos:
            continue
        end = code.find("\n", _closing(code, m.end() - 1))
        end = len(code) if end == -1 else end
        out += [code[pos : m.start()], "def ", code[m.start() : end], ": ..."]
        pos = end
    out.append(code[pos:])
    return ast.parse("".join(out))


def documented_parameters(fn: ast.FunctionDef) -> list[tuple[str, str, str | None]]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[str | None] = [None] * (len(positional) - len(a.defaults))
    defaults += [ast.unparse(d) for d in a.defaults]
    params = []
    for i, arg in enumerate(positional):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        params.append((arg.arg, kind, defaults[i]))
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append((arg.arg, "KEYWORD_ONLY", None if default is None else ast.unparse(default)))
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", None))
    return params


def _default(obj: Any, param: inspect.Parameter) -> Any:
    if repr(param.default) == "<factory>" and dataclasses.is_dataclass(obj):
        field = {f.name: f for f in dataclasses.fields(obj)}[param.name]
        return field.default_factory()  # type: ignore[misc]
    return param.default


def compare_signature(where: str, fn: ast.FunctionDef, obj: Any, env: dict[str, Any]) -> None:
    """The documented ``fn`` has the parameters of ``obj``: names, kinds and defaults."""
    real = list(inspect.signature(obj).parameters.values())
    documented = documented_parameters(fn)
    if (
        real
        and real[0].name in ("self", "cls")
        and [n for n, _, _ in documented[:1]] != [real[0].name]
    ):
        real = real[1:]
    shown = [(name, kind) for name, kind, _ in documented]
    actual = [(p.name, p.kind.name) for p in real]
    assert shown == actual, f"{where}: documented {shown}, the code has {actual}"
    for (name, _, default), param in zip(documented, real, strict=True):
        if default is None:
            assert param.default is inspect.Parameter.empty, (
                f"{where}: {name} has a default in the code ({param.default!r})"
            )
            continue
        assert param.default is not inspect.Parameter.empty, f"{where}: {name} has no default"
        value = eval(default, dict(env))
        assert value == _default(obj, param), (
            f"{where}: {name} defaults to {_default(obj, param)!r}, documented {default}"
        )


def _environment() -> dict[str, Any]:
    import anarchon_core.schedules

    return {**vars(anarchon_core.schedules), **vars(anarchon_core)}


def _lookup(name: str, namespace: dict[str, Any]) -> Any:
    if name in namespace:
        return namespace[name]
    if hasattr(anarchon_core, name):
        return getattr(anarchon_core, name)
    raise LookupError(name)


def check_signatures(where: str, code: str) -> None:
    tree = as_python(code)
    env = _environment()
    imported: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            exec(compile(ast.Module([node], []), where, "exec"), imported)
    env.update(imported)
    checked = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            obj = _lookup(node.name, imported)
            compare_signature(f"{where} {node.name}", node, obj, env)
            checked += 1
        elif isinstance(node, ast.ClassDef):
            cls = _lookup(node.name, imported)
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    assert hasattr(cls, member.name), f"{where}: {node.name}.{member.name}"
                    compare_signature(
                        f"{where} {node.name}.{member.name}",
                        member,
                        getattr(cls, member.name),
                        env,
                    )
                    checked += 1
    assert checked, f"{where}: no signature found"


SIGNATURE_FENCES = [f for f in ALL_FENCES if f.marker == "signature"]


@pytest.mark.parametrize("fence", SIGNATURE_FENCES, ids=lambda f: f.label)
def test_documented_signatures_match_the_code(fence: Fence) -> None:
    check_signatures(fence.label, fence.code)


def _member_rows() -> list[tuple[str, str, str]]:
    """(heading, first cell) of every API table row that names a member or a class."""
    rows = []
    for heading, _, body in tables(prose(DOCS / "api.md")):
        for row in body:
            m = re.fullmatch(r"`([A-Za-z_]\w*)(\(.*\))?( -> .*)?`", row[0])
            if m:
                rows.append((heading, m.group(1), row[0].strip("`")))
    return rows


def _section_class(heading: str) -> Any:
    for name in (heading, heading.rstrip("s")):
        if name.isidentifier() and inspect.isclass(getattr(anarchon_core, name, None)):
            return getattr(anarchon_core, name)
    return None


@pytest.mark.parametrize(("heading", "name", "cell"), _member_rows())
def test_api_tables_name_real_members(heading: str, name: str, cell: str) -> None:
    """A row of a table in docs/api.md: a member of the section's class, or a class."""
    owner = _section_class(heading)
    if owner is not None and has_member(owner, name):
        obj = inspect.getattr_static(owner, name, None)
        if isinstance(obj, (classmethod, staticmethod)):
            obj = getattr(owner, name)
    else:
        assert hasattr(anarchon_core, name), f"api.md, {heading}: {name} does not exist"
        obj = getattr(anarchon_core, name)
    if "(" in cell.split(" -> ")[0]:
        signature = cell.split(" -> ")[0]
        fn = as_python(signature + " -> None").body[0]
        assert isinstance(fn, ast.FunctionDef)
        compare_signature(f"api.md, {heading}: {name}", fn, obj, _environment())


def test_dramatiq_middleware_signature() -> None:
    from anarchon_dramatiq import Anarchon

    spans = [s for s in code_spans(prose(DOCS / "dramatiq.md")) if s.startswith("Anarchon(*")]
    assert spans, "docs/dramatiq.md shows no Anarchon(...) signature"
    for span in spans:
        fn = as_python(span).body[0]
        assert isinstance(fn, ast.FunctionDef)
        compare_signature("docs/dramatiq.md", fn, Anarchon, _environment())


# -- settings, options, events -----------------------------------------------------------

_SETTING = re.compile(r"\banarchon_[a-z_]+\b")


def celery_code() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "anarchon_celery").glob("*.py"))


def test_celery_settings_in_the_docs_and_the_code_agree() -> None:
    """Every ``anarchon_*`` name of docs/celery.md is in anarchon_celery, and back."""
    in_code = set(_SETTING.findall(celery_code())) - set(PACKAGES)
    documented = set(_SETTING.findall((DOCS / "celery.md").read_text(encoding="utf-8")))
    documented -= set(PACKAGES)
    assert documented - in_code == set(), "documented, not in anarchon_celery"
    assert in_code - documented == set(), "in anarchon_celery, not documented"


def test_the_celery_settings_table_lists_what_beat_reads() -> None:
    code = celery_code()
    rows = table(DOCS / "celery.md", "Setting")
    listed = {unquote(row[0]) for row in rows}
    from anarchon_celery import scheduler, tracking

    # Every setting name in the code is a quoted literal; the workers' flag is not a setting.
    read = set(re.findall(r"[\"'](anarchon_[a-z_]+)[\"']", code)) - {tracking.FLAG}
    assert listed == read, "the settings table and the settings anarchon_celery reads differ"
    from anarchon_core.jobs import DEFAULT_LEASE, DISPATCH_JITTER

    defaults = {unquote(row[0]): row[1] for row in rows}
    assert seconds(defaults["anarchon_lease"]) == DEFAULT_LEASE
    assert seconds(defaults["anarchon_jitter"]) == DISPATCH_JITTER
    assert seconds(defaults["anarchon_pickup"]) == scheduler.DEFAULT_PICKUP


def test_dramatiq_actor_options_in_the_docs_and_the_code_agree() -> None:
    from anarchon_dramatiq.declarations import OPTIONS

    text = (DOCS / "dramatiq.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"\bschedule_[a-z_]+\b", text))
    assert documented == OPTIONS - {"schedule"}


def _levels() -> dict[str, str]:
    from anarchon_core import EventKind

    return {kind.value: logging.getLevelName(kind.level) for kind in EventKind}


def test_the_events_table_lists_every_event_and_its_log_level() -> None:
    rows = table(DOCS / "concepts.md", "Kind")
    assert {unquote(row[0]): row[-1] for row in rows} == _levels()


def test_the_api_lists_every_event_kind() -> None:
    text = section(DOCS / "api.md", "Event")
    m = re.search(r"`kind` is one of(.*?)\(see", text, re.S)
    assert m, "docs/api.md: the Event section lists no kinds"
    assert set(code_spans(m.group(1))) == set(_levels())


@pytest.mark.parametrize("page", ["concepts.md", "failure-scenarios.md"])
def test_option_defaults(page: str) -> None:
    from anarchon_core import jobs

    rows = {unquote(row[0]): row[1] for row in table(DOCS / page, "Option")}
    fields = {f.name for f in dataclasses.fields(anarchon_core.JobOptions)}
    assert set(rows) == fields
    assert seconds(rows["lease"]) == jobs.DEFAULT_LEASE
    assert seconds(rows["jitter"]) == jobs.DEFAULT_JITTER
    assert seconds(rows["watch"]) == jobs.DEFAULT_WATCH
    assert "lease / 3" in rows["renew"]
    assert seconds(rows["catch_up"].split("at most", 1)[1]) == jobs.MAX_DEFAULT_CATCH_UP
    assert anarchon_core.JobOptions().renew_every == jobs.DEFAULT_LEASE / 3


# -- commands ------------------------------------------------------------------------------


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = namespace


def parse_with(
    main: Callable[[list[str]], object], argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    """What the command's own argument parser makes of ``argv``; nothing runs."""
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parsed(original(self, *args, **kwargs))

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        try:
            main(argv)
        except _Parsed as parsed:
            return parsed.namespace
        except SystemExit as exc:
            pytest.fail(f"{shlex.join(argv)}: refused by the parser (exit status {exc.code})")
    pytest.fail(f"{shlex.join(argv)}: the command returned without parsing")


def shell_commands() -> list[tuple[str, list[str]]]:
    """Every command of a shell fence that runs one of the project's commands."""
    found = []
    for fence in ALL_FENCES:
        if fence.lang not in ("sh", "shell", "bash", "console"):
            continue
        for line in fence.code.splitlines():
            line = line.removeprefix("$ ")
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            command: list[str] = []
            for token in [*lexer, ";"]:
                if token in ("&&", "||", ";", "|", "&"):
                    name = Path(command[0]).name if command else ""
                    if name in ("anarchon", "dramatiq-anarchon") or (
                        name == "celery" and "anarchon" in command
                    ):
                        found.append((fence.label, command))
                    command = []
                else:
                    command.append(token)
    return found


@pytest.mark.parametrize(
    ("where", "argv"), shell_commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else x
)
def test_shell_commands_parse(where: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = Path(argv[0]).name
    if name == "anarchon":
        from anarchon_core.cli import main

        parse_with(main, argv[1:], monkeypatch)
    elif name == "dramatiq-anarchon":
        from anarchon_dramatiq.cli import main as dramatiq_main

        parse_with(dramatiq_main, argv[1:], monkeypatch)
    else:
        from anarchon_celery.cli import anarchon

        rest = argv[argv.index("anarchon") + 1 :]
        assert rest and rest[0] in anarchon.commands, f"{where}: celery anarchon {rest}"
        anarchon.commands[rest[0]].make_context(rest[0], rest[1:])


def test_the_demo_flags_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from anarchon_core.cli import main

    parsed = vars(parse_with(main, ["demo"], monkeypatch))
    parsed.pop("command")
    rows = {unquote(row[0]): row[1] for row in table(DOCS / "quickstart.md", "Flag")}
    assert set(rows) == {f"--{name}" for name in parsed}
    for flag, default in rows.items():
        assert float(default) == parsed[flag[2:]], f"{flag} defaults to {parsed[flag[2:]]}"


def test_the_extras_table_matches_pyproject() -> None:
    """Each extra of docs/quickstart.md installs what pyproject.toml says it does."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    documented = {}
    for row in table(DOCS / "quickstart.md", "Extra"):
        for name in code_spans(row[0]):
            documented[name] = set(code_spans(row[1]))
    assert set(documented) == set(extras)
    for name, requirements in extras.items():
        if name == "all":
            continue
        expected = set()
        for requirement in requirements:
            m = re.match(r"[A-Za-z0-9_.-]+(\[[^\]]*\])?", requirement)
            assert m, requirement
            if m.group(0).startswith(f"{project['name']}["):
                expected |= set(m.group(1)[1:-1].split(","))  # the extras it includes
            else:
                expected.add(m.group(0))
        assert documented[name] == expected, f"the {name} extra"


def test_the_test_commands_are_the_same_everywhere() -> None:
    """README's test commands, the fast tier first, copied into docs/testing.md; .ci/run
    runs the full one: its setup as written, once, then its pytest command as written."""
    readme = [f.code.strip() for f in fences(ROOT / "README.md") if "pytest" in f.code]
    assert len(readme) == 2
    fast, full = readme
    assert "pytest -m fast" in fast and "pytest -m" not in full
    testing = [f.code.strip() for f in fences(DOCS / "testing.md")]
    assert fast in testing and full in testing
    setup, _, tests = full.rpartition(" && ")
    assert fast.startswith(f"{setup} && .venv/bin/python -m pytest -m fast ")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci.count(setup) == 1 and ci.count(tests) == 1
    assert ci.index(setup) < ci.index(tests)
    assert ci[-1] == tests  # after lint, types and docs: the last step
    assert sum("python3 -m venv" in line for line in ci) == 1  # one environment


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [p.name for p in DOCS.glob("*.md") if not re.search(rf":\s*{p.name}\s*$", nav, re.M)]
    assert not missing


# -- examples --------------------------------------------------------------------------------


def test_markers_are_well_formed() -> None:
    problems = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        marked = {f.line for f in fences(page) if f.marker}
        for m in re.finditer(r"^<!--.*-->$", text, re.M):
            marker = _MARKER.match(m.group(0))
            if not marker or marker.group("kind") not in MARKERS:
                continue
            line = text.count("\n", 0, m.start()) + 1
            following = [f.line for f in fences(page) if f.line > line]
            if not following or following[0] not in marked:
                problems.append(f"{rel(page)}:{line}: the marker is not right before a fence")
        for fence in fences(page):
            if fence.marker == "not-run" and not fence.value:
                problems.append(f"{fence.label}: not-run without a reason")
            if fence.marker == "example-context" and fence.value not in CONTEXTS:
                problems.append(f"{fence.label}: unknown context {fence.value!r}")
            if fence.marker and fence.lang != "python":
                problems.append(f"{fence.label}: a marker on a {fence.lang or 'plain'} fence")
    assert not problems


EXAMPLES = [
    f for f in ALL_FENCES if f.lang == "python" and f.marker not in ("not-run", "signature")
]


@pytest.mark.parametrize("fence", EXAMPLES, ids=lambda f: f.label)
def test_python_examples_run(fence: Fence, tmp_path: Path) -> None:
    """Each example imports, declares and starts without error, in a fresh process."""
    argv = [sys.executable, str(RUNNER), fence.label]
    if fence.marker == "example-context":
        argv.append(fence.value)
    result = subprocess.run(
        argv,
        input=fence.code,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"{fence.label} failed:\n{result.stdout}{result.stderr}"


# -- the product cites only itself ------------------------------------------------------------


def test_product_files_cite_no_document_outside_the_repository() -> None:
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", ROOT / "pyproject.toml", *DOCS.glob("*.md")]
    for package in PACKAGES:
        files += (ROOT / package).rglob("*.py")
    cited = [
        f"{f.relative_to(ROOT)}: {m.group(0)}"
        for f in files
        for m in re.finditer(r"§\s*\d*|\bSPEC(?:\.md)?\b", f.read_text(encoding="utf-8"))
    ]
    assert not cited


# -- the architecture page --------------------------------------------------------

ARCHITECTURE = DOCS / "architecture.md"


def _module_tree() -> str:
    """The module tree of the architecture page: its first fence."""
    fences = [f for f in globals()["fences"](ARCHITECTURE) if f.lang == ""]
    return fences[0].code


def test_the_architecture_page_lists_every_module() -> None:
    """Each package and module of the code is in the tree, and nothing else is."""
    listed: set[str] = set()
    folder = sub = ""
    for line in _module_tree().splitlines():
        words = line.split()
        if not words:
            continue
        if not line.startswith(" "):
            folder, sub = words[0].rstrip("/"), ""
            listed.add(folder)
            continue
        nested = line.startswith("    ")  # a module of the sub-package named above it
        if not nested:
            sub = words[0].rstrip("/") + "/" if words[0].endswith("/") else ""
        for word in words:
            name = word.rstrip(",")
            if name.endswith("/"):
                listed.add(f"{folder}/{name.rstrip('/')}")
            elif name == "__init__.py":
                continue
            elif name.endswith(".py"):
                listed.add(f"{folder}/{sub if nested else ''}{name}")
            else:
                break  # the description
    present = set(PACKAGES)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            where = str(path.relative_to(ROOT))
            if path.name == "__init__.py":
                present.add(str(path.parent.relative_to(ROOT)))  # a package: its folder
            elif not where.startswith("anarchon_core/tools/"):  # listed as one folder
                present.add(where)
    assert present - listed == set(), "modules missing from docs/architecture.md"
    assert listed - present == set(), "docs/architecture.md lists modules that do not exist"


def test_the_architecture_page_names_real_code() -> None:
    """Every ``module.Name.attr`` in the page's "where to look" table exists."""
    text = ARCHITECTURE.read_text()
    table = text.split("Where to look:", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`((?:[A-Za-z_]+\.)+[A-Za-z_]+)`", table))
    names |= set(re.findall(r"`([A-Z][A-Za-z]+\.[a-z_]+)`", text))
    assert names
    engine = importlib.import_module("anarchon_core.engine")
    parts = [f"anarchon_core.engine.{m.name}" for m in pkgutil.iter_modules(engine.__path__)]
    homes = ["anarchon_core", *parts, "anarchon_core.stores.redis"]
    homes += ["anarchon_celery", "anarchon_dramatiq"]
    for name in sorted(names):
        if name.endswith(".py") or "/" in name:
            continue
        found = False
        for home in homes:
            head, *rest = name.split(".")
            try:
                target: Any = importlib.import_module(f"{home}.{head}")
            except ImportError:
                target = getattr(importlib.import_module(home), head, None)
            for part in rest:
                target = getattr(target, part, None)
            if target is not None:
                found = True
                break
        assert found, f"docs/architecture.md names {name!r}, which is not in the code"


def test_the_upgrading_page_gives_each_stores_layout_version_as_the_code_does() -> None:
    """docs/upgrading.md's table names, per store, the layout version of this release:
    the one its module writes (``LAYOUT_VERSION``)."""
    from anarchon_core import __version__
    from anarchon_core.stores import _sql, mysql, nats, postgres, rabbitmq, redis

    page = (DOCS / "upgrading.md").read_text(encoding="utf-8")
    header = next(line for line in page.splitlines() if line.startswith("| Store |"))
    column = [cell.strip() for cell in header.strip("|").split("|")].index(__version__)
    rows = {
        cells[0]: cells[column]
        for line in page.splitlines()
        if line.startswith("| ") and not line.startswith(("| Store", "|---"))
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }
    modules = {
        "Redis, Valkey": redis,
        "PostgreSQL": postgres,
        "SQLite, libSQL": _sql,
        "NATS": nats,
        "RabbitMQ": rabbitmq,
        "MySQL, MariaDB": mysql,
    }
    assert set(rows) == set(modules)
    assert {name: int(rows[name]) for name in modules} == {
        name: module.LAYOUT_VERSION for name, module in modules.items()
    }
