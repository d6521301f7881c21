"""Text collections and their token streams: training batches (packed) and evaluation prompts."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Iterator
from functools import cache
from importlib.resources import files
from itertools import islice
from pathlib import Path

from harness.config import DataSource
from harness.errors import HarnessError
from harness.models import LOCAL_PREFIXES, file_sha256

TINY_CORPUS = "builtin:tiny-corpus"
# Held out for evaluation: every 3rd bundled document of at least 600 characters (long enough for a prompt and a
# continuation); a rule on characters, so the split does not depend on the tokenizer.
HELDOUT_MIN_CHARS = 600
HELDOUT_EVERY = 3


@cache
def _tiny_corpus_bytes() -> bytes:
    return (files("harness") / "data" / "tiny_corpus.jsonl.gz").read_bytes()


def check(src: DataSource) -> None:
    """One-line error for a data source that cannot exist (unknown built-in, missing local path), before work."""
    if src.path.startswith("builtin:"):
        if src.path != TINY_CORPUS:
            raise HarnessError(f"unknown built-in dataset '{src.path}'. Built-in datasets: {TINY_CORPUS}")
    elif src.path.startswith(LOCAL_PREFIXES) and not Path(src.path).expanduser().exists():
        raise HarnessError(f"dataset path '{src.path}' does not exist")


def load_texts(src: DataSource, limit: int | None = None) -> list[str]:
    """The first ``limit`` documents of ``src`` (all of them if None), in a fixed order."""
    return list(islice(iter_texts(src), limit))


def iter_texts(src: DataSource) -> Iterator[str]:
    """Stream the documents of ``src`` in a fixed order (hub datasets are streamed, never fully downloaded)."""
    check(src)
    if src.path == TINY_CORPUS:
        if src.split not in ("train", "heldout"):
            raise HarnessError(f"{TINY_CORPUS} has splits 'train' and 'heldout', not '{src.split}'")
        docs = [json.loads(line)["text"] for line in gzip.decompress(_tiny_corpus_bytes()).decode().splitlines()]
        long_docs = [d for d in docs if len(d) >= HELDOUT_MIN_CHARS]
        heldout = {id(d) for d in long_docs[::HELDOUT_EVERY]}
        want = src.split == "heldout"
        yield from (d for d in docs if (id(d) in heldout) == want)
        return
    rows = _open_dataset(src)
    try:
        for row in rows:
            if src.text_field not in row:
                raise HarnessError(f"dataset '{src.path}' has no field '{src.text_field}' (fields: {', '.join(row)})")
            yield row[src.text_field]
    except HarnessError:
        raise
    except Exception as err:  # datasets raises many types for "not found / offline / bad file"
        raise HarnessError(f"cannot read dataset '{src.path}': {str(err).splitlines()[0]}") from None


def _open_dataset(src: DataSource):
    import datasets

    kind = {".jsonl": "json", ".json": "json", ".txt": "text", ".parquet": "parquet", ".csv": "csv"}
    local = Path(src.path).expanduser()
    try:
        if not local.exists():
            return datasets.load_dataset(src.path, src.name, split=src.split, streaming=True)
        files_ = [p for p in (sorted(local.rglob("*")) if local.is_dir() else [local]) if p.suffix in kind]
        builders = {kind[p.suffix] for p in files_}
        if len(builders) != 1:
            raise HarnessError(f"dataset '{src.path}': expected files of one kind among {sorted(kind)}")
        return datasets.load_dataset(builders.pop(), data_files=[str(p) for p in files_], split="train", streaming=True)
    except HarnessError:
        raise
    except Exception as err:
        raise HarnessError(f"cannot load dataset '{src.path}': {str(err).splitlines()[0]}") from None


def fingerprint(src: DataSource) -> str:
    """Content hash for bundled or local data (file hashes cached as for models); the id and split for hub data."""
    if src.path == TINY_CORPUS:
        return hashlib.sha256(_tiny_corpus_bytes()).hexdigest()[:16]
    local = Path(src.path).expanduser()
    if local.exists():
        digest = hashlib.sha256()
        for file in sorted(local.rglob("*")) if local.is_dir() else [local]:
            if file.is_file():
                digest.update(
                    f"{file.relative_to(local) if local.is_dir() else file.name}:{file_sha256(file)};".encode()
                )
        return digest.hexdigest()[:16]
    return f"hub:{src.path}:{src.name}:{src.split}"


def token_stream(tokenizer, texts: Iterable[str], max_tokens: int | None = None, chunk: int = 256) -> list[int]:
    """Documents tokenized and joined, each followed by EOS (the usual pre-training packing), stopping once
    ``max_tokens`` are collected so that a large dataset is read only as far as training needs."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    texts = iter(texts)
    while max_tokens is None or len(ids) < max_tokens:
        batch = list(islice(texts, chunk))
        if not batch:
            break
        for doc in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            ids.extend(doc)
            if eos is not None:
                ids.append(eos)
    return ids if max_tokens is None else ids[:max_tokens]


def packed_batches(stream: list[int], seq_len: int, batch_size: int, seed: int) -> Iterator:
    """Endless ``(batch_size, seq_len)`` batches of the stream cut into sequences, reshuffled each epoch."""
    import torch

    n = len(stream) // seq_len
    if n < batch_size:
        raise HarnessError(f"training data too small: {len(stream)} tokens make {n} sequences of {seq_len}")
    seqs = torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n, generator=gen)
        for start in range(0, n - batch_size + 1, batch_size):
            yield seqs[order[start : start + batch_size]]


def eval_prompts(tokenizer, texts: list[str], num: int, prompt_tokens: int, new_tokens: int) -> list[dict]:
    """Prompts = the first ``prompt_tokens`` tokens of documents long enough to also hold ``new_tokens`` human
    tokens after them (the negatives). Returns ``num`` records ``{"prompt_ids", "human_ids"}``."""
    need = prompt_tokens + new_tokens
    out = []
    bos = [tokenizer.bos_token_id] if _adds_bos(tokenizer) else []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        if len(ids) >= need:
            out.append({"prompt_ids": bos + ids[:prompt_tokens], "human_ids": ids[prompt_tokens:need]})
            if len(out) == num:
                return out
    raise HarnessError(
        f"only {len(out)} evaluation documents have {need} tokens; asked for {num} (lower eval.num_prompts)"
    )


def _adds_bos(tokenizer) -> bool:
    """Whether the model expects a BOS token first (Llama tokenizers add one; GPT-2 style ones do not)."""
    probe = tokenizer("a")["input_ids"]
    return tokenizer.bos_token_id is not None and len(probe) > 0 and probe[0] == tokenizer.bos_token_id
