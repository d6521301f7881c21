"""Model references: one way to name and load every model the harness uses.

A reference is ``builtin:tiny-lm`` (built and cached here), ``package:NAME`` (a model folder shipped inside an
installed package), a local folder, or a Hugging Face id. All of them load through ``transformers``, from safetensors
only: pickle checkpoints (``pytorch_model.bin``) can run code when loaded, so they need ``--allow-pickle``
(``HARNESS_ALLOW_PICKLE=1``). ``trust_remote_code`` is never set.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
from fnmatch import fnmatch
from pathlib import Path

from harness.assets import gguf, weights
from harness.compute import distributed
from harness.config.errors import HarnessError, first_line
from harness.config.refs import BUILTIN_MODELS, load_target, looks_like_path
from harness.store.files import file_sha256, parse_json

PICKLE_FILES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
ALLOW_PICKLE_ENV = "HARNESS_ALLOW_PICKLE"


def pickle_allowed() -> bool:
    """Whether the user passed ``--allow-pickle`` (the CLI sets the variable, so subprocesses see it too): 1, true,
    yes or on; unset, empty, 0, false, no or off is no, and any other value is refused (``false`` once allowed
    pickled checkpoints to load, which execute code)."""
    value = os.environ.get(ALLOW_PICKLE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise HarnessError(
        f"{ALLOW_PICKLE_ENV}={os.environ[ALLOW_PICKLE_ENV]!r} is not a setting: 1 to allow pickled checkpoints "
        "(they run code when loaded), or leave it unset"
    )


def _check_builtin(ref: str) -> None:
    if ref not in BUILTIN_MODELS:
        raise HarnessError(f"unknown built-in model '{ref}'. Built-in models: {', '.join(BUILTIN_MODELS)}")


def check(ref: str) -> None:
    """Raise a one-line error for a reference that cannot resolve, before any work starts: builds nothing and
    loads no weights (a hub id's config is fetched, or read from the local HF cache)."""
    if ref.startswith("builtin:"):
        _check_builtin(ref)
        if BUILTIN_MODELS[ref].buildable is not None:
            load_target(BUILTIN_MODELS[ref].buildable)(ref)
        return
    if gguf.is_gguf(ref):
        gguf.check(ref)
        return
    folder = Path(resolve(ref))
    if folder.exists():
        check_weights(folder, ref)
        check_files(folder)
        return
    hub_config(ref)


def hub_config(ref: str):
    """The config of the hub model ``ref``: from the local Hugging Face cache if it is there, else from the hub, after
    one look (per process) that the hub answers at all, so that a machine with no network gets one line at once
    instead of the hub client's retries (23 s a model here)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(ref, local_files_only=True)
    except (OSError, ValueError):
        pass
    except config_errors() as err:  # in the cache, and not a config transformers takes
        raise _load_error(ref, err) from None
    unreachable = hub_unreachable()
    if unreachable:
        raise HarnessError(f"cannot load model '{ref}': it is not in the local Hugging Face cache and {unreachable}")
    try:
        return AutoConfig.from_pretrained(ref)
    except config_errors() as err:
        raise _load_error(ref, err) from None


@functools.cache
def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be asked from here (offline mode, or no connection to it in 5 s), else None."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    given = os.environ.get("HF_ENDPOINT")
    endpoint = urlparse(given or "https://huggingface.co")
    if given and (endpoint.scheme not in ("http", "https") or not endpoint.hostname):
        return f"HF_ENDPOINT={given!r} is no http(s) address of a hub"
    try:
        host, port = endpoint.hostname, endpoint.port or (80 if endpoint.scheme == "http" else 443)
    except ValueError:  # (a port that is no number)
        return f"HF_ENDPOINT={given!r} is no http(s) address of a hub"
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        via = f" (HF_ENDPOINT={given!r})" if given else ""
        return f"the hub ({host}){via} cannot be reached from this machine ({err.strerror or err})"
    return None


def built(ref: str) -> bool:
    """Whether ``ref`` loads without building anything first: False for a built-in model that this machine has not
    built yet, and for a GGUF file not converted yet (a dry run converts none: it reads the header alone)."""
    if gguf.is_gguf(ref):
        return gguf.is_converted(ref)
    entry = BUILTIN_MODELS.get(ref)
    return entry is None or bool(load_target(entry.built)())


def build_cost(ref: str) -> str:
    """What building the built-in ``ref`` (converting the GGUF file ``ref``) takes, for messages."""
    if gguf.is_gguf(ref):
        return gguf.conversion_cost(ref)
    return BUILTIN_MODELS[ref].cost if ref in BUILTIN_MODELS else "a moment"


def planned(ref: str) -> bool:
    """Whether ``ref`` is a built-in not built on this machine whose config its recipe gives, or a GGUF file not
    converted yet, whose config its header gives (``planned_config``)."""
    if gguf.is_gguf(ref):
        return not gguf.is_converted(ref)
    return ref in BUILTIN_MODELS and BUILTIN_MODELS[ref].planned_config is not None and not built(ref)


def planned_config(ref: str):
    """The config of ``ref`` if it is ``planned`` (a transformers config, nothing built or converted), else None."""
    if not planned(ref):
        return None
    return gguf.planned_config(ref) if gguf.is_gguf(ref) else load_target(BUILTIN_MODELS[ref].planned_config)()


def config(ref: str):
    """The transformers config of model ``ref``: from its recipe while it is ``planned``, else read from its folder
    (a built-in without a recipe is built first, as the run would next)."""
    from transformers import AutoConfig

    found = planned_config(ref)
    if found is not None:
        return found
    try:
        return AutoConfig.from_pretrained(resolve(ref))
    except config_errors() as err:
        raise _load_error(ref, err) from None


def vocab_length(ref: str) -> int:
    """How many tokens the model ``ref``'s tokenizer has (its recipe's vocabulary size while it is ``planned``)."""
    found = planned_config(ref)
    return found.vocab_size if found is not None else len(load_tokenizer(resolve(ref)))


def context_length(ref: str) -> int | None:
    """The longest sequence the model ``ref`` takes (its config's ``max_position_embeddings``; None where its config
    does not say), read from its config alone (from its recipe while it is ``planned``; another built-in is built
    first, as the run would next)."""
    found = planned_config(ref)
    if found is not None:
        return found.max_position_embeddings
    folder = Path(resolve(ref))
    if (folder / "config.json").is_file():
        config = read_json(folder / "config.json")
    else:
        try:
            config = hub_config(ref).to_dict()
        except HarnessError:
            return None  # (check() says what is wrong with it)
    text = config.get("text_config") if isinstance(config, dict) else None
    value = (config.get("max_position_embeddings") if isinstance(config, dict) else None) or (
        text.get("max_position_embeddings") if isinstance(text, dict) else None
    )
    try:
        return int(value) if value else None
    except (TypeError, ValueError):  # (not a number: transformers refuses the config, check() says so)
        return None


def check_lengths(ref: str, lengths: dict[str, int], what: str = "the base model") -> None:
    """Every sequence of ``lengths`` (``{what it is: tokens}``) fits the model ``ref`` (``context_length``): one line
    naming the first that does not, before it reaches the model (which fails only then, after training)."""
    context = context_length(ref)
    for name, length in lengths.items():
        if context is not None and length > context:
            raise HarnessError(
                f"{name} ({length} tokens) is longer than {what} takes ({context}: its max_position_embeddings)"
            )


def check_causal_lm_once(ref: str) -> None:
    """``check_causal_lm`` and ``check_reads_text`` of a model that needs no build, once per process while its config
    file is unchanged (a grid checks each cell's base and judge: thousands of configs read for one model)."""
    resolved = resolve(ref)
    config = Path(resolved) / "config.json"
    stamp = (config.stat().st_mtime_ns, config.stat().st_size) if config.is_file() else None
    _causal_lm_checked(resolved, ref, stamp)


@functools.cache
def _causal_lm_checked(resolved: str, ref: str, stamp) -> None:
    check_causal_lm(resolved, ref)
    check_reads_text(resolved, ref)


# Plain English and a line of code: what every judge and base of the harness is asked to read (``check_reads_text``).
SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest to look for something to eat.\n"
    "def mean(values):\n    return sum(values) / len(values)\n"
)


