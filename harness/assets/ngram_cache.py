"""The n-gram side of PRO's encoder E, as tensors on E's device: exact keys for rows of token ids, their distinct rows
in order of first appearance, a least-recently-used cache of their embeddings, and the batched decoding of rows to
text. No Python runs per n-gram: a training batch's 8,192 windows at 16 x 512 (and the pool's few at each generated
token) are hashed, de-duplicated, looked up and gathered by torch operations, and only the cache's misses are decoded
(in one call to the fast tokenizer) and embedded.

Written by hand: no maintained library keeps an embedding cache keyed by token-id rows on a device. Its behaviour is
that of the ``OrderedDict`` LRU it replaces, to the bit (``tests/unit/test_pro.py``): the misses of a call are
embedded in their order of first appearance, hits count as used in that order before the misses are added, and the
least recently used entries go once the cache holds more than its capacity. So E's embeddings, and every PRO training
that reads them, are the same as before.
"""

from __future__ import annotations

# Two polynomial hashes modulo primes below 2^31, packed into one int64 key (62 bits). Each product stays below 2^62,
# so no int64 arithmetic overflows; two distinct n-grams share a key with probability about n / 2^62. A shared key
# is never trusted: every lookup compares the ids themselves, and a call whose own rows collide is de-duplicated by
# its rows instead (``distinct``).
_PRIMES = (2_147_483_647, 2_147_483_629)
_MULTIPLIERS = (1_103_515_245, 1_664_525_013)


def row_keys(rows):
    """(N,) int64 keys of the rows of ``rows`` (N, n), token ids in [0, 2^31): equal rows have equal keys."""
    keys = []
    for prime, mult in zip(_PRIMES, _MULTIPLIERS, strict=True):
        h = rows.new_zeros(rows.shape[0])
        for j in range(rows.shape[1]):  # one pass per position of the n-gram, not per n-gram
            h = (h * mult + rows[:, j] + 1) % prime
        keys.append(h)
    return keys[0] * 2**31 + keys[1]


def distinct(rows):
    """The distinct rows of ``rows`` (N, n) in order of first appearance: ``(keys (U,), firsts (U,), inverse (N,))``
    with ``rows[firsts]`` the distinct rows, ``keys`` their keys and ``rows == rows[firsts][inverse]``."""
    import torch

    keys = row_keys(rows)
    unique, inverse = torch.unique(keys, return_inverse=True)
    if not bool((rows[_firsts(inverse, len(unique))][inverse] == rows).all()):  # two rows of this call share a key
        _, inverse = torch.unique(rows, dim=0, return_inverse=True)
        unique = inverse.unique()
    firsts = _firsts(inverse, len(unique))
    order = torch.argsort(firsts)  # distinct rows in order of first appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return keys[firsts[order]], firsts[order], rank[inverse]


def _firsts(inverse, count: int):
    """For each of ``count`` groups, the first index ``i`` with ``inverse[i]`` equal to it."""
    import torch

    index = torch.arange(len(inverse), device=inverse.device)
    return torch.full((count,), len(inverse), device=inverse.device).scatter_reduce(0, inverse, index, "amin")


def decode_rows(tokenizer, rows) -> list[str]:
    """Each row of ids (a tensor) as ``tokenizer.decode(row, skip_special_tokens=False)`` gives it, in one call to
    the Rust tokenizer where that is the same text (transformers' own batch decoding loops in Python per row)."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    ids = rows.tolist()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    plain = type(tokenizer)._decode is TokenizersBackend._decode  # no decoding of its own on top of the backend's
    if backend is not None and plain and not _cleans_up(tokenizer, backend):
        return backend.decode_batch(ids, skip_special_tokens=False)
    return [tokenizer.decode(row, skip_special_tokens=False) for row in ids]


def _cleans_up(tokenizer, backend) -> bool:
    """Whether ``tokenizer.decode`` cleans up spaces after the backend's text (as transformers 5 decides it)."""
    if not tokenizer.clean_up_tokenization_spaces:
        return False
    forced = getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    return type(backend.model).__name__ != "BPE" or forced


class NgramCache:
    """Embeddings of n-grams of one length and one tokenizer, on ``device``: at most ``capacity`` of them, the least
    recently used dropped first. Storage grows as entries arrive (doubling), so an unused capacity costs nothing."""

    def __init__(self, n: int, dim: int, capacity: int, device):
        import torch

        self.n, self.dim, self.capacity, self.device = n, dim, capacity, device
        self.size = 0
        self.ids = torch.zeros(0, n, dtype=torch.long, device=device)
        self.vectors = torch.zeros(0, dim, device=device)
        self.stamps = torch.zeros(0, dtype=torch.long, device=device)  # when each entry was last used
        self.sorted_keys = torch.zeros(0, dtype=torch.long, device=device)  # the keys in order, for searchsorted
        self.sorted_slots = torch.zeros(0, dtype=torch.long, device=device)  # the slot of each sorted key
        self.clock = 0

    def __len__(self) -> int:
        return self.size

    def find(self, keys, rows):
        """``(slots, stored)`` for distinct ``rows`` (U, n) with their ``keys``: the slot holding each row (valid
        where found), whether it is found, and whether its key is taken by another row (then it is not stored)."""
        import torch

        if self.size == 0:
            nothing = torch.zeros(len(keys), dtype=torch.bool, device=keys.device)
            return torch.zeros_like(keys), nothing, nothing
        pos = torch.searchsorted(self.sorted_keys, keys).clamp(max=self.size - 1)
        slots = self.sorted_slots[pos]
        taken = self.sorted_keys[pos] == keys
        found = taken & (self.ids[slots] == rows).all(1)
        return slots, found, taken & ~found

    def touch(self, slots, order) -> None:
        """Mark ``slots`` used, the first of ``order`` (their ranks in this call) least recently."""
        self.stamps[slots] = self.clock + order

    def add(self, keys, rows, vectors, order) -> None:
        """Store new entries (keys not in the cache), used in the order of ``order``, then drop the least recently
        used entries beyond capacity."""
        import torch

        if self.capacity == 0 or len(keys) == 0:
            return
        stop = self.size + len(keys)
        if stop > len(self.ids):
            room = max(stop, 2 * len(self.ids))
            self.ids, self.vectors, self.stamps = (
                torch.cat([t[: self.size], t.new_zeros(room - self.size, *t.shape[1:])])
                for t in (self.ids, self.vectors, self.stamps)
            )
        self.ids[self.size : stop] = rows
        self.vectors[self.size : stop] = vectors
        self.stamps[self.size : stop] = self.clock + order
        slot_keys = torch.cat([self.sorted_keys.new_empty(0) if self.size == 0 else self._slot_keys(), keys])
        self.size = stop
        if self.size > self.capacity:  # keep the `capacity` most recently used, in slot order
            keep = torch.topk(self.stamps[: self.size], self.capacity).indices.sort().values
            self.ids[: self.capacity] = self.ids[keep]
            self.vectors[: self.capacity] = self.vectors[keep]
            self.stamps[: self.capacity] = self.stamps[keep]
            slot_keys = slot_keys[keep]
            self.size = self.capacity
        self.sorted_keys, slots = torch.sort(slot_keys)
        self.sorted_slots = slots

    def _slot_keys(self):
        """Each stored slot's key (the sorted index read back in slot order)."""
        import torch

        keys = torch.empty(self.size, dtype=torch.long, device=self.sorted_keys.device)
        keys[self.sorted_slots] = self.sorted_keys
        return keys
