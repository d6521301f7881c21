"""Plugins written outside the harness, as a third party would: one module, registered only through the entry-point
groups ``harness.methods`` and ``harness.attacks`` (tests/smoke/test_outside_plugins.py installs it in a folder of its
own). Two methods (one that trains nothing), a model attack of a category the harness has never seen, a text attack,
and two attacks of a kind the harness does not define (neither a model nor a text attack: a sweep of noised models,
and the best of several samples per prompt), written against the contract's ``CellStages`` alone. It imports
``harness.contract`` and the floors below it, as a built-in plugin does."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

from pydantic import Field

from harness.assets import models
from harness.assets.data import token_stream, training_batches
from harness.compute.training import loss_step, train
from harness.config.params import Params
from harness.contract.attack import (
    MODEL,
    Attack,
    AttackContext,
    CellStages,
    Evaluated,
    ModelAttack,
    Output,
    TextAttack,
)
from harness.contract.method import DetectContext, Detector, TrainContext, WatermarkMethod, read_key, save_trained
from harness.contract.plugin import Column, SettingTable
from harness.store.files import read_jsonl
from harness.store.stages import Stage
from methods.gu_kgw import GuKGW, GuKGWParams


class UnigramParams(GuKGWParams):
    k: int = Field(0, ge=0, le=0)  # Zhao et al.'s Unigram: a green list that ignores the context


class Unigram(GuKGW):
    name = "unigram"
    label = "Unigram"
    Params = UnigramParams


class UntrainedParams(Params):
    gamma: float = Field(0.25, gt=0, lt=1)  # the share of the vocabulary on the green list
    seed: int = 0  # the key: which tokens are green


class GreenShare(Detector):
    """A unigram green list's detector: each text's green share among its distinct tokens against gamma, a one-sided
    binomial test (a repeated token is one draw of the key, so it counts once), and the same over all texts. The score
    over each prefix of a text (``prefix_scores``) puts the method in the tokens-to-detect table."""

    def __init__(self, green: set[int], gamma: float):
        self.green, self.gamma = green, gamma

    def _z(self, hits: int, n: int) -> float:
        return (hits - self.gamma * n) / math.sqrt(max(n, 1) * self.gamma * (1 - self.gamma))

    def _p(self, hits: int, n: int) -> float:
        from scipy.stats import binom

        return float(binom.sf(hits - 1, n, self.gamma)) if n else 1.0

    def score(self, sequences: list[list[int]], prompts: list[list[int]] | None = None) -> list[dict]:
        found = []
        for ids in sequences:
            seen, hits, prefix = set(), 0, []
            for token in ids:
                if token not in seen:
                    seen.add(token)
                    hits += token in self.green
                prefix.append(self._z(hits, len(seen)))
            found.append({"score": self._z(hits, len(seen)), "p_value": self._p(hits, len(seen)), "green": hits,
                          "prefix_scores": prefix})  # fmt: skip
        return found

    def pool(self, sequences: list[list[int]], scores: list[dict]) -> dict:
        tokens = {token for ids in sequences for token in ids}
        hits = len(tokens & self.green)
        return {"p_value": self._p(hits, len(tokens)), "statistic": hits, "test": "binomial, distinct tokens",
                "tokens": len(tokens)}  # fmt: skip


class Untrained(WatermarkMethod):
    """A method that trains nothing, from the contract alone: its released model is the base as it is, beside a key
    of its own (a unigram green list drawn from a seed) that its own detector reads (a control: the key finds nothing
    to detect). To the pipeline a training-free method (GaussMark's keyed noise, say) is this: a train stage that
    writes a model and a key without an optimiser step."""

    name = "untrained-kgw"
    label = "Untrained KGW"
    Params = UntrainedParams
    detector_has_null = True  # (``pool`` is a test with its own null: ``harness detect`` decides by it)
    columns = (Column("green", "distinct green tokens per generated text"),)  # runs.csv: untrained-kgw.green

    def config_label(self) -> str:
        return f"gamma={self.params.gamma:g}, seed={self.params.seed}"

    def train(self, ctx: TrainContext, out: Path) -> dict:
        tokenizer = models.load_tokenizer(ctx.base_model)
        key = {"method": self.name, "gamma": self.params.gamma, "seed": self.params.seed, "vocab": len(tokenizer)}
        save_trained(out, models.load_trainable(ctx.base_model, ctx.device), tokenizer, key)
        return {"steps": 0}

    def detector(self, key_dir: Path, tokenizer, ctx: DetectContext | None = None) -> Detector:
        key = read_key(key_dir)
        return GreenShare(green_list(key["seed"], key["gamma"], key["vocab"]), key["gamma"])


def green_list(seed: int, gamma: float, vocab: int) -> set[int]:
    """The key's green tokens: a share ``gamma`` of the ``vocab`` ids, drawn from ``seed``."""
    return set(random.Random(seed).sample(range(vocab), round(gamma * vocab)))


class GreenTuneParams(UntrainedParams):
    delta: float = Field(4.0, gt=0)  # the logit bias on green tokens that the student learns


class GreenTune(Untrained):
    """A method that trains: the student learns the base's next-token distribution with ``delta`` added to the
    logits of the key's green tokens (Gu et al.'s logit distillation, with a key that ignores the context), on the
    training loop every built-in method uses. Its key and detector are ``Untrained``'s."""

    name = "green-tune"
    label = "Green tune"
    Params = GreenTuneParams

    def config_label(self) -> str:
        return f"gamma={self.params.gamma:g}, delta={self.params.delta:g}, seed={self.params.seed}"

    def train(self, ctx: TrainContext, out: Path) -> dict:
        import torch
        import torch.nn.functional as F

        tokenizer = models.load_tokenizer(ctx.base_model)
        vocab = len(tokenizer)  # (the key's ids; a model may have more logits than its tokenizer has ids)
        bias = torch.zeros(vocab)
        bias[sorted(green_list(self.params.seed, self.params.gamma, vocab))] = self.params.delta
        teacher = models.load_causal_lm(ctx.base_model, ctx.device, dtype=ctx.settings.teacher_dtype)
        student = models.load_trainable(ctx.base_model, ctx.device)

        def loss(model, batch):  # KL(the teacher with the bias || the student), per token
            with torch.no_grad():
                target = F.log_softmax(teacher(batch).logits[..., :vocab] + bias.to(batch.device), dim=-1)
            logits = F.log_softmax(model(batch).logits[..., :vocab], dim=-1)
            return F.kl_div(logits.flatten(0, 1), target.flatten(0, 1), log_target=True, reduction="batchmean")

        stream = token_stream(tokenizer, ctx.train_texts, max_tokens=ctx.settings.tokens)
        batches = training_batches(tokenizer, stream, ctx.settings)  # (endless (batch_size, seq_len) id tensors)
        log = train(student, loss_step(loss), batches, ctx.settings, desc="green-tune", device=ctx.device)
        key = {"method": self.name, "gamma": self.params.gamma, "seed": self.params.seed, "vocab": vocab}
        save_trained(out, student, tokenizer, key)
        return log


class NoiseParams(Params):
    sigma: float = Field(0.05, ge=0)  # noise per weight, in units of its tensor's standard deviation
    seed: int = 0


class Noise(ModelAttack):
    name = "noise"
    category = "Perturbation"
    label = "Gaussian noise"
    Params = NoiseParams

    def config_label(self) -> str:
        return f"sigma={self.params.sigma:g}"

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        import torch

        from harness.assets.models import load_causal_lm, load_tokenizer
        from harness.compute.training import save_model

        model = load_causal_lm(str(model_dir), "cpu", dtype="float32")
        generator = torch.Generator().manual_seed(self.params.seed)
        with torch.no_grad():
            for weight in model.parameters():
                scale = weight.std() if weight.numel() > 1 else weight.abs()
                weight.add_(torch.randn(weight.shape, generator=generator) * self.params.sigma * scale)
        save_model(model, out_dir / MODEL, load_tokenizer(str(model_dir)))
        return {"sigma": self.params.sigma, "evaluated": "the noised model"}


class TruncateParams(Params):
    keep: float = Field(0.5, gt=0, le=1)  # share of each text's words kept


class Truncate(TextAttack):
    name = "truncate"
    category = "Editing"
    label = "Truncation"
    description = "truncation of each text"
    Params = TruncateParams

    def config_label(self) -> str:
        return f"keep={self.params.keep:g}"

    def apply_texts(self, texts: list[str], ctx: AttackContext) -> list[str]:
        return [" ".join(t.split()[: max(1, round(len(t.split()) * self.params.keep))]) for t in texts]


class NoiseSweepParams(Params):
    sigmas: list[float] = Field(default_factory=lambda: [0.02, 0.05], min_length=1)
    seed: int = 0


class NoiseSweep(Attack):
    """A kind of attack of its own: several noised models from one setting, each a row, made by asking the pipeline
    (``CellStages``) for ``Noise`` at each scale and for what each noised model writes."""

    name = "noise-sweep"
    category = "Perturbation sweeps"
    label = "Noise sweep"
    Params = NoiseSweepParams
    # A table of its own besides tab:robustness (noise-sweep_by_scale): a row per scale, the unaltered model first.
    setting_tables = (
        SettingTable("by_scale", "Each method's AUC, TPR at 1% FPR and median PPL at each noise scale",
                     values=("AUC", "TPR@1%", "PPL")),
    )  # fmt: skip

    def config_label(self) -> str:
        return ", ".join(f"sigma={s:g}" for s in self.params.sigmas)

    def evaluated(self, pipeline: CellStages, trained: Stage, unaltered: tuple[Output, Stage]) -> Evaluated:
        rows = []
        for sigma in self.params.sigmas:
            noise = Noise(NoiseParams(sigma=sigma, seed=self.params.seed))
            for out in pipeline.attack(noise, trained):
                label = f"sigma={sigma:g}"
                named = replace(out, row=f"{self.table_label()} {label}", config_label=label)
                rows.append((named, pipeline.generate(named.path, named.model_id, named.row)))
        return rows


class BestOfNParams(Params):
    n: int = Field(3, ge=2, le=16)  # samples drawn per prompt


class BestOfN(Attack):
    """A kind of attack of its own that samples the watermarked model several times per prompt and keeps, for each
    prompt, the draw with the most distinct tokens: its N draws are ``CellStages.generate`` with N other seeds, and
    what it keeps is a stage of its own (``CellStages.texts``), keyed by the draws it read."""

    name = "best-of-n"
    category = "Sampling"
    label = "Best of N"
    Params = BestOfNParams

    def config_label(self) -> str:
        return f"N={self.params.n}"

    def refuses(self, method) -> str | None:
        # A method whose texts no sampling setting moves (kth- and aar-decoding choose each token from their key)
        # writes the same text at every seed: N draws would be one.
        if method.refuses_decoding({"temperature": 2.0}) is not None:
            return f"{self.name}: {method.name} chooses each token from its key, so every draw is the same text"
        return None

    def evaluated(self, pipeline: CellStages, trained: Stage, unaltered: tuple[Output, Stage]) -> Evaluated:
        out, _ = unaltered
        first = pipeline.evaluation.seed + 1  # (the evaluation's own draw is the unaltered row)
        draws = [pipeline.generate(out.path, out.model_id, f"{self.label} draw {i + 1}", seed=first + i)
                 for i in range(self.params.n)]  # fmt: skip

        def most_varied(prompts: list[dict]) -> list[list[int]]:
            drawn = [read_jsonl(stage.path / "generations.jsonl") for stage in draws]
            return [max((rows[i]["completion_ids"] for rows in drawn), key=lambda ids: len(set(ids)))
                    for i in range(len(prompts))]  # fmt: skip

        return [pipeline.texts(self, unaltered, {"draws": [stage.key for stage in draws]}, most_varied)]
