"""PRO end to end on the tiny preset, through the installed CLI: CAWP alone (FPL doubles the training time and is
covered by the unit and pipeline tests) for 60 of the preset's 150 steps, in the store the Gu-KGW smoke test trained:
the policy is learned, the base shows none, and each method's key leaves the other method's watermarked model
unflagged (``harness detect``). The preset's own strength is the README demo's and the reference grid's to show; 60
steps give AUC 0.970 on 2 AVX2 cores (150 steps: 0.996), well clear of the 0.9 a learned policy must pass."""

import json

import pytest

pytestmark = pytest.mark.smoke

CAWP = ("--method", "pro", "--method-arg", "fpl=false", "--set", "train.steps=60")


@pytest.fixture(scope="module")
def pro_store(tiny_store, harness):
    root, _ = tiny_store
    out = harness("run", *CAWP, "--results", str(root), timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


def test_pro_watermark_is_learned_on_the_tiny_preset(pro_store, runs_by_row):
    found = runs_by_row(pro_store, method="pro")
    assert set(found) == {"Unwatermarked base", "Unaltered"}
    assert found["Unaltered"][1]["auc"] > 0.9, found
    assert 0.35 < found["Unwatermarked base"][1]["auc"] < 0.65, found
    assert found["Unaltered"][0]["config"]["method"]["config_label"].endswith(", no FPL")


def test_one_methods_key_does_not_fire_on_the_other_methods_model(pro_store, harness, runs_by_row):
    keys = {m: runs_by_row(pro_store, method=m)["Unaltered"][0]["detector"]["key_from"] for m in ("gu-kgw", "pro")}
    for key_of, model_of in (("pro", "gu-kgw"), ("gu-kgw", "pro")):
        model = pro_store / "stages" / "train" / keys[model_of] / "model"
        args = ("detect", "--results", str(pro_store), "--num-texts", "64", "--json", "--key", keys[key_of])
        out = harness(*args, "--model", str(model), timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        decision = json.loads(out.stdout)["decision"]
        assert decision["p_value"] > 0.01 and not decision["watermarked"], (key_of, model_of, decision)
