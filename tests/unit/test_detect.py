"""``harness detect`` on a key trained for one step on a random Llama: the pooled tests hold their false-positive rate
under their null, texts and models are audited through the store, and every bad input is one line and exit 2 with
nothing built."""

from __future__ import annotations

import json
import random
import re
import shutil

import numpy as np
import pytest
import torch

from harness.audit import verdict as audit
from harness.config.presets import TINY
from harness.store.stages import spec_hash
from methods.kgw import GreenLists, KGWKey, pooled_score


# --- the pooled tests -----------------------------------------------------------------------------------------------
def test_pooled_kgw_counts_each_distinct_ngram_of_all_texts_once():
    greens = GreenLists(KGWKey(0.25, 2.0, "simple_1", 300))
    texts = [[5, 6, 7, 5, 6], [5, 6, 9], [1, 2]]  # (5, 6) three times, (6, 7) (7, 5) (6, 9) (1, 2) once
    grams = [(5, 6), (6, 7), (7, 5), (6, 9), (1, 2)]
    flat = torch.tensor(grams)
    green = int(greens.hits(flat[:, :1], flat[:, 1]).sum())
    pooled = pooled_score(greens, texts)
    assert (pooled.num_scored, pooled.num_green) == (5, green)
    assert pooled_score(greens, [[3]]).p_value == 1.0  # nothing to score: no evidence


def test_pooled_kgw_p_values_hold_their_level_on_unwatermarked_text():
    """Texts of a source that ignores the key (uniform ids, with phrases repeated inside and across texts, which
    per-token pooling would count again): P(p < 0.05) stays at 5%."""
    greens = GreenLists(KGWKey(0.25, 2.0, "simple_1", 500))
    rng = random.Random(0)
    pvals = []
    for _ in range(400):
        phrase = [rng.randrange(500) for _ in range(6)]
        texts = [[rng.randrange(500) for _ in range(40)] + phrase * 3 for _ in range(8)]
        pvals.append(pooled_score(greens, texts).p_value)
    rate = np.mean(np.array(pvals) < 0.05)
    assert rate < 0.05 + 3 * (0.05 * 0.95 / 400) ** 0.5, rate  # the exact binomial is conservative, never above


def zipf_texts(rng: np.random.Generator, vocab: int, count: int, length: int) -> list[list[int]]:
    """Texts of a source that ignores the key but writes like people: Zipf-distributed ids (a few very frequent),
    repeated in many contexts, and a phrase repeated inside and across texts."""
    weights = 1.0 / np.arange(1, vocab + 1)
    ids = rng.permutation(vocab)
    phrase = list(rng.choice(ids, 5, p=weights / weights.sum()))
    return [list(rng.choice(ids, length, p=weights / weights.sum())) + phrase for _ in range(count)]


@pytest.mark.parametrize("scheme", ["simple_0", "simple_1", "simple_2"])
def test_pooled_kgw_holds_its_stated_rate_over_many_keys_on_unwatermarked_text(scheme):
    """``harness detect``'s KGW decision at 1% over many keys (each its own green lists) on texts that ignore the key:
    the share flagged lies within the binomial interval of 1% (99.9%, upper end; the test is conservative). With one
    fixed list (k = 0) counting distinct bigrams flagged such text at p ~ 1e-11 for keys whose list holds a frequent
    token."""
    from scipy.stats import binom

    rng = np.random.default_rng({"simple_0": 0, "simple_1": 1, "simple_2": 2}[scheme])
    keys = 150 if scheme == "simple_2" else 400  # (simple_2 draws a green list per pair sum: slower)
    flagged = 0
    for _ in range(keys):
        key = KGWKey(0.25, 2.0, scheme, 400, hash_key=int(rng.integers(1, 2**31)))
        flagged += pooled_score(GreenLists(key), zipf_texts(rng, 400, 8, 48)).p_value <= 0.01
    assert flagged <= binom.ppf(0.999, keys, 0.01), flagged


