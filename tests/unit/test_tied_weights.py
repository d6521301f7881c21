"""Attacks on a model whose output projection is its input embedding matrix (Gemma 3, SmolLM2) do what
docs/attacks.md says, the same for every family, checked on a random tied Llama and a random Gemma 3 (sliding-window
and global layers, per-layer-type RoPE, soft-capped output): the quantizers, the pruners and LoRA leave the
embeddings (so the output projection) as they were; weight noise, the merges, fine-tuning and distillation change
the one matrix, and the saved model is still tied. The GGUF attack writes Llama models only and refuses a Gemma base
in one line before any work."""

from __future__ import annotations

import pytest
import torch

from harness.config.errors import HarnessError
from harness.config.registry import attacks
from harness.contract.attack import AttackContext

CALIBRATION = {"calib_data": "builtin:tiny-corpus", "calib_name": None, "calib_split": "train", "calib_len": 32,
               "calib_samples": 4}  # fmt: skip
TRAINING = {"dataset": "tiny-code-instruct", "steps": "2", "batch_size": "2", "seq_len": "128"}

LEAVE = {  # leave the embeddings (and lm_head) untouched
    "int8": {},
    "bnb-4bit": {},
    "hqq": {"bits": "4"},
    "gptq": CALIBRATION,
    "awq": {**CALIBRATION, "group_size": 64},
    "wanda": CALIBRATION,
    "sparsegpt": CALIBRATION,
    "lora": TRAINING,
}
CHANGE = {  # change the one matrix, embeddings and output together
    "weight-noise": {"sigma": "0.1"},
    "slerp": {"t": "0.5"},
    "merge": {"method": "ties", "donors": "donor"},
    "finetune": TRAINING,
    "distill": {"dataset": "tiny-corpus", "texts": "4", "prompt_tokens": "4", "new_tokens": "8", "batch_size": "2"},
}


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tied(request, tmp_path_factory, llama_builder, gemma_builder):
    """(family, model, other model of the family and tokenizer: the base and the donor)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "llama":
        build = lambda folder, seed: llama_builder(folder, seed, tie_word_embeddings=True, hidden_size=128,  # noqa: E731
                                                   intermediate_size=256)  # fmt: skip
    else:
        build = gemma_builder
    return request.param, build(root / "model", 1), build(root / "other", 2)


def embeddings(folder):
    """The loaded model's input embedding matrix, and whether its output projection is that same matrix."""
    from harness.assets.models import load_causal_lm

    model = load_causal_lm(str(folder), "cpu")
    inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return inputs.detach().float().clone(), inputs.data_ptr() == outputs.data_ptr() or torch.equal(inputs, outputs)


@pytest.mark.parametrize("name", [*LEAVE, *CHANGE])
def test_an_attack_on_a_tied_model_does_to_its_embeddings_what_the_docs_say(name, tied, tmp_path):
    family, model, other = tied
    attack = attacks.build(name, {**LEAVE, **CHANGE}[name])
    before, _ = embeddings(model)
    out = tmp_path / "out"
    out.mkdir()
    report = attack.apply(model, out, AttackContext(str(other), "cpu", models={"donor1": str(other)}))
    for label, sub in attack.outputs():
        after, still_tied = embeddings(out / sub)
        assert still_tied, f"{name} ({label}) on a tied {family}: the output projection is no longer the embeddings"
        if name in LEAVE:
            assert torch.equal(after, before), f"{name} ({label}) changed a tied {family}'s embeddings"
        else:
            assert not torch.equal(after, before), f"{name} ({label}) left a tied {family}'s embeddings"
    if name == "weight-noise":
        assert report["tied_embeddings_noised"] is True


def test_the_gguf_attack_refuses_a_gemma_base_before_any_work(tied):
    family, model, _ = tied
    attack = attacks.build("gguf", {"type": "Q8_0"})
    if family == "llama":
        attack.validate(str(model))
        return
    with pytest.raises(HarnessError, match="writes Llama models.*gemma3_text") as err:
        attack.validate(str(model))
    assert "\n" not in str(err.value)
