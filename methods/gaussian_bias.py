"""A Gaussian logit bias distilled into the weights: the "Unremovable" watermark (Christ et al., 2024) of Gloaguen et
al.'s durability study, in the harness's reading. The key is a fixed bias b ~ N(0, std^2) over the vocabulary; the
teacher is the base model's logits plus b at every position, and the student learns it by the harness's logit
distillation (methods/distill.py, as Gu-KGW), so the watermark lives in the ordinary weights, where every attack acts.

The study's code puts b in the head instead: its ``Llama2BiasModel`` (src/watermarks/unremovable/) adds an explicit
``lm_head_bias`` parameter to a Llama's logits, which ``watermark_model`` sets to b, with no training. That form is
not offered: HF Llama's ``lm_head`` has no bias, so it needs a model class of its own (model type ``llama2_bias``)
that only its own code loads: the harness never runs a checkpoint's code (``trust_remote_code``), mergekit and
llama.cpp's GGUF converter take the architectures they know, and a plain Llama load drops ``lm_head_bias`` (an
unexpected key) and the watermark with it (docs/methods.md: the field's other weight watermarks).

Detection reads a text's distinct tokens U: z = sum_{v in U} b_v / (std * sqrt(|U|)). Given U (which does not depend
on the key under the null), the b_v are independent N(0, std^2), so z is exactly N(0, 1): the one-sided p-value is
``1 - Phi(z)``; a text of the watermarked model favours tokens of high bias. The pooled test of ``harness detect`` is
the same statistic over the distinct tokens of all texts together, exact for the same reason.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from harness.assets import data, models
from harness.config.params import Params, float32_scale
from harness.contract.method import (
    Detector,
    PublishedDefault,
    TrainContext,
    WatermarkMethod,
    read_key,
    save_key,
    save_trained,
    score_long_enough,
)
from methods.distill import logit_distill


class GaussianBiasParams(Params):
    std: float = Field(0.6, gt=0)  # the bias's standard deviation, in logits (the durability study's 0.6)
    seed: int = Field(0, ge=0, lt=2**63)  # the key (0, the default, is published with the code)

    _std = field_validator("std")(float32_scale)


def bias(seed: int, size: int, std: float):
    """The key's bias over ``size`` logits (float32, from a generator of its own)."""
    import torch

    return torch.randn(size, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * std


class BiasDetector(Detector):
    def __init__(self, key: dict):
        self.bias = bias(key["seed"], key["size"], key["std"])
        self.std = key["std"]

    def _z(self, tokens: set[int]) -> tuple[float, int]:
        known = [t for t in tokens if 0 <= t < len(self.bias)]
        if not known:
            return 0.0, 0
        return float(self.bias[known].sum()) / (self.std * len(known) ** 0.5), len(known)

    def score(self, sequences: list[list[int]]) -> list[dict]:
        from scipy.stats import norm

        def batch(seqs):
            out = []
            for seq in seqs:
                z, n = self._z(set(seq))
                out.append({"score": z, "p_value": float(norm.sf(z)), "scored": n})
            return out

        return score_long_enough(sequences, 1, batch, {"score": 0.0, "p_value": 1.0})

    def pool(self, sequences: list[list[int]], scores: list[dict]) -> dict:
        from scipy.stats import norm

        z, n = self._z({t for seq in sequences for t in seq})
        test = f"Gaussian bias z over the {n} distinct tokens of all texts, exactly N(0, 1) under the null"
        return {"p_value": float(norm.sf(z)), "statistic": z, "tokens": n, "test": test}


class GaussianBias(WatermarkMethod):
    name = "gaussian-bias"
    label = "Gaussian bias"
    tradeoff_settings = ("std",)
    version = "1"
    Params = GaussianBiasParams
    detector_has_null = True

    def config_label(self) -> str:
        return f"std={self.params.std:g}"

    def train(self, ctx: TrainContext, out: Path) -> dict:
        tokenizer = models.load_tokenizer(ctx.base_model)
        teacher = models.load_causal_lm(ctx.base_model, ctx.device, dtype=ctx.settings.teacher_dtype)
        student = models.load_trainable(ctx.base_model, ctx.device)
        size = teacher.get_output_embeddings().weight.shape[0]
        b = bias(self.params.seed, size, self.params.std).to(ctx.device)
        s = ctx.settings
        stream = data.token_stream(tokenizer, ctx.train_texts, max_tokens=s.tokens)
        batches = data.training_batches(tokenizer, stream, s)
        report = logit_distill(
            student, teacher, lambda ids, logits: logits + b.to(logits.dtype), batches, s, "distill Gaussian bias",
            ctx.device,
        )  # fmt: skip
        save_trained(out, student, tokenizer, self.detection_key(size))
        return report

    def draw_key(self, out: Path, base_model: str) -> None:
        from harness.assets.models import config

        save_key(out, self.detection_key(config(base_model).vocab_size))  # (the logits' size, as train reads it)

    def detection_key(self, size: int) -> dict:
        """What ``train`` writes as ``key.json`` for a model of ``size`` logits: the bias's seed and scale."""
        return {"method": self.name, "std": self.params.std, "seed": self.params.seed, "size": size}

    def published_default(self) -> PublishedDefault:
        return PublishedDefault.seed_setting(self)

    def detector(self, key_dir: Path, tokenizer=None, ctx=None) -> Detector:
        return BiasDetector(read_key(key_dir))
