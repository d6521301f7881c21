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


def options(reference: Path) -> list[str]:
    """The options of the ``harness tables`` command the reference's README gives (``--ci``): what its tables were
    made with."""
    commands = [line.split() for line in (reference / "README.md").read_text().splitlines()
                if line.strip().startswith("harness tables")]  # fmt: skip
    return ["--ci"] if any("--ci" in words for words in commands) else []


@pytest.mark.parametrize("reference", REFERENCES, ids=lambda p: p.name)
def test_committed_tables_regenerate_byte_identically(reference, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(reference / "runs", runs)  # (tables read the store only; a copy keeps the checkout untouched)
    out = tmp_path / "tables"
    assert main(["tables", "--results", str(runs), "--out", str(out), "--no-figures", *options(reference)]) == 0
    committed = {p.relative_to(reference / "tables") for p in (reference / "tables").rglob("*")
                 if p.suffix in (".csv", ".tex")}  # fmt: skip
    made = {p.relative_to(out) for p in out.rglob("*") if p.suffix in (".csv", ".tex")}
    assert made == committed, f"tables made but not committed: {made - committed}; gone: {committed - made}"
    for rel in sorted(made):
        assert (out / rel).read_bytes() == (reference / "tables" / rel).read_bytes(), rel
