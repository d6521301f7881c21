"""The field's other watermarks through the pipeline on small random Llamas. Decoding-time reference rows: the base
as it is with a key, the watermark applied by the sampler (its generations keyed by it), detected by the learned
methods' detectors; model attacks refused in one line before any work, text attacks run. GaussMark, the Gaussian bias
and Gu-AAR: a trained stage and rows, reused."""

import json

import pytest

from harness.cell.pipeline import Pipeline
from harness.config.registry import attacks, methods
from harness.store.stages import Store

SETTINGS = {"train.steps": "3", "train.batch_size": "2", "train.seq_len": "16", "eval.num_prompts": "24",
            "eval.prompt_tokens": "4", "eval.new_tokens": "24", "eval.batch_size": "8",
            # the sampled ids: a random model's text does not survive decoding and tokenizing again (AAR and KTH at
            # k = 1 cycle through a few tokens whose decoded text tokenizes otherwise)
            "eval.score_on": "ids"}  # fmt: skip


@pytest.mark.parametrize(
    "name, settings",
    [("kgw-decoding", {"k": "1", "delta": "4"}), ("aar-decoding", {"k": "1"}),
     ("kth-decoding", {"s": "2", "m": "64", "reference_texts": "20"})],
)  # fmt: skip
def test_the_sampler_writes_the_watermark_and_its_detector_finds_it(name, settings, random_llamas, small_preset,
                                                                     tmp_path):  # fmt: skip
    _, base = random_llamas
    import random

    words = "the quick brown fox jumps over a lazy dog and returns the number of items in the list".split()
    rng = random.Random(0)
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(60)]
    preset = small_preset(tmp_path, base, texts=texts, **SETTINGS)
    store = Store(tmp_path / "runs")
    method = methods.build(name, settings)
    cells = Pipeline(preset, store, "cpu").run(method, attacks.build("typo", {"p": "0.05"}))
    assert [c.row for c in cells][:2] == ["Unwatermarked base", "Unaltered"]
    base_row, unaltered, typo = (c.metrics for c in cells)
    assert unaltered["auc"] > 0.9 and unaltered["auc"] >= base_row["auc"], (unaltered["auc"], base_row["auc"])
    assert typo["auc"] > 0.5
    spec = json.loads((cells[1].run.path / "spec.json").read_text())
    assert spec["upstream"]["generate"]["watermark"]["method"] == name  # the generations are the sampler's
    model = json.loads((cells[1].run.path / "artefacts.json").read_text())["model"]
    from safetensors.torch import load_file

    trained, original = load_file(f"{model}/model.safetensors"), load_file(str(base / "model.safetensors"))
    assert all(trained[k].equal(original[k]) for k in original)  # the "trained" model is the base as it is


@pytest.mark.parametrize("attack", ["slerp", "gptq", "weight-noise"])
def test_model_attacks_are_refused_before_any_work(cli, tmp_path, attack):
    out = cli("run", "--method", "kgw-decoding", "--attack", attack, "--dry-run", "--results", str(tmp_path / "r"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "at decoding time, not in the weights" in out.stderr
    chained = cli("run", "--method", "aar-decoding", "--attack", "weight-noise", "--then", "typo", "--dry-run")
    assert chained.returncode == 2 and "model attacks (chain) do not apply" in chained.stderr
    assert "do not apply" in methods.build("kth-decoding", {}).refuses(attacks.build("slerp", {}))
    assert methods.build("kgw-decoding", {}).refuses(attacks.build("typo", {})) is None
    assert methods.build("gu-kgw", {}).refuses(attacks.build("slerp", {})) is None


def test_an_attack_may_refuse_a_method_before_any_work_and_a_chain_asks_its_links(monkeypatch):
    """``Attack.refuses(method)``, the attack's side of ``WatermarkMethod.refuses``: the checks every run and grid
    make before any work ask both, and a chain refuses what one of its links refuses."""
    from harness.cell.checks import check_inputs
    from harness.config.errors import HarnessError
    from harness.config.presets import TINY

    typo = type(attacks.build("typo", {}))
    monkeypatch.setattr(typo, "refuses", lambda self, method: f"typo cannot act on {method.name}")
    method = methods.build("gu-kgw", {})
    with pytest.raises(HarnessError, match="typo cannot act on gu-kgw"):
        check_inputs(TINY, (method, attacks.build("typo", {})), build=False)
    chain = attacks.build("chain", {"links": [{"attack": "slerp"}, {"attack": "typo"}]})
    assert chain.refuses(method) == "typo cannot act on gu-kgw"
    assert attacks.build("slerp", {}).refuses(method) is None


@pytest.mark.parametrize(
    "name, settings",
    [
        ("gaussmark", {"sigma": "0.05", "layers": "0,1"}),
        ("gaussian-bias", {"std": "2"}),
        ("gu-aar", {"k": "1", "prompt_tokens": "4"}),
    ],
)
def test_the_other_weight_watermarks_run_through_the_pipeline(name, settings, random_llamas, small_preset, tmp_path):
    """Plumbing of the field's other learned methods on a random model (their detection is measured on the tiny
    preset, README): a trained stage, a row each, p-values in [0, 1], a SLERP cell reusing the training."""
    _, base = random_llamas
    preset = small_preset(tmp_path, base, **{**SETTINGS, "eval.num_prompts": "6", "eval.new_tokens": "8"})
    store = Store(tmp_path / "runs")
    method = methods.build(name, settings)
    cells = Pipeline(preset, store, "cpu").run(method, attacks.build("slerp", {"t": "0.5"}))
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered", "SLERP t=0.5"]
    for cell in cells:
        rows = [json.loads(line) for line in (cell.run.path / "scores.jsonl").read_text().splitlines()]
        assert len(rows) == 12 and all(0 <= r["p_value"] <= 1 for r in rows), rows[:2]
    again = Pipeline(preset, store, "cpu").run(method, attacks.build("none", {}))
    assert all(c.reused for c in again)
