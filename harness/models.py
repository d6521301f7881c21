"""Model references: one way to name and load every model the harness uses.

A reference is ``builtin:tiny-lm`` (built and cached here), ``package:NAME`` (a model folder shipped inside an
installed package), a local folder, or a Hugging Face id. All of them load through ``transformers``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from harness.errors import HarnessError

LOCAL_PREFIXES = ("/", "./", "../", "~")


def check(ref: str) -> None:
    """Raise a one-line error for a reference that cannot resolve (builds nothing, loads nothing)."""
    if ref.startswith("builtin:"):
        if ref != "builtin:tiny-lm":
            raise HarnessError(f"unknown built-in model '{ref}'. Built-in models: builtin:tiny-lm")
        return
    resolve(ref)


def resolve(ref: str) -> str:
    """Return a local folder or a hub id for ``ref``, building the tiny model if needed."""
    if ref.startswith("builtin:"):
        check(ref)
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


def fingerprint(path_or_id: str) -> str:
    """A short content fingerprint: config and weight files' names, sizes and first MiB (local), or the hub id."""
    path = Path(path_or_id)
    if not path.exists():
        return f"hub:{path_or_id}"
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if file.is_file() and file.suffix in (".json", ".safetensors", ".bin", ".model", ".txt"):
            digest.update(file.name.encode())
            digest.update(str(file.stat().st_size).encode())
            with file.open("rb") as fh:
                digest.update(fh.read(1 << 20))
    return digest.hexdigest()[:16]


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


def default_device() -> str:
    import torch

    return os.environ.get("HARNESS_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
