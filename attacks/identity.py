"""``none``: the unaltered watermarked model, the reference row of every robustness table."""

from __future__ import annotations

from pathlib import Path

from harness.contract.attack import AttackContext, CellStages, Evaluated, ModelAttack, Output
from harness.store.stages import Stage


class NoAttack(ModelAttack):
    name = "none"
    category = "Unaltered"
    label = ""
    identity = True

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        raise RuntimeError("the 'none' attack has no output: the pipeline uses the input model directly")

    def evaluated(self, pipeline: CellStages, trained: Stage, unaltered: tuple[Output, Stage]) -> Evaluated:
        return []  # the unaltered model is every cell's own row
