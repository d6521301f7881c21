"""What produced a stored result: the versions of Python and the libraries, and the harness checkout's commit."""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

TRACKED_PACKAGES = ("watermark-harness", "torch", "transformers", "accelerate", "mergekit", "datasets", "tokenizers")


def package_versions(names) -> dict[str, str | None]:
    """Installed version of each distribution in ``names`` (None where it is not installed)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def versions() -> dict:
    return {"python": platform.python_version(), **package_versions(TRACKED_PACKAGES)}


@functools.cache
def git_sha() -> str | None:
    """The harness checkout's commit, when it runs from one (an installed wheel has none), read once per process
    (at its first stage build, before the build: a commit made while a long training runs is not the code that ran
    it), with ``-dirty`` where tracked files differ from it."""
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / ".git").exists():
        return None

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=checkout, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    return sha + "-dirty" if git("status", "--porcelain", "--untracked-files=no") else sha
