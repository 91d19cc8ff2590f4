"""Older releases, built from the repository's history for the rolling-upgrade tests.

``RELEASES`` (at the repository's root) names each release and the commit it was
made from. :func:`source_tree` extracts that commit's three packages (``git
archive``) once into a shared cache: processes started with it on their
``PYTHONPATH`` and as their working directory run the older release's code, with
this environment's dependencies (the releases share them).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from tests import servers

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("anarchon_core", "anarchon_celery", "anarchon_dramatiq")


def releases() -> dict[str, str]:
    """Each release's commit, by version, from ``RELEASES``."""
    found: dict[str, str] = {}
    for line in (ROOT / "RELEASES").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            version, commit, _ = line.split()
            found[version] = commit
    return found


def source_tree(version: str) -> Path:
    """The packages of release ``version``, extracted from its commit (cached)."""
    commit = releases()[version]
    target = servers.shared_cache() / f"release-{version}-{commit[:12]}"
    if (target / "anarchon_core" / "__init__.py").exists():
        return target
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        servers.unavailable(f"the repository's history (git) to build release {version}")
    archived = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, *PACKAGES],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if archived.returncode != 0:
        servers.unavailable(
            f"commit {commit} of release {version} in this clone"
            f" ({archived.stderr.decode(errors='replace').strip()})"
        )
    building = Path(tempfile.mkdtemp(prefix=f"release-{version}-", dir=target.parent))
    with tarfile.open(fileobj=BytesIO(archived.stdout)) as tar:
        tar.extractall(building, filter="data")
    try:
        building.rename(target)
    except OSError:  # another worker built it meanwhile
        shutil.rmtree(building, ignore_errors=True)
    return target
