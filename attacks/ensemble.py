"""Decoding through several models: attacks that leave the watermarked weights alone and change how they are decoded.

- ``wash`` (WASH, arXiv 2605.30501): at every step the next-token distribution is the average of the watermarked
  model's and those of ``k`` other models with its tokenizer, ``(p_w + p_1 + ... + p_k) / (k + 1)``, and the sampler
  draws from that. An attacker who holds other fine-tunes of the same base (the preset's merge donors: the tiny
  presets' code and prose fine-tunes of the base) dilutes the watermark's tilt without touching a weight.
- ``logit-merge``: the watermarked model's logits pulled toward the unwatermarked base's,
  ``(1 - t) l_w + t l_base``: the output-space twin of SLERP (``t``, as SLERP's, is the base's weight: 0 is the
  watermarked model, 1 the base), where the base is public as the paper's merging assumes.

Both act as ``LogitsProcessor``s after a decoding-time watermark's own (so a decoding-time row is attacked as its
sampler writes; a point mass of a KTH or AAR sampler is averaged as one) and before the draw's decoding transform
(temperature, top-k, ...): the mixture is of the models' plain distributions, then decoded as users decode. The other
models run beside the sampler on the same token ids with a key-value cache of their own; a batch's left padding
(the sampler pads with EOS) is masked for them as the sampler masks it for the watermarked model. Written here
because no maintained library mixes several models' distributions inside ``transformers``' ``generate``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from harness.config.errors import HarnessError
from harness.config.params import CommaList, Params
from harness.contract.attack import Attack, AttackContext, Evaluated
from harness.contract.plugin import Sweep

MAX_MODELS = 8  # each one is held in memory beside the watermarked model while it writes


class OtherModels:
    """A logits processor that runs ``folders``' models on the sampler's token ids and hands their logits and the
    sampler's scores to ``combine(scores, others) -> scores``. A new batch (token ids that do not extend the last
    call's by one) starts the models' caches again."""

    def __init__(self, folders: list[str], combine, pad_id: int):
        self.folders, self.combine, self.pad_id = folders, combine, pad_id
        self.models: list | None = None
        self.caches: list = []
        self.last = None  # the token ids of the last call
        self.mask = None

    def _load(self, device) -> None:
        import inspect

        from harness.assets.models import load_causal_lm

        self.models = [load_causal_lm(folder, str(device)).eval() for folder in self.folders]
        # the last position's logits alone, as generate asks the sampled model for them (the same arithmetic)
        self.keep = [{"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(m.forward).parameters else {}
                     for m in self.models]  # fmt: skip

    def __call__(self, input_ids, scores):
        import torch
        from transformers import DynamicCache

        if self.models is None:
            self._load(scores.device)
        ids = input_ids.to(scores.device)
        fresh = self.last is None or ids.shape != (self.last.shape[0], self.last.shape[1] + 1)
        fresh = fresh or not torch.equal(ids[:, :-1], self.last)
        if fresh:  # the prompts (left-padded with the pad id, as the sampler pads them), then every token is real
            self.mask = (torch.cumsum((ids != self.pad_id).long(), dim=1) > 0).long()
            self.caches = [DynamicCache() for _ in self.models]
            step = ids
        else:
            self.mask = torch.cat([self.mask, self.mask.new_ones((len(ids), 1))], dim=1)
            step = ids[:, -1:]
        positions = (self.mask.cumsum(dim=1) - 1).clamp(min=0)[:, -step.shape[1] :]
        others = []
        with torch.no_grad():
            for model, cache, keep in zip(self.models, self.caches, self.keep, strict=True):
                logits = model(input_ids=step, attention_mask=self.mask, position_ids=positions,
                               past_key_values=cache, use_cache=True, **keep).logits[:, -1, :].float()  # fmt: skip
                others.append(_fit(logits, scores.shape[-1]))
        self.last = ids
        return self.combine(scores, others)


def _fit(logits, width: int):
    """Logits cut or padded (with -inf: never drawn) to the sampler's vocabulary width."""
    import torch

    if logits.shape[-1] >= width:
        return logits[:, :width]
    pad = logits.new_full((logits.shape[0], width - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def average_distributions(scores, others):
    """WASH's mixture: the log of the mean of the softmaxed scores and logits."""
    import torch

    probs = torch.softmax(scores.float(), dim=-1)
    for logits in others:
        probs = probs + torch.softmax(logits, dim=-1)
    return torch.log(probs / (len(others) + 1)).to(scores.dtype)


def pull_toward(t: float):
    """``(1 - t) scores + t logits`` of one other model (the base): t = 0 returns the scores as they are and t = 1
    the base's logits as they are, bit for bit (0 * -inf would be NaN)."""

    def combine(scores, others):
        (base,) = others
        if t == 0:
            return scores
        if t == 1:
            return base.to(scores.dtype)
        return ((1 - t) * scores.float() + t * base).to(scores.dtype)

    return combine


class DecodingAttack(Attack):
    """An attack kind of its own: rows of the unaltered watermarked model decoded otherwise (``CellStages.decode``),
    no model written. Its rows go in tab:robustness under "Adaptive"."""

    category = "Adaptive"
    tables: ClassVar[tuple[str, ...]] = ("robustness",)

    def folders(self, ctx: AttackContext) -> list[str]:
        """The other models' folders, in order."""
        raise NotImplementedError

    def combine(self):
        raise NotImplementedError

    def evaluated(self, pipeline, trained, unaltered) -> Evaluated:
        def processors(tokenizer, ctx: AttackContext) -> list:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0  # (the sampler's padding)
            return [OtherModels(self.folders(ctx), self.combine(), pad)]

        return [pipeline.decode(self, unaltered, processors)]


class WashParams(Params):
    models: CommaList = ()  # model references (comma-separated on the command line); presets name theirs
    k: int | None = Field(None, ge=1)  # average with the first k of them (None: all): the curve's x

    @model_validator(mode="after")
    def _consistent(self) -> WashParams:
        if not self.models:
            raise ValueError("give at least one other model: models=<reference>[,<reference>...]")
        if len(self.models) > MAX_MODELS:
            raise ValueError(f"at most {MAX_MODELS} other models, not {len(self.models)}")
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"a model is named twice: {', '.join(self.models)}")
        if self.k is not None and self.k > len(self.models):
            raise ValueError(f"k={self.k} is more than the {len(self.models)} models named")
        return self

    def used(self) -> tuple[str, ...]:
        return self.models[: self.k or len(self.models)]


class Wash(DecodingAttack):
    name = "wash"
    label = "WASH"
    description = "decoding through the average of several models (WASH)"
    sweep = Sweep("K (other models averaged with the watermarked one)", "Decoding through several models")  # (K=..)
    version = "1"
    Params = WashParams

    def config_label(self) -> str:
        return f"K={len(self.params.used())}"

    def model_refs(self) -> dict[str, str]:
        return {f"model{i + 1}": ref for i, ref in enumerate(self.params.used())}

    def folders(self, ctx: AttackContext) -> list[str]:
        return [ctx.models[f"model{i + 1}"] for i in range(len(self.params.used()))]

    def combine(self):
        return average_distributions

    def validate(self, base_model: str | None = None) -> None:
        """Each other model is another model (one folder spelt two ways is one model) and reads the base's
        tokenizer: a mixture of distributions over different vocabularies mixes different tokens."""
        from harness.assets import models

        seen: dict = {}
        for ref in self.params.used():
            folder = models.on_disk(ref)
            twin = next((r for f, r in seen.items() if folder is not None and models.same_model(folder, f)), None)
            if twin is not None:
                raise HarnessError(f"wash models '{twin}' and '{ref}' are one model ({folder}): name each once")
            if folder is not None:
                seen[folder] = ref
        if base_model is None:
            return
        from attacks.donor_merge import vocabulary_fits

        for ref in self.params.used():
            vocabulary_fits(base_model, ref, role="wash model")


class LogitMergeParams(Params):
    t: float = Field(0.5, ge=0, le=1)  # the base's weight (SLERP's convention): 0 the watermarked model, 1 the base


class LogitMerge(DecodingAttack):
    name = "logit-merge"
    label = "Logit merge"
    description = "decoding from the watermarked model's logits pulled toward the base's"
    sweep = Sweep("t (weight of the unwatermarked base's logits)", "Decoding pulled toward the base", setting="t")
    version = "1"
    Params = LogitMergeParams

    def config_label(self) -> str:
        return f"t={self.params.t:g}"

    def folders(self, ctx: AttackContext) -> list[str]:
        return [ctx.base_model]

    def combine(self):
        return pull_toward(self.params.t)