def test_pooled_kgw_counts_one_unit_per_seed_and_token():
    """simple_0: a token is green or not whatever precedes it, so it counts once; simple_2 hashes the sum of the two
    previous ids, so (a, b, t) and (b, a, t) are one unit."""
    fixed = GreenLists(KGWKey(0.25, 2.0, "simple_0", 300))
    assert pooled_score(fixed, [[1, 5, 2, 5, 3, 5], [4, 5]]).num_scored == 3  # 5, 2, 3 (1 and 4 are context only)
    additive = GreenLists(KGWKey(0.25, 2.0, "simple_2", 300))
    assert pooled_score(additive, [[1, 2, 9], [2, 1, 9], [4, 0, 9]]).num_scored == 2  # seeds of sums 3, 3, 4
    excluded = GreenLists(KGWKey(0.25, 2.0, "simple_1", 300, excluded_ids=(0,)))
    assert pooled_score(excluded, [[0, 5, 6, 0]]).num_scored == 1  # (0, 5): no list; (6, 0): excluded target


def test_against_base_is_evidence_with_the_auc_and_the_writes_like_base_p_value():
    rng = np.random.default_rng(0)
    null = [audit.against_base(list(rng.normal(size=30)), list(rng.normal(size=30))) for _ in range(300)]
    assert abs(np.mean([n["writes_like_base_p"] < 0.05 for n in null]) - 0.05) < 3 * (0.05 * 0.95 / 300) ** 0.5
    shifted = audit.against_base(list(rng.normal(1.5, size=30)), list(rng.normal(size=30)))
    assert shifted["writes_like_base_p"] < 1e-4 and shifted["auc"] > 0.8 and shifted["base_texts"] == 30


def test_kth_pool_holds_its_stated_rate_on_texts_unlike_human_ones():
    """KTH's pooled permutation test at 5% over 120 keys (the texts do not depend on them) on unwatermarked texts a
    little longer than the human texts of the key's reference (an unwatermarked model's 64 sampled tokens, decoded and
    tokenized again, came to 64.3 on average against 64.0): the share flagged lies within the binomial interval of
    5%. The rank test against the reference statistics that it replaced flags them far more often: a longer text sums
    more costs, so its statistic lies lower, as a watermarked one's does."""
    from scipy.stats import binom, mannwhitneyu

    from methods.gu_kth import KTHDetector
    from methods.kth import KTHKey, statistics

    rng = np.random.default_rng(5)
    texts = [list(rng.integers(0, 64, size=13)) for _ in range(15)]  # one token longer than the reference texts
    human = [list(rng.integers(0, 64, size=12)) for _ in range(60)]
    flagged = against_human = 0
    keys = 120
    for seed in range(keys):
        key = KTHKey(vocab_size=64, key_len=16, seed=1000 + seed)
        detector = KTHDetector(key, "levenshtein", 0.0, statistics(key, human))
        stats = statistics(key, texts)
        pooled = detector.pool(texts, [{"statistic": x} for x in stats], null_keys=39)
        flagged += pooled["p_value"] <= 0.05
        against_human += mannwhitneyu(stats, detector.reference, alternative="less").pvalue <= 0.05
        assert "permutation test" in pooled["test"] and pooled["p_value"] >= 1 / 40
    low, high = binom.interval(0.99, keys, 0.05)
    assert low <= flagged <= high, flagged
    assert against_human > high, against_human  # the test it replaced: these texts are not the reference's source


