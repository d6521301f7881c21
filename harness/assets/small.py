"""The `small` preset's models and corpus, built here on a GPU from English that every machine has.

Corpus (``builtin:small-corpus``): CPython's pydoc topics (``pydoc_data.topics``) and the docstrings of the installed
transformers and torch (modules, classes, functions), read from their source files with ``ast`` (nothing is
imported), one document per docstring of at least ``min_chars`` characters: about 14 MB. Docstrings change between
versions, so the corpus is built once per set of versions and cached under ``$HARNESS_CACHE`` like the tiny model;
its content hash is what runs record (``data.fingerprint``). Held out for prompts as in the tiny corpus: every 3rd
document of at least 600 characters.

Models: ``builtin:small-lm``, a Llama of about 17M parameters with an 8,192-token BPE (SPEC section 6: held-out
perplexity about 11 after 2 minutes on an H100), and ``builtin:small-oracle``, about 88M parameters on the same
tokenizer recipe, the perplexity oracle. Both train in bf16 on a GPU; a CPU would take days, so without CUDA they
are refused before any work (a built copy in the cache is used anywhere).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
import platform
from pathlib import Path

from harness.config.errors import HarnessError
from harness.store import files
from harness.store.versions import package_versions

CORPUS_RECIPE = {"version": 1, "packages": ["transformers", "torch"], "min_chars": 200}
CORPUS_FILE = "corpus.jsonl.gz"
_TRAIN = {"batch_size": 64, "seq_len": 512, "warmup_frac": 0.05, "mixed_precision": "bf16", "seed": 0}
RECIPES = {
    "builtin:small-lm": {
        "version": 1,
        "vocab_size": 8192,
        "model": {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 6,
                  "num_key_value_heads": 2, "max_position_embeddings": 1024, "tie_word_embeddings": False},
        "train": {"steps": 1800, "lr": 2e-3, **_TRAIN},  # ~59M tokens
    },
    "builtin:small-oracle": {
        "version": 1,
        "vocab_size": 8192,
        "model": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "num_key_value_heads": 4, "max_position_embeddings": 1024, "tie_word_embeddings": False},
        "train": {"steps": 1800, "lr": 1e-3, **_TRAIN},
    },
}  # fmt: skip
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _digest(blob: dict) -> str:
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]


def corpus_folder() -> Path:
    versions = {"python": platform.python_version(), **package_versions(CORPUS_RECIPE["packages"])}
    return files.cache_root() / f"small-corpus-{_digest({'recipe': CORPUS_RECIPE, 'versions': versions})}"


def corpus() -> Path:
    """The small corpus file (JSON lines, gzip), extracted first if this machine has none."""
    return files.build_once(corpus_folder(), (CORPUS_FILE,), "the small corpus", build_corpus) / CORPUS_FILE


def docstrings(root: Path, min_chars: int) -> list[str]:
    """Docstrings of at least ``min_chars`` characters in the ``.py`` files under ``root``, in path order, whitespace
    of each paragraph joined (docstrings wrap at the source's width)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a file this Python cannot parse (templates, other versions' syntax) adds nothing
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = ast.get_docstring(node)
                if text and len(text) >= min_chars:
                    found.append("\n\n".join(" ".join(p.split()) for p in text.split("\n\n") if p.strip()))
    return found


def build_corpus(out: Path) -> dict:
    from pydoc_data import topics

    docs = [" ".join(t.split()) for _, t in sorted(topics.topics.items()) if len(t) >= CORPUS_RECIPE["min_chars"]]
    counts = {"pydoc topics": len(docs)}
    for package in CORPUS_RECIPE["packages"]:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise HarnessError(f"the small corpus reads the docstrings of '{package}', which is not installed")
        found = docstrings(Path(next(iter(spec.submodule_search_locations))), CORPUS_RECIPE["min_chars"])
        counts[package] = len(found)
        docs += found
    blob = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    (out / CORPUS_FILE).write_bytes(gzip.compress(blob, mtime=0))
    return {"documents": counts, "characters": sum(map(len, docs)), "versions": package_versions(counts)}


def check_buildable(ref: str) -> None:
    """Refuse, before any work, to build a small model where no GPU is visible (a cached copy is fine)."""
    import torch

    if not torch.cuda.is_available() and not model_folder(ref).is_dir():
        raise HarnessError(
            f"'{ref}' is built on a GPU (minutes on one; days on a CPU) and no GPU is visible here: run the small "
            "preset on a GPU machine, or pass --base-model / --oracle-model"
        )


def model_folder(ref: str) -> Path:
    from harness.assets import data
    from harness.config.settings import DataSource

    corpus_hash = data.fingerprint(DataSource(path=data.SMALL_CORPUS)) if corpus_folder().is_dir() else "unbuilt"
    name = ref.removeprefix("builtin:")
    return files.cache_root() / f"{name}-{_digest({'recipe': RECIPES[ref], 'corpus': corpus_hash})}"


def _model(ref: str) -> Path:
    from harness.assets import data, tiny
    from harness.config.settings import DataSource

    check_buildable(ref)
    corpus()
    texts = data.load_texts(DataSource(path=data.SMALL_CORPUS, split="train"))
    return files.build_once(
        model_folder(ref), MODEL_FILES, f"the {ref} model", lambda out: tiny.build_lm(out, RECIPES[ref], texts, ref)
    )


def planned_lm_config():
    from harness.assets import tiny

    return tiny.planned_config(RECIPES["builtin:small-lm"])


def planned_oracle_config():
    from harness.assets import tiny

    return tiny.planned_config(RECIPES["builtin:small-oracle"])


def small_lm_built() -> bool:
    return files.is_built(model_folder("builtin:small-lm"), MODEL_FILES)


def small_oracle_built() -> bool:
    return files.is_built(model_folder("builtin:small-oracle"), MODEL_FILES)


def small_lm() -> Path:
    return _model("builtin:small-lm")


def small_oracle() -> Path:
    return _model("builtin:small-oracle")
