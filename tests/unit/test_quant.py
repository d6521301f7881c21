"""Quantization attacks: the evaluated weights lie on the scheme's grid (GPTQ, HQQ, AWQ), LLM.int8 stores int8
weights, bitsandbytes' 4-bit stores 4-bit codes, every result loads and generates, and bad settings fail in one line
before any model loads."""

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.assets.models import load_causal_lm, load_tokenizer
from harness.config.errors import HarnessError
from harness.config.registry import attacks
from harness.contract.attack import AttackContext

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
def wide_llama(tmp_path_factory, llama_builder):
    """A random Llama whose every layer is a multiple of 32 wide, its inputs of 64 (hidden 64, intermediate 128,
    k/v 32): what 3-bit GPTQ packs, and what bitsandbytes' CPU kernel takes."""
    return llama_builder(tmp_path_factory.mktemp("wide"), 4, hidden_size=64, intermediate_size=128)


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    path.write_text("".join(json.dumps({"text": f"{s} ({i})"}) + "\n" for i, s in enumerate(TEXTS * 17)))
    return path


def generates(folder):
    model, tokenizer = load_causal_lm(str(folder), "cpu"), load_tokenizer(str(folder))
    batch = tokenizer("The quick brown", return_tensors="pt")
    out = model.generate(
        **batch, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=tokenizer.eos_token_id
    )
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


@pytest.mark.parametrize("bits", [8, 4, 3, 2])
def test_gptq_weights_on_grid(llama, wide_llama, calib_file, tmp_path, bits):
    pytest.importorskip("gptqmodel")
    from harness.assets import data

    llama = wide_llama if bits == 3 else llama  # (3 bits packs layers of whole 32-column blocks)

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
        if 2**bits < group:  # (8 bits have more codes than a group has entries)
            distinct = max(len(torch.unique(grouped[r, j])) for r in range(w.shape[0]) for j in range(grouped.shape[1]))
            assert distinct <= 2**bits
        assert not torch.equal(w, source[f"{name}.weight"])
    for key in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert torch.equal(out[key], source[key])  # GPTQ quantizes the decoder's linear layers only
    generates(tmp_path / "model")


@pytest.mark.parametrize("bits", [4, 8, 3, 2])
def test_hqq_weights_on_grid(llama, tmp_path, bits):
    pytest.importorskip("hqq")
    group = 32  # more entries than 4 bits have codes
    attack = attacks.build("hqq", {"group_size": str(group), "bits": str(bits)})
    record = attack.apply(llama, tmp_path, AttackContext(str(llama), "cpu"))
    assert record["bits"] == bits and record["axis"] == 1 and record["versions"]["hqq"]
    assert "dequantized" in record["evaluated"]

    out, packed, source = weights(tmp_path / "model"), weights(tmp_path / "quantized"), weights(llama)
    names = linear_names(out)
    assert len(names) == 2 * len(PROJECTIONS) and record["quantized_layers"] == len(names)
    for name in names:
        w = out[f"{name}.weight"]
        if bits in (8, 4, 2):  # codes packed 1, 2 or 4 per byte (3 bits: ten per 32-bit word)
            assert packed[f"{name}.W_q"].dtype == torch.uint8
            assert packed[f"{name}.W_q"].numel() == w.numel() * bits // 8
        # axis 1: groups of `group` consecutive input columns of each row; one scale and zero per group
        grouped = w.reshape(-1, group)
        scale, zero = packed[f"{name}.scale"].double(), packed[f"{name}.zero"].double()
        assert scale.shape == zero.shape == (grouped.shape[0], 1)
        codes = grouped.double() / scale + zero
        assert torch.allclose(codes, codes.round(), atol=1e-3)
        assert codes.round().min() >= 0 and codes.round().max() <= 2**bits - 1
        assert max(len(torch.unique(row)) for row in grouped) <= min(2**bits, group)
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


