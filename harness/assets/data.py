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

from harness.config.errors import HarnessError, first_line
from harness.config.refs import (
    SMALL_CORPUS,
    TINY_CHAT,
    TINY_CODE,
    TINY_CODE_INSTRUCT,
    TINY_CORPUS,
    load_target,
    looks_like_path,
)
from harness.config.settings import DataSource
from harness.store.files import file_sha256, parse_json

# Built-in datasets: name -> (a file bundled in harness/assets/bundled, or a "module:function" that builds the file
# on first use and returns its path; splits; fields). The corpora are split by the held-out rule below; the
# fine-tuning set (tools/make_tiny_code_instruct.py) is one split of prompt/response pairs.
BUILTIN_DATA = {
    TINY_CORPUS: ("tiny_corpus.jsonl.gz", ("train", "heldout"), ("text",)),
    TINY_CODE_INSTRUCT: ("tiny_code_instruct.jsonl.gz", ("train",), ("prompt", "response")),
    # Functions of the standard library as written (tools/make_tiny_code.py): the low-entropy domain.
    TINY_CODE: ("tiny_code.jsonl.gz", ("train", "heldout"), ("text",)),
    # Extracted from installed docstrings (harness/assets/small.py), not bundled.
    SMALL_CORPUS: ("harness.assets.small:corpus", ("train", "heldout"), ("text",)),
    # Questions answered by tiny-corpus's documents, on its split (harness/assets/chat.py): made from it as read.
    TINY_CHAT: ("tiny_corpus.jsonl.gz", ("train", "heldout"), ("prompt", "response")),
}
SPLIT_CORPORA = (TINY_CORPUS, SMALL_CORPUS, TINY_CODE)  # split into train and held-out documents by the rule below
# Held out for evaluation: every 3rd bundled document of at least 600 characters (long enough for a prompt and a
# continuation); a rule on characters, so the split does not depend on the tokenizer.
HELDOUT_MIN_CHARS = 600
HELDOUT_EVERY = 3


@cache
def _bundled_bytes(name: str) -> bytes:
    source = BUILTIN_DATA[name][0]
    if ":" in source:
        return Path(load_target(source)()).read_bytes()
    return (files("harness.assets") / "bundled" / source).read_bytes()


CHECK_DOCS = 1000  # documents of a local dataset read by ``check`` before any work
DATA_KINDS = {".jsonl": "json", ".json": "json", ".txt": "text", ".parquet": "parquet", ".csv": "csv"}


def check(src: DataSource) -> None:
    """One-line error for a data source that cannot be read, before any work: an unknown built-in or split, a
    missing local path (whatever form it takes), an empty file, a missing text field or a corrupt line among the
    first ``CHECK_DOCS`` documents of a local file, a hub dataset that is neither cached nor reachable (its first
    document is read)."""
    if src.path.startswith("builtin:"):
        if src.path not in BUILTIN_DATA:
            raise HarnessError(f"unknown built-in dataset '{src.path}'. Built-in datasets: {', '.join(BUILTIN_DATA)}")
        _, splits, fields = BUILTIN_DATA[src.path]
        if src.split not in splits:
            raise HarnessError(f"{src.path} has splits {', '.join(splits)}, not '{src.split}'")
        wanted = (src.text_field, *([src.prompt_field] if src.prompt_field is not None else []))
        if any(f not in fields for f in wanted) or src.name is not None:  # settings it has no use for are refused
            raise HarnessError(f"{src.path} has fields {', '.join(fields)} and no configurations (name)")
        return
    local = Path(src.path).expanduser()
    if not local.exists() and (looks_like_path(src.path) or local.suffix in DATA_KINDS):
        raise HarnessError(f"dataset path '{src.path}' does not exist")
    if not load_texts(src, limit=CHECK_DOCS if local.exists() else 1):
        raise HarnessError(f"dataset '{src.path}' holds no documents")


