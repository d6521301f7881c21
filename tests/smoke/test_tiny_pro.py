"""PRO end to end on the tiny preset, through the installed CLI: CAWP alone (FPL doubles the training time and is
covered by the unit and pipeline tests), next to nothing else: the policy is learned and the base shows none."""

import json

import pytest

pytestmark = pytest.mark.smoke


def test_pro_watermark_is_learned_on_the_tiny_preset(tmp_path, harness):
    root = tmp_path / "runs"
    out = harness("run", "--method", "pro", "--method-arg", "fpl=false", "--results", str(root), timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    found = {}
    for done in root.glob("*/DONE"):
        spec = json.loads((done.parent / "spec.json").read_text())
        found[spec["row"]] = json.loads((done.parent / "metrics.json").read_text())
    assert set(found) == {"Unwatermarked base", "Unaltered"}
    assert found["Unaltered"]["auc"] > 0.95, found
    assert 0.35 < found["Unwatermarked base"]["auc"] < 0.65, found
    unaltered = next(p.parent for p in root.glob("*/DONE") if json.loads((p.parent / "spec.json").read_text())["row"]
                     == "Unaltered")  # fmt: skip
    assert json.loads((unaltered / "spec.json").read_text())["config"]["method"]["config_label"].endswith(", no FPL")
