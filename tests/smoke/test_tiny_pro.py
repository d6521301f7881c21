"""PRO end to end on the tiny preset, through the installed CLI: CAWP alone (FPL doubles the training time and is
covered by the unit and pipeline tests) for 60 of the preset's 150 steps: the policy is learned, the base shows none,
and each method's key leaves the other method's watermarked model unflagged (``harness detect``, against the Gu-KGW
student of the smoke tests' shared store). The preset's own strength is the README demo's and the reference grid's to
show; 60 steps give AUC 0.970 on 2 AVX2 cores (150 steps: 0.996), well clear of the 0.9 a learned policy must pass. PRO
trains into a store of its own: its shorter training is another setup, which would split the shared store's tables into
one folder per setup."""

import json

import pytest

pytestmark = pytest.mark.smoke

CAWP = ("--method", "pro", "--method-arg", "fpl=false", "--set", "train.steps=60")


@pytest.fixture(scope="module")
def pro_store(tmp_path_factory, harness):
    root = tmp_path_factory.mktemp("pro-store") / "runs"
    out = harness("run", *CAWP, "--results", str(root), timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


def test_pro_watermark_is_learned_on_the_tiny_preset(pro_store, runs_by_row):
    found = runs_by_row(pro_store, method="pro")
    assert set(found) == {"Unwatermarked base", "Unaltered"}
    assert found["Unaltered"][1]["auc"] > 0.9, found
    assert 0.35 < found["Unwatermarked base"][1]["auc"] < 0.65, found
    assert found["Unaltered"][0]["config"]["method"]["config_label"].endswith(", no FPL")


def test_one_methods_key_does_not_fire_on_the_other_methods_model(pro_store, shared_store, harness, cli, runs_by_row):
    out = harness("run", "--method", "gu-kgw", "--results", str(shared_store), timeout=1800)  # the Gu-KGW student
    assert out.returncode == 0, out.stderr[-3000:]
    stores = {"pro": pro_store, "gu-kgw": shared_store}
    keys = {m: runs_by_row(root, method=m)["Unaltered"][0]["detector"]["key_from"] for m, root in stores.items()}
    for key_of, model_of in (("pro", "gu-kgw"), ("gu-kgw", "pro")):
        model = stores[model_of] / "stages" / "train" / keys[model_of] / "model"
        args = ("detect", "--results", str(stores[key_of]), "--num-texts", "64", "--json", "--key", keys[key_of])
        out = cli(*args, "--model", str(model))
        assert out.returncode == 0, out.stderr[-3000:]
        decision = json.loads(out.stdout)["decision"]
        if key_of == "pro":  # no null of its own: no verdict, whatever the model (harness.audit.verdict.NO_NULL)
            assert decision["p_value"] is None and decision["watermarked"] is None, decision
        else:
            assert decision["p_value"] > 0.01 and not decision["watermarked"], (key_of, model_of, decision)


def test_the_pro_key_tells_its_student_from_the_base_but_gives_no_verdict(pro_store, cli, runs_by_row):
    """``harness detect`` with a PRO key scores with the centred score and compares the texts with the base model's
    own continuations: the student's stand far above them, the base's do not; as PRO has no null distribution (an
    unwatermarked fine-tune of the base writes unlike the base too), neither audit gives a p-value or a verdict."""
    key = runs_by_row(pro_store, method="pro")["Unaltered"][0]["detector"]["key_from"]
    args = ("detect", "--results", str(pro_store), "--num-texts", "64", "--json", "--key", key)
    found = {}
    for name, model in (("student", pro_store / "stages" / "train" / key / "model"), ("base", "builtin:tiny-lm")):
        out = cli(*args, "--model", str(model))
        assert out.returncode == 0, out.stderr[-3000:]
        found[name] = json.loads(out.stdout)
    for report in found.values():
        d = report["decision"]
        assert d["p_value"] is None and d["watermarked"] is None and "no p-value and no verdict" in d["test"], d
        assert all("p_value" not in t for t in report["texts"]), report["texts"][:2]
    assert found["student"]["decision"]["against_base"]["auc"] > 0.9, found["student"]["decision"]
    assert 0.3 < found["base"]["decision"]["against_base"]["auc"] < 0.7, found["base"]["decision"]
    assert found["base"]["key"]["config"].endswith("centred score, no FPL")
    shown = cli("detect", "--results", str(pro_store), "--num-texts", "64", "--key", key, "--model", "builtin:tiny-lm")
    assert "decision: none: PRO has no null distribution" in shown.stdout and "WATERMARKED" not in shown.stdout
