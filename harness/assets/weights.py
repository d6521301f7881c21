"""The tensors of a saved model folder, read one at a time from its safetensors files."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from harness.config.errors import HarnessError


def non_finite_weight(folder: Path | str) -> str | None:
    """The name of the first tensor of a saved model holding a NaN or an infinity, or None (read a tensor at a time)."""
    import torch

    weights = weight_reader(folder)
    for name in weights:
        tensor = weights[name]
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


class weight_reader(Mapping):  # noqa: N801 (reads as a function)
    """The tensors of a saved model folder, ``{name: tensor}``, each read from its safetensors file (one or several
    shards) when asked for, so that a whole model never sits in memory."""

    def __init__(self, folder: Path | str):
        from safetensors import safe_open

        self.files: dict[str, Path] = {}
        for file in sorted(Path(folder).glob("*.safetensors")):
            with safe_open(file, framework="pt") as f:
                self.files.update(dict.fromkeys(f.keys(), file))
        if not self.files:
            raise HarnessError(f"model folder '{folder}' holds no weights (no *.safetensors file)")

    def __getitem__(self, name: str):
        from safetensors import safe_open

        with safe_open(self.files[name], framework="pt") as f:
            return f.get_tensor(name)

    def __contains__(self, name) -> bool:
        return name in self.files

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)
