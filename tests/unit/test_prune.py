"""Wanda and SparseGPT through llm-compressor: every Linear of every decoder layer pruned to the setting (counted in the
saved safetensors), lm_head / embeddings / norms untouched, a dense model plain transformers loads, and repeated calls
in one process (llm-compressor's global session) each correct."""

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.assets.models import load_causal_lm
from harness.config.errors import HarnessError
from harness.config.registry import attacks
from harness.contract.attack import AttackContext

pytest.importorskip("llmcompressor")

LAYERS = 2
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
PROJECTIONS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
PRUNED = [f"model.layers.{i}.{p}" for i in range(LAYERS) for p in PROJECTIONS]
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Pruning sets the least important weights of each layer to zero.",
    "A watermark is a hidden signal in generated text that a detector can find.",
] * 20


@pytest.fixture(scope="module")
def llama(tmp_path_factory, llama_builder):
    """A random Llama whose rows are 40 or 80 wide (20% and 50% of a row are whole numbers), and a JSONL corpus."""
    from harness.assets.tiny import build_tokenizer

    root = tmp_path_factory.mktemp("prune")
    dims = {"hidden_size": 40, "intermediate_size": 80, "num_hidden_layers": LAYERS, "max_position_embeddings": 64}
    llama_builder(root / "model", 0, build_tokenizer(SENTENCES), **dims)
    corpus = root / "calib.jsonl"
    corpus.write_text("".join(json.dumps({"text": s}) + "\n" for s in SENTENCES))
    return root / "model", corpus


def build(name: str, sparsity: float, corpus):
    settings = {"calib_data": str(corpus), "calib_name": None, "calib_samples": "8", "calib_len": "16"}
    return attacks.build(name, {"sparsity": str(sparsity), **settings})


def prune(name: str, sparsity: float, llama, out):
    model, corpus = llama
    out.mkdir()
    record = build(name, sparsity, corpus).apply(model, out, AttackContext(str(model), "cpu"))
    return record, weights(out / "model")


def weights(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def expected_zeros(name: str, weight: torch.Tensor, sparsity: float) -> int:
    """Wanda prunes int(cols * s) weights of each row. SparseGPT, like the reference code, prunes the weights at or
    below the threshold of each 128-column block: int(block numel * s) + 1 of them (ties aside)."""
    rows, cols = weight.shape
    if name == "wanda":
        return rows * int(cols * sparsity)
    return sum(int(rows * (min(i + 128, cols) - i) * sparsity) + 1 for i in range(0, cols, 128))


def check_pruned(name: str, sparsity: float, record: dict, original: dict, pruned: dict) -> None:
    assert pruned.keys() == original.keys()
    assert sorted(record["pruned_layers"]) == sorted(PRUNED)
    for layer in PRUNED:
        weight = pruned[f"{layer}.weight"]
        zeros = int((weight == 0).sum())
        assert zeros == expected_zeros(name, weight, sparsity), layer
        assert abs(zeros / weight.numel() - sparsity) < 2 / weight.numel(), layer
        assert record["pruned_layers"][layer] == {
            "zeros": zeros,
            "numel": weight.numel(),
            "sparsity": zeros / weight.numel(),
        }
        if name == "wanda":  # exactly int(cols * s) per row
            assert ((weight == 0).sum(dim=1) == int(weight.shape[1] * sparsity)).all(), layer
        kept = weight != 0
        assert kept.any() and (original[f"{layer}.weight"] != 0).all()
    untouched = [k for k in original if k.removesuffix(".weight") not in PRUNED]
    assert {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"} <= set(untouched)
    assert all(torch.equal(pruned[k], original[k]) for k in untouched)  # bit-identical
    assert sorted(record["untouched"]) == sorted(untouched)
    zeros = sum(int((pruned[f"{layer}.weight"] == 0).sum()) for layer in PRUNED)  # counted in the saved weights
    assert record["sparsity_overall"] == zeros / sum(pruned[f"{layer}.weight"].numel() for layer in PRUNED)


@pytest.mark.parametrize("name", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("sparsity", [0.2, 0.5])
def test_prunes_every_linear_to_the_sparsity(llama, tmp_path, name, sparsity):
    model, corpus = llama
    record, pruned = prune(name, sparsity, llama, tmp_path / "stage")
    out = tmp_path / "stage" / "model"
    check_pruned(name, sparsity, record, weights(model), pruned)

    assert json.loads(json.dumps(record)) == record  # the stage stores it as JSON
    assert record["evaluated"] == "the pruned model (dense weights with zeros)"
    assert record["settings"]["sparsity"] == sparsity and record["settings"]["mask_structure"] == "0:0"
    assert record["calibration"]["shape"] == [8, 16] and len(record["calibration"]["fingerprint"]) == 16
    assert record["versions"]["llmcompressor"] and record["versions"]["compressed-tensors"]
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and "sparsity_config" not in config  # dense, plain transformers
    assert (out / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()

    lm = load_causal_lm(str(out), "cpu")
    ids = torch.tensor([[1, 2, 3, 4]])
    generated = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, 7)


def test_repeated_calls_in_one_process(llama, tmp_path):
    """llm-compressor keeps a global session: each call must still prune with its own settings, and a repeated call
    give the same model."""
    original = weights(llama[0])
    first, first_weights = prune("wanda", 0.2, llama, tmp_path / "a")
    second, second_weights = prune("sparsegpt", 0.5, llama, tmp_path / "b")
    third, third_weights = prune("wanda", 0.5, llama, tmp_path / "c")
    again, again_weights = prune("wanda", 0.2, llama, tmp_path / "d")
    check_pruned("wanda", 0.2, first, original, first_weights)
    check_pruned("sparsegpt", 0.5, second, original, second_weights)
    check_pruned("wanda", 0.5, third, original, third_weights)
    assert all(torch.equal(again_weights[k], first_weights[k]) for k in first_weights)
    assert again["pruned_layers"] == first["pruned_layers"]


def test_zero_sparsity_saves_the_model_unchanged(llama, tmp_path):
    record, pruned = prune("sparsegpt", 0.0, llama, tmp_path / "stage")
    original = weights(llama[0])
    assert all(torch.equal(pruned[k], original[k]) for k in original)
    assert record["sparsity_overall"] == 0


@pytest.mark.parametrize("value", ["1.0", "-0.1", "1.5", "half"])
def test_bad_sparsity_is_a_one_line_error(value):
    with pytest.raises(HarnessError) as err:
        attacks.build("wanda", {"sparsity": value})
    assert str(err.value).startswith("bad settings for attack 'wanda': sparsity: ") and "\n" not in str(err.value)


def test_labels_and_data_refs():
    wanda = attacks.build("wanda", {"sparsity": "0.2"})
    sparsegpt = attacks.build("sparsegpt", {})
    assert (wanda.category, wanda.label, wanda.config_label()) == ("Pruning", "Wanda", "rho=0.2")
    assert (sparsegpt.label, sparsegpt.config_label(), sparsegpt.params.calib_samples) == ("SparseGPT", "rho=0.5", 128)
    assert wanda.data_refs()["calibration"].path == "allenai/c4"
