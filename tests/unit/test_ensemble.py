"""Decoding through several models (``attacks/ensemble.py``): WASH's average of next-token distributions and the
logit merge toward the base, rows of the unaltered watermarked model decoded otherwise (``CellStages.decode``)."""

from __future__ import annotations

import pytest
import torch

from harness.cell.pipeline import Pipeline
from harness.config.errors import HarnessError
from harness.config.registry import attacks, methods
from harness.store.files import read_jsonl
from harness.store.stages import Store

PRESET = {"train.steps": "2", "train.batch_size": "2", "train.seq_len": "12", "eval.num_prompts": "4",
          "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "2"}  # fmt: skip


def texts(cell) -> list[list[int]]:
    return [g["completion_ids"] for g in read_jsonl(cell.run.path / "generations.jsonl")]


def run(pipe, attack, method: str = "kgw-decoding"):
    """The cells of ``method`` under ``attack``: by default decoding-time KGW (delta 4), whose unaltered texts differ
    from the base's at once (a student of two training steps would write the base's), and whose sampler the attack's
    processors follow."""
    cells = pipe.run(methods.build(method, {"delta": "4"} if method == "kgw-decoding" else {}), attack)
    return {c.row: c for c in cells}


def test_logit_merge_ends_are_the_watermarked_model_and_the_base(random_llamas, tmp_path, small_preset):
    """t = 0 writes the unaltered row's texts and t = 1 the base row's, token for token (each a stage of its own; the
    decoding-time watermark's processor acts first, and t = 1 overrides it); t = 0.5 writes others, and its run names
    the attack and its setting."""
    marked, _ = random_llamas
    pipe = Pipeline(small_preset(tmp_path, marked, **PRESET), Store(tmp_path / "runs"), "cpu")
    ends = {t: run(pipe, attacks.build("logit-merge", {"t": str(t)})) for t in (0, 1, 0.5)}
    zero, one, half = ends[0], ends[1], ends[0.5]
    assert set(zero) == {"Unwatermarked base", "Unaltered", "Logit merge t=0"}
    assert texts(zero["Logit merge t=0"]) == texts(zero["Unaltered"])
    assert texts(one["Logit merge t=1"]) == texts(one["Unwatermarked base"])
    assert texts(one["Unwatermarked base"]) != texts(one["Unaltered"])  # (so the two checks above can fail)
    assert texts(half["Logit merge t=0.5"]) not in (texts(half["Unaltered"]), texts(half["Unwatermarked base"]))
    assert zero["Logit merge t=0"].run.spec["config"]["attack"]["category"] == "Adaptive"


def test_wash_samples_the_average_of_the_distributions(random_llamas, tmp_path, small_preset):
    """One step of WASH by hand: the processor's scores are the log of the mean of the watermarked model's softmax and
    the other model's; across a batch with left padding, each prompt's other-model logits are those it gets alone."""
    from attacks.ensemble import OtherModels, average_distributions
    from harness.assets.models import load_causal_lm

    marked, other = random_llamas
    pad = 0
    prompts = [[5, 6, 7, 8], [9, 10]]
    ids = torch.tensor([[5, 6, 7, 8], [pad, pad, 9, 10]])
    scores = torch.randn(2, 40)
    processor = OtherModels([str(other)], average_distributions, pad)
    got = processor(ids, scores.clone())
    model = load_causal_lm(str(other), "cpu")
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([p])).logits[0, -1, :40] for p in prompts]
    want = torch.log((torch.softmax(scores, -1) + torch.softmax(torch.stack(alone), -1)) / 2)
    assert torch.allclose(got, want, atol=1e-5)
    # the next step extends the cache: the same as the whole sequences alone
    step = torch.cat([ids, torch.tensor([[11], [12]])], dim=1)
    got = processor(step, scores.clone())
    with torch.no_grad():
        alone = [
            model(input_ids=torch.tensor([p + [t]])).logits[0, -1, :40] for p, t in zip(prompts, (11, 12), strict=True)
        ]
    want = torch.log((torch.softmax(scores, -1) + torch.softmax(torch.stack(alone), -1)) / 2)
    assert torch.allclose(got, want, atol=1e-5)


def test_wash_runs_a_cell_with_another_model(random_llamas, tmp_path, small_preset):
    marked, other = random_llamas
    pipe = Pipeline(small_preset(tmp_path, marked, **PRESET), Store(tmp_path / "runs"), "cpu")
    found = run(pipe, attacks.build("wash", {"models": str(other)}))
    assert set(found) == {"Unwatermarked base", "Unaltered", "WASH K=1"}
    wash = found["WASH K=1"]
    assert texts(wash) != texts(found["Unaltered"])
    generate = read_jsonl(wash.run.path / "generations.jsonl")
    assert len(generate) == 4 and all(len(g["completion_ids"]) == 8 for g in generate)
    assert "auc" in wash.metrics


@pytest.mark.parametrize(
    "name, settings, message",
    [("wash", {}, "give at least one other model"), ("wash", {"models": "a,b,a"}, "a model is named twice"),
     ("wash", {"models": "a", "k": "0"}, "k: Input should be greater than or equal to 1"),
     ("wash", {"models": "a", "k": "2"}, "k=2 is more than the 1 models named"),
     ("logit-merge", {"t": "nan"}, "t: Input should be a finite number"),
     ("logit-merge", {"t": "inf"}, "t: Input should be a finite number"),
     ("logit-merge", {"t": "1.5"}, "t: Input should be less than or equal to 1")],
)  # fmt: skip
def test_bad_settings_are_refused(name, settings, message):
    with pytest.raises(HarnessError, match=message):
        attacks.build(name, settings)


def test_a_model_of_another_tokenizer_is_refused_before_any_work(random_llamas, other_tokenizer_llama, cli, tmp_path):
    marked, _ = random_llamas
    settings = ["--set", f"base_model={marked}", "--set", f"oracle_model={marked}", "--results", str(tmp_path / "r")]
    out = cli("run", "--method", "gu-kgw", "--attack", "wash", "--attack-arg", f"models={other_tokenizer_llama}",
              *settings)  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "wash model" in out.stderr and "another vocabulary" in out.stderr
    assert not (tmp_path / "r" / "stages").exists()
