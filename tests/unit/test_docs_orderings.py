"""A sentence of the results pages that orders two methods rests on a row of a committed comparison table, named
beside it, and holds only while that row's interval excludes zero on the side it states.

The row is named in an HTML comment (invisible on the page), ``<!-- order: <reference> | <row> | <A> > <B> -->`` (or
``<``; ``(TPR@1%)`` or ``(AUC_vs_base)`` after B for another column than AUC): ``<reference>`` a folder of
``results/reference/`` whose ``tables/<setup>/comparison.csv`` holds the row (``<reference>:matched``: its
``matched_comparison.csv``), ``<row>`` its attack and setting as tab:comparison writes them (``SLERP t=0.5``) or
``unaltered``. Every such comment in README.md, docs/ and the references' READMEs is read against its row; and in
every one of those pages a sentence that orders two methods by name without a negation must sit in a paragraph that
names its rows so."""

from __future__ import annotations

import csv
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = ROOT / "results" / "reference"
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/**/*.md")),
         *sorted(str(p.relative_to(ROOT)) for p in REFERENCES.glob("*/README.md"))]  # fmt: skip
MARK = re.compile(r"<!--\s*order:\s*(?P<body>.*?)-->", re.S)
ORDERING = re.compile(
    r"\b(?:is|are|stays?|ranks?) (?:above|below)\b|\babove (?:every|all|both)\b|\bbelow (?:them|every)\b"
    r"|\boutperforms?\b|\bhardest to\b|\bmore strongly than\b|\bstronger than\b"
)
GROUP = re.compile(r"\b(?:above|below) (?:every|all|both|them)\b|\bthe other (?:three|two|methods)\b")
NEGATION = re.compile(r"\b(?:not|neither|nor|no order|never|withdrawn)\b")


@cache
def method_labels() -> tuple[str, ...]:
    from harness.config.registry import methods

    return tuple(sorted({methods.load(n).label for n in methods.ordered()} | {"CAWP"}, key=len, reverse=True))


@cache
def comparison_rows(reference: str) -> list[dict]:
    """The rows of ``reference``'s comparison tables: ``tab:comparison`` (``comparison.csv``), or with ``:matched``
    after the reference's name, the one at matched quality (``matched_comparison.csv``)."""
    reference, matched = reference.removesuffix(":matched"), reference.endswith(":matched")
    found = sorted((REFERENCES / reference / "tables").glob(f"*/{'matched_' if matched else ''}comparison.csv"))
    assert found, f"results/reference/{reference}/ has no comparison table"
    rows = []
    for path in found:
        with open(path, newline="") as fh:
            rows += list(csv.DictReader(fh))
    return rows


def marks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for found in MARK.finditer((ROOT / page).read_text()):
            out.append((page, " ".join(found["body"].split())))
    return out


def test_the_pages_name_rows_to_check():
    assert len([m for m in marks() if m[0] == "docs/results.md"]) >= 10


@pytest.mark.parametrize("page, body", marks(), ids=lambda x: x if len(x) < 60 else x[:60])
def test_every_ordering_rests_on_a_row_whose_interval_excludes_zero_on_its_side(page, body):
    parts = [p.strip() for p in body.split("|")]
    assert len(parts) == 3, f"{page}: '{body}' is not '<reference> | <row> | <A> > <B>'"
    reference, row, claim = parts
    found = re.fullmatch(r"(?P<a>.+?) (?P<op>[<>]) (?P<b>.+?)(?: \((?P<metric>TPR@1%|AUC_vs_base)\))?", claim)
    assert found, f"{page}: '{claim}' is not '<A> > <B>'"
    a, b, metric = found["a"], found["b"], found["metric"] or "AUC"
    key = "" if row == "unaltered" else row
    matches = [r for r in comparison_rows(reference) if f"{r['attack']} {r['setting']}".strip() == key
               and {r["A"], r["B"]} == {a, b}]  # fmt: skip
    assert len(matches) == 1, f"{page}: no single row '{row}' for {a} and {b} in {reference}'s comparison"
    r = matches[0]
    assert r[f"{metric}_excludes_0"] == "True", f"{page}: {claim} at '{row}' rests on an interval that holds zero"
    diff = float(r[f"d{metric}"]) * (1 if r["A"] == a else -1)
    assert (diff > 0) == (found["op"] == ">"), f"{page}: {claim} at '{row}', but {a} - {b} is {diff:+.3f}"


def paragraphs(text: str) -> list[str]:
    """Paragraphs and list items (a bullet is one), tables and code left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for block in re.split(r"\n\s*\n|\n(?=- )", text):
        if not block.lstrip().startswith("|"):
            out.append(" ".join(block.split()))
    return out


@pytest.mark.parametrize("page", PAGES)
def test_a_sentence_that_orders_two_methods_names_its_rows(page):
    unbacked = []
    for paragraph in paragraphs((ROOT / page).read_text()):
        if MARK.search(paragraph):
            continue
        in_paragraph = {label for label in method_labels() if label in paragraph}
        for sentence in re.split(r"(?<=[.;])\s+", MARK.sub("", paragraph)):
            named = {label for label in method_labels() if label in sentence}
            # (a claim against a group, "above every other method", orders the paragraph's method against them)
            orders = len(named) >= 2 or (GROUP.search(sentence) is not None and len(in_paragraph) >= 1)
            if orders and ORDERING.search(sentence) and not NEGATION.search(sentence):
                unbacked.append(sentence[:160])
    assert not unbacked, f"{page}: orderings of methods that name no comparison row: {unbacked}"
