"""The text edits end to end on the tiny preset, in the store the Gu-KGW smoke test trained (one cell per plugin, two
rates of token edits): each edited row lies between the base and the unaltered model, more edits remove more of the
watermark, and ``harness tables`` writes each edit's table and its AUC-against-rate figure."""

import importlib.util

import pytest

pytestmark = pytest.mark.smoke

CELLS = {  # row -> the attack and its settings
    "Token edits p=0.1": ("token-edit", "p=0.1"),
    "Token edits p=0.5": ("token-edit", "p=0.5"),
    "Word deletion p=0.3": ("word-delete", "p=0.3"),
    "Typos p=0.1": ("typo", "p=0.1"),
    "Lowercase": ("lowercase",),
}
if importlib.util.find_spec("nltk") is not None:  # with WordNet's data, else the attack refuses in one line
    CELLS["Synonyms p=0.3"] = ("synonym", "p=0.3")


def test_edited_rows_lie_between_base_and_unaltered(tiny_store, harness, runs_by_row, tmp_path):
    root, _ = tiny_store
    for attack, *settings in CELLS.values():
        args = [a for s in settings for a in ("--attack-arg", s)]
        out = harness("run", "--method", "gu-kgw", "--attack", attack, *args, "--results", str(root), timeout=900)
        if attack == "synonym" and out.returncode == 2 and "nltk.downloader wordnet" in out.stderr:
            continue  # nltk without its WordNet data
        assert out.returncode == 0, out.stderr[-3000:]
    rows = {row: m for row, (_, m) in runs_by_row(root).items()}
    base, unaltered = rows["Unwatermarked base"], rows["Unaltered"]
    for row in (r for r in CELLS if r in rows):
        m = rows[row]
        assert base["auc"] - 0.05 < m["auc"] <= unaltered["auc_ci95"][1] + 1e-9, (row, m["auc"])
        assert 0 < m["paraphrase"]["mean_unigram_overlap"] <= 1, (row, m["paraphrase"])
    assert rows["Token edits p=0.5"]["auc"] < rows["Token edits p=0.1"]["auc"]
    out = harness("tables", "--results", str(root), "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    for attack in ("token-edit", "word-delete", "typo", "lowercase"):
        assert (tmp_path / "tiny" / f"{attack}.csv").is_file(), attack
    assert (tmp_path / "tiny" / "figures" / "auc_vs_token-edit.png").is_file()