def test_kth_pool_finds_the_keys_own_texts():
    """Texts written with the key (each token the argmax of the key's row at its position, KTH's decoding with a
    uniform model) lie below every key drawn afresh: p is the smallest the test gives."""
    from methods.gu_kth import KTHDetector
    from methods.kth import KTHKey, key_uniforms, statistics

    key = KTHKey(vocab_size=64, key_len=16, seed=9)
    xi = key_uniforms(key).numpy()
    texts = [[int(xi[(start + t) % 16].argmax()) for t in range(10)] for start in range(0, 16, 3)]
    pooled = KTHDetector(key, "levenshtein", 0.0, [0.0]).pool(texts, [{"statistic": x} for x in statistics(key, texts)],
                                                             null_keys=19)  # fmt: skip
    assert pooled["p_value"] == pytest.approx(1 / 20) and pooled["statistic"] > 3


# --- the command ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(tmp_path_factory, random_llamas):
    """A store with Gu-KGW trained for one step on the random base (``random_llamas[1]``); returns (store, stage)."""
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import methods
    from harness.store.stages import Store

    preset = _setup(random_llamas[1])
    store = Store(tmp_path_factory.mktemp("detect") / "runs")
    stage = Pipeline(preset, store, "cpu").train(methods.build("gu-kgw", {}, preset))
    return store, stage


def _setup(base):
    """The tiny preset on the random ``base``, trained one step and evaluated on 6 short prompts (``SETUP``)."""
    return TINY.model_copy(
        update={
            "base_model": str(base),
            "oracle_model": str(base),
            "train": TINY.train.model_copy(update={"steps": 1, "batch_size": 2, "seq_len": 32}),
            "eval": TINY.eval.model_copy(update={"num_prompts": 6, "prompt_tokens": 8, "new_tokens": 16}),
        }
    )


SETUP = ("--set", "eval.num_prompts=6", "--set", "eval.prompt_tokens=8", "--set", "eval.new_tokens=16")


def test_texts_are_scored_one_by_one_and_pooled(keyed, cli, tmp_path):
    store, stage = keyed
    texts = ["The quick brown fox jumps over the lazy dog.", "A watermark is a hidden signal in generated text."]
    file = tmp_path / "texts.jsonl"
    file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = cli("detect", "--results", str(store.root), "--key", stage.key[:6], "--texts", str(file), "--json", *SETUP)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [t["text"] for t in report["texts"]] == texts
    from harness.assets.models import load_tokenizer
    from harness.config.registry import methods

    tokenizer = load_tokenizer(str(stage.path / "model"))
    direct = (
        methods.build("gu-kgw", {})
        .detector(stage.path, tokenizer)
        .score(tokenizer(texts, add_special_tokens=False)["input_ids"])
    )
    assert [t["score"] for t in report["texts"]] == pytest.approx([s["score"] for s in direct], abs=1e-9)
    d = report["decision"]
    assert 0 <= d["p_value"] <= 1 and d["texts"] == 2 and d["human_texts"] == 6 and "binomial" in d["test"]
    assert d["watermarked"] == (d["p_value"] < 0.01) and report["key"]["train_stage"] == stage.key
    assert "15485863" in report["key"]["published"]  # the preset's key is lm-watermarking's
    # The same audit again is read from its stage; a .txt file holds one text per line.
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n\n")
    again = cli(
        "detect", "--results", str(store.root), "--key", stage.key, "--texts", str(tmp_path / "texts.txt"), *SETUP
    )
    assert again.returncode == 0 and "decision:" in again.stdout and "2 texts" in again.stdout, again
    lines = again.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("decision:"))
    assert lines[at + 1].startswith("the key is a published one (lm-watermarking's default hash key 15485863")


def test_json_output_is_json_alone_when_a_library_prints(keyed, cli, tmp_path, monkeypatch):
    """gptqmodel prints a banner to standard output when it loads a packed model: --json output stays parseable."""
    from harness.audit import verdict as audit

    store, stage = keyed
    file = tmp_path / "texts.txt"
    file.write_text("The quick brown fox jumps over the lazy dog.\n")
    real = audit.audit

    def chatty(*args, **kwargs):
        print("GPT-QModel banner")
        return real(*args, **kwargs)

    monkeypatch.setattr(audit, "audit", chatty)
    out = cli("detect", "--results", str(store.root), "--key", stage.key, "--texts", str(file), "--json", *SETUP)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["decision"]["texts"] == 1 and "GPT-QModel banner" in out.stderr


