"""SLERP merging of the watermarked model with its unwatermarked base, through mergekit.

``t`` is the weight of the unwatermarked base (Gloaguen et al.'s convention, which the paper follows): t = 0 is the
watermarked model, t = 1 the base. mergekit interpolates each parameter tensor as a whole (the paper's formula) and
falls back to linear interpolation for (nearly) collinear tensors.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from harness.config.params import Params
from harness.contract.attack import MODEL, AttackContext, ModelAttack, library_versions
from harness.contract.plugin import Sweep


class SlerpParams(Params):
    t: float = Field(0.5, ge=0, le=1)


class Slerp(ModelAttack):
    name = "slerp"
    category = "Merging"
    label = "SLERP"
    sweep = Sweep("SLERP t (weight of the unwatermarked base)", "Merging with the base", setting="t", error_bars=True)
    version = "1"
    Params = SlerpParams
    requires = {"mergekit": "merge"}

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        from mergekit.config import MergeConfiguration
        from mergekit.merge import MergeOptions, run_merge

        config = {
            "merge_method": "slerp",
            "base_model": str(model_dir),  # mergekit's base is the t = 0 end
            "models": [{"model": str(model_dir)}, {"model": ctx.base_model}],
            "parameters": {"t": self.params.t},
            "dtype": "float32",
        }
        options = MergeOptions(
            cuda=ctx.device.startswith("cuda"), copy_tokenizer=True, write_model_card=False, quiet=True
        )
        run_merge(MergeConfiguration.model_validate(config), str(out_dir / MODEL), options)
        return {
            "mergekit_config": config,
            "t_is_weight_of": "unwatermarked base",
            "versions": library_versions("mergekit"),
            "evaluated": "the merged model (float32)",
        }