def data_files(src: DataSource) -> list[Path]:
    """The files of a local dataset (a file, or a folder of files of one kind), refused if none or mixed."""
    local = Path(src.path).expanduser()
    found = [p for p in (sorted(local.rglob("*")) if local.is_dir() else [local]) if p.is_file()]
    found = [p for p in found if p.suffix in DATA_KINDS]
    kinds = {DATA_KINDS[p.suffix] for p in found}
    if len(kinds) != 1:
        what = "mixes " + ", ".join(sorted(kinds)) if kinds else "has no data file"
        raise HarnessError(f"dataset '{src.path}' {what}: expected files of one kind among {sorted(DATA_KINDS)}")
    if all(p.stat().st_size == 0 for p in found):
        raise HarnessError(f"dataset '{src.path}' is empty")
    return found


def load_texts(src: DataSource, limit: int | None = None) -> list[str]:
    """The first ``limit`` documents of ``src`` (all of them if None), in a fixed order."""
    return list(islice(iter_texts(src), limit))


def iter_texts(src: DataSource) -> Iterator[str]:
    """Stream the documents of ``src`` in a fixed order (hub datasets are streamed, never fully downloaded)."""
    for row in iter_rows(src, (src.text_field,)):
        yield row[src.text_field]


def iter_rows(src: DataSource, fields: tuple[str, ...]) -> Iterator[dict]:
    """Stream the records of ``src`` in a fixed order, each checked to hold text in every one of ``fields``."""
    if src.path == TINY_CHAT:  # made from the corpus's documents of the same split, as they are read
        check(src)
        from harness.assets.chat import tiny_chat_record

        corpus = DataSource(path=TINY_CORPUS, split=src.split)
        yield from (tiny_chat_record(row) for row in iter_rows(corpus, ("text",)))
        return
    if src.path.startswith("builtin:"):
        check(src)
        rows = [json.loads(line) for line in gzip.decompress(_bundled_bytes(src.path)).decode().splitlines()]
        if src.path in SPLIT_CORPORA:
            long_docs = [r for r in rows if len(r["text"]) >= HELDOUT_MIN_CHARS]
            heldout = {id(r) for r in long_docs[::HELDOUT_EVERY]}
            want = src.split == "heldout"
            rows = [r for r in rows if (id(r) in heldout) == want]
        yield from rows
        return
    rows = _open_dataset(src)
    try:
        for row in rows:
            for name in fields:
                if name not in row:
                    raise HarnessError(f"dataset '{src.path}' has no field '{name}' (fields: {', '.join(row)})")
                if not isinstance(row[name], str):
                    raise HarnessError(
                        f"dataset '{src.path}': field '{name}' holds {type(row[name]).__name__}, not text"
                    )
            yield row
    except HarnessError:
        raise
    except Exception as err:  # datasets raises many types for "not found / offline / bad file"
        raise HarnessError(f"cannot read dataset '{src.path}': {first_line(err)}") from None


def _jsonl_rows(files_: list[Path]) -> Iterator[dict]:
    """JSON Lines read here rather than through ``datasets``, whose errors name a row of an internal chunk
    ("row 3") instead of the file's line; blank lines are skipped."""
    for file in files_:
        with file.open(encoding="utf-8", errors="strict") as fh:
            try:
                for number, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    row = parse_json(line, f"dataset file '{file}' line {number}")
                    if not isinstance(row, dict):
                        raise HarnessError(f"dataset file '{file}' line {number}: expected a JSON object")
                    yield row
            except UnicodeDecodeError:
                raise HarnessError(f"dataset file '{file}' is not UTF-8 text") from None


