"""Quantization attacks: the evaluated weights lie on the scheme's grid (GPTQ, HQQ), LLM.int8 stores int8 weights,
every result loads and generates, and bad settings fail in one line before any model loads."""

import json

import pytest
import torch
from safetensors.torch import load_file

from attacks.base import AttackContext
from harness.assets.models import load_causal_lm, load_tokenizer
from harness.config.errors import HarnessError
from harness.config.registry import attacks

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def weights(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def linear_names(tensors):
    return sorted(
        k.removesuffix(".weight") for k in tensors if k.endswith(".weight") and k.split(".")[-2] in PROJECTIONS
    )


TEXTS = [
    "Quantization rounds every weight of a layer to one of a few levels.",
    "The calibration texts show which input columns matter most to each layer.",
    "A watermark that survives rounding must live in more than the last bits.",
]


@pytest.fixture(scope="module")
def llama(random_llamas):
    """conftest's random Llama (make_random_llama): 2 layers, hidden 32, intermediate 64."""
    return random_llamas[0]


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    path.write_text("".join(json.dumps({"text": f"{s} ({i})"}) + "\n" for i, s in enumerate(TEXTS * 17)))
    return path


def generates(folder):
    model, tokenizer = load_causal_lm(str(folder), "cpu"), load_tokenizer(str(folder))
    batch = tokenizer("The quick brown", return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert out.shape[1] == batch["input_ids"].shape[1] + 4
    loss = model(**batch, labels=batch["input_ids"]).loss  # perplexity scoring runs
    assert torch.isfinite(loss)
    return model


def assert_on_grid(w, scale, bits):
    """Every weight of a group is ``scale * (q - zero)`` with integer q in [0, 2^bits - 1] and one zero per group:
    ``w / scale`` is an integer (up to float error) and spans at most 2^bits - 1 steps."""
    steps = w.double() / scale.double()
    assert torch.allclose(steps, steps.round(), atol=1e-3), (steps - steps.round()).abs().max()
    steps = steps.round()
    assert (steps.max(-1).values - steps.min(-1).values <= 2**bits - 1).all()


@pytest.mark.parametrize("bits", [8, 4])
def test_gptq_weights_on_grid(llama, calib_file, tmp_path, bits):
    pytest.importorskip("gptqmodel")
    from harness.assets import data

    group = 32  # more entries than 4 bits have codes, so the count of distinct values below can fail
    settings = {"bits": str(bits), "group_size": str(group), "calib_data": str(calib_file), "calib_name": None}
    attack = attacks.build("gptq", settings | {"calib_samples": "4", "calib_len": "16"})
    assert attack.data_refs()["calibration"].path == str(calib_file)
    record = attack.apply(llama, tmp_path, AttackContext(str(llama), "cpu"))

    assert record["versions"]["gptqmodel"] and record["quantize_config"]["group_size"] == group
    assert record["calibration"]["fingerprint"] == data.fingerprint(attack.params.calibration_source())
    assert "dequantized" in record["evaluated"]
    assert record["quantize_config"]["bits"] == bits

    out, packed, source = weights(tmp_path / "model"), weights(tmp_path / "quantized"), weights(llama)
    assert all(v.dtype == torch.float32 for v in out.values())
    names = linear_names(out)
    assert len(names) == 2 * len(PROJECTIONS)
    for name in names:
        w = out[f"{name}.weight"]  # (out_features, in_features)
        g_idx = packed[f"{name}.g_idx"].long()  # input column -> group
        assert torch.equal(g_idx, torch.arange(w.shape[1]) // group)
        scale = packed[f"{name}.scales"].float().t()[:, g_idx]  # (out_features, in_features)
        grouped = w.view(w.shape[0], -1, group)
        assert_on_grid(grouped, scale.view_as(grouped), bits)
        if bits == 4:  # (8 bits have more codes than a group has entries)
            distinct = max(len(torch.unique(grouped[r, j])) for r in range(w.shape[0]) for j in range(grouped.shape[1]))
            assert distinct <= 16
        assert not torch.equal(w, source[f"{name}.weight"])
    for key in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert torch.equal(out[key], source[key])  # GPTQ quantizes the decoder's linear layers only
    generates(tmp_path / "model")


def test_hqq_weights_on_grid(llama, tmp_path):
    pytest.importorskip("hqq")
    group = 32  # more entries than 4 bits have codes
    record = attacks.build("hqq", {"group_size": str(group)}).apply(llama, tmp_path, AttackContext(str(llama), "cpu"))
    assert record["bits"] == 4 and record["axis"] == 1 and record["versions"]["hqq"]
    assert "dequantized" in record["evaluated"]

    out, packed, source = weights(tmp_path / "model"), weights(tmp_path / "quantized"), weights(llama)
    names = linear_names(out)
    assert len(names) == 2 * len(PROJECTIONS) and record["quantized_layers"] == len(names)
    for name in names:
        w = out[f"{name}.weight"]
        assert packed[f"{name}.W_q"].dtype == torch.uint8  # 4-bit codes packed two per byte
        # axis 1: groups of `group` consecutive input columns of each row; one scale and zero per group
        grouped = w.reshape(-1, group)
        scale, zero = packed[f"{name}.scale"].double(), packed[f"{name}.zero"].double()
        assert scale.shape == zero.shape == (grouped.shape[0], 1)
        codes = grouped.double() / scale + zero
        assert torch.allclose(codes, codes.round(), atol=1e-3)
        assert codes.round().min() >= 0 and codes.round().max() <= 15
        assert max(len(torch.unique(row)) for row in grouped) <= 16
        assert not torch.equal(w, source[f"{name}.weight"])
    assert torch.equal(out["lm_head.weight"], source["lm_head.weight"])
    generates(tmp_path / "model")


@pytest.mark.parametrize("threshold", [None, 6.0])
def test_int8_stores_int8(llama, tmp_path, threshold):
    pytest.importorskip("bitsandbytes")
    attack = attacks.build("int8", {} if threshold is None else {"threshold": str(threshold)})
    record = attack.apply(llama, tmp_path, AttackContext(str(llama), "cpu"))
    expected = 0.6 if threshold is None else threshold
    assert record["threshold"] == expected and record["quantization_config"]["llm_int8_threshold"] == expected
    assert record["versions"]["bitsandbytes"]
    assert attack.config_label() == ("8 bits" if threshold is None else "8 bits, threshold 6")

    out = weights(tmp_path / "model")
    names = linear_names(out)
    assert len(names) == 2 * len(PROJECTIONS)
    assert all(out[f"{name}.weight"].dtype == torch.int8 for name in names)
    assert out["lm_head.weight"].is_floating_point()
    model = generates(tmp_path / "model")
    assert type(model.model.layers[0].mlp.down_proj).__name__ == "Linear8bitLt"


@pytest.mark.parametrize(
    ("name", "settings", "needle"),
    [
        ("gptq", {"bits": "3"}, "bits"),
        ("gptq", {"bits": "16"}, "bits"),
        ("gptq", {"group_size": "0"}, "group_size"),
        ("hqq", {"group_size": "20"}, "group_size"),
        ("hqq", {"bits": "5"}, "bits"),
        ("int8", {"threshold": "-1"}, "threshold"),
    ],
)
def test_bad_settings_one_line(name, settings, needle):
    with pytest.raises(HarnessError) as err:
        attacks.build(name, settings)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"bad settings for attack '{name}': {needle}: "), message


def test_labels_and_defaults():
    assert attacks.build("gptq", {}).config_label() == "4 bits"
    assert attacks.build("gptq", {"bits": "8", "group_size": "-1"}).config_label() == "8 bits, no groups"
    assert attacks.build("gptq", {}).params.calib_data == "Salesforce/wikitext"
    assert attacks.build("hqq", {}).config_label() == "4 bits"
    assert attacks.build("hqq", {"bits": "8", "group_size": "32"}).config_label() == "8 bits, group 32"
    assert attacks.build("int8", {}).params.threshold == 0.6


def test_gptq_kernel_limits_copy_matches_the_library():
    """The copy of TorchLinear's limits that spares a dry run gptqmodel's import is what the installed library says
    (a version without a copy is asked directly, so this holds for every version)."""
    from attacks.quant import gptq_kernel_limits

    assert gptq_kernel_limits() == gptq_kernel_limits(ask_library=True)
    with pytest.raises(HarnessError, match="GPTQ group_size 24 is not one gptqmodel packs: use one of -1, 16, 32"):
        attacks.build("gptq", {"group_size": "24"}).validate()
