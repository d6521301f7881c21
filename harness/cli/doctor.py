"""``harness doctor``: one table of the optional backends, whether each works on this machine, and why not.

The backends are what the registered plugins declare (``Plugin.requires``: an importable module and the extra that
installs it; ``needs_cuda``) and the models shipped in packages that plugins' defaults and the presets name
(``package:...``), so a plugin from an outside package is examined like a built-in one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, packages_distributions, version

from harness.config.errors import HarnessError, first_line


def _version(module: str) -> str:
    for dist in packages_distributions().get(module, [module]):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return module


def _cuda() -> tuple[bool, str]:
    import torch

    if not torch.cuda.is_available():
        why = "torch is a CPU-only build" if torch.version.cuda is None else "no GPU visible to torch"
        return False, f"{why} (torch {torch.__version__})"
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return True, f"{torch.cuda.device_count()} GPU(s): {names}; CUDA {torch.version.cuda}"


def _package(module: str, extra: str | None) -> Callable[[], tuple[bool, str]]:
    """A check that imports ``module`` (its banners and warnings go nowhere); a failing import is reported by its first
    line."""

    def check() -> tuple[bool, str]:
        from harness.compute.progress import library_output

        install = f"pip install 'watermark-harness[{extra}]'" if extra else f"pip install {module}"
        if importlib.util.find_spec(module) is None:
            return False, f"not installed: {install}"
        try:
            with library_output(os.devnull):
                importlib.import_module(module)
        except Exception as err:  # a backend's import can fail in many ways (missing CUDA libraries, ABI)
            return False, f"installed ({_version(module)}) but its import fails: {first_line(err)}"
        return True, _version(module)

    return check


def _packaged_model(ref: str) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        from harness.assets.models import resolve

        try:
            folder = resolve(ref)
        except HarnessError as err:
            return False, str(err)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(folder)
        return True, f"{config.model_type} ({getattr(config, 'hidden_size', '?')}-d) at {folder}"

    return check


def backends() -> dict[str, tuple[str, Callable[[], tuple[bool, str]]]]:
    """``{backend: (what uses it, check)}``: CUDA and accelerate, every module a registered plugin requires, and every
    ``package:`` model that a plugin's defaults or a preset names."""
    from harness.assets.textsim import SIMILARITY_MODEL
    from harness.config.presets import PRESETS
    from harness.config.registry import attacks, methods

    users: dict[str, list[str]] = {}
    extras: dict[str, str] = {}
    cuda = []
    models: dict[str, list[str]] = {SIMILARITY_MODEL: ["text attacks (meaning kept)"]}
    for registry in (methods, attacks):
        for name in registry.ordered():
            try:
                cls = registry.load(name)
            except HarnessError:  # (a broken outside plugin: 'harness list' names it)
                continue
            for module, extra in cls.requires.items():
                users.setdefault(module, []).append(name)
                extras[module] = extra
            if cls.needs_cuda:
                cuda.append(name)
            for field in cls.Params.model_fields.values():
                if isinstance(field.default, str) and field.default.startswith("package:"):
                    models.setdefault(field.default, []).append(name)
    for preset in PRESETS.values():
        for name, settings in {**preset.methods, **preset.attacks}.items():
            for value in settings.values():
                if isinstance(value, str) and value.startswith("package:"):
                    models.setdefault(value, []).append(f"{name} ({preset.name} preset)")
    found = {
        "CUDA": ("training and generation at speed" + (f"; needed by {', '.join(cuda)}" if cuda else ""), _cuda),
        "accelerate": ("training on one or several GPUs", _package("accelerate", None)),
    }
    for module, names in users.items():
        found[module] = (", ".join(names), _package(module, extras[module]))
    for ref, names in models.items():
        found[ref.removeprefix("package:")] = (", ".join(dict.fromkeys(names)), _packaged_model(ref))
    return found


def report() -> str:
    """The table, one row per backend: works or not, and the reason."""
    import pandas as pd

    rows = []
    for name, (used_by, check) in backends().items():
        try:
            ok, detail = check()
        except Exception as err:  # the doctor reports; it never crashes on what it examines
            ok, detail = False, f"check failed: {type(err).__name__}: {err}"
        rows.append({"backend": name, "works": "yes" if ok else "no", "used by": used_by, "detail": detail})
    df = pd.DataFrame(rows)
    return df.to_string(
        index=False, justify="left", formatters={c: f"{{:<{df[c].str.len().max()}}}".format for c in df}
    )
