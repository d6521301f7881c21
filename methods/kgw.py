"""The KGW watermark (Kirchenbauer et al.): green lists, the distillation teacher, and the detector.

Green lists are bit-compatible with lm-watermarking's seeding schemes ``simple_0`` (one fixed list),
``simple_1`` and ``simple_2`` (Additive-LeftHash over the previous 1 or 2 ids): the generator is a CPU
``torch.Generator`` seeded with ``hash_key * sum(context ids)`` (``hash_key`` alone for ``simple_0``), and the green
list is the first ``int(gamma * vocab_size)`` entries of ``torch.randperm(vocab_size)``.

Written here rather than imported because no maintained package exposes batched green lists: lm-watermarking and
Gu et al. seed one generator per position, and Gu et al. precompute a ``(k*V) x V`` mask (16 GB for a 128k
vocabulary). Here a batch's distinct seeds are computed once each and cached.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import torch

HASH_KEY = 15485863  # lm-watermarking's default hash key: the paper's, and public
# A key of one's own (``secret_hash_key``) has this many bits: the seeds ``hash_key * sum(context ids)`` stay below
# 2**63 (int64 tensors) for any context sum below 2**23, two ids of a vocabulary of up to 4M tokens.
SECRET_KEY_BITS = 40
# seeding scheme -> (context width, whether the seed depends on the context)
SEEDING_SCHEMES = {"simple_0": (1, False), "simple_1": (1, True), "simple_2": (2, True)}


@dataclass(frozen=True)
class KGWKey:
    """Everything a KGW detector needs; saved next to a watermarked model as its key."""

    gamma: float
    delta: float
    seeding_scheme: str
    vocab_size: int  # size of the permutation: len(tokenizer.get_vocab()), as in Gu et al.
    hash_key: int = HASH_KEY
    # Ids removed from every green list, and contexts ending in them get no green list (Gu et al.'s distillation).
    excluded_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.seeding_scheme not in SEEDING_SCHEMES:
            raise ValueError(f"unknown seeding scheme {self.seeding_scheme!r}; known: {sorted(SEEDING_SCHEMES)}")
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {self.gamma}")
        if not 1 <= self.hash_key or self.hash_key * self.context_width * self.vocab_size >= 2**63:
            raise ValueError(f"hash key {self.hash_key} must be at least 1 and keep its seeds below 2**63")

    @property
    def context_width(self) -> int:
        return SEEDING_SCHEMES[self.seeding_scheme][0]

    @property
    def greenlist_size(self) -> int:
        return int(self.gamma * self.vocab_size)

    def to_dict(self) -> dict:
        return {"scheme": "kgw", **asdict(self), "excluded_ids": list(self.excluded_ids)}

    @classmethod
    def from_dict(cls, data: dict) -> KGWKey:
        data = {k: v for k, v in data.items() if k != "scheme"}
        return cls(**{**data, "excluded_ids": tuple(data.get("excluded_ids", ()))})


def secret_hash_key(seed: int) -> int:
    """A hash key of one's own, drawn from ``seed`` (a number kept secret): ``SECRET_KEY_BITS`` bits of a SHA-256 of
    it, never 0 (which would give every context one list); any seed, small ones included, spreads over the range."""
    digest = hashlib.sha256(f"kgw-hash-key:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**SECRET_KEY_BITS - 1) + 1


# The largest bit-packed table of green lists built (``table_bytes``): LLaMA-3's 128,256 ids make 2.1 GB; Gemma 3's
# 262,144 would make 8.6 GB (on disk in the store, and in memory), where the on-the-fly lists cost a draw per new
# context instead. Both give the same lists, so this chooses speed and memory, never a result.
MAX_TABLE_BYTES = 4 * 2**30


def packable(key: KGWKey) -> bool:
    """Whether every green list of ``key`` fits one table row per vocabulary id: ``simple_0`` (one list) and
    ``simple_1`` (the seed depends on the previous id alone) up to ``MAX_TABLE_BYTES``; ``simple_2``, and a table past
    the bound, keep the on-the-fly cache."""
    return key.seeding_scheme in ("simple_0", "simple_1") and table_bytes(key) <= MAX_TABLE_BYTES


def table_bytes(key: KGWKey) -> int:
    """The size of ``key``'s bit-packed table: a row of ceil(V / 8) bytes per row (``table_rows``)."""
    return table_rows(key) * ((key.vocab_size + 7) // 8)


def table_rows(key: KGWKey) -> int:
    return 1 if key.seeding_scheme == "simple_0" else key.vocab_size


def _pack_rows(key: KGWKey, path: str, start: int, stop: int) -> None:
    """Rows ``start:stop`` of the packed table in the ``.npy`` at ``path``: row v holds the list of seed
    ``hash_key * v`` (``hash_key`` for ``simple_0``), drawn with the CPU ``randperm`` exactly as lm-watermarking."""
    import numpy as np

    table = np.load(path, mmap_mode="r+")
    greens = GreenLists(key)
    row = np.zeros(key.vocab_size, dtype=bool)
    for v in range(start, stop):
        seed = key.hash_key if key.seeding_scheme == "simple_0" else key.hash_key * v
        row[:] = False
        row[greens.green_ids(seed).numpy()] = True
        table[v] = np.packbits(row, bitorder="little")
    table.flush()


def build_green_table(key: KGWKey, path, workers: int | None = None, progress=None) -> None:
    """Write every green list of ``key`` (``packable``) bit-packed to ``path`` (``.npy``, uint8, rows x ceil(V/8);
    bit i of byte j is id 8j + i; 2 GB for V = 128,256), rows drawn by ``workers`` threads (torch's ``randperm``
    releases the GIL). Exclusions are not applied: they are the key's, applied at lookup."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    if not packable(key):
        raise ValueError(f"seeding scheme {key.seeding_scheme} has no table of one list per id")
    rows = table_rows(key)
    np.lib.format.open_memmap(str(path), mode="w+", dtype=np.uint8, shape=(rows, (key.vocab_size + 7) // 8)).flush()
    workers = max(1, min(workers or os.cpu_count() or 1, rows))
    bounds = [rows * i // (workers * 8) for i in range(workers * 8 + 1)]  # small chunks: a progress line per chunk
    chunks = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    with ThreadPoolExecutor(workers) as pool:
        done = pool.map(lambda ab: _pack_rows(key, str(path), *ab), chunks)
        for (a, b), _ in zip(chunks, done, strict=True):
            if progress:
                progress(b - a)


def load_green_table(path, device: str | torch.device = "cpu") -> torch.Tensor:
    """A table of ``build_green_table`` as a uint8 tensor on ``device``."""
    import numpy as np

    return torch.from_numpy(np.load(str(path))).to(device)


TABLE_FILE = "green_table.npy"


def green_lists(key: KGWKey, stage=None, device: str = "cpu") -> GreenLists:
    """The green lists of ``key``: from its bit-packed table where the scheme has one and a store is at hand
    (``stage``, ``MethodStages.aux_stage`` or ``DetectContext.stage``: the table is built once per key and shared by
    training and detection), else computed on the fly."""
    if stage is None or not packable(key):
        return GreenLists(key)
    spec = {k: v for k, v in key.to_dict().items() if k in ("gamma", "seeding_scheme", "vocab_size", "hash_key")}

    def build(out) -> dict:
        import time

        start = time.time()
        build_green_table(key, out / TABLE_FILE)
        return {"rows": table_rows(key), "bytes": (out / TABLE_FILE).stat().st_size, "seconds": time.time() - start}

    folder = stage("kgw-green-table", {"key": spec}, build, f"KGW green lists (V={key.vocab_size})")
    return GreenLists(key, table=load_green_table(folder / TABLE_FILE, device))


class GreenLists:
    """Green-list masks of one key: looked up in a bit-packed table of all lists when one is given (``table``, from
    ``build_green_table``; gather + unpack, on the table's device), else computed on the fly and cached by seed."""

    def __init__(self, key: KGWKey, cache_bytes: int = 1 << 30, table: torch.Tensor | None = None):
        self.key = key
        self.cache_size = max(1, cache_bytes // key.vocab_size)  # one byte per vocabulary entry and cached seed
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._generator = torch.Generator(device="cpu")
        if table is not None and (
            not packable(key) or tuple(table.shape) != (table_rows(key), (key.vocab_size + 7) // 8)
        ):
            raise ValueError(f"a green table of shape {tuple(table.shape)} does not fit key {key}")
        self.table = table
        self._excluded = torch.tensor(key.excluded_ids, dtype=torch.long)

    def _rows(self, windows: torch.Tensor) -> torch.Tensor:
        """Table row of each context window ``(..., width)``: its last id (``simple_1``), or 0 (``simple_0``)."""
        last = windows[..., -1].long()
        return torch.zeros_like(last) if self.key.seeding_scheme == "simple_0" else last

    def _unpacked(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """Boolean masks ``(..., width)`` of table rows ``rows``: gather the packed rows, then unpack their bits."""
        table = self.table
        packed = table[rows.to(table.device).clamp_(0, table.shape[0] - 1)]
        bits = (packed.unsqueeze(-1) >> torch.arange(8, device=table.device, dtype=torch.uint8)) & 1
        masks = bits.flatten(-2)[..., : self.key.vocab_size].bool()
        if self.key.excluded_ids:
            masks[..., self._excluded.to(table.device)] = False
        if width > self.key.vocab_size:
            masks = torch.nn.functional.pad(masks, (0, width - self.key.vocab_size))
        return masks

    def seeds(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Seed of every full context, shape ``(..., T - width + 1)``: column j hashes ids j .. j + width - 1."""
        return self.hash(input_ids.long().unfold(-1, self.key.context_width, 1))

    def hash(self, windows: torch.Tensor) -> torch.Tensor:
        """Seeds of context windows ``(..., width)``: Additive-LeftHash, or the bare key for ``simple_0``."""
        if not SEEDING_SCHEMES[self.key.seeding_scheme][1]:
            return torch.full(windows.shape[:-1], self.key.hash_key, dtype=torch.long, device=windows.device)
        # hash_key * sum < 2**63 for any real vocabulary, so lm-watermarking's "% (2**64 - 1)" is a no-op here.
        return self.key.hash_key * windows.long().sum(-1)

    def green_ids(self, seed: int) -> torch.Tensor:
        """The green ids for one seed, exactly as lm-watermarking draws them (before any exclusion)."""
        self._generator.manual_seed(seed % (2**64 - 1))
        perm = torch.randperm(self.key.vocab_size, generator=self._generator)
        return perm[: self.key.greenlist_size]

    def _mask_for_seed(self, seed: int) -> torch.Tensor:
        mask = self._cache.get(seed)
        if mask is None:
            mask = torch.zeros(self.key.vocab_size, dtype=torch.bool)
            mask.index_fill_(0, self.green_ids(seed), True)  # 20x faster than mask[ids] = True on CPU
            if self.key.excluded_ids:
                mask.index_fill_(0, self._excluded, False)
            self._cache[seed] = mask
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(seed)
        return mask

    def masks(self, input_ids: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """Boolean green masks ``(..., T - width + 1, W)`` for every full context in ``input_ids``.

        ``width`` pads the vocabulary axis (a model may have more logits than the tokenizer has ids); padded
        columns are never green.
        """
        windows = input_ids.long().unfold(-1, self.key.context_width, 1)
        if self.table is not None:
            masks = self._unpacked(self._rows(windows), width or self.key.vocab_size).to(input_ids.device)
            return masks & self._has_list(windows).unsqueeze(-1)
        unique, inverse = torch.unique(self.hash(windows).cpu(), return_inverse=True)
        table = torch.zeros(len(unique), width or self.key.vocab_size, dtype=torch.bool)
        for row, seed in enumerate(unique.tolist()):
            table[row, : self.key.vocab_size] = self._mask_for_seed(seed)
        masks = table.to(input_ids.device)[inverse.to(input_ids.device)]
        return masks & self._has_list(windows).unsqueeze(-1)

    def _has_list(self, windows: torch.Tensor) -> torch.Tensor:
        """False for context windows ``(..., width)`` whose last id is excluded (Gu et al.: no green list at all)."""
        last = windows[..., -1]
        if not self.key.excluded_ids:
            return torch.ones_like(last, dtype=torch.bool)
        return ~torch.isin(last, torch.tensor(self.key.excluded_ids, device=windows.device))

    def hits(self, contexts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Whether each ``targets[i]`` is green for the context ending at ``contexts[i]``'s window, for flat 1-D
        tensors of full-context windows ``(N, width)`` and ids ``(N,)``. Looks up one cached list per distinct seed,
        so scoring never builds an ``N x V`` mask."""
        if self.table is not None:
            table = self.table
            targets_on = targets.long().to(table.device)
            inside = targets_on < self.key.vocab_size
            safe = torch.where(inside, targets_on, 0)
            byte = table[self._rows(contexts).to(table.device).clamp_(0, table.shape[0] - 1), safe >> 3]
            hit = ((byte >> (safe & 7).to(torch.uint8)) & 1).bool() & inside
            if self.key.excluded_ids:
                hit &= ~torch.isin(targets_on, self._excluded.to(table.device))
            return hit.cpu() & self._has_list(contexts)
        seeds = self.hash(contexts)
        out = torch.zeros(len(targets), dtype=torch.bool)
        unique, inverse = torch.unique(seeds, return_inverse=True)
        order = torch.argsort(inverse)
        for seed, idx in zip(unique.tolist(), torch.split(order, torch.bincount(inverse).tolist()), strict=True):
            inside = targets[idx] < self.key.vocab_size
            out[idx[inside]] = self._mask_for_seed(seed)[targets[idx[inside]]]
        return out & self._has_list(contexts)


def watermark_logits(greens: GreenLists, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KGW teacher logits: ``logits + delta`` on the green ids of each position's context (positions without a full
    context keep their logits). ``logits`` is ``(B, T, V_model)`` for ``input_ids`` ``(B, T)``."""
    start = greens.key.context_width - 1
    masks = greens.masks(input_ids, width=logits.shape[-1])
    out = logits.clone()
    out[:, start:, :] += greens.key.delta * masks.to(logits.dtype)
    return out


@dataclass
class KGWScore:
    """Detection result for one text."""

    num_scored: int
    num_green: int
    z_score: float
    p_value: float  # exact one-sided binomial P(X >= G) over the distinct units (``units``, ``units_green``)
    p_value_gu: float  # Gu et al.'s binom.sf(G, T, gamma) = P(X > G) over every position: not a valid p-value
    prefix: list[float] = field(default_factory=list)  # the z-score of the text's first 1, 2, ..., len tokens
    units: int = 0  # distinct (green list, token) pairs: what ``p_value`` counts (``count_units``)
    units_green: int = 0


def score_sequences(
    greens: GreenLists, sequences: list[list[int]], ignore_repeated_ngrams: bool = False
) -> list[KGWScore]:
    """Score token-id sequences (completions only, never the prompt).

    T = positions with a full context (length - width), G = green tokens among them; the score is the z-score over
    them, as lm-watermarking (with ``ignore_repeated_ngrams`` each distinct (width+1)-gram counts once, as its
    ``ignore_repeated_ngrams``). The p-value is the exact binomial P(X >= G') over the text's distinct units, the
    units of ``pooled_score`` (``count_units``): a text that repeats a (context, token) pair repeats its green
    luck, which counting every position takes for new evidence (the default KGW key flagged 23.9% of human
    docstrings at a nominal 1% so). Gu et al.'s ``binom.sf(G, T, gamma)`` = P(X > G) over every position is kept as
    ``p_value_gu`` for comparison with their numbers; it is no p-value (2% of human text under 1%). All sequences
    are looked up in one batch.
    """
    from scipy.stats import binom

    key = greens.key
    width, gamma = key.context_width, key.gamma
    if any(len(seq) <= width for seq in sequences):
        short = min(len(seq) for seq in sequences)
        raise ValueError(f"need more than {width} tokens to score a text, got {short}")
    windows = [torch.tensor(seq, dtype=torch.long).unfold(0, width + 1, 1) for seq in sequences]  # context + target
    flat = torch.cat(windows)
    hits = greens.hits(flat[:, :width], flat[:, width]).split([len(w) for w in windows])
    out = []
    for win, hit in zip(windows, hits, strict=True):
        counted = torch.ones(len(hit), dtype=torch.bool)
        if ignore_repeated_ngrams:  # each distinct (width+1)-gram counts at its first position
            seen: set = set()
            for j, gram in enumerate(map(tuple, win.tolist())):
                counted[j] = gram not in seen
                seen.add(gram)
        num_scored, num_green = int(counted.sum()), int((hit & counted).sum())
        z = (num_green - gamma * num_scored) / (num_scored * gamma * (1 - gamma)) ** 0.5
        units, units_green = count_units(greens, win, hit)
        p_exact = float(binom.sf(units_green - 1, units, gamma)) if units else 1.0
        p_gu = float(binom.sf(num_green, num_scored, gamma))
        prefix = prefix_z(hit, counted, width, gamma)
        out.append(KGWScore(num_scored, num_green, float(z), p_exact, p_gu, prefix, units, units_green))
    return out


def count_units(greens: GreenLists, windows: torch.Tensor, hit: torch.Tensor) -> tuple[int, int]:
    """How many of ``windows`` (rows of context + target ids) are distinct units, and how many of those are green
    (``hit``: each window's target is green). A unit is a distinct (seed, token) pair: a token is green or not as
    a function of its green list's seed and of itself alone, so that is what is independent under the null. With
    one fixed list (``simple_0``) that is each distinct token: counting distinct bigrams there (what Kirchenbauer
    et al.'s repeated-n-gram rule does) counts a frequent token once per context, and a key whose list holds "the"
    flagged human text at p = 5e-11. Additive hashing (``simple_2``) gives (a, b) and (b, a) one seed, so they are
    one unit too. Positions with no green list (a context ending in an excluded id) and excluded targets, never
    green, are not counted. Under the null each unit is green with probability ``int(gamma V) / V <= gamma`` and
    units of one seed are drawn without replacement, so the binomial p-value at gamma is conservative."""
    width = greens.key.context_width
    contexts, targets = windows[:, :width], windows[:, width]
    keep = greens._has_list(contexts)
    if greens.key.excluded_ids:
        keep &= ~torch.isin(targets, torch.tensor(greens.key.excluded_ids, dtype=torch.long))
    _, first = _first_rows(torch.stack([greens.hash(contexts), targets], 1)[keep])
    return len(first), int(hit[keep][first].sum())


def prefix_z(hit: torch.Tensor, counted: torch.Tensor, width: int, gamma: float) -> list[float]:
    """The z-score of the first ``L`` tokens of a text, for L = 1 .. width + len(hit): 0 until a position is scored
    (tokens-to-detect and TPR by text length read it; rounded to 4 decimals to keep the stored scores small)."""
    scored = torch.cumsum(counted.double(), 0)
    green = torch.cumsum((hit & counted).double(), 0)
    z = (green - gamma * scored) / (scored.clamp(min=1) * gamma * (1 - gamma)).sqrt()
    return [0.0] * width + [round(v, 4) for v in z.tolist()]


def pooled_score(greens: GreenLists, sequences: list[list[int]]) -> KGWScore:
    """All ``sequences`` scored as one text over their distinct units (``count_units``): each (seed, token) pair
    over all texts counts once, and the exact binomial p-value at gamma is conservative under the null."""
    from scipy.stats import binom

    width, gamma = greens.key.context_width, greens.key.gamma
    windows = [torch.tensor(seq, dtype=torch.long).unfold(0, width + 1, 1) for seq in sequences if len(seq) > width]
    if not windows:
        return KGWScore(0, 0, 0.0, 1.0, 1.0)
    flat = torch.cat(windows)
    num_scored, num_green = count_units(greens, flat, greens.hits(flat[:, :width], flat[:, width]))
    if not num_scored:
        return KGWScore(0, 0, 0.0, 1.0, 1.0)
    z = (num_green - gamma * num_scored) / (num_scored * gamma * (1 - gamma)) ** 0.5
    p_exact, p_gu = binom.sf([num_green - 1, num_green], num_scored, gamma)
    return KGWScore(num_scored, num_green, float(z), float(p_exact), float(p_gu), [], num_scored, num_green)


def _first_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of a 2-D tensor and the index of each one's first occurrence."""
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    first = torch.full((len(unique),), len(rows), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(rows)), reduce="amin"
    )
    return unique, first
