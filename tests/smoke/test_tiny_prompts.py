"""Other prompts end to end on the tiny preset, in the smoke tests' shared store (the Gu-KGW student trained once for
every smoke test): ``harness run --prompts code`` and ``--prompts chat --system-prompt ...`` ask the base and the
watermarked model otherwise, their runs are new ones (the documents' keep theirs), the unwatermarked base's texts are
flagged at about the stated 1%, ``harness tables`` sets their rows beside the documents' in the prompts table alone,
and ``harness detect --prompts chat`` does not convict the unwatermarked base."""

import csv
import json

import pytest
from scipy.stats import binom

pytestmark = pytest.mark.smoke

ASKED = {"code": ["--prompts", "code"], "chat": ["--system-prompt", "Answer briefly."]}


def test_code_and_chat_rows_hold_the_stated_false_positive_rate(shared_store, harness, tmp_path, runs_by_row):
    for args in ([], *ASKED.values()):  # (the documents' cell: stored already where another test asked)
        out = harness("run", "--method", "gu-kgw", *args, "--results", str(shared_store), timeout=3600)
        assert out.returncode == 0, out.stderr[-3000:]

    def asked(prompts: str | None) -> dict:  # {row: metrics} of Gu-KGW's base and unaltered runs asked ``prompts``
        def at(spec: dict) -> bool:  # (at plain sampling: other tests decode otherwise)
            settings = spec["config"]["preset"]["eval"]
            return settings.get("prompts") == prompts and "top_p" not in settings

        return {row: m for row, (_, m) in runs_by_row(shared_store, "none", where=at).items()}

    documents = asked(None)
    for prompts in ASKED:
        runs = asked(prompts)
        assert set(runs) == set(documents) == {"Unwatermarked base", "Unaltered"}, (prompts, sorted(runs))
        assert runs["Unaltered"]["auc"] != documents["Unaltered"]["auc"]  # other texts: a run of its own
        # The base's texts flagged at the threshold that flags 1% of the human texts: within the binomial tail of 1%
        # (one-sided, 0.1%), as on the documents.
        base = runs["Unwatermarked base"]
        assert base["tpr@0.01"] * base["n_pos"] <= binom.ppf(0.999, base["n_pos"], 0.01), (prompts, base["tpr@0.01"])
        assert runs["Unaltered"]["auc"] > base["auc"] + 0.1, (prompts, runs["Unaltered"]["auc"], base["auc"])
    out = harness("tables", "--results", str(shared_store), "--out", str(tmp_path / "tables"))
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "tables" / "tiny" / "prompts.csv", newline="") as fh:
        labels = {row["prompts"] for row in csv.DictReader(fh)}
    assert {"documents", "code", 'chat (system: "Answer briefly.")'} <= labels, labels
    for table in ("robustness.csv", "fpr_tpr.csv"):
        text = (tmp_path / "tables" / "tiny" / table).read_text()
        assert "chat" not in text and "code" not in text, table


def test_detect_asks_the_suspect_in_chat_and_keeps_its_rate(shared_store, harness):
    from harness.assets.models import resolve

    out = harness("run", "--method", "gu-kgw", "--results", str(shared_store), timeout=3600)  # (the key's training)
    assert out.returncode == 0, out.stderr[-3000:]
    specs = [json.loads(p.read_text()) for p in shared_store.glob("*/spec.json")]
    key = next(s["detector"]["key_from"] for s in specs if s["detector"]["method"] == "gu-kgw")
    out = harness("detect", "--results", str(shared_store), "--key", key, "--model", resolve("builtin:tiny-lm"),
                  "--prompts", "chat", "--num-texts", "60", "--json", timeout=1800)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["source"]["prompts"] == "chat", report["source"]
    assert not report["decision"]["watermarked"] and report["decision"]["p_value"] > 0.01, report["decision"]
