"""Presets, overrides, the bundled corpus, batching and prompts."""

import re

import pytest

from harness.assets import data
from harness.config.errors import HarnessError
from harness.config.presets import PRESETS, TINY
from harness.config.registry import attacks, methods
from harness.config.settings import DataSource, apply_overrides


def test_overrides_validate_and_nest():
    p = apply_overrides(TINY, {"train.steps": "7", "eval_data.split": "train", "base_model": "./x"})
    assert (p.train.steps, p.eval_data.split, p.base_model) == (7, "train", "./x")
    assert TINY.train.steps != 7  # presets are frozen values
    with pytest.raises(HarnessError, match="bad setting train.lr"):
        apply_overrides(TINY, {"train.lr": "fast"})


def test_presets_hold_valid_plugin_defaults():
    """Every preset's settings for every method and attack validate (a renamed setting would fail here)."""
    for preset in PRESETS.values():
        for kind, registry in (("method", methods), ("attack", attacks)):
            for name, values in getattr(preset, f"{kind}s").items():
                registry.load(name).parse_params(kind, values)


def test_tiny_corpus_splits_are_disjoint_and_stable():
    train = data.load_texts(DataSource(path=data.TINY_CORPUS, split="train"))
    held = data.load_texts(DataSource(path=data.TINY_CORPUS, split="heldout"))
    assert (len(train), len(held)) == (2083, 279)  # the held-out rule on the bundled corpus
    assert all(len(d) >= data.HELDOUT_MIN_CHARS for d in held)  # long enough for prompt + continuation
    assert not set(train) & set(held)
    # The content hash every tiny run records: a changed corpus (or hashing) changes every run's hash.
    assert data.fingerprint(DataSource(path=data.TINY_CORPUS)) == "79c35bf804483f9e"


def test_local_jsonl_source(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n{"text": "three"}\n')
    assert data.load_texts(DataSource(path=str(tmp_path / "d.jsonl")), limit=2) == ["one", "two"]
    with pytest.raises(HarnessError, match="no field 'body'"):
        data.load_texts(DataSource(path=str(tmp_path / "d.jsonl"), text_field="body"))


def test_packed_batches_cover_the_stream():
    stream = list(range(100))
    batches = data.packed_batches(stream, seq_len=10, batch_size=3, seed=0)
    first_epoch = [next(batches) for _ in range(3)]
    assert all(b.shape == (3, 10) for b in first_epoch)
    rows = {tuple(r.tolist()) for b in first_epoch for r in b}
    assert len(rows) == 9 and all(r[0] % 10 == 0 and list(r) == list(range(r[0], r[0] + 10)) for r in rows)
    with pytest.raises(HarnessError, match="too small"):
        next(data.packed_batches(stream, seq_len=50, batch_size=3, seed=0))


def test_eval_prompts_have_exact_lengths(random_llamas):
    from harness.assets.models import load_tokenizer

    tok = load_tokenizer(str(random_llamas[0]))
    texts = ["short", "the quick brown fox jumps over the lazy dog " * 5, "a watermark is a hidden signal " * 6]
    prompts = data.eval_prompts(tok, texts, num=2, prompt_tokens=4, new_tokens=6)
    assert [(len(p["prompt_ids"]), len(p["human_ids"])) for p in prompts] == [(4, 6), (4, 6)]
    with pytest.raises(HarnessError, match="only 2 evaluation documents"):
        data.eval_prompts(tok, texts, num=3, prompt_tokens=4, new_tokens=6)


def test_any_setting_of_a_plugin_and_every_field_can_be_overridden():
    """--set methods.<m>.<k> takes any setting the plugin declares (not only those the preset already sets), refuses
    others naming them, and a pair takes "0.9,0.95" or JSON."""
    p = apply_overrides(TINY, {"methods.pro.delta": "0.5", "methods.gu-kth.s": "2", "train.betas": "0.9,0.95"})
    assert (p.methods["pro"]["delta"], p.methods["gu-kth"]["s"], p.train.betas) == ("0.5", "2", (0.9, 0.95))
    assert methods.build("pro", {}, p).params.delta == 0.5
    assert apply_overrides(TINY, {"train.betas": "[0.8, 0.9]"}).train.betas == (0.8, 0.9)
    for setting, words in [
        ("methods.pro.deltaa", "unknown setting 'methods.pro.deltaa': method 'pro' has embedding_model, delta"),
        ("methods.prox.delta", "unknown method 'prox'. Did you mean 'pro'?"),
        ("attacks.slerp.tt", "attack 'slerp' has t"),
        ("train.betas", "bad setting train.betas: not valid JSON"),
    ]:
        with pytest.raises(HarnessError, match=re.escape(words)):
            apply_overrides(TINY, {setting: "[0.5" if setting == "train.betas" else "1"})
    with pytest.raises(HarnessError, match="bad setting train.betas: JSON nested too deeply to read"):
        apply_overrides(TINY, {"train.betas": "[" * 100_000})
