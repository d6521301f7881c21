"""Every committed reference that holds its runs regenerates its committed tables byte for byte from them: a change
to what a table computes re-makes the references, or this fails (the rule of results/README)."""

import shutil
from pathlib import Path

import pytest

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = sorted(p.parent for p in (ROOT / "results" / "reference").glob("*/runs") if p.is_dir())


def test_the_references_with_runs_are_found():
    assert len(REFERENCES) >= 5, REFERENCES


@pytest.mark.parametrize("reference", REFERENCES, ids=lambda p: p.name)
def test_committed_tables_regenerate_byte_identically(reference, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(reference / "runs", runs)  # (tables read the store only; a copy keeps the checkout untouched)
    out = tmp_path / "tables"
    assert main(["tables", "--results", str(runs), "--out", str(out), "--no-figures"]) == 0
    committed = {p.relative_to(reference / "tables") for p in (reference / "tables").rglob("*")
                 if p.suffix in (".csv", ".tex")}  # fmt: skip
    made = {p.relative_to(out) for p in out.rglob("*") if p.suffix in (".csv", ".tex")}
    assert made == committed, f"tables made but not committed: {made - committed}; gone: {committed - made}"
    for rel in sorted(made):
        assert (out / rel).read_bytes() == (reference / "tables" / rel).read_bytes(), rel
