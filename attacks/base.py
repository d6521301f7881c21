"""The attack interface. A model attack reads a saved model folder and writes the modified model to another; a
text attack rewrites generated texts (paraphrasing). Both are pure functions of their inputs (no state kept
between calls)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from harness.plugins import Plugin


@dataclass(frozen=True)
class AttackContext:
    """What an attack may use besides the model: the unwatermarked base (for merging) and the device."""

    base_model: str  # local folder or hub id of the unwatermarked base
    device: str


class Attack(Plugin):
    """What every attack declares: where its rows go in tab:robustness."""

    category: ClassVar[str]  # row group in tab:robustness, e.g. "Merging"
    label: ClassVar[str]  # e.g. "SLERP"
    identity: ClassVar[bool] = False  # True only for ``none``: the pipeline then uses the input model as is


class ModelAttack(Attack, ABC):
    """Base of every model -> model attack (quantization, pruning, merging, fine-tuning)."""

    @abstractmethod
    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        """Write the attacked model (weights + tokenizer) into ``out_dir``; return every setting it used."""


class TextAttack(Attack, ABC):
    """Base of every texts -> texts attack: it rewrites the unaltered watermarked model's completions."""

    @abstractmethod
    def apply_texts(self, texts: list[str], ctx: AttackContext) -> list[str]:
        """Return one rewritten text per input text, in order."""