@pytest.mark.parametrize(("quant_type", "double_quant"), [("nf4", False), ("fp4", True)])
def test_bnb_4bit_stores_4bit_codes(wide_llama, tmp_path, quant_type, double_quant):
    pytest.importorskip("bitsandbytes")
    from bitsandbytes.functional import dequantize_4bit

    attack = attacks.build("bnb-4bit", {"quant_type": quant_type, "double_quant": str(double_quant).lower()})
    attack.validate(str(wide_llama))
    record = attack.apply(wide_llama, tmp_path, AttackContext(str(wide_llama), "cpu"))
    config = record["quantization_config"]
    assert (config["bnb_4bit_quant_type"], config["bnb_4bit_use_double_quant"]) == (quant_type, double_quant)
    assert config["load_in_4bit"] and record["compute_dtype"] == "float32" and record["versions"]["bitsandbytes"]
    assert record["evaluated"].startswith("the bitsandbytes 4-bit model itself")

    out, source = weights(tmp_path / "model"), weights(wide_llama)
    names = linear_names(out)
    assert len(names) == 2 * len(PROJECTIONS) == record["quantized_layers"]
    for name in names:  # two 4-bit codes a byte
        assert out[f"{name}.weight"].dtype == torch.uint8
        assert out[f"{name}.weight"].numel() * 2 == source[f"{name}.weight"].numel()
    assert torch.equal(out["lm_head.weight"], source["lm_head.weight"])
    model = load_causal_lm(str(tmp_path / "model"), "cpu")  # (before a forward repacks the codes for the CPU)
    layer = model.model.layers[0].mlp.down_proj
    assert type(layer).__name__ == "Linear4bit" and layer.weight.quant_state.quant_type == quant_type
    w = dequantize_4bit(layer.weight.data, layer.weight.quant_state)
    blocks = w.reshape(-1, record["blocksize"])  # each block: one scale times 16 codes
    assert max(len(torch.unique(block)) for block in blocks) <= 16
    assert not torch.equal(w, source["model.layers.0.mlp.down_proj.weight"])
    assert (w - source["model.layers.0.mlp.down_proj.weight"]).abs().max() < source[
        "model.layers.0.mlp.down_proj.weight"
    ].abs().max()
    generates(tmp_path / "model")


def test_awq_weights_on_grid(wide_llama, calib_file, tmp_path):
    pytest.importorskip("llmcompressor")
    group = 32
    settings = {"group_size": str(group), "calib_data": str(calib_file), "calib_name": None, "n_grid": "5"}
    attack = attacks.build("awq", settings | {"calib_samples": "4", "calib_len": "16"})
    attack.validate(str(wide_llama))
    record = attack.apply(wide_llama, tmp_path, AttackContext(str(wide_llama), "cpu"))
    weights_args = record["quantization_config"]["config_groups"]["group_0"]["weights"]
    assert (weights_args["num_bits"], weights_args["group_size"], weights_args["symmetric"]) == (4, group, False)
    assert record["quantization_config"]["format"] == "pack-quantized" and "dequantized" in record["evaluated"]
    assert [m["modifier"] for m in record["recipe"]] == ["AWQModifier", "QuantizationModifier"]
    assert record["versions"]["llmcompressor"]

    out, packed, source = weights(tmp_path / "model"), weights(tmp_path / "quantized"), weights(wide_llama)
    names = linear_names(out)
    assert names == record["quantized_layers"] and len(names) == 2 * len(PROJECTIONS)
    for name in names:
        w = out[f"{name}.weight"]
        assert packed[f"{name}.weight_packed"].dtype == torch.int32  # eight 4-bit codes a word
        grouped = w.view(w.shape[0], -1, group)
        scale = packed[f"{name}.weight_scale"]  # (out_features, groups)
        assert_on_grid(grouped, scale[:, :, None].expand_as(grouped), 4)
        assert max(len(torch.unique(g)) for g in grouped.reshape(-1, group)) <= 16
        assert not torch.equal(w, source[f"{name}.weight"])
    for key in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert torch.equal(out[key], source[key])  # (AWQ rescales only the norms inside the decoder layers)
    generates(tmp_path / "model")


def test_checks_against_the_base_model_shapes(llama, wide_llama, tmp_path, monkeypatch):
    """What a library refuses only once it packs, or once the model first runs, is refused before any work."""
    with pytest.raises(HarnessError, match=r"^GPTQ 3-bit cannot pack model\.layers\.0\.self_attn\.k_proj: its "
                       r"out_features \(16\) is not a multiple of 32$"):  # fmt: skip
        attacks.build("gptq", {"bits": "3"}).validate(str(llama))
    attacks.build("gptq", {"bits": "3", "group_size": "32"}).validate(str(wide_llama))
    attacks.build("gptq", {"bits": "2"}).validate(str(llama))  # (2 bits packs any width)
    with pytest.raises(HarnessError, match=r"^AWQ group_size 48 does not divide the in_features \(64\) of "):
        attacks.build("awq", {"group_size": "48"}).validate(str(wide_llama))
    attacks.build("awq", {"group_size": "64"}).validate(str(wide_llama))

    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as bnb_functional

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bnb_functional, "has_avx512bf16", lambda: True)
    with pytest.raises(HarnessError, match=r"^bnb-4bit on this CPU \(AVX512-BF16\) needs every layer's in_features"):
        attacks.build("bnb-4bit", {}).validate(str(llama))
    attacks.build("bnb-4bit", {}).validate(str(wide_llama))

    def no_cpu_backend(*args, **kwargs):
        raise RuntimeError("no kernel for the cpu\nsecond line")

    monkeypatch.setattr(bnb_functional, "quantize_4bit", no_cpu_backend)
    with pytest.raises(HarnessError) as err:
        attacks.build("bnb-4bit", {}).validate(str(wide_llama))
    assert str(err.value).startswith("bnb-4bit needs a CUDA GPU or a bitsandbytes that quantizes to 4 bits on the CPU")
    assert "\n" not in str(err.value)


