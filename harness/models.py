"""Model references: one way to name and load every model the harness uses.

A reference is ``builtin:tiny-lm`` (built and cached here), ``package:NAME`` (a model folder shipped inside an
installed package), a local folder, or a Hugging Face id. All of them load through ``transformers``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from fnmatch import fnmatch
from pathlib import Path

from harness.errors import HarnessError

LOCAL_PREFIXES = ("/", "./", "../", "~")  # a reference starting so is a path, never a hub id
TINY_LM = "builtin:tiny-lm"


def cache_root() -> Path:
    """Where built models and file hashes are kept between runs: ``$HARNESS_CACHE``, default ``~/.cache/harness``."""
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness")).expanduser()


def _check_builtin(ref: str) -> None:
    if ref != TINY_LM:
        raise HarnessError(f"unknown built-in model '{ref}'. Built-in models: {TINY_LM}")


def check(ref: str) -> None:
    """Raise a one-line error for a reference that cannot resolve, before any work starts: builds nothing and
    loads no weights (a hub id's config is fetched, or read from the local HF cache)."""
    if ref.startswith("builtin:"):
        _check_builtin(ref)
        return
    if not Path(resolve(ref)).exists():
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(ref)
        except (OSError, ValueError) as err:
            raise _load_error(ref, err) from None


def resolve(ref: str) -> str:
    """Return a local folder or a hub id for ``ref``, building the tiny model if needed."""
    if ref.startswith("builtin:"):
        _check_builtin(ref)
        from harness import tiny

        return str(tiny.tiny_lm())
    if ref.startswith("package:"):
        package = ref.removeprefix("package:")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise HarnessError(f"model '{ref}' needs the Python package '{package}' installed")
        folder = Path(next(iter(spec.submodule_search_locations))) / "model"
        if not (folder / "config.json").exists():
            raise HarnessError(f"package '{package}' has no model folder at {folder}")
        return str(folder)
    path = Path(ref).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise HarnessError(f"model path '{ref}' is not a model folder (no config.json)")
        return str(path.resolve())
    if ref.startswith(LOCAL_PREFIXES) or ref.count("/") > 1 or not ref.strip():
        raise HarnessError(f"model path '{ref}' does not exist")
    return ref  # a hub id; loading says clearly if it is neither cached nor reachable


# Files that define a model's behaviour; anything else in its folder (reports, READMEs) is left out.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "*.safetensors",
    "*.bin",
    "*.index.json",
)


def fingerprint(path_or_id: str) -> str:
    """Content hash of a local model's defining files (sha256 of each, cached by path, size and mtime), or
    ``hub:<id>`` for a hub model."""
    path = Path(path_or_id)
    if not path.exists():
        return f"hub:{path_or_id}"
    files = sorted(f for f in path.iterdir() if f.is_file() and any(fnmatch(f.name, p) for p in MODEL_FILES))
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}:{file_sha256(file)};".encode())
    return digest.hexdigest()[:16]


def file_sha256(file: Path) -> str:
    """sha256 of a file, remembered in ``$HARNESS_CACHE/file-hashes.json`` so a 16 GB checkpoint is read once."""
    stat = file.stat()
    key = f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    index = cache_root() / "file-hashes.json"
    known = json.loads(index.read_text()) if index.exists() else {}
    if key not in known:
        digest = hashlib.sha256()
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                digest.update(block)
        known[key] = digest.hexdigest()
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_name(f"{index.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known))
        tmp.replace(index)
    return known[key]


def _load_error(path_or_id: str, err: Exception) -> HarnessError:
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return HarnessError(f"cannot load model '{path_or_id}': {reason}")


def load_tokenizer(path_or_id: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path_or_id)
    except (OSError, ValueError) as err:
        raise _load_error(path_or_id, err) from None


def load_causal_lm(path_or_id: str, device: str | None = None, dtype: str = "auto"):
    """Load a causal LM for inference (eval mode) on ``device`` (default: CUDA if available, else CPU)."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype)
    except (OSError, ValueError) as err:
        raise _load_error(path_or_id, err) from None
    return model.to(device or default_device()).eval().requires_grad_(False)


def check_device(device: str) -> None:
    """One-line error for a device torch does not know or cannot see (e.g. ``cuda`` on a CPU-only machine)."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise HarnessError(f"unknown device '{device}': use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and (not torch.cuda.is_available() or (parsed.index or 0) >= torch.cuda.device_count()):
        raise HarnessError(f"device '{device}' is not available: torch sees {torch.cuda.device_count()} CUDA GPUs")


def default_device() -> str:
    import torch

    return os.environ.get("HARNESS_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
