"""Rebuild ``harness/assets/bundled/tiny_code_instruct.jsonl.gz``: the instruction set the ``tiny`` preset fine-tunes
on.

The fine-tuning attack needs data of another domain than the watermark's training text (the paper fine-tunes on
OpenMathInstruct-2 and OpenCodeInstruct after distilling on OpenWebText). The tiny preset trains on CPython's
documentation, so its fine-tuning set is code, in OpenCodeInstruct's shape: the instruction asks for a function by
its signature and the first paragraph of its docstring, the response is the function's source without the docstring.
Functions come from the pure-Python standard library, read with ``ast`` (no import), in a fixed order. Bundled, like
the corpus, because the standard library differs between Python versions. Licence: PSF-2.0
(``harness/assets/bundled/NOTICE``).

Usage: ``python tools/make_tiny_code_instruct.py`` (the committed file was made with CPython 3.11.7).
"""

from __future__ import annotations

import ast
import gzip
import json
import pathlib
import sys

from make_tiny_corpus import stdlib_trees  # this folder is on sys.path when the script runs

MIN_DOC, MAX_CODE, MIN_CODE = 40, 1500, 120  # characters
OUT = pathlib.Path(__file__).resolve().parent.parent / "harness" / "assets" / "bundled" / "tiny_code_instruct.jsonl.gz"


def examples() -> list[dict]:
    """``{"source", "prompt", "response"}`` records, one per documented function, duplicates removed."""
    out, seen = [], set()
    for rel, tree in stdlib_trees():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < MIN_DOC:
                continue
            node.body = node.body[1:] or [ast.Pass()]  # drop the docstring: the response is code only
            node.decorator_list = []
            code = ast.unparse(node)
            if not MIN_CODE <= len(code) <= MAX_CODE or code in seen:
                continue
            seen.add(code)
            signature = code.split("\n", 1)[0].removesuffix(":").removeprefix("async ").removeprefix("def ")
            summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
            prompt = f"Write a Python function `{signature}`: {summary}"
            out.append({"source": f"{'/'.join(rel)}:{node.name}", "prompt": prompt, "response": code})
    return out


def main() -> None:
    rows = examples()
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    OUT.write_bytes(gzip.compress(payload, mtime=0))  # mtime=0: identical bytes on every rebuild
    size = OUT.stat().st_size
    print(
        f"{len(rows)} examples, {len(payload) / 1e6:.2f} MB ({size / 1e6:.2f} MB gzipped) -> {OUT} "
        f"(Python {sys.version.split()[0]})"
    )


if __name__ == "__main__":
    main()
