"""``none``: the unaltered watermarked model, the reference row of every robustness table."""

from __future__ import annotations

from pathlib import Path

from attacks.base import AttackContext, ModelAttack


class NoAttack(ModelAttack):
    name = "none"
    category = "Unaltered"
    label = ""
    identity = True

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        raise RuntimeError("the 'none' attack has no output: the pipeline uses the input model directly")

    def evaluated(self, graph, trained, unaltered) -> list[tuple]:
        return []  # the unaltered model is every cell's own row
