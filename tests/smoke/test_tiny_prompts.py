"""Other prompts end to end on the tiny preset, in the smoke tests' shared store (the Gu-KGW student trained once for
every smoke test): ``harness run --prompts code`` and ``--prompts chat --system-prompt ...`` ask the base and the
watermarked model otherwise, their runs are new ones (the documents' keep theirs), the unwatermarked base's texts are
flagged at about the stated 1%, ``harness tables`` sets their rows beside the documents' in the prompts table alone,
and ``harness detect --prompts chat`` does not convict the unwatermarked base."""

import csv

import pytest

pytestmark = pytest.mark.smoke

ASKED = {"code": ["--prompts", "code"], "chat": ["--system-prompt", "Answer briefly."]}


def test_code_and_chat_rows_hold_the_stated_false_positive_rate(
    shared_store, harness, tmp_path, unattacked_metrics, check_stated_rate
):
    for args in ([], *ASKED.values()):  # (the documents' cell: stored already where another test asked)
        out = harness("run", "--method", "gu-kgw", *args, "--results", str(shared_store), timeout=3600)
        assert out.returncode == 0, out.stderr[-3000:]
    # (at plain sampling: other tests decode otherwise)
    documents = unattacked_metrics(shared_store, prompts=None, top_p=None)
    for prompts in ASKED:
        runs = unattacked_metrics(shared_store, prompts=prompts, top_p=None)
        assert set(runs) == set(documents) == {"Unwatermarked base", "Unaltered"}, (prompts, sorted(runs))
        assert runs["Unaltered"]["auc"] != documents["Unaltered"]["auc"]  # other texts: a run of its own
        check_stated_rate(runs, prompts)  # as on the documents
    out = harness("tables", "--results", str(shared_store), "--out", str(tmp_path / "tables"))
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "tables" / "tiny" / "prompts.csv", newline="") as fh:
        labels = {row["prompts"] for row in csv.DictReader(fh)}
    assert {"documents", "code", 'chat (system: "Answer briefly.")'} <= labels, labels
    for table in ("robustness.csv", "fpr_tpr.csv"):
        text = (tmp_path / "tables" / "tiny" / table).read_text()
        assert "chat" not in text and "code" not in text, table


def test_detect_asks_the_suspect_in_chat_and_keeps_its_rate(audit_tiny_base):
    report = audit_tiny_base("--prompts", "chat")
    assert report["source"]["prompts"] == "chat", report["source"]
    assert not report["decision"]["watermarked"] and report["decision"]["p_value"] > 0.01, report["decision"]
