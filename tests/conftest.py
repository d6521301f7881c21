"""Shared fixtures: small random models built once per test session (no downloads)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


def pytest_configure(config):
    """Under pytest-xdist each worker (and every process it starts, which inherits ``OMP_NUM_THREADS``) gets its share
    of torch's threads: the cores over the workers. Two torch processes that each take every core slow each other
    several-fold, as OpenMP's threads spin while they wait for a thread the other process holds off its core. Beside a
    2-thread matmul loop on 2 cores a unit test of 360 small MiniLM passes took 6-17 s against 2-3 s alone, and 3.3 s
    with a thread each; in CI, with the second worker niced instead, it took 177 s and 338 s in two runs. The default
    suite on a fresh clone, back to back on 2 cores: 719 s niced, 624 s with a thread each. Thread counts change float
    results (``harness/store/versions.py``), and every process of a session runs at the same count."""
    if getattr(config, "workerinput", None) is None:
        return
    import torch

    threads = max(1, torch.get_num_threads() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def console_script(name: str) -> str:
    """Path of an installed console script (harness, torchrun, accelerate): beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    command = str(beside) if beside.exists() else shutil.which(name)
    if not command:
        pytest.fail(f"the '{name}' console script is not installed (pip install '.[dev]')")
    return command


@pytest.fixture(scope="session")
def script():
    """``console_script``, for tests that launch torchrun or accelerate."""
    return console_script


@pytest.fixture(scope="session")
def harness():
    """Run the installed console script (next to this interpreter, else on PATH) and capture its output."""
    command = console_script("harness")

    def run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
        return subprocess.run([command, *args], capture_output=True, text=True, timeout=timeout)

    return run


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    """``cli(*args)``: ``harness.cli.main`` run in this process as the console script runs it, returning its exit code
    and what it printed (argparse's exits included), in a fresh working directory (the default store is relative),
    with the variables ``main`` sets restored afterwards. Checks the same as a subprocess, without starting Python."""
    from harness.cli.main import main

    monkeypatch.chdir(tmp_path)
    for variable in ("HARNESS_DEVICE", "HARNESS_ALLOW_PICKLE", "TOKENIZERS_PARALLELISM"):
        was_set = variable in os.environ
        # Set first so that monkeypatch records it (it records nothing when deleting a variable that is not set).
        monkeypatch.setenv(variable, os.environ.get(variable, ""))
        if not was_set:
            monkeypatch.delenv(variable)

    def run(*args: str) -> Outcome:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exit:  # argparse: --help, usage errors
            code = exit.code
        out = capsys.readouterr()
        return Outcome(code, out.out, out.err)

    return run


SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Return the number of items in the list, or raise an error if it is empty.",
    "A watermark is a hidden signal in generated text that a detector can find.",
] * 20


def _eos_everywhere(tokenizer) -> dict:
    """The random models' special ids: the tokenizer's EOS as EOS, BOS and padding."""
    return {f"{name}_token_id": tokenizer.eos_token_id for name in ("eos", "bos", "pad")}


def make_random_llama(folder, seed: int, tokenizer=None, **config):
    """A 2-layer random Llama (and its tokenizer) saved to ``folder``; ``config`` overrides its LlamaConfig (e.g.
    ``hidden_size=40``); returns the folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.assets.tiny import build_tokenizer

    tokenizer = tokenizer or build_tokenizer(SENTENCES)
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **_eos_everywhere(tokenizer),
    )
    LlamaForCausalLM(LlamaConfig(**{**settings, **config})).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def make_random_gemma(folder, seed: int, tokenizer=None):
    """A 2-layer random Gemma 3 (tied embeddings, one sliding-window layer and one global, per-layer-type RoPE, a
    soft-capped output: what a Llama never exercises) and its tokenizer saved to ``folder``; returns the folder."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from harness.assets.tiny import build_tokenizer

    tokenizer = tokenizer or build_tokenizer(SENTENCES)
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,  # (a multiple of 64 and 128: the quantizers' groups)
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=30.0,
        max_position_embeddings=256,
        **_eos_everywhere(tokenizer),
    )
    Gemma3ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def llama_builder():
    """``make_random_llama(folder, seed, tokenizer=None, **config)``, for tests that need other dimensions."""
    return make_random_llama


