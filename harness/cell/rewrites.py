"""What a text attack's stage stores: the unaltered model's generations with their completions rewritten by the
attack, tokenized again with the base tokenizer, and measured against the originals: how much was rewritten
(unigram overlap), how much meaning was kept (cosine similarity of sentence embeddings) and, where the attack says
it, what it applied to each text."""

from __future__ import annotations

from harness.assets import textsim


def rewrite(attack, gens: list[dict], ctx, tokenizer, similarity_model: str) -> tuple[list[dict], dict]:
    """The rows of ``gens`` with ``attack``'s rewrites (``ctx``: its ``AttackContext``) as their completions, and the
    stage's report (how many texts, and the similarity measures' summary). The human texts stay as they are."""
    texts, applied = attack.apply_texts_measured([g["completion"] for g in gens], ctx)
    if len(texts) != len(gens):
        raise RuntimeError(f"attack {attack.name} returned {len(texts)} texts for {len(gens)}")
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    originals = [g["completion"] for g in gens]
    overlap = [textsim.unigram_overlap(a, b) for a, b in zip(originals, texts, strict=True)]
    cosine = textsim.embedding_cosine(originals, texts, similarity_model, ctx.device)
    rows = [
        {**g, "completion": t, "completion_ids": i, "original_completion": g["completion"],
         "unigram_overlap": o, "embedding_cosine": c}
        for g, t, i, o, c in zip(gens, texts, ids, overlap, cosine, strict=True)
    ]  # fmt: skip
    for row, done in zip(rows, applied or [], strict=False):  # an edit's rate as applied, text by text
        row["edit"] = done
    return rows, {"texts": len(rows), **textsim.summary(overlap, cosine, applied)}
