"""Rebuild ``harness/assets/bundled/tiny_code.jsonl.gz``: the code the ``tiny`` and ``smol`` presets continue when
evaluating in a low-entropy domain (``harness run --prompts code``).

Each document is the source of one function of the pure-Python standard library as written (comments, docstring and
layout kept: what a user asks a model to continue), read with ``ast`` (no import) in a fixed order. Functions whose
bodies are in the fine-tuning set (tools/make_tiny_code_instruct.py) are left out, so that the fine-tuning attack
never trains on the code that evaluations continue. Bundled, like the corpus, because the standard library differs
between Python versions. Licence: PSF-2.0 (``harness/assets/bundled/NOTICE``).

Usage: ``python tools/make_tiny_code.py`` (the committed file was made with CPython 3.11.7).
"""

from __future__ import annotations

import ast
import gzip
import json
import pathlib
import sys
import textwrap

from make_tiny_code_instruct import examples  # this folder is on sys.path when the script runs
from make_tiny_corpus import stdlib_root, stdlib_trees

MIN_CHARS, MAX_CHARS = 700, 2500  # long enough for a prompt and a continuation; a function, not a module
KEEP_EVERY = 2  # every 2nd eligible function: 762 documents, 254 of them held out (0.27 MB gzipped)
BUNDLED = pathlib.Path(__file__).resolve().parent.parent / "harness" / "assets" / "bundled"
OUT = BUNDLED / "tiny_code.jsonl.gz"


def documents() -> list[dict]:
    """``{"source", "text"}`` records, one per kept function, duplicates removed."""
    tuned = {e["source"] for e in examples()}
    out, seen, eligible = [], set(), 0
    for rel, tree in stdlib_trees():
        source = (stdlib_root() / pathlib.Path(*rel)).read_text(encoding="utf-8")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            key = f"{'/'.join(rel)}:{node.name}"
            segment = ast.get_source_segment(source, node, padded=True)
            if key in tuned or segment is None:
                continue
            text = textwrap.dedent(segment).strip("\n")
            if not MIN_CHARS <= len(text) <= MAX_CHARS or text in seen:
                continue
            seen.add(text)
            eligible += 1
            if eligible % KEEP_EVERY == 0:
                out.append({"source": key, "text": text})
    return out


def main() -> None:
    docs = documents()
    payload = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    OUT.write_bytes(gzip.compress(payload, mtime=0))  # mtime=0: identical bytes on every rebuild
    print(
        f"{len(docs)} documents, {len(payload) / 1e6:.2f} MB ({OUT.stat().st_size / 1e6:.2f} MB gzipped) -> {OUT} "
        f"(Python {sys.version.split()[0]})"
    )


if __name__ == "__main__":
    main()