def _open_dataset(src: DataSource):
    import datasets

    local = Path(src.path).expanduser()
    try:
        if not local.exists():
            try:
                return datasets.load_dataset(src.path, src.name, split=src.split, streaming=True)
            except Exception as err:
                raise HarnessError(
                    f"dataset '{src.path}' is no local path and cannot be loaded from the hub: {first_line(err)}"
                ) from None
        found = data_files(src)
        if all(p.suffix == ".jsonl" for p in found):
            return _jsonl_rows(found)
        builder = DATA_KINDS[found[0].suffix]
        return datasets.load_dataset(builder, data_files=[str(p) for p in found], split="train", streaming=True)
    except HarnessError:
        raise
    except Exception as err:
        raise HarnessError(f"cannot load dataset '{src.path}': {first_line(err)}") from None


def same_documents(a: DataSource, b: DataSource) -> bool:
    """Whether two sources read the same documents (whatever field each reads of them): one local file or folder
    (a folder also holds the files under it), or one built-in or hub dataset, configuration and split."""
    here, there = Path(a.path).expanduser(), Path(b.path).expanduser()
    if here.exists() and there.exists():
        here, there = here.resolve(), there.resolve()
        return here == there or here in there.parents or there in here.parents
    return (a.path, a.name, a.split) == (b.path, b.name, b.split)


@cache  # (the package's files do not change under a running process; a grid asks once per cell)
def _bundled_fingerprint(name: str) -> str:
    if name == TINY_CHAT:  # the corpus it is made from, and how its instructions are worded
        from harness.assets.chat import TINY_CHAT_VERSION

        return hashlib.sha256(_bundled_bytes(name) + f"tiny-chat-{TINY_CHAT_VERSION}".encode()).hexdigest()[:16]
    return hashlib.sha256(_bundled_bytes(name)).hexdigest()[:16]


def fingerprint(src: DataSource) -> str:
    """Content hash for bundled or local data (file hashes cached as for models); the id and split for hub data."""
    if src.path == TINY_CHAT or src.path in BUILTIN_DATA:
        return _bundled_fingerprint(src.path)
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


def hashed_path(src: DataSource, known: str | None = None) -> str:
    """How a stage's spec names the data of ``src``: bundled data and a hub id as written; a local file or folder by
    what it holds (``local:<fingerprint>``; ``known``: its fingerprint, where the caller has it), as
    ``models.hashed_ref`` names a local model."""
    if src.path in BUILTIN_DATA or not Path(src.path).expanduser().exists():
        return src.path
    return f"local:{known or fingerprint(src)}"


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


def packed_batches(stream: list[int], seq_len: int, batch_size: int, seed: int, bos: int | None = None) -> Iterator:
    """Endless ``(batch_size, seq_len)`` batches of the stream cut into sequences, reshuffled each epoch. ``bos``
    (``sequence_bos``): every sequence starts with it and holds ``seq_len - 1`` tokens of the stream, for a model that
    expects BOS first (Gemma: 1.4 nats a token worse on the tiny corpus's windows without it)."""
    import torch

    cut = seq_len - (bos is not None)
    n = len(stream) // cut
    if n < batch_size:
        raise HarnessError(f"training data too small: {len(stream)} tokens make {n} sequences of {seq_len}")
    seqs = torch.tensor(stream[: n * cut], dtype=torch.long).view(n, cut)
    if bos is not None:
        seqs = torch.cat([torch.full((n, 1), bos, dtype=torch.long), seqs], dim=1)
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n, generator=gen)
        for start in range(0, n - batch_size + 1, batch_size):
            yield seqs[order[start : start + batch_size]]


def eval_prompts(tokenizer, texts: list[str], num: int, prompt_tokens: int, new_tokens: int) -> list[dict]:
    """Prompts = the first ``prompt_tokens`` tokens of documents long enough to also hold ``new_tokens`` human
    tokens after them (the negatives). Returns ``num`` records ``{"prompt_ids", "human_ids"}``."""
    out = prompt_records(tokenizer, texts, prompt_tokens, new_tokens, num)
    if len(out) < num:
        raise HarnessError(
            f"only {len(out)} evaluation documents have {prompt_tokens + new_tokens} tokens; asked for {num} (lower "
            "eval.num_prompts)"
        )
    return out


