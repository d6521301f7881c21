"""Figures the documentation quotes from a committed reference are that reference's: a page cannot keep a number the
reference no longer holds.

- The README's demo table is the one its first command prints: each row is read back from the committed run it
  names (``results/reference/*/tables/runs.csv``), to the digits printed.
- In README.md and every page of docs/, a section (the text between two headings) that names a reference
  (``results/reference/<name>/``) quotes from it: each figure with three decimals (an AUC, a TPR, an interval's end)
  outside code spans is one of the numbers in the committed files of the references it names (their tables, runs
  and raw logs, not their READMEs). The paper's own numbers are ``results/reference/paper/``. README.md and
  docs/results.md, the pages about results, quote a three-decimal figure only in a section that names its
  reference. Figures the other pages measure with a benchmark or a test name that instead, and are not checked
  here."""

from __future__ import annotations

import csv
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = ROOT / "results" / "reference"
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/**/*.md"))]
RESULTS_PAGES = {"README.md", "docs/results.md"}
FIGURE = re.compile(r"(?<![\w.+-])[+-]?\d\.\d{3}(?!\d)")
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE]-?\d+)?")
DATA = {".csv", ".tex", ".json", ".jsonl", ".txt", ".log"}


@cache
def reference_numbers(name: str) -> frozenset[float]:
    """Every number in the committed data files of ``results/reference/<name>/`` (not its README), to 3 decimals."""
    folder = REFERENCES / name
    assert folder.is_dir(), f"no reference results/reference/{name}/"
    found = set()
    for file in folder.rglob("*"):
        if file.is_file() and file.suffix in DATA:
            found |= {round(abs(float(n)), 3) for n in NUMBER.findall(file.read_text(errors="replace"))}
    return frozenset(found)


def sections(text: str) -> list[str]:
    """The text between headings (fenced code kept: a printed table quotes too), code spans dropped."""
    return [re.sub(r"`[^`\n]*`", "", part) for part in re.split(r"^#{1,6} .*$", text, flags=re.MULTILINE)]


def quoted(page: str) -> list[tuple[set[str], list[str]]]:
    """``(references named, figures quoted)`` of each section of ``page`` that quotes a figure."""
    out = []
    text = (ROOT / page).read_text()
    for raw, part in zip(re.split(r"^#{1,6} .*$", text, flags=re.MULTILINE), sections(text), strict=True):
        figures = FIGURE.findall(part)
        if figures:
            out.append((set(re.findall(r"results/reference/([\w-]+)/", raw)), figures))
    return out


@pytest.mark.parametrize("page", PAGES)
def test_a_figure_quoted_from_a_reference_is_in_its_committed_files(page):
    stray = []
    for names, figures in quoted(page):
        if not names:
            if page in RESULTS_PAGES:
                stray.append(f"{figures[:5]} in a section that names no reference")
            continue
        held = frozenset().union(*(reference_numbers(name) for name in names))
        missing = [f for f in figures if round(abs(float(f)), 3) not in held]
        if missing:
            stray.append(f"{missing} not in {sorted(names)}")
    assert not stray, f"{page}: " + "; ".join(stray)


def test_the_readme_demo_table_is_its_committed_runs():
    text = (ROOT / "README.md").read_text()
    block = text.split("## What the first line prints", 1)[1].split("```", 2)[1]
    rows = [line.split() for line in block.strip().splitlines()[2:]]
    assert len(rows) == 3, block
    stored = {}
    for table in REFERENCES.glob("*/tables/runs.csv"):
        with open(table, newline="") as fh:
            stored.update({row["run"]: row for row in csv.DictReader(fh)})
    for row in rows:
        run, text, ratio, ppl, versus, tpr1, hi, lo, auc = row[-1], *row[-2:-10:-1]
        assert run in stored, f"README demo row {' '.join(row[:-9])}: run {run} is in no committed reference"
        r = stored[run]
        assert auc == f"{float(r['AUC']):.3f}", (run, auc, r["AUC"])
        assert lo == f"[{float(r['AUC_lo']):.3f}," and hi == f"{float(r['AUC_hi']):.3f}]", (run, lo, hi)
        assert tpr1 == f"{float(r['TPR@1%']):.3f}" and versus == f"{float(r['AUC_vs_base']):.3f}", (run, tpr1, versus)
        assert ppl == f"{float(r['PPL']):.2f}" and ratio == f"{float(r['PPL_ratio']):.2f}", (run, ppl, ratio)
        assert text == r["quality"].split(":")[0], (run, text, r["quality"])
