"""What a run's texts look like beyond their perplexity, from their stored token ids: repetition and diversity, so
that a model that collapsed into a loop (low perplexity under a judge that likes its favourite tokens) or into token
noise is seen as such (``harness.config.gate.QualityGate`` keeps such rows out of every ranking).

``rep3`` is Welleck et al.'s seq-rep-3 ("Neural Text Generation with Unlikelihood Training", ICLR 2020): the share of
a text's 3-grams that repeat an earlier 3-gram of the same text, 1 - |distinct 3-grams| / |3-grams|; ``distinct1`` and
``distinct2`` are Li et al.'s distinct-n (NAACL 2016) taken per text, |distinct n-grams| / |n-grams|. Each is the mean
over the texts long enough to hold an n-gram. Written here because they are three lines of counting on ids the run
already stores; the libraries that compute them (nltk, torchmetrics) tokenize text themselves, which would measure
another footing than the model's own tokens.
"""

from __future__ import annotations


def ppl_ratio(ppl, base_ppl) -> float | None:
    """A row's median PPL over its base's (the quality gate's reading); None where either is missing, not a number,
    or the base's is not positive."""
    try:
        num, den = float(ppl), float(base_ppl)
    except (TypeError, ValueError):
        return None
    return num / den if den > 0 and num == num and den == den else None


def ngram_share(ids: list[int], n: int) -> float | None:
    """|distinct n-grams| / |n-grams| of one text (None where it is shorter than ``n`` tokens)."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def text_quality(completions: list[list[int]]) -> dict:
    """``rep3``, ``distinct1``, ``distinct2`` of a run's generated texts (their token ids), means over the texts."""
    rep3 = _mean([None if (s := ngram_share(ids, 3)) is None else 1 - s for ids in completions])
    return {
        "rep3": rep3,
        "distinct1": _mean([ngram_share(ids, 1) for ids in completions]),
        "distinct2": _mean([ngram_share(ids, 2) for ids in completions]),
    }