@pytest.fixture(scope="session")
def gemma_builder():
    """``make_random_gemma(folder, seed, tokenizer=None)``: a random Gemma 3, for tests of another family."""
    return make_random_gemma


@pytest.fixture(scope="session")
def random_llamas(tmp_path_factory):
    """Two random Llamas with one tokenizer: (watermarked stand-in, base stand-in)."""
    from harness.assets.tiny import build_tokenizer

    tokenizer = build_tokenizer(SENTENCES)
    root = tmp_path_factory.mktemp("llamas")
    return make_random_llama(root / "a", 1, tokenizer), make_random_llama(root / "b", 2, tokenizer)


@pytest.fixture(scope="session")
def other_tokenizer_llama(tmp_path_factory):
    """A random Llama whose tokenizer differs from ``random_llamas``' (an oracle that must re-tokenize)."""
    from harness.assets.tiny import build_tokenizer

    tokenizer = build_tokenizer([s.upper() + " Lorem ipsum dolor sit amet." for s in SENTENCES])
    return make_random_llama(tmp_path_factory.mktemp("oracle"), 3, tokenizer)


PARAPHRASER_TEXTS = ["The cat sat on the mat.", "It was warm there!", "Why did it leave?", "Nobody knows.", "The end."]


@pytest.fixture(scope="session")
def random_t5(tmp_path_factory):
    """A tiny random T5 with a tokenizer of the tiny paraphraser's kind, saved as a model folder: a paraphraser."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from harness.assets.tiny_paraphraser import build_tokenizer

    folder = tmp_path_factory.mktemp("t5")
    tokenizer = build_tokenizer([" ".join(PARAPHRASER_TEXTS)] * 20 + ["Prompt one. Prompt two. Lexical order."] * 5)
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    T5ForConditionalGeneration(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


ROW_TEXTS = 300  # the random texts each configuration's detector scores, the rows fake runs draw from


@functools.cache
def _row_tokenizer():
    """The small tokenizer of the random texts that detectors score for fake runs (a few hundred tokens)."""
    from harness.assets.tiny import build_tokenizer

    return build_tokenizer(SENTENCES)


def _detect_context(folder: Path, prompt_tokens: int, new_tokens: int, tokenizer, rng, base_model: str | None = None):
    """A ``DetectContext`` as the pipeline gives detectors, for the random texts of ``_detector_rows``: stages are
    built into ``folder`` (Gu-KTH's reference statistics), and its reference texts are random token texts long enough
    for a window of a prompt and a completion."""
    import hashlib

    from harness.contract.method import DetectContext

    def stage(kind: str, spec: dict, build, what: str, collective: bool = False) -> Path:
        key = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]
        out = folder / kind / key
        if not out.is_dir():
            out.mkdir(parents=True)
            build(out)
        return out

    length = 2 * (prompt_tokens + new_tokens)  # more than a window, however the text re-tokenizes
    ids = rng.integers(0, len(tokenizer), size=(100, length)).tolist()
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return DetectContext(stage, lambda n: texts[:n], prompt_tokens, new_tokens, "cpu", base_model)


def _write_key(method, tokenizer, folder: Path, seed: int, base: str | None) -> None:
    """The detection key ``method`` writes when it trains on a base model with ``tokenizer``: drawn by its own
    ``draw_key`` where the key does not depend on training (on the random ``base``, or a random model of ``tokenizer``),
    else PRO's with a random, untrained policy M of its own class: a real detector of an unlearned key. Every
    registered method needs a way here, so that its table rows are what its detector writes."""
    if method.name != "pro":
        base = base or str(make_random_llama(folder.parent / "base", 0, tokenizer, num_hidden_layers=1))
        method.draw_key(folder, base)
        return
    import torch

    from harness.assets.encoder import shared_embedder
    from harness.assets.models import resolve
    from harness.contract.method import save_key
    from methods.pro import save_policy
    from methods.pro_policy import PolicyMLP

    p = method.params
    emb_folder = resolve(p.embedding_model)
    embedder = shared_embedder(emb_folder, "cpu", cache_size=p.embed_cache, batch_size=p.embed_batch)
    torch.manual_seed(seed)
    policy = PolicyMLP(embedder.dim, len(tokenizer), hidden=p.policy_hidden).eval()
    save_key(folder, method.detection_key(emb_folder, embedder, policy))
    save_policy(folder, policy)


@functools.cache
def _detector_rows(method_name: str, params_json: str, prompt_tokens: int, new_tokens: int) -> tuple[dict, ...]:
    """The per-text score rows that the real detector of one method configuration (``params_json``: all its settings;
    its key from ``_write_key``) writes for ``ROW_TEXTS`` random token sequences of ``new_tokens`` tokens, each with a
    random prompt of ``prompt_tokens``: the rows fake runs draw from. Cached per process (the arguments hash)."""
    import tempfile

    import numpy as np

    from harness.config.registry import methods
    from harness.contract.method import score_texts

    method = methods.build(method_name, json.loads(params_json))
    tokenizer = _row_tokenizer()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="detector-rows-") as tmp:
        folder = Path(tmp)
        (folder / "key").mkdir()
        base = None
        # (PRO's centred score, GaussMark's gradient and the decoding-time rows' base: a random model of the tokenizer)
        if method.detector_reads_prompt() or method.decoding_time or method.name == "gaussmark":
            base = str(make_random_llama(folder / "base", 0, tokenizer, num_hidden_layers=3))  # (the tiny LM's)
        _write_key(method, tokenizer, folder / "key", seed=0, base=base)
        ctx = _detect_context(folder / "stages", prompt_tokens, new_tokens, tokenizer, rng, base)
        detector = method.detector(folder / "key", tokenizer, ctx)
        sequences = rng.integers(0, len(tokenizer), size=(ROW_TEXTS, new_tokens)).tolist()
        prompts = rng.integers(0, len(tokenizer), size=(ROW_TEXTS, prompt_tokens)).tolist()
        return tuple(score_texts(method, detector, sequences, prompts))


def _fake_run(
    store,
    method: str,
    method_settings: dict,
    attack: str,
    attack_settings: dict,
    auc: float,
    seed: int = 0,
    preset=None,
    output: int = 0,
    n: int = 60,
    prompts: int = 0,
    ppl_scale: float = 1.0,
    loop: bool = False,
) -> Path:
    """A finished run as the pipeline records it (``scoring.run_spec`` with the real plugins, made-up upstream keys),
    published by the pipeline's own ``publish_scores``: for tests of what reads the store, with no model. Its per-text
    score rows are rows the configuration's real detector wrote (``_detector_rows``), left as written: ``n`` human
    texts drawn uniformly among them and ``n`` generated ones drawn by an exponential tilt on their rank, so that the
    AUC is ``auc`` in expectation (as far as the rows' ties allow). ``attack`` ``"base"`` is the unwatermarked base's
    row; ``output``: which of the attack's outputs (fine-tuning's checkpoints) the run is. Its generations record the
    prompts and human texts they continue, the same for every run of a preset; ``prompts`` other than 0 makes other
    ones (a run that is not paired with the rest). Its texts' perplexities are drawn from [5, 9] times ``ppl_scale``,
    and its completions' ids are varied (no repeated 3-gram) or, with ``loop``, one 3-gram over and over."""
    import hashlib

    import numpy as np

    from harness.cell import metrics, scoring
    from harness.config.presets import TINY
    from harness.config.registry import attacks, methods
    from harness.contract.attack import TextAttack
    from harness.store import files

    preset = preset or TINY
    preset = preset.model_copy(update={"train": preset.train.model_copy(update={"seed": seed})})
    m = methods.build(method, method_settings, preset)
    a = attacks.build(attack, attack_settings, preset) if attack != "base" else None
    label = None if a is None or a.identity or not hasattr(a, "outputs") else a.outputs()[output][0]
    # (the preset as a run spec hashes it: preset defaults given to a plugin later move no draw)
    what = json.dumps([method, method_settings, attack, attack_settings, seed, output, preset.hashed()]
                      + ([prompts] if prompts else []), sort_keys=True, default=str)  # fmt: skip
    digest = hashlib.sha256(what.encode()).hexdigest()
    # (the evaluation a generate stage's spec records, as a real run's upstream holds it: what pairs runs)
    generate = {"eval": preset.eval.model_dump(), "eval_data": preset.eval_source().model_dump(), "tokenizer": "fake"}
    spec = scoring.run_spec(preset, m, a, label, trained_key=digest[:16], generate_key=digest[16:32],
                            oracle={"ref": preset.oracle_model, "fingerprint": "fake"},
                            upstream={"generate": generate})  # fmt: skip
    params = json.dumps(m.params.model_dump(), sort_keys=True)
    rows = _detector_rows(method, params, preset.eval.prompt_tokens, preset.eval.new_tokens)
    rng = np.random.default_rng(int(digest[:8], 16))
    pos_at, neg_at = _draw_for_auc([r["score"] for r in rows], auc, n, rng)
    pos = [{**rows[i], "ppl": float(rng.uniform(5, 9)) * ppl_scale} for i in pos_at]
    ppl_on = metrics.ppl_footing(preset.oracle_model == preset.base_model, isinstance(a, TextAttack))
    if ppl_on == metrics.SAMPLED_IDS:  # the pipeline stores the PPL of the decoded text tokenized again beside it
        pos = [{**s, "ppl_retokenized": 1.4 * s["ppl"]} for s in pos]
    neg = [rows[i] for i in neg_at]
    rewritten = {"unigram_overlap": 0.5, "embedding_cosine": 0.8} if isinstance(a, TextAttack) else {}
    texts = np.random.default_rng([preset.eval.seed, prompts]).integers(0, 100, size=(n, 2, 3)).tolist()
    completions = [[7, 8, 9] * 8 if loop else list(range(24 * i, 24 * i + 24)) for i in range(n)]
    gens = [{"i": i, "prompt_ids": p, "human_ids": h, "completion_ids": c, **rewritten}
            for i, ((p, h), c) in enumerate(zip(texts, completions, strict=True))]  # fmt: skip
    stage = store.stage("run", spec)

    def build(out):
        files.write_jsonl(out / "generate.jsonl", gens)  # stands for the generate stage's file, which runs link
        scoring.publish_scores(out, out / "generate.jsonl", gens, pos, neg, ppl_on=ppl_on)
        (out / "generate.jsonl").unlink()
        return {}

    stage.build(build)
    return stage.path


def _draw_for_auc(scores: list[float], auc: float, n: int, rng):
    """Indices of ``n`` positives and ``n`` negatives among ``scores`` whose AUC is ``auc`` in expectation: negatives
    uniformly, positives with weights ``exp(beta * q)`` on each score's mid-rank quantile ``q``, the AUC of one such
    draw against a uniform one being the weighted mean of ``q``; ``beta`` is found by bisection (an AUC beyond what
    the scores' ties allow gets the nearest one they do)."""
    import numpy as np
    from scipy.stats import rankdata

    q = (rankdata(scores) - 0.5) / len(scores)

    def weights(beta: float):
        w = np.exp(beta * (q - q.max() if beta > 0 else q - q.min()))
        return w / w.sum()

    lo, hi = -1e3, 1e3
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if weights(mid) @ q < auc else (lo, mid)
    return rng.choice(len(scores), n, p=weights((lo + hi) / 2)), rng.choice(len(scores), n)


@pytest.fixture(scope="session")
def detector_rows():
    """``detector_rows(method, params_json, prompt_tokens, new_tokens)``: the rows fake runs draw from (see
    ``_detector_rows``)."""
    return _detector_rows


@pytest.fixture(scope="session")
def fake_run():
    """``fake_run(store, method, method_settings, attack, attack_settings, auc, seed=0, preset=None, output=0)``: a
    finished run of no model, its score rows drawn from what the real detector wrote for random texts so that the AUC
    is about ``auc``; attack ``"base"`` is the unwatermarked base's row."""
    return _fake_run


@pytest.fixture
def two_method_store(tmp_path, fake_run):
    """A store of made-up runs of Gu-KGW and PRO: the base, unaltered and SLERP t = 0.5 rows of each (for what reads
    a store: tables, the report, export)."""
    from harness.store.stages import Store

    store = Store(tmp_path / "runs")
    for method, auc in (("gu-kgw", 0.97), ("pro", 0.9)):
        fake_run(store, method, {}, "base", {}, 0.5)
        fake_run(store, method, {}, "none", {}, auc)
        fake_run(store, method, {}, "slerp", {"t": 0.5}, auc - 0.25)
    return store


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory) -> Path:
    """The run store of the tiny preset that the smoke tests share, one per test session: under pytest-xdist a folder
    beside the workers' own temporary folders (their parent is the session's), so every worker's tests write into the
    same one. Nothing is computed here: each test asks ``harness run`` or ``harness grid`` for the cells it needs, and
    the harness builds each stage once (under the stage's lock, while another process that asks for it waits) and
    reuses it afterwards, so the Gu-KGW student is trained once for all of them, by whichever test asks first. The
    store is the cache."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-tiny-store" / "runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _runs_by_row(root, attack: str | None = None, method: str = "gu-kgw", where=None) -> dict:
    """``{row: (spec, metrics)}`` of one method's finished runs in ``root`` (of one attack's command if ``attack`` is
    given: its rows plus the base and unaltered ones; ``where(spec)``, if given, says which runs of the command: a
    decoding's, some prompts'). Rows are named alike across methods, hence the filter."""
    found = {}
    for done in root.glob("*/DONE"):
        spec = json.loads((done.parent / "spec.json").read_text())
        name = spec["config"]["attack"]["name"]
        if spec["config"]["method"]["name"] != method or (where is not None and not where(spec)):
            continue
        if attack is None or name in (None, "none", attack):
            found[spec["row"]] = (spec, json.loads((done.parent / "metrics.json").read_text()))
    return found


@pytest.fixture(scope="session")
def runs_by_row():
    """``runs_by_row(root, attack=None, method="gu-kgw", where=None)``: ``{row: (spec, metrics)}`` of a method's runs in
    a store."""
    return _runs_by_row


def _unattacked_metrics(root, **eval_settings) -> dict:
    """``{row: metrics}`` of Gu-KGW's unwatermarked base and unaltered runs in ``root`` whose evaluation settings are
    ``eval_settings`` for each one named (``top_p=0.9``, ``prompts="code"``; None: not set, which a run's spec leaves
    out), so that one test's runs are told from those of the others that decode or ask otherwise."""

    def at(spec: dict) -> bool:
        stored = spec["config"]["preset"]["eval"]
        return all(stored.get(name) == value for name, value in eval_settings.items())

    return {row: m for row, (_, m) in _runs_by_row(root, "none", where=at).items()}


