"""Rebuild ``harness/assets/bundled/tiny_corpus.jsonl.gz``: the English corpus the ``tiny`` preset trains and
evaluates on.

The text is CPython's own documentation as shipped with the interpreter: the ``pydoc_data.topics`` help pages and
the distinct docstrings (over 200 characters) of the pure-Python standard library, read with ``ast`` (no import).
It is bundled rather than extracted at run time because docstrings differ between Python versions: a bundled file
gives every machine the same corpus, hence the same tiny model. Licence: PSF-2.0
(see ``harness/assets/bundled/NOTICE``).

Usage: ``python tools/make_tiny_corpus.py`` (the committed file was made with CPython 3.11.7).
"""

from __future__ import annotations

import ast
import gzip
import json
import pathlib
import sys
import sysconfig

MAX_CHARS = 2000  # long help pages are cut at paragraph ends into documents of about this size
SKIP_TOP = {"site-packages", "test", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip"}
OUT = pathlib.Path(__file__).resolve().parent.parent / "harness" / "assets" / "bundled" / "tiny_corpus.jsonl.gz"


def stdlib_root() -> pathlib.Path:
    """The folder of this interpreter's pure-Python standard library."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def stdlib_trees():
    """``(path parts, ast)`` of every module of the pure-Python standard library (the folders in SKIP_TOP and test
    suites left out), in a fixed order; read with ``ast``, never imported. tools/make_tiny_code_instruct.py uses it
    too."""
    root = stdlib_root()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel[0] in SKIP_TOP or "tests" in rel:
            continue
        try:
            yield rel, ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue


def documents() -> list[dict]:
    """Return the corpus as ``{"source", "text"}`` records in a fixed order."""
    import pydoc_data.topics as topics

    docs = [{"source": f"pydoc:{k}", "text": topics.topics[k].strip()} for k in sorted(topics.topics)]
    for rel, tree in stdlib_trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    name = getattr(node, "name", "<module>")
                    docs.append({"source": f"{'/'.join(rel)}:{name}", "text": doc.strip()})
    seen: set[str] = set()  # the same docstring appears in several modules (posixpath/ntpath, ...)
    unique = [d for d in docs if not (d["text"] in seen or seen.add(d["text"]))]
    return [{"source": d["source"], "text": piece} for d in unique for piece in split_paragraphs(d["text"])]


def split_paragraphs(text: str) -> list[str]:
    """Cut ``text`` at blank lines into pieces of at most about MAX_CHARS (a longer paragraph stays whole)."""
    pieces, current = [], ""
    for para in text.split("\n\n"):
        if current and len(current) + len(para) > MAX_CHARS:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    return pieces + [current] if current else pieces


def main() -> None:
    docs = documents()
    payload = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    # mtime=0 keeps the gzip bytes identical between rebuilds.
    OUT.write_bytes(gzip.compress(payload, mtime=0))
    print(f"{len(docs)} documents, {len(payload) / 1e6:.2f} MB -> {OUT} (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
