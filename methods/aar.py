"""Aaronson's watermark (AAR) as Gu et al.'s ``watermark-learnability`` implements it, bit for bit: the key, its
decoding and its detector. Used by Gu-AAR (methods/gu_aar.py) to write its teacher texts and to detect.

The key is one table of uniforms ``u`` of shape (V * k, V), drawn by ``torch.rand`` from a CPU generator seeded with
``seed``; the row for the next token is the *sum* of the previous k token ids (their hash). Decoding adds Gumbel noise
``-log(-log u)`` of that row to the logits and takes the argmax (exponential-minimum sampling: a sample of the
model's distribution, fixed by the context); fewer than k tokens before it, the logits are left as they are.
Detection sums ``-log(1 - u)`` of each token after the first k: Exp(1) each if the text does not depend on the key,
so the sum of n - k of them is Gamma(n - k, 1) (their p-value, ``p_value_gu``). A (row, token) pair that repeats
in a text repeats its u, which that p-value counts as new evidence; ``p_value`` counts each distinct pair once, which
makes it exact under the null.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from transformers import LogitsProcessor

EPS = 1e-20  # Gu et al.'s clamp
DEFAULT_SEED = 42  # Gu et al.'s key seed, published
# The key table is V * k x V float32, built whole as theirs is: refused past this (LLaMA-3's 128k tokens at k=1: 64 GB);
# KTH's key tables (methods/kth.py) are held to it too.
MAX_TABLE_BYTES = 8 << 30


@dataclass(frozen=True)
class AARKey:
    vocab_size: int  # V: len(tokenizer), as Gu et al.
    k: int  # previous tokens hashed (summed)
    seed: int = DEFAULT_SEED

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AARKey:
        return cls(**d)

    def table_bytes(self) -> int:
        return self.vocab_size * self.k * self.vocab_size * 4


def uniforms(key: AARKey) -> torch.Tensor:
    """The key's uniform table, as Gu et al. draw it (before either clamp)."""
    generator = torch.Generator().manual_seed(key.seed)
    return torch.rand((key.vocab_size * key.k, key.vocab_size), generator=generator, dtype=torch.float32)


def decoding_gumbel(key: AARKey) -> torch.Tensor:
    """The Gumbel noise their decoding adds: ``-log(clamp(-log(clamp(u, min=eps)), min=eps))``."""
    u = torch.clamp(uniforms(key), min=EPS)
    return -torch.log(torch.clamp(-torch.log(u), min=EPS))


def detection_uniforms(key: AARKey) -> torch.Tensor:
    """The uniforms their detector reads: clamped into [eps, 1 - eps]."""
    return torch.clamp(uniforms(key), min=EPS, max=1 - EPS)


class AARLogitsProcessor(LogitsProcessor):
    """Greedy decoding with this processor is AAR decoding (``model.generate(do_sample=False, ...)``), as their
    ``AarWatermark.__call__``: the row of the summed last k ids, its Gumbel noise added to the first V logits (logits
    past V are dropped, as theirs returns ``scores[..., :V] + gumbel``: here set to -inf, the same argmax)."""

    def __init__(self, key: AARKey, gumbel: torch.Tensor | None = None):
        self.key = key
        self.gumbel = decoding_gumbel(key) if gumbel is None else gumbel

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[-1] < self.key.k:
            return scores
        if self.gumbel.device != scores.device:
            self.gumbel = self.gumbel.to(scores.device)
        rows = input_ids[:, -self.key.k :].sum(-1)
        out = scores.clone()
        vocab = self.key.vocab_size
        out[:, :vocab] += self.gumbel[rows].to(scores.dtype)
        out[:, vocab:] = -torch.inf
        return out


@dataclass(frozen=True)
class AARScore:
    score: float  # the sum of -log(1 - u) over the tokens after the first k
    scored: int  # n - k
    p_value_gu: float  # Gamma(n - k) survival of the score: Gu et al.'s
    distinct: int  # distinct (row, token) pairs
    p_value: float  # Gamma(distinct) survival of their sum: exact under the null


def score_sequence(u: torch.Tensor, k: int, ids: list[int]) -> AARScore:
    """Their detector's score of one text's ids (``u``: ``detection_uniforms``), with the exact p-value beside."""
    from scipy.stats import gamma

    if len(ids) <= k:
        return AARScore(0.0, 0, 1.0, 0, 1.0)
    t = torch.tensor(ids)
    rows = t.unfold(0, k, 1)[:-1].sum(-1)  # the row of token i is the sum of tokens i-k .. i-1
    tokens = t[k:]
    values = -torch.log(1 - u[rows, tokens])  # float32, as theirs
    total = float(np.cumsum(values.numpy(), dtype=np.float32)[-1])  # their running float32 sum, token by token
    pairs = {}
    for row, token, value in zip(rows.tolist(), tokens.tolist(), values.double().tolist(), strict=True):
        pairs.setdefault((row, token), value)
    exact = float(gamma.sf(sum(pairs.values()), len(pairs)))
    return AARScore(total, len(tokens), float(gamma.sf(total, len(tokens))), len(pairs), exact)