def test_awq_refuses_a_model_family_llm_compressor_does_not_map(tmp_path):
    pytest.importorskip("llmcompressor")
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(tmp_path)
    with pytest.raises(HarnessError, match=r"^AWQ: llm-compressor has no AWQ layer mappings for GPT2LMHeadModel"):
        attacks.build("awq", {}).validate(str(tmp_path))


@pytest.mark.parametrize(
    ("name", "settings", "needle"),
    [
        ("gptq", {"bits": "1"}, "bits"),  # (gptqmodel quantizes to 1 bit, but its CPU kernel packs 2 to 8)
        ("gptq", {"bits": "9"}, "bits"),
        ("gptq", {"bits": "16"}, "bits"),
        ("gptq", {"bits": "0"}, "bits"),
        ("gptq", {"bits": "4.5"}, "bits"),
        ("gptq", {"group_size": "0"}, "group_size"),
        ("gptq", {"group_size": "-2"}, "group_size"),
        ("gptq", {"damp": "nan"}, "damp"),
        ("gptq", {"damp": "inf"}, "damp"),
        ("hqq", {"group_size": "20"}, "group_size"),
        ("hqq", {"bits": "5"}, "bits"),
        ("hqq", {"bits": "6"}, "bits"),
        ("hqq", {"bits": "7"}, "bits"),
        ("hqq", {"bits": "16"}, "bits"),
        ("hqq", {"axis": "2"}, "axis"),
        ("int8", {"threshold": "-1"}, "threshold"),
        ("int8", {"threshold": "nan"}, "threshold"),
        ("int8", {"threshold": "inf"}, "threshold"),
        ("bnb-4bit", {"quant_type": "int4"}, "quant_type"),
        ("bnb-4bit", {"quant_type": "nf8"}, "quant_type"),
        ("bnb-4bit", {"quant_type": "NF4 "}, "quant_type"),
        ("bnb-4bit", {"compute_dtype": "int8"}, "compute_dtype"),
        ("bnb-4bit", {"compute_dtype": "float64"}, "compute_dtype"),
        ("bnb-4bit", {"double_quant": "sometimes"}, "double_quant"),
        ("bnb-4bit", {"bits": "8"}, "bits"),  # (4-bit only: LLM.int8 is the int8 attack)
        ("bnb-4bit", {"bits": "4"}, "bits"),
        ("awq", {"bits": "3"}, "bits"),
        ("awq", {"bits": "2"}, "bits"),
        ("awq", {"bits": "16"}, "bits"),
        ("awq", {"group_size": "0"}, "group_size"),
        ("awq", {"group_size": "-8"}, "group_size"),
        ("awq", {"n_grid": "0"}, "n_grid"),
        ("awq", {"duo_scaling": "half"}, "duo_scaling"),
        ("awq", {"calib_samples": "0"}, "calib_samples"),
        ("awq", {"calib_len": "inf"}, "calib_len"),
        ("awq", {"scheme": "W4A16"}, "scheme"),
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
    assert attacks.build("gptq", {"bits": "3"}).config_label() == "3 bits"
    assert attacks.build("bnb-4bit", {}).config_label() == "NF4"
    assert (
        attacks.build("bnb-4bit", {"quant_type": "fp4", "double_quant": "true"}).config_label() == "FP4, double quant"
    )
    assert attacks.build("bnb-4bit", {"compute_dtype": "bfloat16"}).config_label() == "NF4, bfloat16"
    assert attacks.build("awq", {}).config_label() == "4 bits"
    assert attacks.build("awq", {"group_size": "64", "sym": "true"}).config_label() == "4 bits, group 64, sym"


def test_gptq_kernel_limits_copy_matches_the_library():
    """The copy of TorchLinear's limits that spares a dry run gptqmodel's import is what the installed library says
    (a version without a copy is asked directly, so this holds for every version)."""
    from attacks.quant import gptq_kernel_limits

    assert gptq_kernel_limits() == gptq_kernel_limits(ask_library=True)
    with pytest.raises(HarnessError, match="GPTQ group_size 24 is not one gptqmodel packs: use one of -1, 16, 32"):
        attacks.build("gptq", {"group_size": "24"}).validate()
