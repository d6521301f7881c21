"""The KTH watermark (Kuditipudi et al., "Robust Distortion-free Watermarks"), as distilled by Gu et al. ("On the
Learnability of Watermarks for Language Models"): the key, the watermarked sampler, and the detector.

The key is bit-compatible with Gu et al.'s ``KTHWatermark``: ``xi = torch.rand((m, V), generator=g)`` with a CPU
``torch.Generator`` seeded with ``seed``. The watermarked token at key position ``k`` is
``argmax(logits[:V] + gumbel[k])`` (the Gumbel-max trick, i.e. ``argmax u_i ** (1 / p_i)``), where
``gumbel = -log(clamp(-log(clamp(xi, min=eps)), min=eps))``. A text is shifted by one of ``s`` evenly spaced key
offsets so that the model cannot learn a single fixed sequence.

Detection (lower statistic = more watermarked) scores a text ``x`` of ``T`` tokens against every cyclic offset ``j``
of the key and keeps the minimum:

- ``"min-offset"``: ``min_j sum_t log(1 - xi[(t + j) % m, x_t])``;
- ``"levenshtein"`` (Gu et al.'s detector, from Kuditipudi et al.'s ``levenshtein.pyx``): the same cost aligned to
  the key window ``xi[(j + arange(T)) % m]`` by an edit-distance DP in which insertions and deletions cost ``gamma``
  (Gu et al.: ``gamma = 0``).

Written here rather than imported because the reference detector runs one Cython DP per offset after copying a
``(T, V)`` slice of the key for each (217-542 tokens/s on 2 CPU cores); here the DP runs over anti-diagonals,
vectorised over offsets and texts, and the plain statistic is a strided sum with no loop over tokens.

Ids ``>= V`` (a model may have more logits than the tokenizer has ids) never come out of the sampler; in a scored text
they cost 0 (as if ``xi = 0``: no evidence for the watermark). The reference code would read outside the key there.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided
from transformers import LogitsProcessor

DEFAULT_SEED = 42
DEFAULT_KEY_LEN = 256
METHODS = ("min-offset", "levenshtein")


@dataclass(frozen=True)
class KTHKey:
    """Everything a KTH detector needs; saved next to a watermarked model as its key."""

    vocab_size: int  # V, columns of the key: len(tokenizer), as in Gu et al.
    key_len: int = DEFAULT_KEY_LEN  # m, rows of the key
    seed: int = DEFAULT_SEED
    num_shifts: int = 1  # s: texts start at one of s evenly spaced key offsets (Gu et al.: 4, 2 or 1)
    eps: float = 1e-20  # clamp inside the Gumbel transform, as Gu et al.

    def __post_init__(self) -> None:
        if self.key_len < 1:
            raise ValueError(f"key_len (m) must be >= 1, got {self.key_len}")
        if not 1 <= self.num_shifts <= self.key_len:
            raise ValueError(f"num_shifts (s) must be in 1..key_len={self.key_len}, got {self.num_shifts}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")

    def to_dict(self) -> dict:
        return {"scheme": "kth", **asdict(self)}

    def table_bytes(self) -> int:
        """At most what the detector holds for this key at once: its uniforms, float32, and their cost table, float64,
        of the texts' ids alone (12 m V bytes where the texts hold every id; the generator's Gumbel noise, float32, is
        less)."""
        return 12 * self.key_len * self.vocab_size

    @classmethod
    def from_dict(cls, data: dict) -> KTHKey:
        return cls(**{k: v for k, v in data.items() if k != "scheme"})


def key_uniforms(key: KTHKey) -> torch.Tensor:
    """The key ``xi``: ``(m, V)`` float32 uniforms, bit-identical to Gu et al.'s for the same seed and ``V``."""
    generator = torch.Generator(device="cpu")  # always CPU, so the key does not depend on the device
    generator.manual_seed(key.seed)
    return torch.rand((key.key_len, key.vocab_size), generator=generator, dtype=torch.float32)


def key_gumbel(key: KTHKey) -> torch.Tensor:
    """Gumbel noise ``(m, V)`` float32 of the key, computed exactly as Gu et al. (same clamps, same order)."""
    uniform = torch.clamp(key_uniforms(key), min=key.eps)
    return -torch.log(torch.clamp(-torch.log(uniform), min=key.eps))