def check_reads_text(resolved: str, ref: str) -> None:
    """One line for a model whose tokenizer cannot read plain text into ids its own embeddings hold (another model's
    tokenizer in its folder: an index error after the texts were generated), or reads most of it as its unknown token
    (every text would score alike, a perplexity that judges nothing)."""
    tokenizer = load_tokenizer(resolved)
    ids = tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    rows = getattr(config(resolved), "vocab_size", None)
    if rows is not None and ids and max(ids) >= rows:
        raise HarnessError(
            f"model '{ref}': its tokenizer gives ids up to {max(ids):,} for plain text and its embeddings hold "
            f"{rows:,}: the tokenizer is another model's"
        )
    unknown = tokenizer.unk_token_id
    share = sum(i == unknown for i in ids) / max(len(ids), 1) if unknown is not None else 0.0
    if share >= 0.5:
        raise HarnessError(
            f"model '{ref}': its tokenizer reads {share:.0%} of plain English as its unknown token "
            f"({tokenizer.unk_token!r}): every text would read alike"
        )


def check_causal_lm(resolved: str, ref: str) -> None:
    """One line for a model that is not a causal language model (e.g. a sentence encoder), read from its config:
    one of its ``architectures`` (or, where it names none, its ``model_type``) must be one transformers generates
    with."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL

    if Path(resolved).is_dir():
        try:
            config = AutoConfig.from_pretrained(resolved)
        except config_errors() as err:
            raise _load_error(ref, err) from None
    else:
        config = hub_config(resolved)
    architectures = getattr(config, "architectures", None) or []
    causal = set(CAUSAL.values())
    if not (any(a in causal for a in architectures) or (not architectures and config.model_type in CAUSAL)):
        named = ", ".join(architectures) or config.model_type
        raise HarnessError(f"model '{ref}' is not a causal language model ({named}): it cannot continue a prompt")
    check_quantized(config, ref)


# A model saved quantized loads only with its library: quant_method -> (modules to import, what to install).
QUANTIZED_NEEDS = {
    "gptq": (("optimum", "gptqmodel"), "pip install 'watermark-harness[quant]' (optimum and gptqmodel)"),
    "bitsandbytes": (("bitsandbytes",), "pip install 'watermark-harness[quant]' (bitsandbytes)"),
    "hqq": (("hqq",), "pip install 'watermark-harness[quant]' (hqq)"),
}


def check_quantized(config, ref: str) -> None:
    """One line, before any work, for a model saved quantized (a GPTQ checkpoint from the hub, say) whose library is
    not installed; transformers would fail only when loading it, with a traceback."""
    quant = getattr(config, "quantization_config", None) or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    method = getattr(method, "value", method)
    needs, install = QUANTIZED_NEEDS.get(str(method).lower(), ((), ""))
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        raise HarnessError(
            f"model '{ref}' is saved {method}-quantized, which loads with {', '.join(missing)}: {install}"
        )


def check_weights(folder: Path, ref: str) -> None:
    """Refuse a local model whose weights are pickles only (unless allowed), or that holds no weights at all."""
    names = [f.name for f in folder.iterdir() if f.is_file()]
    if any(fnmatch(n, "*.safetensors") for n in names):
        return
    pickles = sorted(n for n in names if any(fnmatch(n, p) for p in PICKLE_FILES))
    if not pickles:
        raise HarnessError(f"model folder '{ref}' holds no weights (no *.safetensors file)")
    if not pickle_allowed():
        raise HarnessError(
            f"model folder '{ref}' holds only pickle weights ({pickles[0]}), which can run code when loaded: "
            "convert them to safetensors, or pass --allow-pickle if you trust them"
        )


def check_files(folder: Path) -> None:
    """One line for a model file that does not read in its format, before any work: a safetensors file cut short or
    whose header claims more bytes than it holds, a config or tokenizer JSON file that is not JSON (transformers and
    safetensors fail on them with a traceback, at load), a config describing far more than its weights hold
    (``weights.check_described``). Once per version of the folder's files."""
    listing = tuple(
        (f.name, f.stat().st_size, f.stat().st_mtime_ns)
        for f in sorted(folder.iterdir())
        if f.is_file() and f.suffix in (".json", ".safetensors") and any(fnmatch(f.name, p) for p in MODEL_FILES)
    )
    _check_files(str(folder), listing)


