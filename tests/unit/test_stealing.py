"""Watermark stealing (``attacks/stealing.py``): the estimate from the watermarked model's texts against a reference,
scrubbing with it and spoofing with it, on decoding-time KGW, whose green lists are known exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.cell.pipeline import Pipeline
from harness.config.errors import HarnessError
from harness.config.registry import attacks, methods
from harness.store.files import read_jsonl
from harness.store.stages import Store

PRESET = {"train.steps": "2", "train.batch_size": "2", "train.seq_len": "12", "eval.num_prompts": "6",
          "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "3"}  # fmt: skip


def on_stolen(cell, stolen: set) -> float:
    """The share of a row's sampled bigrams (prompt's last token included) that are pairs of the stolen estimate."""
    pairs = []
    for g in read_jsonl(cell.run.path / "generations.jsonl"):
        ids = g["prompt_ids"][-1:] + g["completion_ids"]
        pairs += list(zip(ids, ids[1:], strict=False))
    return sum(p in stolen for p in pairs) / len(pairs)


def steal_settings(corpus, **more) -> dict:
    return {"dataset": str(corpus), "texts": "300", "prompt_tokens": "4", "new_tokens": "24", **more}


def test_the_estimate_recovers_decoding_time_kgw_green_lists(random_llamas, tmp_path, small_preset):
    """The stolen boosts of decoding-time KGW (delta 4, gamma 0.25) are green far more often than chance (0.25), the
    more so among the highest-scored; the estimate is a stage of its own, which spoofing with the same settings
    reuses; the scrubbed texts keep off the stolen pairs and the spoofed ones (the base's, decoded toward them) go
    onto them."""
    from attacks.stealing import ESTIMATE, recovered
    from methods.kgw import GreenLists, KGWKey

    marked, _ = random_llamas
    preset = small_preset(tmp_path, marked, **PRESET)
    store = Store(tmp_path / "runs")
    pipe = Pipeline(preset, store, "cpu")
    method = methods.build("kgw-decoding", {"delta": "4"})
    corpus = tmp_path / "corpus.jsonl"
    cells = {c.row: c for c in pipe.run(method, attacks.build("steal-scrub", steal_settings(corpus)))}
    (stage,) = list((store.root / "stages" / "steal").iterdir())
    with np.load(stage / ESTIMATE) as found:
        estimate = {k: found[k] for k in found.files}
    key = KGWKey.from_dict(method.detection_key(pipe.tokenizer)["detector"])
    greens = GreenLists(key)

    def green(context: int, token: int) -> bool:
        return bool(greens.masks(__import__("torch").tensor([context]))[0, token])

    assert len(estimate["scores"]) > 50
    assert recovered(estimate, green) > 0.5 and recovered(estimate, green, top=50) > 0.6
    # Decoding with it moves the texts off (scrub) or onto (spoof) the stolen pairs: here, a random model's nearly flat
    # distribution and green lists of a quarter of a small vocabulary, 300 texts see few greens of a context twice, so
    # the detector's scores move little; the share of the texts' bigrams that the estimate boosts moves for certain.
    stolen = set(zip(estimate["contexts"].tolist(), estimate["tokens"].tolist(), strict=True))
    scrub = cells["Stolen scrub N=300, strength=4"]
    assert on_stolen(scrub, stolen) < on_stolen(cells["Unaltered"], stolen) / 2
    spoofed = {c.row: c for c in pipe.run(method, attacks.build("steal-spoof", steal_settings(corpus)))}
    assert len(list((store.root / "stages" / "steal").iterdir())) == 1  # the same estimate, reused
    spoof = spoofed["Stolen spoof N=300, strength=4"]
    assert on_stolen(spoof, stolen) > 2 * on_stolen(spoofed["Unwatermarked base"], stolen)
    gens = read_jsonl(spoof.run.path / "generations.jsonl")
    assert len(gens) == 6 and all(len(g["completion_ids"]) == 8 for g in gens)


def test_scrubbing_by_fine_tuning_trains_a_model_of_its_own(random_llamas, tmp_path, small_preset):
    """steal-finetune trains the watermarked model for its steps on the attacker's queries toward its distribution
    with the stolen boosts taken off: a stage of its own holding the model, whose texts are the row's; the same
    estimate as the decoding scrub's; a decoding-time watermark (not in the weights) refuses it."""
    from safetensors.torch import load_file

    marked, _ = random_llamas
    store = Store(tmp_path / "runs")
    pipe = Pipeline(small_preset(tmp_path, marked, **PRESET), store, "cpu")
    corpus = tmp_path / "corpus.jsonl"
    settings = steal_settings(corpus, texts="40", steps="3", batch_size="4", lr="1e-2")
    cells = {c.row: c for c in pipe.run(methods.build("gu-kgw", {}), attacks.build("steal-finetune", settings))}
    row = "Stolen scrub (fine-tuning) N=40, strength=4, steps=3"
    assert set(cells) == {"Unwatermarked base", "Unaltered", row}
    (stage,) = list((store.root / "stages" / "steal-finetune").iterdir())
    (train,) = list((store.root / "stages" / "train").iterdir())
    scrubbed, unaltered = (
        load_file(stage / "model" / "model.safetensors"),
        load_file(train / "model" / "model.safetensors"),
    )
    assert any(not (scrubbed[k] == unaltered[k]).all() for k in unaltered)
    report = json.loads((stage / "manifest.json").read_text())["report"]
    assert (
        report["queries"] == 40
    )  # (the weights moved; a 2-step student's stolen boosts are too weak to move its texts)
    with pytest.raises(HarnessError, match="watermarks at decoding time, not in the weights"):
        pipe.run(methods.build("kgw-decoding", {}), attacks.build("steal-finetune", settings))


def test_scrubbing_by_paraphrase_counts_the_estimate_in_the_paraphrasers_tokens(random_llamas, random_t5, tmp_path,
                                                                               small_preset, monkeypatch):  # fmt: skip
    """steal-paraphrase: DIPPER (a random T5 of its own vocabulary here) rewrites the unaltered texts with the stolen
    boosts taken off its decoding. Its estimate is a stage of its own, counted in the paraphraser's tokens, shared by
    every strength; each rewrite stage is keyed by the estimate it read. At strength 0 the rewrites are DIPPER's with
    the same settings, text for text; at strength 8 the paraphraser puts a tenth or less of the probability it put at
    strength 0 on the tokens the estimate boosts after its decoder's previous token."""
    import attacks.stealing as stealing
    from harness.assets.models import load_tokenizer

    steps: list = []  # each decoding step's contexts, and the paraphraser's distributions before and after
    processor = stealing.StolenBoosts.__call__

    def recording(self, input_ids, scores):
        out = processor(self, input_ids, scores)
        steps.append((input_ids[:, -1].tolist(), scores.float().softmax(-1), out.float().softmax(-1)))
        return out

    monkeypatch.setattr(stealing.StolenBoosts, "__call__", recording)
    marked, _ = random_llamas
    store = Store(tmp_path / "runs")
    pipe = Pipeline(small_preset(tmp_path, marked, **PRESET), store, "cpu")
    method = methods.build("kgw-decoding", {"delta": "4"})
    dipper = {"model": str(random_t5), "tokenizer": None, "max_length": "24", "sent_interval": "1"}
    rows, recorded = {}, {}
    for strength in ("0", "8"):
        attack = attacks.build("steal-paraphrase", steal_settings(tmp_path / "corpus.jsonl", strength=strength,
                                                                  **dipper))  # fmt: skip
        steps.clear()
        rows |= {c.row: c for c in pipe.run(method, attack)}
        recorded[strength] = list(steps)
    rows |= {c.row: c for c in pipe.run(method, attacks.build("dipper", dipper))}
    (estimate,) = list((store.root / "stages" / "steal").iterdir())  # one, shared (no base-token one: none was asked)
    assert "counted_in" in json.loads((estimate / "spec.json").read_text())
    found = stealing.load_estimate(estimate)
    assert len(found["scores"]) > 50 and int(found["tokens"].max()) < len(load_tokenizer(str(random_t5)))
    stolen: dict[int, list[int]] = {}
    for context, token in zip(found["contexts"].tolist(), found["tokens"].tolist(), strict=True):
        stolen.setdefault(context, []).append(token)

    def mass(strength: str) -> tuple[float, float]:
        """The paraphraser's mean probability on the stolen tokens of each step's context, before and after."""
        on = [(p[row, stolen.get(c, [])].sum().item(), q[row, stolen.get(c, [])].sum().item())
              for contexts, p, q in recorded[strength] for row, c in enumerate(contexts)]  # fmt: skip
        return sum(b for b, _ in on) / len(on), sum(a for _, a in on) / len(on)

    def texts(row: str) -> list[str]:
        return [g["completion"] for g in read_jsonl(rows[row].run.path / "generations.jsonl")]

    plain, off = (texts(f"Stolen scrub (paraphrase) N=300, strength={s}, lex=60, order=0") for s in ("0", "8"))
    assert plain == texts("DIPPER lex=60, order=0") and off != plain
    (before, after), (before8, after8) = mass("0"), mass("8")
    assert after == before > 0.002 and after8 < before8 / 10, (mass("0"), mass("8"))  # (0.0052; 0.0042 -> 0.0002)
    reads = {rows[r].run.spec["upstream"]["generate"].get("reads", {}).get("estimate") for r in rows if "scrub" in r}
    assert reads == {estimate.name}


def test_every_stealing_attack_with_the_same_stealing_settings_shares_one_estimate():
    """The estimate is keyed by the stealing settings alone: an attack's own settings (the scrub's or spoof's
    strength, a fine-tuning budget, a paraphraser's) never make a second estimate; a stealing setting does."""
    common = {"texts": "40", "min_count": "3", "context": "2"}
    own = {
        "steal-scrub": {"strength": "2"},
        "steal-spoof": {"strength": "8"},
        "steal-finetune": {"steps": "3", "lr": "1e-2", "batch_size": "4"},
        "steal-paraphrase": {"strength": "1", "lexical": "40", "top_p": "0.9"},
    }
    specs = {name: attacks.build(name, {**common, **extra}).params.estimate_spec() for name, extra in own.items()}
    assert len({json.dumps(spec, sort_keys=True) for spec in specs.values()}) == 1, specs
    assert specs["steal-scrub"]["texts"] == 40 and "strength" not in specs["steal-scrub"]
    other = attacks.build("steal-finetune", {**common, "texts": "41"}).params.estimate_spec()
    assert other != specs["steal-finetune"]


def test_a_chain_holds_no_attack_of_a_kind_of_its_own():
    """A chain's links are model attacks and a text attack at the end: an attack that makes its rows through stages
    of its own (stealing, several models' decoding) is refused in one line, not found broken after training."""
    for links in (["hqq", "steal-scrub"], ["steal-paraphrase"], ["wash", "hqq"], ["hqq", "logit-merge"]):
        settings = {"links": [{"attack": a, "settings": {"models": "x"} if a == "wash" else {}} for a in links]}
        if len(links) == 1:
            settings["links"].insert(0, {"attack": "hqq"})
        with pytest.raises(HarnessError, match="not an attack a chain can hold"):
            attacks.build("chain", settings)
    attacks.build("chain", {"links": [{"attack": "hqq"}, {"attack": "dipper"}]})


def test_estimate_counts_by_hand():
    """The boosts from the module's formula, counted by hand: after context 1 the watermarked texts write 2 and 3 half
    the time each; the reference writes 2 once and 3 twice in its 6 continuations of 1, smoothed toward its unigram
    (add-one over the 8 ids: f_r(2) = 2/15, f_r(3) = 3/15). A pair written fewer than min_count times (4, 5) has no
    estimate."""
    import math

    from attacks.stealing import estimate_boosts

    marked = [[1, 2], [1, 2], [1, 3], [1, 3], [4, 5]]
    reference = [[1, 3], [1, 3], [1, 2], [1, 6], [1, 6], [1, 6], [4, 5]]
    found = estimate_boosts(marked, reference, vocab=8, min_count=2)
    got = dict(zip(zip(found["contexts"].tolist(), found["tokens"].tolist(), strict=True), found["scores"].tolist(),
                   strict=True))  # fmt: skip
    assert set(got) == {(1, 2), (1, 3)}
    assert got[(1, 2)] == 1.0  # log2(0.5 / ((1 + 2/15) / 7)) = 1.63, clipped at 1
    assert got[(1, 3)] == pytest.approx(math.log2(0.5 / ((2 + 3 / 15) / 7)), abs=1e-6)  # 0.67


def test_estimate_of_two_token_contexts_counts_by_hand():
    """With context=2 each context is the two tokens before (here (1, 2) and (5, 2), which one token would merge as
    context 2), keyed 1 * 8 + 2 = 10 and 5 * 8 + 2 = 42. After (1, 2) the watermarked texts write 3 two times in three;
    the reference writes 3 twice in its four continuations of (1, 2), smoothed toward its unigram (f_r(3) = 3/13). After
    (5, 2): 7 half the time, which the reference never writes there (f_r(7) = 1/13); 4 half the time, as often as the
    reference does (no boost). A pair written once ((1, 2), 4) has no estimate."""
    import math

    from attacks.stealing import estimate_boosts

    marked = [[1, 2, 3]] * 2 + [[1, 2, 4], [5, 2, 4], [5, 2, 4], [5, 2, 7], [5, 2, 7]]
    reference = [[1, 2, 4]] * 2 + [[1, 2, 3]] * 2 + [[5, 2, 4]]
    found = estimate_boosts(marked, reference, vocab=8, min_count=2, width=2)
    got = dict(zip(zip(found["contexts"].tolist(), found["tokens"].tolist(), strict=True), found["scores"].tolist(),
                   strict=True))  # fmt: skip
    assert set(got) == {(10, 3), (42, 7)} and int(found["width"]) == 2 and int(found["vocab"]) == 8
    assert got[(10, 3)] == pytest.approx(math.log2((2 / 3) / ((2 + 3 / 13) / 5)), abs=1e-6)  # 0.58
    assert got[(42, 7)] == 1.0  # log2(0.5 / ((0 + 1/13) / 2)) = 3.7, clipped at 1
    with pytest.raises(HarnessError, match="does not fit 64-bit keys"):
        estimate_boosts(marked, reference, vocab=128_256, min_count=2, width=3)


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (2, 3), (4, 9)])
def test_boosts_after_two_token_contexts_go_where_the_last_two_ids_say(shape):
    """A context=2 estimate boosts a row's scores where its last two ids are an estimated context (an id past the
    estimate's vocabulary is no context, not another's key), and ``along`` gives at each position what the processor
    gives on the prefix that ends there, no position before the second boosted."""
    import torch

    from attacks.stealing import StolenBoosts, context_keys, estimate_boosts

    rng = np.random.default_rng(shape[0] * 10 + shape[1])
    vocab = 12
    p = rng.dirichlet(np.full(vocab, 0.3))
    marked = [rng.choice(vocab, size=30, p=p).tolist() for _ in range(40)]
    estimate = estimate_boosts(marked, [rng.choice(vocab, size=30).tolist() for _ in range(40)], vocab, 1, width=2)
    boosts = dict(zip(zip(estimate["contexts"].tolist(), estimate["tokens"].tolist(), strict=True),
                      estimate["scores"].tolist(), strict=True))  # fmt: skip
    assert len({c for c, _ in boosts}) > 5
    batch, length = shape
    ids = torch.as_tensor(rng.integers(0, vocab + 3, size=shape), dtype=torch.long)  # some ids past the vocabulary
    logits = torch.as_tensor(rng.normal(size=(batch, length, vocab)), dtype=torch.float32)
    processor = StolenBoosts(estimate, -2.0)
    target = processor.along(ids, logits)
    for t in range(length):
        expected = logits[:, t].clone()
        for row in range(batch):
            window = ids[row, t - 1 : t + 1].tolist() if t >= 1 else []
            if len(window) == 2 and max(window) < vocab:
                for token in range(vocab):
                    expected[row, token] += -2.0 * boosts.get((int(context_keys(np.array(window), vocab)), token), 0.0)
        assert torch.allclose(processor(ids[:, : t + 1], logits[:, t]), expected, atol=1e-6, rtol=0)
        if t < length - 1:
            assert torch.equal(target[:, t], processor(ids[:, : t + 1], logits[:, t]))
    assert torch.equal(target[:, -1], logits[:, -1])


