"""Every method trains and detects on a second architecture, a random Gemma 3 (tied embeddings, sliding-window and
global layers, per-layer-type RoPE, a soft-capped output, embeddings scaled by the width's square root): a trained
stage, the base row and the unaltered row, every text scored (a p-value in [0, 1] where the method gives one).
Plumbing only, as on the random Llamas of the other method tests; what the vocabulary's size does to each method's
memory is measured at the gemma preset (results/reference/gemma-pro-vs-gu-kgw/README.md)."""

import json
import math

import pytest

from harness.cell.pipeline import Pipeline
from harness.config.registry import attacks, methods
from harness.store.stages import Store

SETTINGS = {"train.steps": "2", "train.batch_size": "2", "train.seq_len": "16", "eval.num_prompts": "6",
            "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "6",
            "eval.score_on": "ids"}  # fmt: skip

METHODS = {
    "gu-kgw": {"k": "1"},
    "gu-kth": {"s": "2", "m": "16", "prompt_tokens": "4", "reference_texts": "20", "generate_batch": "3"},
    "gloaguen-kgw": {"k": "1", "ft_steps": "2", "ft_warmup": "0"},
    "pro": {},
    "gaussmark": {"sigma": "0.05", "layers": "0,1"},
    "gaussian-bias": {"std": "2"},
    "gu-aar": {"k": "1", "prompt_tokens": "4"},
    "kgw-decoding": {"k": "1"},
    "kth-decoding": {"s": "2", "m": "16", "reference_texts": "20"},
    "aar-decoding": {"k": "1"},
}


@pytest.fixture(scope="module")
def gemma_base(tmp_path_factory, gemma_builder):
    return gemma_builder(tmp_path_factory.mktemp("gemma") / "base", 1)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_trains_and_detects_on_a_gemma(name, gemma_base, small_preset, tmp_path):
    preset = small_preset(tmp_path, gemma_base, **SETTINGS)
    cells = Pipeline(preset, Store(tmp_path / "runs"), "cpu").run(methods.build(name, METHODS[name]),
                                                                  attacks.build("none", {}))  # fmt: skip
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered"]
    for cell in cells:
        rows = [json.loads(line) for line in (cell.run.path / "scores.jsonl").read_text().splitlines()]
        assert len(rows) == 12 and all(math.isfinite(r["score"]) for r in rows), rows[:2]
        assert all(0 <= r["p_value"] <= 1 for r in rows if "p_value" in r), rows[:2]  # (PRO's score has none)
