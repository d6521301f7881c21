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
def machine() -> dict:
    """The processor that computed a result, and with how many threads. Float results (a trained model's bits, so
    every hash downstream of a model built here) depend on the vector instructions torch's kernels use (the tiny LM
    built on an AVX2 machine differs from the one built on an AVX-512 machine, and so do the numbers of every run made
    from it) and on the number of threads torch splits its reductions over (one per physical core by default: 30
    steps of the tiny paraphraser's build on 1 and on 2 threads give different weights)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        capability, threads = torch.backends.cpu.get_cpu_capability(), torch.get_num_threads()
    except (ImportError, AttributeError):
        capability = threads = None
    return {"cpu": cpu, "torch_cpu_capability": capability, "torch_threads": threads}


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
