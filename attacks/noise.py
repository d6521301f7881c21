"""Weight noise: the uninformed attacker. Gaussian noise added to every linear layer's weight, each tensor's noise
scaled to that tensor's own standard deviation (``sigma`` = 0.01 adds noise of 1% of each weight matrix's spread).

It knows nothing of the watermark, so it is the baseline the informed attacks are read against: an attack that
removes a watermark no better than noise of the same quality cost has done nothing clever (Gloaguen et al.'s
durability study draws the same line). Written here because no library does it: a few lines of torch.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from harness.config.params import Params, float32_scale
from harness.contract.attack import MODEL, AttackContext, ModelAttack, library_versions
from harness.contract.plugin import Sweep


class WeightNoiseParams(Params):
    sigma: float = Field(0.01, ge=0)  # the noise's standard deviation, in units of each weight tensor's own
    seed: int = Field(0, ge=0, lt=2**63)  # the noise's random numbers (one generator, layers in the model's order)

    _sigma = field_validator("sigma")(float32_scale)


class WeightNoise(ModelAttack):
    name = "weight-noise"
    category = "Noise"
    label = "Weight noise"
    description = "Gaussian noise on every linear weight"
    sweep = Sweep("sigma (noise / each weight tensor's standard deviation)", "Weight noise", setting="sigma",
                  error_bars=True)  # fmt: skip
    version = "1"
    Params = WeightNoiseParams
    reference_curve = True  # the AUC-utility figure's reference

    def config_label(self) -> str:
        return f"sigma={self.params.sigma:g}"

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        import torch

        from harness.assets.models import load_causal_lm, load_tokenizer
        from harness.compute.training import save_model

        model = load_causal_lm(str(model_dir), "cpu")  # in the dtype it was saved in, so sigma = 0 changes no bit
        generator = torch.Generator().manual_seed(self.params.seed)
        noised, seen = [], set()
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            # Every linear layer, the output projection included; a weight tied to another (an lm_head tied to the
            # embeddings) is one tensor and gets noise once.
            if not isinstance(module, torch.nn.Linear) or weight is None or id(weight) in seen:
                continue
            seen.add(id(weight))
            if self.params.sigma > 0:  # (sigma = 0 is no noise: the weights stay bit for bit)
                with torch.no_grad():
                    values = weight.float()
                    noise = torch.randn(values.shape, generator=generator) * (self.params.sigma * values.std())
                    weight.copy_((values + noise).to(weight.dtype))
            noised.append(name)
        if not noised:
            from harness.config.errors import HarnessError

            raise HarnessError(f"weight-noise: the model in '{model_dir}' has no linear layer to add noise to")
        save_model(model, out_dir / MODEL, load_tokenizer(str(model_dir)))
        return {
            "sigma": self.params.sigma,
            "seed": self.params.seed,
            "scaled_to": "each weight tensor's standard deviation",
            "linear_weights": len(noised),
            # A tied output projection is the input embedding matrix (Gemma, SmolLM2): its noise reaches both.
            "tied_embeddings_noised": bool(getattr(model.config, "tie_word_embeddings", False)),
            "versions": library_versions(),
            "evaluated": "the noised model",
        }