def test_a_model_continues_the_prompts_and_is_decided(keyed, cli, random_llamas):
    store, stage = keyed
    args = ("detect", "--results", str(store.root), "--key", str(stage.path), "--model", str(random_llamas[0]), *SETUP)
    before = _stages(store)
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert "6 texts" in out.stdout and "decision:" in out.stdout
    # Its texts beside the base model's continuations of the same prompts, under the preset's judge and gate.
    assert re.search(r"its texts: median PPL [\d.]+, [\d.]+x the base model's, under .*: (ok|degenerate|unknown)",
                     out.stdout), out.stdout  # fmt: skip
    made = _stages(store) - before
    assert sorted(p.parts[1] for p in made) == ["detect", "generate", "generate"], made  # (the suspect's, the base's)
    assert cli(*args).returncode == 0 and _stages(store) == before | made  # reused, nothing new


def _stages(store) -> set:
    return {p.relative_to(store.root) for p in (store.root / "stages").glob("*/*")}


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A random BERT encoder: a model that is not a causal LM."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("bert")
    BertModel(BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(folder)  # fmt: skip
    return folder


BAD_TEXTS = {
    "empty.txt": (b"", "holds no text"),
    "blank.txt": (b"  \n\n \n", "holds no text"),
    "bytes.txt": (b"\xff\xfe\x00bad", "cannot read texts file"),
    "rows.jsonl": (b'{"text": "fine"}\n{"text": \n', "line 2: not JSON"),
    "field.jsonl": (b'{"body": "no text field"}\n', "line 1: no 'text' field"),
    "number.jsonl": (b'{"text": 3}\n', "no 'text' field holding a string"),
    "table.csv": (b"text\nhello\n", "must be .txt"),
    "nul.txt": (b"fine text\nbad \x00 text\n", "line 2: a NUL byte"),
    "empty.jsonl": (b"", "holds no text"),
    "array.jsonl": (b'{"text": "fine"}\n["a", "list"]\n', "line 2: no 'text' field"),
    "null.jsonl": (b"null\n", "line 1: no 'text' field"),
    # JSON's escapes reach what UTF-8 cannot hold (a lone surrogate breaks the first write of the text), and its
    # nesting Python's recursive parser (RecursionError).
    "surrogate.jsonl": (b'{"text": "fine"}\n{"text": "a \\ud800 b"}\n', "line 2: a lone surrogate (\\ud800)"),
    "deep.jsonl": (b'{"text": "fine", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 1: nested too deeply"),
    # The key's base model takes 128 tokens: a longer text is refused, naming its line; one too long to fit in any
    # tokenization is refused before tokenizing (a 47 MB line took 58 s and 6.7 GB to score).
    "long.jsonl": (b'{"text": "fine"}\n' + json.dumps({"text": "fox " * 300}).encode(), "line 2: a text of 302 tokens"),
    "wide.txt": (b"fine\n" + b"word " * 400_000, "line 2: a text of 2,000,000 characters, more than the 128 tokens"),
    "huge.txt": (b"fine text\n" * (1 << 21), "is larger than 16 MiB"),
    "many.txt": (b"a\n" * 100_001, "holds 100,001 texts, more than 100,000"),
}


@pytest.mark.parametrize("name", sorted(BAD_TEXTS) + ["folder.txt", "fifo.txt"])
def test_bad_texts_file_is_one_line(name, keyed, cli, tmp_path):
    import os

    store, stage = keyed
    if name == "folder.txt":
        (tmp_path / name).mkdir()
        content, message = b"", "is not a regular file"
    elif name == "fifo.txt":  # (reading it would wait for a writer for ever)
        os.mkfifo(tmp_path / name)
        content, message = b"", "is not a regular file"
    else:
        content, message = BAD_TEXTS[name]
        (tmp_path / name).write_bytes(content)
    before = _stages(store)
    out = cli("detect", "--results", str(store.root), "--key", stage.key, "--texts", str(tmp_path / name))
    assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out
    assert _stages(store) == before


def test_texts_are_split_at_newlines_alone_and_shown_escaped(keyed, cli, tmp_path):
    """JSON Lines are split at '\\n' (str.splitlines() also splits at U+2028, U+0085, form feeds...: a valid record
    holding one was "not JSON"), a .txt's CRLF ends a line; a text's ESC, CR and other controls are shown escaped,
    never sent raw to the terminal."""
    store, stage = keyed
    texts = ["one \u2028 record \x85 \x0c still one", "red \x1b[31m text \r over \u202e written \x07"]
    file = tmp_path / "texts.jsonl"
    file.write_text("".join(json.dumps(t and {"text": t}, ensure_ascii=False) + "\n" for t in texts))
    out = cli("detect", "--results", str(store.root), "--key", stage.key, "--texts", str(file), *SETUP)
    assert out.returncode == 0, out.stderr
    assert "2 texts" in out.stdout and "\\x1b[31m text \\x0d over \\u202e written \\x07" in out.stdout
    assert not any(c in out.stdout + out.stderr for c in "\x1b\r\x07\x85\u2028\u202e"), out.stdout
    report = json.loads(cli("detect", "--results", str(store.root), "--key", stage.key, "--texts", str(file), "--json",
                            *SETUP).stdout)  # fmt: skip
    assert [t["text"] for t in report["texts"]] == texts  # the texts themselves are kept as they are
    crlf = tmp_path / "texts.txt"
    crlf.write_bytes(b"one text\r\ntwo text\r\n")
    report = json.loads(cli("detect", "--results", str(store.root), "--key", stage.key, "--texts", str(crlf), "--json",
                            *SETUP).stdout)  # fmt: skip
    assert [t["text"] for t in report["texts"]] == ["one text", "two text"]


def test_bad_inputs_are_one_line_and_build_nothing(keyed, cli, tmp_path, encoder, other_tokenizer_llama, random_llamas):
    from safetensors.torch import load_file, save_file

    store, stage = keyed
    root, key, model = str(store.root), stage.key, str(random_llamas[0])
    table = next((store.root / "stages" / "kgw-green-table").iterdir())
    (tmp_path / "not-a-model").mkdir()
    texts, gguf = tmp_path / "texts.txt", tmp_path / "suspect.gguf"
    texts.write_text("A watermark is a hidden signal.\n")
    gguf.write_bytes(b"not a GGUF")
    short, cut = tmp_path / "short", tmp_path / "cut"
    shutil.copytree(random_llamas[0], short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    shutil.copytree(random_llamas[0], cut)
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:-64])
    holed = tmp_path / "holed"  # a suspect without one of its weights: transformers would initialize it afresh
    shutil.copytree(random_llamas[0], holed)
    tensors = load_file(holed / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, holed / "model.safetensors", metadata={"format": "pt"})
    nested = tmp_path / "nested"
    shutil.copytree(random_llamas[0], nested)
    (nested / "config.json").write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    cases = {
        ("--key", "0123abcd", "--model", model): "no stage '0123abcd'",
        ("--key", "zz!", "--model", model): "neither a folder nor a stage hash",
        ("--key", str(table), "--model", model): "not a trained watermark: a kgw-green-table stage",
        ("--key", str(tmp_path), "--model", model): "not a trained watermark",
        ("--key", key, "--model", str(encoder)): "is not a causal language model (BertModel)",
        ("--key", key, "--model", str(other_tokenizer_llama)): "the key's vocabulary does not fit the tokenizer",
        ("--key", key, "--model", str(tmp_path / "missing")): "does not exist",
        ("--key", key, "--model", str(tmp_path / "not-a-model")): "not a model folder",
        ("--key", key, "--model", model, "--alpha", "0"): "--alpha must lie between 0 and 1",
        ("--key", key, "--model", model, "--alpha", "1.5"): "--alpha must lie between 0 and 1",
        ("--key", key, "--model", model, "--num-texts", "1"): "--num-texts must be at least 2",
        ("--model", model): "name the trained watermark by --key",
        ("--key", key, "--method", "gu-kgw", "--model", model): "name the trained watermark by --key",
        ("--key", key, "--method-arg", "k=2", "--model", model): "--method-arg goes with --method",
        ("--method", "gu-kgw", "--set", f"base_model={random_llamas[1]}", "--model", model): "no trained gu-kgw",
        ("--key", key, "--model", model, "--preset", "nope"): "unknown preset 'nope'",
        # What 'harness run' refuses, detect refuses too (the key's base model takes 128 tokens).
        ("--key", key, "--model", model, "--set", "eval.new_tokens=1000"): "(1033 tokens) is longer than the base",
        ("--key", key, "--texts", str(texts), "--set", "eval.new_tokens=1000"): "is longer than the base model takes",
        # How a model is asked or samples means nothing for texts already written.
        ("--key", key, "--texts", str(texts), "--decode", "temperature=0.7"): "--decode says how a model is asked",
        ("--key", key, "--texts", str(texts), "--prompts", "chat"): "--prompts says how a model is asked",
        ("--key", key, "--texts", str(texts), "--system-prompt", "Be brief."): "--system-prompt says how a model",
        ("--key", key, "--model", str(short)): f"is longer than the suspect model '{short}' takes (64",
        ("--key", key, "--model", model, "--show", "-100000"): "argument --show: expected a whole number",
        ("--key", key, "--model", model, "--num-texts", "99999999999999999999"): "--num-texts must be at most 1,0",
        ("--key", key, "--model", str(gguf)): "is not a readable GGUF file (GGUF magic invalid)",
        ("--key", key, "--model", str(cut)): "model.safetensors' does not read as safetensors",
        ("--key", key, "--model", str(holed)): "its weights lack model.norm.weight",
        ("--key", key, "--model", str(nested)): "config.json': nested too deeply to read",
    }
    before = _stages(store)
    for args, message in cases.items():
        out = cli("detect", "--results", root, *args)
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, (args, out)
    assert _stages(store) == before
    out = cli("detect", "--results", str(tmp_path / "nowhere"), "--key", key, "--model", model)
    assert out.returncode == 2 and "no run store" in out.stderr
    out = cli("detect", "--results", root, "--key", key)  # argparse: --model or --texts is required
    assert out.returncode == 2 and "one of the arguments --model --texts is required" in out.stderr


def test_what_needs_no_model_is_refused_before_any_is_built(keyed, cli, tmp_path, monkeypatch, random_llamas):
    """A suspect built-in model whose recipe's vocabulary is not the key's, a method and settings no stored training
    has, a suspect path that does not exist: each one line, before the tiny LM (or the key's base) is built and before
    the key's weights are hashed (an empty cache stays empty)."""
    store, stage = keyed
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("HARNESS_CACHE", str(cache))
    root, key, model = str(store.root), stage.key, str(random_llamas[0])
    cases = {
        ("--key", key, "--model", "builtin:tiny-lm"): "the key's vocabulary does not fit the tokenizer of 'builtin:t",
        ("--method", "gu-kgw", "--model", model): "no trained gu-kgw with these settings",
        ("--method", "gaussmark", "--model", model): "no trained gaussmark with these settings",
        ("--key", key, "--model", str(tmp_path / "missing")): "does not exist",
    }
    for args, message in cases.items():
        out = cli("detect", "--results", root, *args)
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, (args, out)
    assert not any(cache.iterdir())


def _republish(stage_path, edit) -> None:
    """``edit(stage_path)``, then contents.json written anew as a store from elsewhere may hold it (not signed)."""
    from harness.store.stages import CONTENTS, contents

    edit(stage_path)
    (stage_path / CONTENTS).write_text(json.dumps(contents(stage_path)))


def _detector_key(**values):
    """An edit of a Gu-KGW key.json: its detector's KGW key given ``values``."""

    def edit(stage_path) -> None:
        key = json.loads((stage_path / "key.json").read_text())
        key["detector"].update(values)
        (stage_path / "key.json").write_text(json.dumps(key))

    return edit


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda p: (p / "contents.json").write_text(json.dumps({"key.json": None})), "its entry for key.json is null"),
        (lambda p: (p / "contents.json").write_text('{"key.json": {"size": "1"}}'), "contents.json is damaged"),
        (lambda p: _republish(p, lambda q: (q / "spec.json").write_text("[]")), "not a train stage's (method)"),
        (lambda p: _republish(p, lambda q: (q / "spec.json").write_text('{"method": "gu-kgw"}')), "(params)"),
        (lambda p: _republish(p, _detector_key(gamma=float("nan"))), "makes no Gu-KGW detector: ValueError: gamma"),
        (lambda p: _republish(p, _detector_key(hash_key="x")), "makes no Gu-KGW detector: TypeError"),
    ],
)
def test_a_key_whose_record_is_malformed_is_one_line(keyed, cli, tmp_path, random_llamas, edit, words):
    """A contents.json entry that is null (or not a size and a hash), a spec.json that is not a train stage's (in the
    folder its spec hashes to): each a traceback once (TypeError, KeyError), one line now."""
    store, stage = keyed
    copy = tmp_path / "stages" / "train" / stage.key
    shutil.copytree(stage.path, copy)
    edit(copy)
    edited = json.loads((copy / "spec.json").read_text())
    if spec_hash(edited) != stage.key:  # (a stage is the folder its spec hashes to: else refused as renamed)
        copy = copy.rename(copy.with_name(spec_hash(edited)))
    out = cli("detect", "--results", str(tmp_path), "--key", str(copy), "--model", str(random_llamas[0]))
    assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, out


