"""Plugins written outside the harness, as a third party would: one module, registered only through the entry-point
groups ``harness.methods`` and ``harness.attacks`` (tests/smoke/test_outside_plugins.py installs it in a folder of its
own). Two methods (one that trains nothing), a model attack of a category the harness has never seen, a text attack,
and an attack of a kind the harness does not define (neither a model nor a text attack), written against the
contract's ``CellStages`` alone. It imports ``harness.contract`` and the floors below it, as a built-in plugin does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pydantic import Field

from harness.assets import models
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
from harness.contract.method import TrainContext, save_trained
from harness.store.stages import Stage
from methods.gu_kgw import GuKGW, GuKGWParams


class UnigramParams(GuKGWParams):
    k: int = Field(0, ge=0, le=0)  # Zhao et al.'s Unigram: a green list that ignores the context


class Unigram(GuKGW):
    name = "unigram"
    label = "Unigram"
    Params = UnigramParams


class Untrained(GuKGW):
    """A method that trains nothing: its released model is the base as it is, beside a KGW key (a control, whose key
    finds nothing to detect). To the pipeline a training-free method (GaussMark's keyed noise, say) is this: a train
    stage that writes a model and a key without an optimiser step."""

    name = "untrained-kgw"
    label = "Untrained KGW"

    def train(self, ctx: TrainContext, out: Path) -> dict:
        tokenizer = models.load_tokenizer(ctx.base_model)
        key = {
            "method": self.name,
            "detector": self.key(tokenizer, self.params.detector_drop_special).to_dict(),
            "ignore_repeated_ngrams": self.params.ignore_repeated_ngrams,
        }
        save_trained(out, models.load_trainable(ctx.base_model, ctx.device), tokenizer, key)
        return {"steps": 0}


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