@functools.lru_cache(maxsize=64)
def _check_files(folder: str, listing: tuple) -> None:
    from harness.store.files import FORMATS

    for name, _, _ in listing:
        file = Path(folder) / name
        if file.suffix == ".json":  # a config holding NaN is refused: it describes a model that computes NaN
            read_json(file, finite=name in CONFIG_FILES)
            continue
        try:
            FORMATS[file.suffix](file)
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as err:
            raise HarnessError(f"model file '{file}' does not read as {file.suffix[1:]}: {first_line(err)}") from None
    weights.check_described(Path(folder))


CONFIG_FILES = ("config.json", "generation_config.json")


def read_json(file: Path, finite: bool = True):
    """A JSON file of a model folder, or one line naming it (``files.parse_json``)."""
    try:
        text = file.read_bytes()
    except OSError as err:
        raise HarnessError(f"cannot read model file '{file}': {err.strerror or err}") from None
    return parse_json(text, f"model file '{file}'", finite=finite)


def resolve(ref: str) -> str:
    """Return a local folder or a hub id for ``ref``, building the tiny model if needed."""
    if ref.startswith("builtin:"):
        _check_builtin(ref)
        return str(load_target(BUILTIN_MODELS[ref].build)())
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
    if gguf.is_gguf(ref):
        return str(gguf.converted(path))  # a GGUF file: its cached transformers folder, converted once
    if path.exists():
        if not (path / "config.json").exists():
            raise HarnessError(f"model path '{ref}' is not a model folder (no config.json)")
        return str(path.resolve())
    if looks_like_path(ref):
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
    built = path / "build.json"
    if built.is_file() and (path / "DONE").is_file():  # a GGUF's conversion is what the GGUF file holds
        record = json.loads(built.read_text())
        if "gguf" in record and "sha256" in record:
            return f"gguf-{record['sha256'][:11]}-c{record.get('conversion', 1)}"
    files = sorted(f for f in path.iterdir() if f.is_file() and any(fnmatch(f.name, p) for p in MODEL_FILES))
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}:{file_sha256(file)};".encode())
    return digest.hexdigest()[:16]