@pytest.fixture(scope="session")
def unattacked_metrics():
    """``unattacked_metrics(root, **eval_settings)``: see ``_unattacked_metrics``."""
    return _unattacked_metrics


def _check_stated_rate(runs: dict, what: str) -> None:
    """Of ``unattacked_metrics``' rows (``what``: which runs, for the messages): the unwatermarked base's texts flagged
    at the threshold that flags 1% of the human texts are within the binomial tail of 1% (one-sided, 0.1%), and the
    unaltered model's AUC is above the base's by more than 0.1."""
    from scipy.stats import binom

    base, unaltered = runs["Unwatermarked base"], runs["Unaltered"]
    assert base["tpr@0.01"] * base["n_pos"] <= binom.ppf(0.999, base["n_pos"], 0.01), (what, base["tpr@0.01"])
    assert unaltered["auc"] > base["auc"] + 0.1, (what, unaltered["auc"], base["auc"])


@pytest.fixture(scope="session")
def check_stated_rate():
    """``check_stated_rate(runs, what)``: see ``_check_stated_rate``."""
    return _check_stated_rate


@pytest.fixture(scope="session")
def gu_kgw_key(shared_store, harness) -> str:
    """The Gu-KGW key of the smoke tests' shared store (its train stage's hash), trained by ``harness run --method
    gu-kgw`` where no other test has stored it yet."""
    out = harness("run", "--method", "gu-kgw", "--results", str(shared_store), timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    specs = [json.loads(p.read_text()) for p in shared_store.glob("*/spec.json")]
    return next(s["detector"]["key_from"] for s in specs if s["detector"]["method"] == "gu-kgw")


@pytest.fixture(scope="session")
def audit_tiny_base(shared_store, harness, gu_kgw_key):
    """``audit_tiny_base(*args)``: the JSON report of ``harness detect`` with the shared store's Gu-KGW key on 60 texts
    of the unwatermarked tiny base, sampled or asked as ``args`` say (``"--decode", "top_p=0.9"``)."""
    from harness.assets.models import resolve

    def audit(*args: str) -> dict:
        out = harness("detect", "--results", str(shared_store), "--key", gu_kgw_key, "--model",
                      resolve("builtin:tiny-lm"), *args, "--num-texts", "60", "--json", timeout=1800)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout)

    return audit


