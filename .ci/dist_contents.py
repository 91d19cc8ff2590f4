"""What the built wheel and sdist hold: checked before a release can be made of them.

Usage: python .ci/dist_contents.py WHEEL SDIST. Exits non-zero naming every problem.
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("anarchon_core", "anarchon_celery", "anarchon_dramatiq")
DASHBOARD = ("page.html", "page.css", "page.js")


def wheel_problems(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
        entry_points = next(
            (wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")),
            "",
        )
    top = {name.split("/", 1)[0] for name in names}
    problems = []
    for package in PACKAGES:
        if f"{package}/__init__.py" not in names:
            problems.append(f"wheel: no package {package}")
        if f"{package}/py.typed" not in names:
            problems.append(f"wheel: {package} has no py.typed")
    for page in DASHBOARD:
        if f"anarchon_core/dashboard/{page}" not in names:
            problems.append(f"wheel: the dashboard's {page} is missing")
    stray = sorted(t for t in top if t not in PACKAGES and not t.endswith(".dist-info"))
    if stray:
        problems.append(f"wheel: holds more than the three packages: {stray}")
    if not any(n.endswith("/licenses/LICENSE") for n in names):
        problems.append("wheel: no LICENSE")
    written = (ROOT / "anarchon_core" / "version.py").read_text(encoding="utf-8")
    version = re.search(r'^__version__ = "([^"]+)"$', written, re.M).group(1)  # type: ignore[union-attr]
    if metadata["Version"] != version:
        problems.append(f"wheel: version {metadata['Version']}, anarchon_core/version.py {version}")
    if metadata["License-Expression"] != "MIT" and metadata["License"] != "MIT":
        problems.append("wheel: the license is not MIT")
    for script in (
        "anarchon = anarchon_core.cli:main",
        "dramatiq-anarchon = anarchon_dramatiq.cli:main",
    ):
        if script not in entry_points:
            problems.append(f"wheel: no console script {script!r}")
    if "anarchon = anarchon_celery.cli:anarchon" not in entry_points:
        problems.append("wheel: no celery.commands entry point for celery anarchon")
    return problems


def sdist_problems(path: Path) -> list[str]:
    with tarfile.open(path) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    problems = []
    for needed in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        if needed not in names:
            problems.append(f"sdist: no {needed}")
    for package in PACKAGES:
        if f"{package}/__init__.py" not in names:
            problems.append(f"sdist: no package {package}")
    return problems


def main(argv: list[str]) -> int:
    wheel, sdist = (Path(arg) for arg in argv)
    problems = wheel_problems(wheel) + sdist_problems(sdist)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{wheel.name} and {sdist.name}: contents as expected")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
