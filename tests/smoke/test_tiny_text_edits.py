"""The text edits end to end on the tiny preset, in the smoke tests' shared store (one cell per plugin, two rates of
token edits): each edited row lies between the base and the unaltered model, more edits remove more of the watermark,
and ``harness tables`` writes each edit's table and its AUC-against-rate figure. The cells run as one ``harness grid``
(one process, its models loaded once), as a user would run several edits."""

import importlib.util

import pytest

pytestmark = pytest.mark.smoke

SPEC = """\
preset: tiny
groups:
  edits:
    methods:
      gu-kgw: [{}]
    attacks:
      token-edit: [{p: 0.1}, {p: 0.5}]
      token-insert: [{p: 0.1}]
      word-delete: [{p: 0.3}]
      typo: [{p: 0.1}]
      lowercase: [{}]
"""
ROWS = ["Token edits p=0.1", "Token edits p=0.5", "Token insertion p=0.1", "Word deletion p=0.3", "Typos p=0.1",
        "Lowercase"]  # fmt: skip


def test_edited_rows_lie_between_base_and_unaltered(shared_store, harness, cli, runs_by_row, tmp_path):
    root = shared_store
    spec = tmp_path / "edits.yaml"
    spec.write_text(SPEC)
    out = cli("grid", str(spec), "--results", str(root))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = list(ROWS)
    if importlib.util.find_spec("nltk") is not None:  # with WordNet's data, else the attack refuses in one line
        args = ("--method", "gu-kgw", "--attack", "synonym", "--attack-arg", "p=0.3", "--results", str(root))
        out = harness("run", *args, timeout=900)
        if not (out.returncode == 2 and "nltk.downloader wordnet" in out.stderr):
            assert out.returncode == 0, out.stderr[-3000:]
            rows.append("Synonyms p=0.3")
    found = {row: m for row, (_, m) in runs_by_row(root).items()}
    base, unaltered = found["Unwatermarked base"], found["Unaltered"]
    assert base["ppl_on"] == unaltered["ppl_on"] == "sampled ids"  # the tiny LM is its own oracle
    for row in rows:
        m = found[row]
        assert base["auc"] - 0.05 < m["auc"] <= unaltered["auc_ci95"][1] + 1e-9, (row, m["auc"])
        assert 0 < m["paraphrase"]["mean_unigram_overlap"] <= 1, (row, m["paraphrase"])
        assert m["ppl_on"] == "re-tokenized text", (row, m.get("ppl_on"))  # what its PPL measures, stated
        if row != "Lowercase":  # each edit stores the rate it applied, near its p (tokens, words or letters)
            p = float(row.rsplit("p=", 1)[1])
            assert abs(m["paraphrase"]["applied_rate"] - p) < 0.05 + p / 4, (row, m["paraphrase"])
    assert found["Token edits p=0.5"]["auc"] < found["Token edits p=0.1"]["auc"]
    out = cli("tables", "--results", str(root), "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    for attack in ("token-edit", "token-insert", "word-delete", "typo", "lowercase"):
        assert (tmp_path / "tiny" / f"{attack}.csv").is_file(), attack
    assert (tmp_path / "tiny" / "figures" / "auc_vs_token-edit.png").is_file()