def test_a_two_token_scheme_is_stolen_with_two_token_contexts(random_llamas, tmp_path, small_preset):
    """Decoding-time KGW seeded by two tokens (k = 2, lm-watermarking's simple_2): the estimate with context=2 holds
    pairs green far more often than chance (0.25), and more often than the one-token estimate of the same texts."""
    import torch

    from attacks.stealing import load_estimate, recovered
    from methods.kgw import GreenLists, KGWKey

    marked, _ = random_llamas
    store = Store(tmp_path / "runs")
    pipe = Pipeline(small_preset(tmp_path, marked, **PRESET), store, "cpu")
    method = methods.build("kgw-decoding", {"k": "2", "delta": "4"})
    greens = GreenLists(KGWKey.from_dict(method.detection_key(pipe.tokenizer)["detector"]))
    shares = {}
    for width in ("1", "2"):
        pipe.run(method, attacks.build("steal-scrub", steal_settings(tmp_path / "corpus.jsonl", texts="1000",
                                                                     context=width)))  # fmt: skip
        (stage,) = [s for s in (store.root / "stages" / "steal").iterdir() if s.name not in shares.values()]
        estimate = load_estimate(stage)
        vocab = int(estimate.get("vocab", len(pipe.tokenizer)))

        def green(context: int, token: int, width=int(width), vocab=vocab) -> bool:
            window = [context // vocab, context % vocab] if width == 2 else [context, context]  # (1: its last id)
            return bool(greens.masks(torch.tensor(window))[0, token])

        shares[width] = stage.name
        shares[f"green{width}"] = recovered(estimate, green)
    assert shares["green2"] > 0.5 and shares["green2"] > shares["green1"] + 0.1, shares


@pytest.mark.parametrize(
    "settings, message",
    [({"texts": "0"}, "texts: Input should be greater than or equal to 1"),
     ({"strength": "-1"}, "strength: Input should be greater than or equal to 0"),
     ({"strength": "nan"}, "strength: Input should be a finite number"),
     ({"texts": "1000001"}, "texts: Input should be less than or equal to 1000000"),
     ({"texts": "10", "new_tokens": "8", "min_count": "81"}, "min_count=81 is more than the 10 x 8 tokens")],
)  # fmt: skip
def test_bad_settings_are_refused(settings, message):
    for name in ("steal-scrub", "steal-spoof", "steal-finetune"):
        with pytest.raises(HarnessError, match=message):
            attacks.build(name, settings)


def test_a_min_count_other_than_the_default_is_in_the_rows_label():
    """Two scrubs that differ in min_count alone are two rows, not one that reads as the default."""
    assert "min_count" not in attacks.build("steal-scrub", {}).config_label()
    assert attacks.build("steal-scrub", {"min_count": "5"}).config_label() == "N=1000, strength=4, min_count=5"


def test_a_context_whose_keys_overflow_is_refused_before_any_work(random_llamas, monkeypatch):
    """A context of three tokens of LLaMA-3's 128,256-token vocabulary would key (context, token) pairs past 2^63: each
    stealing attack refuses it when validated (before any training), naming the widest that fits; the paraphrasing
    scrub checks its paraphraser's vocabulary, which its estimate is counted in."""
    from types import SimpleNamespace

    from harness.assets import models

    marked, paraphraser = random_llamas  # (the second stands for a paraphraser of a small vocabulary)
    monkeypatch.setattr(models, "config", lambda ref: SimpleNamespace(vocab_size=128_256 if ref == str(marked) else 8))
    for name in ("steal-scrub", "steal-spoof", "steal-finetune"):
        attacks.build(name, {"context": "2"}).validate(str(marked))
        with pytest.raises(HarnessError, match="context=3 with a 128,256-token vocabulary does not fit 64-bit keys; "
                                               "at most context=2"):  # fmt: skip
            attacks.build(name, {"context": "3"}).validate(str(marked))
    attacks.build("steal-paraphrase", {"context": "3", "model": str(paraphraser), "tokenizer": None}).validate(
        str(marked)
    )
    with pytest.raises(HarnessError, match="context=3 with a 128,256-token vocabulary"):
        attacks.build("steal-paraphrase", {"context": "3", "model": str(marked), "tokenizer": None}).validate(
            str(paraphraser)
        )


def test_a_reference_model_of_another_tokenizer_is_refused_before_any_work(random_llamas, other_tokenizer_llama, cli,
                                                                           tmp_path):  # fmt: skip
    marked, other = random_llamas
    settings = ["--set", f"base_model={marked}", "--set", f"oracle_model={marked}", "--results", str(tmp_path / "r")]
    out = cli("run", "--method", "gu-kgw", "--attack", "steal-spoof", "--attack-arg",
              f"reference={other_tokenizer_llama}", *settings)  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "stealing reference" in out.stderr and "another vocabulary" in out.stderr
    assert not (tmp_path / "r" / "stages").exists()
    out = cli("run", "--method", "gu-kgw", "--attack", "steal-spoof", "--attack-arg", "reference=/no/such/model",
              *settings)  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_dry_run_builds_no_estimate(random_llamas, tmp_path, small_preset):
    """Planned (``harness run --dry-run``, a grid's dry run), a stealing cell says its runs are to compute and builds
    neither the estimate nor the fine-tuned model (the model it would query is not trained yet)."""
    marked, _ = random_llamas
    store = Store(tmp_path / "runs")
    pipe = Pipeline(small_preset(tmp_path, marked, **PRESET), store, "cpu", plan=True)
    for name in ("steal-scrub", "steal-finetune"):
        cells = pipe.run(methods.build("gu-kgw", {}), attacks.build(name, steal_settings(tmp_path / "corpus.jsonl")))
        assert len(cells) == 3 and not any(c.reused for c in cells)
    assert not (store.root / "stages" / "steal").exists() and not (store.root / "stages" / "train").exists()


def test_spoofs_of_two_watermarks_are_two_stages(random_llamas, tmp_path, small_preset):
    """The base writes every spoof, so what keys its texts is the estimate it decodes with: spoofing two watermarked
    models (here decoding-time KGW at two deltas) gives two estimates and two generate stages, never one's texts
    scored for the other (a grid once scored Gu-KTH's spoofed texts for the KGW methods so)."""
    marked, _ = random_llamas
    store = Store(tmp_path / "runs")
    pipe = Pipeline(small_preset(tmp_path, marked, **PRESET), store, "cpu")
    spoof = attacks.build("steal-spoof", steal_settings(tmp_path / "corpus.jsonl", texts="40"))
    generated = set()
    for delta in ("2", "4"):
        (row,) = [c for c in pipe.run(methods.build("kgw-decoding", {"delta": delta}), spoof) if "spoof" in c.row]
        generated.add(row.run.spec["upstream"]["generate"]["decoding_with"]["reads"]["estimate"])
    assert len(generated) == 2 and len(list((store.root / "stages" / "steal").iterdir())) == 2


class LoopBoosts:
    """The processor as it was written, a row at a time: the reference ``StolenBoosts`` must match."""

    def __init__(self, estimate: dict, scale: float):
        import torch

        contexts = np.asarray(estimate["contexts"])
        self.starts = {int(c): i for i, c in reversed(list(enumerate(contexts)))}
        self.ends = {int(c): i + 1 for i, c in enumerate(contexts)}
        self.tokens = torch.as_tensor(np.asarray(estimate["tokens"]), dtype=torch.long)
        self.values = torch.as_tensor(np.asarray(estimate["scores"]), dtype=torch.float32) * scale

    def __call__(self, input_ids, scores):
        if not len(self.tokens):
            return scores
        out = scores.clone()
        for row, context in enumerate(input_ids[:, -1].tolist()):
            start = self.starts.get(context)
            if start is None:
                continue
            tokens, values = self.tokens[start : self.ends[context]], self.values[start : self.ends[context]]
            inside = tokens < out.shape[-1]
            out[row, tokens[inside].to(out.device)] += values[inside].to(out.device, out.dtype)
        return out


def loop_target(boosts, ids, logits):
    """The fine-tuning scrub's target as it was built: the processor applied at each position but the last."""
    target = logits.clone()
    for t in range(ids.shape[1] - 1):
        target[:, t] = boosts(ids[:, : t + 1], target[:, t])
    return target


def random_estimate(rng, vocab: int, texts: int = 60) -> dict:
    """An estimate as the attack makes one (sorted by context, one entry per pair), from random texts over a skewed
    vocabulary so that contexts have several boosted tokens."""
    from attacks.stealing import estimate_boosts

    p = rng.dirichlet(np.full(vocab, 0.3))
    marked = [rng.choice(vocab, size=20, p=p).tolist() for _ in range(texts)]
    reference = [rng.choice(vocab, size=20).tolist() for _ in range(texts)]
    return estimate_boosts(marked, reference, vocab, min_count=1)


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3, 1), (4, 7), (5, 16), (2, 33)])
@pytest.mark.parametrize("width", [0, 5])  # logits as wide as the estimate's vocabulary, or wider
def test_the_target_of_every_position_is_the_processor_at_each_prefix(shape, width):
    """``StolenBoosts.along`` (every position at once) and its processor call give, bit for bit, what the processor
    written a row at a time gave at each prefix: the same single float32 addition per boosted score. The ids include
    contexts never estimated (ids past the estimate's vocabulary, and padding), the first position of each sequence,
    and the last (never boosted); some estimated tokens lie past narrower logits (left out)."""
    import torch

    from attacks.stealing import StolenBoosts

    rng = np.random.default_rng(shape[0] * 100 + shape[1] + width)
    vocab = 40
    estimate = random_estimate(rng, vocab)
    assert len(estimate["scores"]) > 20 and len(set(estimate["contexts"].tolist())) > 5
    batch, length = shape
    ids = torch.as_tensor(rng.integers(0, vocab + 10, size=shape), dtype=torch.long)  # 10 ids never estimated
    ids[0, length // 2 :] = 0  # padding (id 0: estimated or not, it is boosted as any id, as before)
    ids[-1, 0] = int(np.bincount(estimate["contexts"]).argmax())  # a sequence's start, on an estimated context
    for logits_width in (vocab + width, vocab - 8):
        logits = torch.as_tensor(rng.normal(size=(batch, length, logits_width)), dtype=torch.float32)
        for scale in (-4.0, 2.5):
            new, old = StolenBoosts(estimate, scale), LoopBoosts(estimate, scale)
            target = new.along(ids, logits)
            assert torch.equal(target, loop_target(old, ids, logits))
            assert torch.equal(target[:, -1], logits[:, -1]) and (length == 1 or not torch.equal(target, logits))
            for t in range(length):
                prefix = ids[:, : t + 1]
                assert torch.equal(new(prefix, logits[:, t]), old(prefix, logits[:, t]))
            half = logits[:, -1].to(torch.bfloat16)  # a processor's scores in the model's dtype
            assert torch.equal(new(ids, half), old(ids, half))


def test_a_target_with_no_estimate_or_no_estimated_context_is_the_teacher():
    import torch

    from attacks.stealing import StolenBoosts

    logits = torch.randn(3, 6, 12)
    ids = torch.randint(0, 12, (3, 6))
    for none in (ids[:, :0], ids[:, :1]):  # no position, one: nothing boosted
        some = {"contexts": np.arange(12), "tokens": np.arange(12), "scores": np.ones(12, np.float32)}  # every id
        assert torch.equal(StolenBoosts(some, 1.0).along(none, logits[:, : none.shape[1]]), logits[:, : none.shape[1]])
    empty = {"contexts": np.zeros(0, np.int64), "tokens": np.zeros(0, np.int64), "scores": np.zeros(0, np.float32)}
    elsewhere = {"contexts": np.array([50, 50, 51]), "tokens": np.array([1, 2, 3]), "scores": np.ones(3, np.float32)}
    for estimate in (empty, elsewhere):
        target = StolenBoosts(estimate, -4.0).along(ids, logits)
        assert torch.equal(target, logits) and torch.equal(target, loop_target(LoopBoosts(estimate, -4.0), ids, logits))
        assert target.data_ptr() != logits.data_ptr()  # a copy, as before
