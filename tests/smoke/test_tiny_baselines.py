"""Gloaguen-KGW and Gu-KTH end to end on the tiny preset, through the installed CLI: each unaltered student is
detected (AUC >= 0.9) while the unwatermarked base stays near chance. Gloaguen-KGW runs in the smoke tests' shared
store, whose Gu-KGW student is its stage 1."""

import pytest

pytestmark = pytest.mark.smoke


def check_cell(root, harness, runs_by_row, method: str):
    out = harness("run", "--method", method, "--attack", "slerp", "--attack-arg", "t=0.5", "--results", str(root),
                  timeout=2400)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {row: m for row, (_, m) in runs_by_row(root, "slerp", method).items()}
    assert set(rows) == {"Unwatermarked base", "Unaltered", "SLERP t=0.5"}, sorted(rows)
    assert rows["Unaltered"]["auc"] >= 0.9, rows
    assert 0.40 <= rows["Unwatermarked base"]["auc"] <= 0.60, rows
    assert rows["SLERP t=0.5"]["auc"] < rows["Unaltered"]["auc"], rows
    return out


@pytest.mark.slow  # stage 2 and stage 3 train for minutes; tests/unit/test_gloaguen.py covers the mechanics in CI
def test_gloaguen_kgw(shared_store, harness, runs_by_row):
    root = shared_store
    gu_kgw = harness("run", "--method", "gu-kgw", "--results", str(root), timeout=1800)  # its student, or stored
    assert gu_kgw.returncode == 0, gu_kgw.stderr[-3000:]
    out = check_cell(root, harness, runs_by_row, "gloaguen-kgw")
    assert "reusing training of gu-kgw" in out.stderr  # stage 1 is the Gu-KGW student of the same settings


@pytest.mark.slow  # the base model writes 4,800 KTH teacher texts first (minutes on 2 cores)
def test_gu_kth(tmp_path, harness, runs_by_row):
    check_cell(tmp_path / "runs", harness, runs_by_row, "gu-kth")
