"""The `small` preset: its corpus comes from installed docstrings, its models are built by the tiny model's code from
their own recipes, and without a GPU it is refused before any work."""

import gzip
import json

import pytest
import torch

from harness.assets import data, small
from harness.config.settings import DataSource
from harness.store import files


def test_docstrings_are_read_from_source_without_importing(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        '"""Module text that is long enough to be kept as a document of the corpus."""\n'
        "raise SystemExit('never imported')\n"
        "class C:\n    '''Short.'''\n    def f(self):\n"
        "        '''A method docstring,\n        wrapped over\n        three lines of source.\n\n"
        "        Second paragraph.'''\n"
    )
    (tmp_path / "pkg" / "broken.py").write_text("def (:\n")  # not Python: skipped
    found = small.docstrings(tmp_path, min_chars=40)
    assert found == [
        "Module text that is long enough to be kept as a document of the corpus.",
        "A method docstring, wrapped over three lines of source.\n\nSecond paragraph.",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the small models can be built")
def test_small_preset_is_refused_without_a_gpu(cli, tmp_path):
    out = cli("run", "--preset", "small", "--method", "gu-kgw", "--results", str(tmp_path / "runs"))
    assert out.returncode == 2 and "no GPU is visible" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("DONE"))


def test_small_models_build_from_their_recipe(tmp_path, monkeypatch):
    """The build path on this CPU, with the recipe shrunk to seconds (the real one needs a GPU): corpus from pydoc
    topics only, split like the tiny corpus, a model that loads and generates, a folder named by the recipe."""
    from harness.assets import models

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    monkeypatch.setitem(small.CORPUS_RECIPE, "packages", [])
    data._bundled_bytes.cache_clear()
    monkeypatch.setattr(small, "check_buildable", lambda ref: None)
    recipe = {"version": 1, "vocab_size": 300,
              "model": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                        "num_key_value_heads": 1, "max_position_embeddings": 64, "tie_word_embeddings": False},
              "train": {"steps": 2, "batch_size": 2, "seq_len": 32, "lr": 1e-3, "seed": 0}}  # fmt: skip
    monkeypatch.setitem(small.RECIPES, "builtin:small-lm", recipe)
    try:
        folder = small.small_lm()
        rows = [json.loads(line) for line in gzip.decompress(small.corpus().read_bytes()).decode().splitlines()]
        train = data.load_texts(DataSource(path=data.SMALL_CORPUS, split="train"))
        heldout = data.load_texts(DataSource(path=data.SMALL_CORPUS, split="heldout"))
        assert len(rows) > 50 and len(train) + len(heldout) == len(rows) and heldout
        assert folder.parent == files.cache_root() and folder.name.startswith("small-lm-")
        assert json.loads((folder / "build.json").read_text())["recipe"] == recipe
        model = models.load_causal_lm(str(folder), "cpu")
        out = model.generate(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
        assert out.shape == (1, 7)
        monkeypatch.setitem(small.RECIPES, "builtin:small-lm", {**recipe, "version": 2})
        assert small.model_folder("builtin:small-lm") != folder  # another recipe, another model
    finally:
        data._bundled_bytes.cache_clear()


@pytest.mark.gpu
def test_small_lm_reaches_its_perplexity_on_a_gpu():
    """SPEC section 6: held-out perplexity about 11 after ~2 minutes on an H100."""
    from harness.assets import models
    from harness.compute.generation import completion_perplexity

    folder = models.resolve("builtin:small-lm")
    tokenizer = models.load_tokenizer(folder)
    model = models.load_causal_lm(folder, "cuda")
    texts = data.load_texts(DataSource(path=data.SMALL_CORPUS, split="heldout"))[:200]
    ids = [tokenizer(t)["input_ids"][:257] for t in texts if len(tokenizer(t)["input_ids"]) > 64]
    ppl = completion_perplexity(model, [i[:1] for i in ids], [i[1:] for i in ids], 32, tokenizer.eos_token_id)
    assert sorted(ppl)[len(ppl) // 2] < 15