def test_the_setup_of_a_key_skips_a_run_whose_spec_does_not_read(keyed, tmp_path):
    store, stage = keyed
    shutil.copytree(store.root, tmp_path / "runs")
    bad = {"a": "{", "b": json.dumps({"detector": {"key_from": stage.key}, "config": 3})}  # cut short; no preset
    for name, spec in bad.items():
        (tmp_path / "runs" / name).mkdir()
        (tmp_path / "runs" / name / "spec.json").write_text(spec)
        (tmp_path / "runs" / name / "DONE").write_text("")
    from harness.store.stages import Store

    copied = audit.train_stage(Store(tmp_path / "runs"), stage.key)
    assert audit.setup_of(copied, None).eval.num_prompts == TINY.eval.num_prompts  # (no run of its own: the tiny setup)


def test_a_damaged_key_is_refused(keyed, cli, tmp_path, random_llamas):
    store, stage = keyed
    copy = tmp_path / "stages" / "train" / stage.key
    shutil.copytree(stage.path, copy)
    (copy / "key.json").unlink()
    out = cli("detect", "--results", str(tmp_path), "--key", str(copy), "--model", str(random_llamas[0]))
    assert out.returncode == 2 and "not a trained watermark" in out.stderr
    (copy / "key.json").write_text((stage.path / "key.json").read_text())
    weights = next((copy / "model").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    out = cli("detect", "--results", str(tmp_path), "--key", str(copy), "--model", str(random_llamas[0]))
    assert out.returncode == 2 and "is damaged" in out.stderr, out


def test_the_audit_table_shows_as_many_texts_as_asked():
    from harness.cli.commands import format_audit

    report = {
        "key": {"method": "gu-kgw", "config": "k=1", "train_stage": "ab12", "base_model": "builtin:tiny-lm"},
        "source": {"kind": "texts", "ref": "t.jsonl"},
        "scores": "store/scores.jsonl",
        "decision": {"watermarked": False, "p_value": 0.5, "alpha": 0.01, "texts": 2, "tokens": 9, "test": "a test",
                     "statistic": 0.0, "human_median_score": 0.1, "human_texts": 2},
    }  # fmt: skip
    rows = [{"i": i, "tokens": 4, "score": 0.25, "p_value": 0.5, "text": f"text number {i}"} for i in range(2)]
    none = format_audit(report, rows, 0)
    assert "DataFrame" not in none and "text number" not in none and "... 2 more texts in store/scores.jsonl" in none
    one = format_audit(report, rows, 1)
    assert "text number 0" in one and "text number 1" not in one and "... 1 more texts" in one
    both = format_audit(report, rows, 5)
    assert "text number 1" in both and "more texts" not in both
    assert "published" not in both  # a key of the owner's own (no "published" in the report: one of before)
    report["key"]["published"] = "the default key seed 42"
    lines = format_audit(report, rows, 0).splitlines()
    assert lines[-2].startswith("decision:") and lines[-1].startswith("the key is a published one (the default key")
    assert "no evidence against anyone who could know the key" in lines[-1]


def test_a_scheme_with_no_null_of_its_own_gets_no_p_value_and_no_verdict(keyed, cli, random_llamas):
    """PRO's key (a policy trained one step here) audits a model: its texts are scored and compared with the base's
    own continuations, as evidence, but no p-value or verdict is given, per text or pooled: the comparison's null is
    "writes like the base", which unwatermarked fine-tunes of the base reject as well
    (harness.audit.verdict.NO_NULL)."""
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import methods

    store, _ = keyed
    setup = _setup(random_llamas[1])
    stage = Pipeline(setup, store, "cpu").train(methods.build("pro", {"fpl": False}, setup))
    args = ("detect", "--results", str(store.root), "--key", str(stage.path), "--model", str(random_llamas[0]), *SETUP)
    out = cli(*args, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    d = report["decision"]
    assert d["p_value"] is None and d["watermarked"] is None and "no p-value and no verdict" in d["test"], d
    assert 0 <= d["against_base"]["auc"] <= 1 and d["against_base"]["base_texts"] == 6 == d["texts"], d
    assert all("p_value" not in t for t in report["texts"]), report["texts"][:1]
    shown = cli(*args)
    assert shown.returncode == 0 and "decision: none: PRO has no null distribution" in shown.stdout, shown.stdout
    assert "WATERMARKED" not in shown.stdout and "probability at most" not in shown.stdout


@pytest.mark.parametrize(
    "decode", [["--decode", "temperature=1"], ["--decode", "top_p=0.9"], ["--prompts", "documents"]]
)
def test_how_a_suspect_is_sampled_keeps_the_keys_own_setup(decode, tmp_path, random_llamas, cli):
    """--decode and --prompts alone say how the suspect is used, not which setup judges it: the key's stored run's
    (here 6 prompts of 8 tokens), not the whole tiny preset's 200 prompts, as --preset or --set would choose."""
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import attacks, methods
    from harness.store.stages import Store

    preset = _setup(random_llamas[1])
    store = Store(tmp_path / "runs")
    method = methods.build("gu-kgw", {}, preset)
    Pipeline(preset, store, "cpu").run(method, attacks.build("none", {}))
    key = Pipeline(preset, store, "cpu", plan=True).train(method).key
    out = cli("detect", "--results", str(store.root), "--key", key, "--model", str(random_llamas[0]), "--json", *decode)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["decision"]["texts"] == preset.eval.num_prompts == 6
    assert report["source"].get("decoding") == ("top_p=0.9" if "top_p=0.9" in decode else None)
