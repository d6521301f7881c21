"""A decoding setting end to end on the tiny preset, in the smoke tests' shared store (the Gu-KGW student trained once
for every smoke test): ``harness run --decode top_p=0.9`` samples the base and the watermarked model with nucleus
sampling, its runs are new ones (the plain runs keep theirs), the unwatermarked base's texts are flagged at about the
stated 1%, and ``harness tables`` sets the decoded rows beside plain sampling's in the decoding table alone. A text
attack's rows, rewrites of what the model wrote, refuse a decoding setting in one line."""

import csv

import pytest

pytestmark = pytest.mark.smoke


def test_top_p_rows_hold_the_stated_false_positive_rate(
    shared_store, harness, tmp_path, unattacked_metrics, check_stated_rate
):
    for decode in ([], ["--decode", "top_p=0.9"]):  # (the plain cell: stored already where another test asked)
        out = harness("run", "--method", "gu-kgw", *decode, "--results", str(shared_store), timeout=3600)
        assert out.returncode == 0, out.stderr[-3000:]
    # (on the documents: other tests ask otherwise)
    decoded = unattacked_metrics(shared_store, top_p=0.9, prompts=None)
    plain = unattacked_metrics(shared_store, top_p=None, prompts=None)
    assert set(decoded) == set(plain) == {"Unwatermarked base", "Unaltered"}, (sorted(decoded), sorted(plain))
    assert decoded["Unaltered"]["auc"] != plain["Unaltered"]["auc"]  # other texts: a run of its own
    check_stated_rate(decoded, "top_p=0.9")  # as at plain sampling
    out = harness("tables", "--results", str(shared_store), "--out", str(tmp_path / "tables"))
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "tables" / "tiny" / "decoding.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    labels = {row[0] for row in rows[1:]}
    assert {"temperature=1", "top_p=0.9"} <= labels, labels
    with open(tmp_path / "tables" / "tiny" / "robustness.csv", newline="") as fh:
        assert "top_p" not in fh.read()


def test_detect_samples_the_suspect_as_asked_and_keeps_its_rate(audit_tiny_base):
    """The unwatermarked base sampled with top-p 0.9 is not convicted by the Gu-KGW key at 1%, and the report says
    how it was sampled."""
    report = audit_tiny_base("--decode", "top_p=0.9")
    assert report["source"]["decoding"] == "top_p=0.9", report["source"]
    assert not report["decision"]["watermarked"] and report["decision"]["p_value"] > 0.01, report["decision"]


def test_a_text_attack_refuses_a_decoding_setting(shared_store, harness):
    out = harness("run", "--method", "gu-kgw", "--attack", "typo", "--decode", "temperature=0.7",
                  "--results", str(shared_store), timeout=600)  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    assert "decoding (temperature=0.7)" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