CORPUS = [
    "The quick brown fox jumps over the lazy dog and runs into the forest to find more food.",
    "Return the number of items in the list, or raise an error if it is empty; lists are ordered.",
    "A watermark is a hidden signal in generated text that a detector can find with a secret key.",
] * 8


def _small_preset(folder, base, texts=None, **settings):
    """The tiny preset on a local model folder ``base`` (also the oracle) and a little JSONL corpus written into
    ``folder`` (``texts``, default CORPUS) for training and evaluation; ``settings`` are ``--set`` overrides."""
    from harness.config.presets import TINY
    from harness.config.settings import apply_overrides

    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts or CORPUS))
    paths = {"base_model": str(base), "oracle_model": str(base), "train_data.path": str(corpus)}
    return apply_overrides(TINY, {**paths, "eval_data.path": str(corpus), **settings})


@pytest.fixture(scope="session")
def small_preset():
    """``small_preset(folder, base, texts=None, **settings)``: see ``_small_preset``."""
    return _small_preset


INSTRUCT_PAIRS = [
    ("Add two numbers.", "def add(a, b):\n    return a + b"),
    ("Reverse a list.", "def rev(xs):\n    return xs[::-1]"),
    ("Count the words of a text.", "def words(text):\n    return len(text.split())"),
] * 10


def _instruct_file(folder: Path) -> Path:
    """``INSTRUCT_PAIRS`` written to ``folder/instruct.jsonl``, a ``{"prompt", "response"}`` line each: a local
    instruction dataset for the fine-tuning attacks (full fine-tuning, LoRA); returns its path."""
    path = folder / "instruct.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in INSTRUCT_PAIRS))
    return path


@pytest.fixture(scope="session")
def instruct_pairs():
    """``INSTRUCT_PAIRS``: the (prompt, response) pairs of ``instruct_file``, for a test's own corpus of them."""
    return INSTRUCT_PAIRS


@pytest.fixture(scope="session")
def instruct_file():
    """``instruct_file(folder)``: see ``_instruct_file``."""
    return _instruct_file


def _saved_weights(folder: Path) -> dict:
    """The tensors of the model saved in ``folder`` (its one ``model.safetensors``), by name."""
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="session")
def saved_weights():
    """``saved_weights(folder)``: see ``_saved_weights``."""
    return _saved_weights
