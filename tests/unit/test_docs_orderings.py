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
    """(The walk saw the markers: the results page's, and the references'. Orderings on rows that fail the quality
    gate were withdrawn, so the results page keeps a few.)"""
    assert len([m for m in marks() if m[0] == "docs/results.md"]) >= 3 and len(marks()) >= 20


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
    assert not r.get("note", "").startswith("not ranked"), f"{page}: {claim} at '{row}': {r['note']}"
    for method in (a, b):  # (tables made before the quality gate say nothing of it: the gate is applied here)
        ratio = ppl_ratio(reference, r["category"], key, method)
        assert ratio is None or GATE[0] <= ratio <= GATE[1], (
            f"{page}: {claim} at '{row}' ranks {method}, whose text there is degenerate (median PPL {ratio:.2f}x the "
            f"base's, outside the quality gate [{GATE[0]:.3g}, {GATE[1]:g}])"
        )
    assert r[f"{metric}_excludes_0"] == "True", f"{page}: {claim} at '{row}' rests on an interval that holds zero"
    diff = float(r[f"d{metric}"]) * (1 if r["A"] == a else -1)
    assert (diff > 0) == (found["op"] == ">"), f"{page}: {claim} at '{row}', but {a} - {b} is {diff:+.3f}"


GATE = (2 / 3, 1.5)  # the default quality gate's median PPL ratio (harness.config.gate)


@cache
def ppl_ratio(reference: str, category: str, row: str, method: str) -> float | None:
    """``method``'s median PPL at ``row`` (of ``category``) over the unwatermarked base's, from the reference's
    robustness table (``matched.csv`` for a ``:matched`` reference): its ``PPL_ratio`` column, the ratio the quality
    gate reads (on one footing: a table whose PPL column is re-tokenized because text attacks share it keeps its ratio
    on the runs' own), or for tables made before that column, its PPL over the base rows' of its ``runs.csv``; None
    where the tables do not say (a table of one setup is read)."""
    name, matched = reference.removesuffix(":matched"), reference.endswith(":matched")
    tables = REFERENCES / name / "tables"
    found = sorted(tables.glob(f"*/{'matched' if matched else 'robustness'}.csv"))
    if len(found) != 1 or not (tables / "runs.csv").is_file():
        return None
    with open(found[0], newline="") as fh:
        rows = list(csv.reader(fh))
    methods, metrics = rows[0], rows[1]
    column = next(
        (i for i, (m, v) in enumerate(zip(methods, metrics, strict=True)) if m == method and v == "PPL"), None
    )
    line = next((x for x in rows[3:] if x[0] == category and f"{x[1]} {x[2]}".strip() == row), None)
    ratio = next(
        (i for i, (m, v) in enumerate(zip(methods, metrics, strict=True)) if m == method and v == "PPL_ratio"), None
    )
    if ratio is not None and line is not None:
        return None if line[ratio] in ("", "missing") else float(line[ratio])
    with open(tables / "runs.csv", newline="") as fh:
        bases = [float(x["PPL"]) for x in csv.DictReader(fh) if x["attack"] == "No watermark" and x["PPL"]]
    if column is None or line is None or not bases or line[column] in ("", "missing"):
        return None
    return float(line[column]) / (sum(bases) / len(bases))


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
