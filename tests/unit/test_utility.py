"""Retained utility (harness/cell/utility.py): every model a run evaluates gets its perplexity on the held-out human
continuations, once per model, and the AUC-utility figure draws it with weight noise as the reference curve."""

import json
import math

from harness.cell.pipeline import Pipeline
from harness.config.registry import attacks, methods
from harness.store import kinds
from harness.store.stages import Store

SMALL = {"train.steps": "3", "train.batch_size": "2", "train.seq_len": "16", "eval.num_prompts": "6",
         "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "3"}  # fmt: skip


def test_every_model_gets_its_heldout_perplexity_once(random_llamas, small_preset, tmp_path):
    from harness.assets.models import load_causal_lm
    from harness.compute.generation import completion_perplexity
    from harness.report import collect, figures

    _, base = random_llamas
    preset = small_preset(tmp_path, base, **SMALL)
    store = Store(tmp_path / "runs")
    method = methods.build("gu-kgw", {"k": "1"})
    pipe = Pipeline(preset, store, "cpu")
    for attack in (attacks.build("weight-noise", {"sigma": "0.5"}), attacks.build("typo", {"p": "0.2"})):
        cells = pipe.run(method, attack)
    utilities = [s for s in store.finished() if s.kind == kinds.UTILITY]
    assert len(utilities) == 3  # base, unaltered, noised: the typo row reads the unaltered model's texts
    found = collect.heldout_ppl(store)
    unaltered = collect.model_of_run(store, cells[1].run.key)
    assert collect.model_of_run(store, cells[2].run.key) is None  # the typo row
    # the unaltered model's held-out perplexity, computed here by hand from the same prompts and human tokens
    trained = store.at(kinds.TRAIN, unaltered)
    model = load_causal_lm(str(trained.path / "model"), "cpu")
    ppl = completion_perplexity(
        model, [p["prompt_ids"] for p in pipe.prompts], [p["human_ids"] for p in pipe.prompts], 4
    )
    # float32 logits in batches of 4 + 2 here, of 6 in the stage (eval.ppl_batch_size 32): a matmul of another batch
    # size may sum in another order on another CPU (~1e-7 relative per log-probability); another model or other
    # tokens move it by far more than 1e-5.
    assert math.isclose(found[unaltered], math.exp(sum(map(math.log, ppl)) / len(ppl)), rel_tol=1e-5)
    base_ppl = found[f"base:{pipe.base['fingerprint']}"]
    assert base_ppl > 1 and len(set(found.values())) == 3
    record = json.loads((utilities[0].path / kinds.UTILITY_FILE).read_text())
    assert record["texts"] == 6 and record["tokens_per_text"] == 8
    df = collect.collect(store)
    drawn = figures.setup_figures(df, store)
    assert "auc_utility" in drawn
    again = Pipeline(preset, store, "cpu").run(method, attacks.build("weight-noise", {"sigma": "0.5"}))
    assert all(c.reused for c in again) and len([s for s in store.finished() if s.kind == kinds.UTILITY]) == 3


def test_every_attack_of_the_utility_figure_has_its_own_colour_and_marker():
    from harness.report.figures import MARKERS, attack_styles

    names = [f"attack {i}" for i in range(10 * len(MARKERS))]
    styles = attack_styles(names)
    assert len(set(styles.values())) == len(names)  # matplotlib's default cycle alone repeats after ten
    assert attack_styles(names[:3]) == {n: styles[n] for n in names[:3]}  # the same attack alike in every panel


def test_perplexity_in_parts_equals_one_pass(random_llamas, monkeypatch):
    """A batch whose logits exceed the budget passes through the model in parts (Gemma 3's 262,144-token vocabulary
    held 12-15 GiB at 32 texts a pass) and gives each text the same perplexity: every text is padded to its batch's
    width either way. Perplexities here are about the vocabulary's size (a random model), so 1e-6 of it is float32
    noise in the sum of a text's few log-probabilities."""
    import random

    from harness.assets.models import load_causal_lm
    from harness.compute import generation

    _, base = random_llamas
    model = load_causal_lm(str(base), "cpu")
    vocab = model.get_output_embeddings().out_features
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 5))] for _ in range(7)]
    completions = [[rng.randrange(vocab) for _ in range(rng.randint(2, 6))] for _ in range(7)]
    whole = generation.completion_perplexity(model, prompts, completions, 7)
    passes = []
    real = generation._perplexity
    monkeypatch.setattr(generation, "_perplexity", lambda m, pairs, *a: passes.append(len(pairs)) or real(m, pairs, *a))
    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    monkeypatch.setattr(generation, "LOGITS_BYTES", 3 * width * vocab * 4)  # three texts' float32 logits a pass
    parts = generation.completion_perplexity(model, prompts, completions, 7)
    assert passes == [3, 3, 1]
    assert all(abs(a - b) <= 1e-6 * vocab for a, b in zip(whole, parts, strict=True)), (whole, parts)
