"""The run store: one folder per stage result, named by a hash of everything that determines it.

``<root>/<hash>/`` holds a run (one table cell: full resolved config -> metrics); ``<root>/stages/<kind>/<hash>/``
holds what runs share (trained, attacked models; generations). Each folder is built under a temporary name and
renamed into place after ``DONE`` is written, so a crash never leaves a folder that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from harness.errors import HarnessError

TRACKED_PACKAGES = ("watermark-harness", "torch", "transformers", "accelerate", "mergekit", "datasets", "tokenizers")


def spec_hash(spec: dict) -> str:
    """Stable short hash of a JSON-able spec (key order does not matter)."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def git_sha() -> str | None:
    """The harness checkout's commit, when it runs from one (an installed wheel has none)."""
    checkout = Path(__file__).resolve().parent.parent
    if not (checkout / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@dataclass(frozen=True)
class Stage:
    """One stored result: its spec, its hash and its folder."""

    kind: str
    spec: dict
    key: str
    path: Path

    @property
    def done(self) -> bool:
        return (self.path / "DONE").exists()

    def manifest(self) -> dict:
        return json.loads((self.path / "manifest.json").read_text())

    def build(self, fn: Callable[[Path], dict]) -> None:
        """Run ``fn(tmp_folder)`` (it writes the outputs and returns a report), then publish the folder atomically."""
        tmp = self.path.with_name(f".{self.path.name}.partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        start = time.time()
        try:
            report = fn(tmp)
            manifest = {
                "kind": self.kind,
                "hash": self.key,
                "versions": versions(),
                "git_sha": git_sha(),
                "host": platform.node(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
                "seconds": round(time.time() - start, 2),
                "report": report,
            }
            (tmp / "spec.json").write_text(json.dumps(self.spec, indent=2, sort_keys=True, default=str))
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
            (tmp / "DONE").write_text("")
            if self.path.exists():  # an unfinished or foreign folder under our name: replace it
                shutil.rmtree(self.path)
            tmp.rename(self.path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)

    def check_writable(self) -> None:
        """Fail early, in one line, if results cannot be written here."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise HarnessError(f"results folder '{self.root}' is not writable: {err.strerror or err}") from None

    def stage(self, kind: str, spec: dict) -> Stage:
        key = spec_hash(spec)
        path = self.root / key if kind == "run" else self.root / "stages" / kind / key
        return Stage(kind, spec, key, path)

    def runs(self) -> list[Path]:
        """Finished run folders, oldest first."""
        found = [p for p in self.root.glob("*/DONE") if p.parent.name != "stages"]
        return [p.parent for p in sorted(found, key=lambda p: p.stat().st_mtime)]
