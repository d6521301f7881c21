"""Distillation end to end on the tiny preset, in the smoke tests' shared store (the Gu-KGW student trained once for
every smoke test): ``harness run --attack distill`` trains the base on the watermarked model's texts and scores the
student's own texts with the owner's key, its row between the unwatermarked base and the unaltered model; and a
student distilled from the unwatermarked base itself is not convicted by ``harness detect`` with that key at its
stated false-positive rate (1%)."""

import json

import pytest

pytestmark = pytest.mark.smoke

TEXTS = 40  # teacher texts: a short training, as the default suite's other cells


def test_a_distilled_student_is_scored_with_the_owners_key(shared_store, harness, runs_by_row):
    out = harness("run", "--method", "gu-kgw", "--attack", "distill", "--attack-arg", f"texts={TEXTS}",
                  "--results", str(shared_store), timeout=3600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = runs_by_row(shared_store, "distill")
    base, unaltered = rows["Unwatermarked base"][1], rows["Unaltered"][1]
    student = rows[f"Distillation N={TEXTS}"][1]
    assert base["auc"] - 0.1 < student["auc"] <= unaltered["auc_ci95"][1] + 1e-9, (student["auc"], base, unaltered)


def test_a_student_of_the_unwatermarked_base_is_not_convicted(shared_store, harness, tmp_path, gu_kgw_key):
    from harness.assets.models import resolve
    from harness.config.presets import TINY
    from harness.config.registry import attacks
    from harness.contract.attack import AttackContext

    base = resolve("builtin:tiny-lm")
    attack = attacks.build("distill", {"texts": str(TEXTS)}, TINY)
    stage = tmp_path / "distilled"
    stage.mkdir()
    attack.apply(base, stage, AttackContext(base_model=base, device="cpu"))
    student = stage / f"students/n-{TEXTS}"
    out = harness("detect", "--results", str(shared_store), "--key", gu_kgw_key, "--model", str(student),
                  "--num-texts", "100", "--json", timeout=1800)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    decision = json.loads(out.stdout)["decision"]
    assert not decision["watermarked"] and decision["p_value"] > 0.01, decision
