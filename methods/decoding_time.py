"""Decoding-time reference rows: KGW, KTH and AAR applied by the sampler to the unwatermarked base, no training. They
are the closed-source upper bound each learned method is measured against (the paper's motivation figure): the same
key and detector as Gu-KGW, Gu-KTH and Gu-AAR, whose teachers they are, so a learned method's shortfall is what
distillation loses. Their "trained" model is the base as it is, with the key beside it; the watermark is in the
sampler (``logits_processors``), so model attacks do not apply to them (``WatermarkMethod.refuses``: one line before
any work; the tables say why their cells under model modifications are empty). Text attacks do.

KGW adds delta to the green list of each context and the sampler draws from the result. KTH and AAR decide the next
token themselves (exponential-minimum sampling from the key's uniforms): their processors leave only that token
possible, so the sampler's own noise changes nothing. A KTH text takes one of the key's ``s`` shifts, chosen by its
prompt (the sum of the prompt's ids, modulo s: the same text in any batch); Gu et al. draw it at random.
"""

from __future__ import annotations

from pathlib import Path

from harness.assets import models
from harness.contract.method import TrainContext, read_key, save_trained
from methods.gu_aar import GuAAR
from methods.gu_kgw import GuKGW
from methods.gu_kth import GuKTH


class OnlyArgmax:
    """A processor that leaves only ``inner``'s argmax possible (the rest -inf), so that later noise cannot move it."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, input_ids, scores):
        import torch

        chosen = self.inner(input_ids, scores).argmax(-1, keepdim=True)
        return torch.full_like(scores, -torch.inf).scatter_(-1, chosen, 0.0)


class KGWProcessor:
    """KGW decoding: ``logits + delta`` on the green list of the context that ends the sequence."""

    def __init__(self, key):
        from methods.kgw import green_lists

        self.greens = green_lists(key)

    def __call__(self, input_ids, scores):
        width = self.greens.key.context_width
        if input_ids.shape[1] < width:
            return scores
        masks = self.greens.masks(input_ids[:, -width:].cpu(), width=scores.shape[-1])[:, -1].to(scores.device)
        return scores + self.greens.key.delta * masks.to(scores.dtype)


class KTHByPrompt:
    """KTH decoding, each row at the key shift its prompt picks (``prompt_len`` ids: the first call's length)."""

    def __init__(self, key):
        from methods.kth import key_gumbel, shifts

        self.key, self.gumbel, self.shifts = key, key_gumbel(key), shifts(key)
        self.prompt_len = None

    def __call__(self, input_ids, scores):
        from methods.kth import KTHLogitsProcessor

        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        picks = input_ids[:, : self.prompt_len].sum(-1).cpu() % len(self.shifts)
        shift = [self.shifts[int(i)] for i in picks]
        return KTHLogitsProcessor(self.key, shift, gumbel=self.gumbel)(input_ids, scores)


class DecodingTime:
    """What the decoding-time rows share, before the learned method they borrow key and detector from: their train
    stage holds the base as it is, and the key the learned method writes."""

    decoding_time = True

    def train(self, ctx: TrainContext, out: Path) -> dict:
        tokenizer = models.load_tokenizer(ctx.base_model)
        save_trained(out, models.load_trainable(ctx.base_model, ctx.device), tokenizer, self.detection_key(tokenizer))
        return {"steps": 0, "decoding_time": True}


class ChoosesItsToken(DecodingTime):
    """KTH and AAR decoding choose each token themselves from the key (``OnlyArgmax``): a user's temperature,
    truncation or greedy decoding, applied after the watermark, cannot move that token, so a row labelled with them
    would be plain sampling's row again. The repetition penalty acts before the watermark (``generation.draw``) and
    does change their texts."""

    def refuses_decoding(self, decoding: dict) -> str | None:
        ignored = sorted(k for k in decoding if k != "repetition_penalty")
        if ignored:
            return (
                f"{self.name} chooses each token itself from its key, so {', '.join(ignored)} would change nothing in "
                "its texts while labelling its rows with them: only repetition_penalty (applied before the watermark) "
                "acts on it"
            )
        return None


class KGWDecoding(DecodingTime, GuKGW):
    name = "kgw-decoding"
    label = "KGW (decoding-time)"

    def logits_processors(self, key_dir: Path, tokenizer) -> list:
        from methods.kgw import KGWKey

        return [KGWProcessor(KGWKey.from_dict(read_key(key_dir)["teacher"]))]


class KTHDecoding(ChoosesItsToken, GuKTH):
    name = "kth-decoding"
    label = "KTH (decoding-time)"

    def logits_processors(self, key_dir: Path, tokenizer) -> list:
        from methods.kth import KTHKey

        return [OnlyArgmax(KTHByPrompt(KTHKey.from_dict(read_key(key_dir)["key"])))]


class AARDecoding(ChoosesItsToken, GuAAR):
    name = "aar-decoding"
    label = "AAR (decoding-time)"

    def logits_processors(self, key_dir: Path, tokenizer) -> list:
        from methods.aar import AARKey, AARLogitsProcessor

        return [OnlyArgmax(AARLogitsProcessor(AARKey.from_dict(read_key(key_dir)["key"])))]
