"""The tensors of a saved model folder, read one at a time from its safetensors files."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from harness.config.errors import HarnessError, first_line


def non_finite_weight(folder: Path | str) -> str | None:
    """The name of the first tensor of a saved model holding a NaN or an infinity, or None (read a tensor at a time)."""
    import torch

    weights = weight_reader(folder)
    for name in weights:
        tensor = weights[name]
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def tensor_shapes(folder: Path) -> dict[str, list[int]]:
    """``{name: shape}`` of the tensors in the safetensors files of ``folder``, from their headers alone."""
    shapes = {}
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        shapes |= {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
    return shapes


def load_problem(err: BaseException) -> str:
    """What a library's error says in one line: its first, or where that only introduces the next (huggingface_hub's
    "Validation error for field 'x':"), both."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return first_line(err)


def check_described(folder: Path) -> None:
    """One line where the config of the model folder ``folder`` describes a causal LM of far more parameters than its
    safetensors files hold (4,096 layers in a config beside the weights of two): transformers builds the model its
    config describes, then initializes what the weights lack (or fails on a shape that differs, with a traceback).
    Its layer count is read against the layer numbers in the weights' names first; the rest is built on the meta
    device (shapes only). A quantized model's packed weights hold fewer numbers than it has parameters, and a folder
    that is not a causal LM is judged elsewhere: both are left alone."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shapes = tensor_shapes(folder)
    held = sum(math.prod(shape) for shape in shapes.values())
    from huggingface_hub.errors import StrictDataclassError

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # (the loader says what, in one line)
        return
    except StrictDataclassError as err:  # a field of the wrong type ("hidden_size": "x"): the loader fails alike
        raise HarnessError(f"cannot load model '{folder}': {load_problem(err)}") from None
    if not held or getattr(config, "quantization_config", None):
        return
    layers = getattr(config, "num_hidden_layers", None)
    numbers = {int(part) for name in shapes for part in name.split(".") if part.isdigit()}
    if isinstance(layers, int) and numbers and layers > max(numbers) + 1:
        raise HarnessError(
            f"model folder '{folder}' does not hold the model its config.json describes: {layers:,} layers "
            f"(num_hidden_layers), and its weights are numbered up to {max(numbers)}"
        )
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # not a causal LM: check_causal_lm says so
        return
    described = sum(p.numel() for p in skeleton.parameters())
    if described > 2 * held + 2**20:  # (a tied output projection, a rotary table: far less than this)
        raise HarnessError(
            f"model folder '{folder}' does not hold the model its config.json describes: a causal LM of "
            f"{described:,} parameters, and its weights hold {held:,} numbers"
        )
    check_tensors(folder, skeleton, shapes)


def check_tensors(folder: Path, skeleton, shapes: dict[str, list[int]]) -> None:
    """One line where the weights of ``folder`` (``shapes``: their names and shapes) lack a parameter of the model its
    config describes (``skeleton``, on the meta device), or hold one of another shape (a vocabulary smaller than its
    embeddings): transformers would initialize the missing one afresh and run another model. Weights that are tied
    (the output layer is the embeddings) count once, under either name. Judged only where the weights name the
    parameters as the model does (most of them are found by name): another naming is transformers' to convert, and
    ``models.check_loaded`` checks what it loaded."""
    groups: dict[int, list] = {}
    for name, param in skeleton.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), [list(param.shape)]).append(name)
    found = [names for _, *names in groups.values() if any(n in shapes for n in names)]
    if len(found) * 2 < len(groups):
        return
    for shape, *names in groups.values():
        held = [n for n in names if n in shapes]
        if not held:
            raise HarnessError(
                f"model folder '{folder}' does not hold the model its config.json describes: its weights lack "
                f"{names[0]}"
            )
        if shapes[held[0]] != shape:
            raise HarnessError(
                f"model folder '{folder}' does not hold the model its config.json describes: {held[0]} is "
                f"{'x'.join(map(str, shapes[held[0]]))} in its weights and {'x'.join(map(str, shape))} in its config"
            )


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