def hashed_ref(ref: str, known: str | None = None) -> str:
    """How a stage's spec names the model ``ref``: a built-in, a package's model or a hub id as written; a local folder
    or GGUF file by what it holds (``local:<fingerprint>``; ``known``: its fingerprint, where the caller has it), so
    that one model at two paths (in two stores, on two machines, a relative path from another folder) keys the same
    stages, and two models at one path do not."""
    if ref.startswith(("builtin:", "package:")) or not Path(ref).expanduser().exists():
        return ref
    return f"local:{known or fingerprint(resolve(ref))}"


def config_errors() -> tuple[type[Exception], ...]:
    """What transformers raises for a model's files it cannot read: besides OSError and ValueError, a RecursionError
    (JSON nested too deeply) and huggingface_hub's StrictDataclassError (a config field of the wrong type,
    ``"hidden_size": "x"``)."""
    from huggingface_hub.errors import StrictDataclassError

    return (OSError, ValueError, RecursionError, StrictDataclassError)


def on_disk(ref: str) -> Path | None:
    """Where the model ``ref`` is on this machine, resolved (symlinks, ``..``, ``~``), building and converting
    nothing: a local folder or GGUF file, a package's folder, a built-in once built; None for a hub id and a built-in
    not built yet. What two references are compared by: one folder may be spelt many ways."""
    if ref.startswith("builtin:"):
        return Path(resolve(ref)).resolve() if ref in BUILTIN_MODELS and built(ref) else None
    if ref.startswith("package:"):
        return Path(resolve(ref)).resolve()
    path = Path(ref).expanduser()
    return path.resolve() if path.exists() else None


def _listing(folder: Path) -> list[tuple[str, int]]:
    return sorted((f.name, f.stat().st_size) for f in folder.iterdir() if f.is_file() and
                  any(fnmatch(f.name, p) for p in MODEL_FILES))  # fmt: skip


