"""A decoding setting end to end on the tiny preset, in the smoke tests' shared store (the Gu-KGW student trained once
for every smoke test): ``harness run --decode top_p=0.9`` samples the base and the watermarked model with nucleus
sampling, its runs are new ones (the plain runs keep theirs), the unwatermarked base's texts are flagged at about the
stated 1%, and ``harness tables`` sets the decoded rows beside plain sampling's in the decoding table alone. A text
attack's rows, rewrites of what the model wrote, refuse a decoding setting in one line."""

import csv
import json

import pytest
from scipy.stats import binom

pytestmark = pytest.mark.smoke


def test_top_p_rows_hold_the_stated_false_positive_rate(shared_store, harness, tmp_path, runs_by_row):
    for decode in ([], ["--decode", "top_p=0.9"]):  # (the plain cell: stored already where another test asked)
        out = harness("run", "--method", "gu-kgw", *decode, "--results", str(shared_store), timeout=3600)
        assert out.returncode == 0, out.stderr[-3000:]

    def sampled(top_p: float | None) -> dict:  # {row: metrics} of Gu-KGW's base and unaltered runs at ``top_p``
        def at(spec: dict) -> bool:  # (on the documents: other tests ask otherwise)
            settings = spec["config"]["preset"]["eval"]
            return settings.get("top_p") == top_p and "prompts" not in settings

        return {row: m for row, (_, m) in runs_by_row(shared_store, "none", where=at).items()}

    decoded, plain = sampled(0.9), sampled(None)
    assert set(decoded) == set(plain) == {"Unwatermarked base", "Unaltered"}, (sorted(decoded), sorted(plain))
    assert decoded["Unaltered"]["auc"] != plain["Unaltered"]["auc"]  # other texts: a run of its own
    # The base's texts flagged at the threshold that flags 1% of the human texts: within the binomial tail of 1%
    # (one-sided, 0.1%), as at plain sampling.
    base = decoded["Unwatermarked base"]
    n = base["n_pos"]
    assert base["tpr@0.01"] * n <= binom.ppf(0.999, n, 0.01), base["tpr@0.01"]
    assert decoded["Unaltered"]["auc"] > base["auc"] + 0.1, (decoded["Unaltered"]["auc"], base["auc"])
    out = harness("tables", "--results", str(shared_store), "--out", str(tmp_path / "tables"))
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "tables" / "tiny" / "decoding.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    labels = {row[0] for row in rows[1:]}
    assert {"temperature=1", "top_p=0.9"} <= labels, labels
    with open(tmp_path / "tables" / "tiny" / "robustness.csv", newline="") as fh:
        assert "top_p" not in fh.read()


def test_detect_samples_the_suspect_as_asked_and_keeps_its_rate(shared_store, harness):
    """The unwatermarked base sampled with top-p 0.9 is not convicted by the Gu-KGW key at 1%, and the report says
    how it was sampled."""
    from harness.assets.models import resolve

    out = harness("run", "--method", "gu-kgw", "--results", str(shared_store), timeout=3600)  # (the key's training)
    assert out.returncode == 0, out.stderr[-3000:]
    specs = [json.loads(p.read_text()) for p in shared_store.glob("*/spec.json")]
    key = next(s["detector"]["key_from"] for s in specs if s["detector"]["method"] == "gu-kgw")
    out = harness("detect", "--results", str(shared_store), "--key", key, "--model", resolve("builtin:tiny-lm"),
                  "--decode", "top_p=0.9", "--num-texts", "60", "--json", timeout=1800)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["source"]["decoding"] == "top_p=0.9", report["source"]
    assert not report["decision"]["watermarked"] and report["decision"]["p_value"] > 0.01, report["decision"]


def test_a_text_attack_refuses_a_decoding_setting(shared_store, harness):
    out = harness("run", "--method", "gu-kgw", "--attack", "typo", "--decode", "temperature=0.7",
                  "--results", str(shared_store), timeout=600)  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    assert "decoding (temperature=0.7)" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