def shifts(key: KTHKey) -> list[int]:
    """The ``s`` evenly spaced key offsets a text may start at: ``[i * (m // s) for i in range(s)]``."""
    step = key.key_len // key.num_shifts
    return [i * step for i in range(key.num_shifts)]


def draw_shifts(key: KTHKey, count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` shifts drawn with ``rng.choice(shifts(key))``, as Gu et al. draw one per batch; ``rng`` defaults to a
    fresh ``random.Random(key.seed)`` (pass one ``rng`` to successive calls to continue the stream). With ``s = 1``
    every shift is 0 and, as in Gu et al., ``rng`` is not consumed."""
    if key.num_shifts == 1:
        return [0] * count
    rng = rng if rng is not None else random.Random(key.seed)
    options = shifts(key)
    return [rng.choice(options) for _ in range(count)]


def _shift_tensor(shift: int | Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(shift, dtype=torch.long, device=device)


def watermark_argmax(
    key: KTHKey, logits: torch.Tensor, shift: int | Sequence[int] | torch.Tensor = 0, gumbel: torch.Tensor | None = None
) -> torch.Tensor:
    """Watermarked tokens ``(B, L)`` for a whole sequence of logits ``(B, L, V_model)`` at once (Gu et al.'s
    sampling-distillation targets): position ``t`` takes ``argmax(logits[b, t, :V] + gumbel[(t + shift_b) % m])``.
    ``shift`` is one int or one per row. ``logits`` is not modified.

    Gu et al. index by the position of the logits (so the token at ``t + 1`` uses key row ``t + shift``), while their
    generation processor (:class:`KTHLogitsProcessor`) uses the position of the generated token; detection minimises
    over offsets, so the two agree up to a shift of one."""
    vocab = key.vocab_size
    if logits.shape[-1] < vocab:
        raise ValueError(f"logits have {logits.shape[-1]} entries, fewer than the key's vocab_size {vocab}")
    gumbel = (key_gumbel(key) if gumbel is None else gumbel).to(device=logits.device, dtype=logits.dtype)
    positions = torch.arange(logits.shape[-2], device=logits.device)
    rows = (positions + _shift_tensor(shift, logits.device).reshape(-1, 1)) % key.key_len  # (1 or B, L)
    return torch.argmax(logits[..., :vocab] + gumbel[rows], dim=-1)


class KTHLogitsProcessor(LogitsProcessor):
    """Turns greedy decoding into KTH watermarked sampling: use with ``model.generate(do_sample=False,
    logits_processor=[KTHLogitsProcessor(key, shift)])``.

    The next token, at position ``p = input_ids.shape[1]`` of the full (prompt + generated, padding included)
    sequence, gets ``gumbel[(p + shift) % m]`` added to its first ``V`` logits, as Gu et al.'s ``KTHWatermark``;
    logits past ``V`` are set to ``-inf`` so the argmax is always a key id. ``shift`` is one int for the batch or one
    per row (e.g. ``draw_shifts(key, batch_size, rng)``)."""

    def __init__(self, key: KTHKey, shift: int | Sequence[int] | torch.Tensor = 0, gumbel: torch.Tensor | None = None):
        self.key = key
        self.shift = _shift_tensor(shift, torch.device("cpu"))
        self._gumbel = key_gumbel(key) if gumbel is None else gumbel

    def key_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Key row of the next token of each batch row, shape ``(B,)``."""
        shift = self.shift.to(input_ids.device)
        rows = (input_ids.shape[1] + shift) % self.key.key_len
        return rows.expand(input_ids.shape[0]) if rows.dim() == 0 else rows

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        vocab = self.key.vocab_size
        if scores.shape[-1] < vocab:
            raise ValueError(f"scores have {scores.shape[-1]} entries, fewer than the key's vocab_size {vocab}")
        if self._gumbel.device != scores.device:
            self._gumbel = self._gumbel.to(scores.device)
        out = scores.clone()
        out[:, :vocab] += self._gumbel[self.key_rows(input_ids)].to(scores.dtype)
        out[:, vocab:] = -torch.inf
        return out


# --- detection ---------------------------------------------------------------------------------------------------


@lru_cache(maxsize=2)
def _uniforms(key: KTHKey) -> np.ndarray:
    """``key_uniforms`` as numpy, kept for the next call with the same key (a detector scores its texts in chunks)."""
    return key_uniforms(key).numpy()


def _cost_table(key: KTHKey, ids: np.ndarray, dtype: str) -> np.ndarray:
    """``log(1 - xi)`` of the ids ``ids`` (sorted, distinct, each ``< V``), transposed to ``(len(ids) + 1, m)``: row
    ``r`` is every key row's cost of id ``ids[r]``; the extra last row is all zeros (ids ``>= V`` and padding). Only
    the ids the texts hold: the whole ``(V + 1, m)`` table took 1.1 s of a 1.2 s test at SmolLM2's 49,152 ids (the
    DP on 50 texts, 0.08 s), and each null key of a permutation test needs its own. The same values, bit for bit."""
    table = np.zeros((len(ids) + 1, key.key_len), dtype=dtype)
    table[:-1] = np.log1p(-_uniforms(key)[:, ids].astype(np.float64)).T
    return table


def _check_sequences(sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    arrays = [np.asarray(seq, dtype=np.int64).reshape(-1) for seq in sequences]
    for i, arr in enumerate(arrays):
        if len(arr) == 0:
            raise ValueError(f"text {i} has length 0: KTH needs at least 1 token to score a text")
        if arr.min() < 0:
            raise ValueError(f"text {i} has a negative token id {int(arr.min())}")
    return arrays


def _costs(table: np.ndarray, tokens: np.ndarray, width: int) -> np.ndarray:
    """``out[b, t, c] = table[tokens[b, t], c % m]`` for ``c < width``: each token's cost against the key,
    extended cyclically so that any window of key rows is a contiguous slice. Shape ``(B, T, width)``."""
    m = table.shape[1]
    per_token = table[tokens]  # (B, T, m)
    if width <= m:
        return per_token[..., :width]
    if width <= 2 * m:
        return np.concatenate([per_token, per_token[..., : width - m]], axis=-1)
    return per_token[..., np.arange(width) % m]


def _min_offset(table: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``min_j sum_t C[b, t, (t + j) % m]`` for a padded batch ``(B, T)`` (padding = the zero-cost id)."""
    batch, length = tokens.shape
    m = table.shape[1]
    width = m + length - 1
    ext = np.ascontiguousarray(_costs(table, tokens, width))  # (B, T, W)
    item = ext.itemsize
    # diagonal[b, t, j] = ext[b, t, t + j]: stride W + 1 along t
    diagonal = as_strided(ext, (batch, length, m), (length * width * item, (width + 1) * item, item), writeable=False)
    return diagonal.sum(axis=1).min(axis=1)


def _levenshtein(table: np.ndarray, tokens: np.ndarray, lengths: np.ndarray, gamma: float) -> np.ndarray:
    """Kuditipudi et al.'s alignment statistic for a padded batch ``(B, T)``, all ``m`` offsets at once.

    ``A[i][j]`` (``i`` text tokens against ``j`` key rows) is computed one anti-diagonal ``d = i + j`` at a time;
    every array is laid out ``(i, B, offset)``. A text of length ``T_b`` reads its answer ``A[T_b][T_b]`` off
    diagonal ``2 T_b``: ``A[i][j]`` depends on tokens ``< i`` and key rows ``< j`` only, so the padding after it never
    reaches it."""
    batch, length = tokens.shape
    m, dtype = table.shape[1], table.dtype
    width = m + length - 1
    # cost[i, b, o, j] = log(1 - xi[(o + j - 1) % m, x_b[i - 1]]) = ext[i - 1, b, o + j - 1]
    ext = np.ascontiguousarray(_costs(table, tokens, width).transpose(1, 0, 2))  # (T, B, W)
    flat, item = ext.reshape(-1), ext.itemsize
    row = batch * width
    prev2, prev1, cur, tmp = (np.empty((length + 1, batch, m), dtype) for _ in range(4))
    prev1[0] = 0.0  # d = 0
    prev2, prev1 = prev1, prev2
    prev1[0] = prev1[1] = gamma  # d = 1: A[0][1] and A[1][0]
    done = {}
    for b, t in enumerate(lengths.tolist()):
        done.setdefault(2 * t, []).append(b)
    out = np.empty(batch, dtype=np.float64)
    for d in range(2, 2 * length + 1):
        lo, hi = max(1, d - length), min(length, d - 1)
        # cells (i, d - i) for i in lo..hi: cost[i] = ext[i - 1, :, d - i - 1 + o], i.e. stride row - 1 along i
        start = lo * (row - 1) + d - 1 - row
        cost = as_strided(flat[start:], (hi - lo + 1, batch, m), ((row - 1) * item, width * item, item))
        gap, new = tmp[lo : hi + 1], cur[lo : hi + 1]
        np.minimum(prev1[lo - 1 : hi], prev1[lo : hi + 1], out=gap)  # A[i-1][j] and A[i][j-1]
        if gamma:
            gap += gamma
        np.add(prev2[lo - 1 : hi], cost, out=new)  # A[i-1][j-1] + cost
        np.minimum(new, gap, out=new)
        if d <= length:
            cur[0] = cur[d] = d * gamma
        for b in done.get(d, ()):
            out[b] = cur[d // 2, b].min()
        prev2, prev1, cur = prev1, cur, prev2
    return out


def statistics(
    key: KTHKey,
    sequences: Sequence[Sequence[int]],
    method: str = "levenshtein",
    gamma: float = 0.0,
    *,
    dtype: str = "float64",
    chunk: int = 8,
) -> list[float]:
    """Detection statistic of each token sequence (lower = more watermarked), minimised over all ``m`` key offsets.

    ``method`` is ``"min-offset"`` (``min_j sum_t log(1 - xi[(t + j) % m, x_t])``) or ``"levenshtein"`` (Gu et al.'s
    detector; ``gamma`` = insertion/deletion cost, 0 in Gu et al.). Texts are scored ``chunk`` at a time, grouped by
    length; each needs at least one token. ``dtype`` ``"float32"`` is about twice as fast and carries rounding errors
    of about 1e-4 on 200 tokens (the reference Cython accumulates in float32 too)."""
    if method not in METHODS:
        raise ValueError(f"unknown KTH statistic {method!r}; known: {list(METHODS)}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    arrays = _check_sequences(sequences)
    ids = np.unique(np.concatenate(arrays))
    ids = ids[ids < key.vocab_size]
    table = _cost_table(key, ids, np.dtype(dtype).name)
    pad = len(ids)  # the zero row; ids >= V map there too
    out = np.empty(len(arrays), dtype=np.float64)
    order = sorted(range(len(arrays)), key=lambda i: len(arrays[i]))
    for begin in range(0, len(order), chunk):
        members = order[begin : begin + chunk]
        lengths = np.array([len(arrays[i]) for i in members])
        tokens = np.full((len(members), lengths.max()), pad, dtype=np.int64)
        for row, i in enumerate(members):  # (each id as its row of the table: ids >= V find the zero row)
            tokens[row, : lengths[row]] = np.searchsorted(ids, arrays[i])
        if method == "min-offset":
            out[members] = _min_offset(table, tokens)
        else:
            out[members] = _levenshtein(table, tokens, lengths, float(gamma))
    return out.tolist()


def null_key(key: KTHKey, index: int) -> KTHKey:
    """The ``index``-th key drawn afresh for ``key``'s permutation test: the same shape, a seed from a hash of the
    key's seed and ``index`` (never a small seed another watermark would use)."""
    digest = hashlib.sha256(f"kth-null:{key.seed}:{index}".encode()).digest()
    return replace(key, seed=int.from_bytes(digest[:8], "little") >> 1)


def null_workers(key: KTHKey, memory: int = 2 << 30) -> int:
    """Threads for the null keys of ``permutation_p``: the cores this process may use, at most 8, and as many as the
    keys' transient arrays fit in ``memory`` (``KTHKey.table_bytes``: 394 MB at LLaMA-3's vocabulary)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, 8, memory // key.table_bytes()))


def permutation_p(
    key: KTHKey, sequences: Sequence[Sequence[int]], method: str, gamma: float, null_keys: int, progress=None
) -> dict:
    """Kuditipudi et al.'s permutation test of a key, pooled over texts: the texts' summed statistic under ``key``
    against the same sum under ``null_keys`` keys drawn afresh (``null_key``). Where the texts do not depend on the
    key, the ``null_keys + 1`` sums are exchangeable, so ``p = (1 + #{null sums <= the key's}) / (null_keys + 1)`` is
    exact whatever wrote the texts (ties count against the key). The same keys give each text its own permutation
    p-value (``per_text``: its statistic against its statistics under the null keys), exact for that text alone.
    ``progress(n)`` is called after each null key.

    The null keys are scored on ``null_workers`` threads (numpy's array operations, where the time goes, release the
    GIL: 1.6x on 2 cores); each key's statistics are computed as alone, so the result is the same bit for bit."""
    observed = np.asarray(statistics(key, sequences, method, gamma))

    def null_stats(index: int) -> np.ndarray:
        return np.asarray(statistics(null_key(key, index), sequences, method, gamma))

    null = []
    with ThreadPoolExecutor(null_workers(key)) as pool:
        for stats in pool.map(null_stats, range(null_keys)):  # (in order: the same list as one thread makes)
            null.append(stats)
            if progress is not None:
                progress(1)
    null_arr = np.asarray(null).reshape(null_keys, len(observed))
    sums, total = null_arr.sum(axis=1), float(observed.sum())
    spread = float(sums.std(ddof=1)) if null_keys > 1 else 0.0
    return {
        "p_value": float((1 + np.sum(sums <= total)) / (null_keys + 1)),
        "per_text": ((1 + (null_arr <= observed).sum(axis=0)) / (null_keys + 1)).tolist(),
        "sum": total,
        "null_mean": float(sums.mean()),
        "null_sd": spread,
        # how many null standard deviations below the null keys' mean the key's sum lies (higher = watermarked)
        "z": float((sums.mean() - total) / spread) if spread > 0 else 0.0,
    }


def p_values(stats: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Gu et al.'s empirical p-value ``(1 + #{reference < d}) / (N + 1)`` of each statistic ``d`` against ``N``
    reference statistics of non-watermarked texts (never below ``1 / (N + 1)``). It holds its level only for a text
    exchangeable with the reference texts (human texts of the same kind and length); a model's texts are not, and
    the tiny base's were flagged 7% at a stated 1%: the detectors keep it as ``p_value_gu``, not as a p-value."""
    ref = np.sort(np.asarray(reference, dtype=np.float64))
    if len(ref) == 0:
        raise ValueError("p-values need at least one reference statistic")
    if np.isnan(ref).any():
        raise ValueError("reference statistics contain NaN")
    below = np.searchsorted(ref, np.asarray(stats, dtype=np.float64), side="left")
    return ((1 + below) / (len(ref) + 1)).tolist()


def statistic_loop(xi: np.ndarray, tokens: Sequence[int], method: str = "levenshtein", gamma: float = 0.0) -> float:
    """One text's statistic straight from the definitions, in plain Python loops (for tests and the benchmark).

    ``xi`` is the ``(m, V)`` key as numpy; ids ``>= V`` cost 0 as in :func:`statistics`."""
    if method not in METHODS:
        raise ValueError(f"unknown KTH statistic {method!r}; known: {list(METHODS)}")
    tokens = [int(t) for t in tokens]
    m, vocab = xi.shape
    length = len(tokens)
    if length == 0:
        raise ValueError("text has length 0: KTH needs at least 1 token to score a text")

    def cost(row: int, token: int) -> float:
        return math.log(1.0 - float(xi[row, token])) if token < vocab else 0.0

    best = math.inf
    for j in range(m):
        if method == "min-offset":
            total = sum(cost((t + j) % m, x) for t, x in enumerate(tokens))
        else:
            # key window y[k] = xi[(j + k) % m]; c[i][k] = log(1 - y[k, x_i])
            c = [[cost((j + k) % m, x) for k in range(length)] for x in tokens]
            above = [k * gamma for k in range(length + 1)]  # A[i - 1][:]
            for i in range(1, length + 1):
                here = [i * gamma] + [0.0] * length
                ci = c[i - 1]
                for k in range(1, length + 1):
                    here[k] = min(above[k] + gamma, here[k - 1] + gamma, above[k - 1] + ci[k - 1])
                above = here
            total = above[length]
        best = min(best, total)
    return best