def same_model(a: Path, b: Path) -> bool:
    """Whether the folders (or files) ``a`` and ``b`` hold one model: the same place, or copies (the same defining
    files, of the same sizes and content: the content is hashed only when names and sizes all agree)."""
    if a.resolve() == b.resolve():
        return True
    if not (a.is_dir() and b.is_dir()) or _listing(a) != _listing(b):
        return False
    return fingerprint(str(a)) == fingerprint(str(b))


def _load_error(path_or_id: str, err: Exception) -> HarnessError:
    return HarnessError(f"cannot load model '{path_or_id}': {weights.load_problem(err)}")


def load_tokenizer(path_or_id: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path_or_id)
    except config_errors() as err:
        raise _load_error(path_or_id, err) from None


def load_causal_lm(path_or_id: str, device: str | None = None, dtype: str = "auto"):
    """Load a causal LM for inference (eval mode) on ``device`` (default: CUDA if available, else CPU)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    quantized = False  # a quantized model (e.g. bitsandbytes int8) is placed by device_map, never moved by .to()
    if Path(path_or_id).is_dir():
        check_weights(Path(path_or_id), path_or_id)
        config = Path(path_or_id) / "config.json"
        quantized = config.exists() and "quantization_config" in read_json(config)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path_or_id,
            dtype=dtype,
            use_safetensors=None if pickle_allowed() else True,
            output_loading_info=True,
            **({"device_map": device} if quantized else {}),
        )
    # (RuntimeError: a tensor of another shape than its config gives, a vocabulary smaller than it)
    except (*config_errors(), SafetensorError, RuntimeError) as err:
        raise _load_error(path_or_id, err) from None
    if not quantized:  # (a quantized model's packed tensors are named and shaped by its library, which checks them)
        check_loaded(path_or_id, info)
    return (model if quantized else model.to(device)).eval().requires_grad_(False)


def check_loaded(path_or_id: str, info: dict) -> None:
    """One line for a model whose weight files lack a tensor its config names, or hold one it does not, or one of
    another shape (transformers' loading info): transformers would initialize the missing ones afresh, or drop the
    others, and the model would run as another one. Tied weights (an output layer that is the embeddings) are not
    missing: transformers leaves them out of its report."""
    for key, what in (
        ("missing_keys", "lack the tensor"),
        ("unexpected_keys", "hold a tensor its config does not name,"),
        ("mismatched_keys", "hold a tensor of another shape than its config gives,"),
    ):
        found = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(key) or ())
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise HarnessError(f"cannot load model '{path_or_id}': its weight files {what} {found[0]}{more}")


def load_trainable(path_or_id: str, device: str | None = None):
    """A causal LM to train: float32 weights with gradients on (a watermarked student, a model being fine-tuned)."""
    return load_causal_lm(path_or_id, device, dtype="float32").requires_grad_(True)


def check_device(device: str, origin: str = "device") -> None:
    """One-line error for a device the harness cannot run on: unknown to torch, not visible (``cuda`` on a CPU-only
    machine, ``cuda:3`` with two GPUs), or not a compute device (``meta``). ``origin`` names where it came from."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise HarnessError(f"unknown {origin} '{device}': use cpu, cuda or cuda:N") from None
    if parsed.type == "cpu":
        if parsed.index not in (None, 0):
            raise HarnessError(f"{origin} '{device}': the CPU takes no index, use cpu")
    elif parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (parsed.index or 0) >= count:
            raise HarnessError(f"{origin} '{device}' is not available: torch sees {count} CUDA GPUs")
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise HarnessError(f"{origin} '{device}' is not available: this torch build or machine has no MPS")
    else:
        raise HarnessError(f"{origin} '{device}' is not supported: use cpu, cuda or cuda:N")


def default_device() -> str:
    """``$HARNESS_DEVICE`` if set, else cuda when torch sees a GPU, else cpu. Under a launcher with several processes
    (harness/compute/distributed.py), ``cuda`` means this process's own GPU, ``cuda:$LOCAL_RANK``."""
    import torch

    device = os.environ.get("HARNESS_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and distributed.world_size() > 1:
        device = f"cuda:{distributed.local_rank()}"
    return device