def chat_prompts(tokenizer, ref: str, rows: list[dict], src: DataSource, num: int, new_tokens: int,
                 system: str | None, context: int | None) -> list[dict]:  # fmt: skip
    """Chat prompts (``eval.prompts=chat``): ``eval_prompts``' records of the instruction set ``rows`` (read from
    ``src``: its ``prompt_field`` the instruction, its ``text_field`` the human answer), each instruction rendered
    for the model ``ref`` (harness/assets/chat.py), and the first ``new_tokens`` tokens of its human answer as the
    negative. Instructions whose answer is shorter, or that leave no room for ``new_tokens`` in the model's
    ``context``, are skipped; one line where a system prompt alone leaves none, or too few records remain."""
    from harness.assets.chat import check_system, render

    check_system(tokenizer, ref, system, new_tokens, context)
    answers = tokenizer([r[src.text_field] for r in rows], add_special_tokens=False)["input_ids"]
    out, too_long = [], 0
    for row, answer in zip(rows, answers, strict=True):
        if len(answer) < new_tokens:
            continue
        prompt = render(tokenizer, ref, row[src.prompt_field], system)
        if context is None or len(prompt) + new_tokens <= context:
            out.append({"prompt_ids": prompt, "human_ids": answer[:new_tokens]})
            if len(out) == num:
                return out
        else:
            too_long += 1
    if too_long and too_long >= num - len(out):  # the context, not the data, is what is short: say so
        alone = len(render(tokenizer, ref, "", system))
        raise HarnessError(
            f"only {len(out)} of the {len(out) + too_long} instructions of '{src.path}' with long enough answers fit "
            f"the model's {context}-token context with {new_tokens} new tokens: the chat format"
            + (
                f" and the system prompt take {alone} tokens before any instruction; shorten the system prompt or "
                if system
                else f" takes {alone} tokens before any instruction; lower "
            )
            + f"eval.new_tokens (asked for {num})"
        )
    raise HarnessError(
        f"only {len(out)} instructions of '{src.path}' have human answers of {new_tokens} tokens (and fit the "
        f"model's context); asked for {num} (lower eval.num_prompts)"
    )


def prompt_records(tokenizer, texts: list[str], prompt_tokens: int, new_tokens: int, limit: int | None = None) -> list:
    """``eval_prompts``' records of every document of ``texts`` long enough (the first ``limit`` of them)."""
    need = prompt_tokens + new_tokens
    out = []
    bos = [tokenizer.bos_token_id] if _adds_bos(tokenizer) else []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        if len(ids) >= need:
            out.append({"prompt_ids": bos + ids[:prompt_tokens], "human_ids": ids[prompt_tokens:need]})
            if len(out) == limit:
                break
    return out


def training_batches(tokenizer, stream: list[int], settings) -> Iterator:
    """``packed_batches`` of ``stream`` at ``settings``' sequence length, batch size and seed (a ``TrainSettings``),
    each sequence starting with BOS where ``tokenizer``'s model expects one first (``sequence_bos``)."""
    return packed_batches(stream, settings.seq_len, settings.batch_size, settings.seed, sequence_bos(tokenizer))


def sequence_bos(tokenizer) -> int | None:
    """The BOS id every training sequence starts with where the model expects one first (``_adds_bos``), else None:
    the harness's own models and SmolLM2 add none, and their training sequences are what they always were."""
    return tokenizer.bos_token_id if _adds_bos(tokenizer) else None


def _adds_bos(tokenizer) -> bool:
    """Whether the model expects a BOS token first (Llama tokenizers add one; GPT-2 style ones do not)."""
    probe = tokenizer("a")["input_ids"]
    return tokenizer.bos_token_id is not None and len(probe) > 0 and probe[0] == tokenizer.bos_token_id
