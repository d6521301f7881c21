"""The quality gate: when a row's texts still count as writing, judged against the unwatermarked base's texts. A row
outside it is marked degenerate in every table and never ordered against another (``harness.cell.quality`` measures
the texts)."""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from harness.config.params import Params

OK, DEGENERATE, UNKNOWN = "ok", "degenerate", "unknown"


class QualityGate(Params):
    """When a row's texts still count as writing, judged against the unwatermarked base's texts of the same setup,
    prompts and decoding under the same judge. Declared before any run (a preset's ``quality_gate``, or a grid's
    ``overrides: {quality_gate.ppl_ratio: ...}``); a row outside it is marked degenerate and never ordered against
    another.

    Defaults: the paper's methods keep their median PPL within 3.6-9.9 of LLaMA-2-13B's reading, and its claims
    compare methods whose PPLs differ by 20-25%; a watermark that costs more than half the base's perplexity again is
    not the paper's regime, and a model whose texts read 1.5x *likelier* than its base's has collapsed toward its
    favourite tokens (the loops of tab:robustness's degenerate rows read 0.27x). Repetition: human text repeats
    about 1% of its 3-grams (Welleck et al.'s seq-rep-4 of human text: 0.006) and a loop most of them (greedy GPT-2:
    0.44 at 4-grams); a row may repeat up to ``rep3_ratio`` times its base's share, and always ``rep3_floor``."""

    ppl_ratio: tuple[float, float] = (2 / 3, 1.5)
    rep3_ratio: float = Field(3.0, gt=1)
    rep3_floor: float = Field(0.05, ge=0, lt=1)

    @model_validator(mode="after")
    def _bounds(self) -> QualityGate:
        lo, hi = self.ppl_ratio
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < 1 < hi):
            raise ValueError(
                f"ppl_ratio must be two finite bounds around 1, low first (0 < low < 1 < high): {lo}, {hi}"
            )
        if not math.isfinite(self.rep3_ratio):
            raise ValueError(f"rep3_ratio must be finite: {self.rep3_ratio}")
        return self

    def describe(self) -> str:
        """The gate in words, as tables and the CLI state it."""
        lo, hi = self.ppl_ratio
        return (
            f"median PPL within [{lo:.3g}, {hi:.3g}]x the base's, repeated 3-grams at most "
            f"max({self.rep3_ratio:g}x the base's, {self.rep3_floor:g})"
        )

    def verdict(self, ppl_ratio: float | None, rep3: float | None, base_rep3: float | None) -> str:
        """``ok``, ``degenerate: <why>``, or ``unknown: <why>`` (what the stored run does not hold to judge it), from a
        row's median PPL over its base's (``ppl_ratio``) and the two texts' repeated 3-gram shares."""
        if ppl_ratio is None or ppl_ratio != ppl_ratio:
            return f"{UNKNOWN}: no perplexity of its texts or of the base's on one footing"
        why = []
        ratio = ppl_ratio
        lo, hi = self.ppl_ratio
        if not lo <= ratio <= hi:
            why.append(f"PPL {ratio:.3g}x the base's, outside [{lo:.3g}, {hi:.3g}]")
        if rep3 is not None and base_rep3 is not None and rep3 == rep3 and base_rep3 == base_rep3:
            bound = max(self.rep3_ratio * base_rep3, self.rep3_floor)
            if rep3 > bound:
                why.append(f"repeats {rep3:.2f} of its 3-grams (bound {bound:.2f})")
        elif not why:
            return f"{UNKNOWN}: no repetition stored (scored before metrics version 4, or exported without texts)"
        return f"{DEGENERATE}: {'; '.join(why)}" if why else OK
