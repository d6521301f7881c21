"""Detection and quality metrics (paper Section 4.1): ROC AUC, TPR at fixed FPRs, median perplexity; and a run's
metrics from what it stores, which is all ``harness rescore`` and the tables read."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.store.files import read_jsonl

FPRS = (0.001, 0.01, 0.05, 0.1)
# Bump when the code that turns stored per-text scores into metrics changes: runs keep their hash and are brought up
# to date from their scores (``harness rescore``), with no detector or model loaded.
METRICS_VERSION = "1"


def tpr_at_fpr(pos: np.ndarray, neg: np.ndarray, fpr: float) -> float:
    """TPR at the empirical threshold from the negatives: the best TPR among thresholds whose FPR <= ``fpr``. Every
    threshold is kept (``drop_intermediate=False``): with tied scores, common for z-scores of fixed-length texts,
    the default thinning can drop the very operating point asked for."""
    from sklearn.metrics import roc_curve

    labels = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    fp, tp, _ = roc_curve(labels, np.r_[pos, neg], drop_intermediate=False)
    return float(tp[fp <= fpr].max())


def bootstrap_aucs(samples: np.ndarray, n_pos: int) -> np.ndarray:
    """ROC AUC of each row of ``samples`` (first ``n_pos`` columns positives, the rest negatives) in one pass:
    the Mann-Whitney statistic from average ranks, which is what ``roc_auc_score`` computes (ties count a half)."""
    from scipy.stats import rankdata

    if len(samples) == 0:
        return np.zeros(0)
    n_neg = samples.shape[1] - n_pos
    ranks = rankdata(samples, axis=1)
    return (ranks[:, :n_pos].sum(axis=1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def detection_metrics(
    pos: list[float],
    neg: list[float],
    pos_p: list[float] | None = None,
    neg_p: list[float] | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
) -> dict:
    """Metrics of detector scores on watermarked (``pos``) vs human (``neg``) texts; higher score = watermarked.

    With p-values, also the analytic TPR (p <= target FPR) and the FPR that threshold really gives on the negatives.
    ``auc_ci95``: percentile bootstrap over both sets.
    """
    from sklearn.metrics import roc_auc_score

    pos_a, neg_a = np.asarray(pos, float), np.asarray(neg, float)
    labels = np.r_[np.ones(len(pos_a)), np.zeros(len(neg_a))]
    scores = np.r_[pos_a, neg_a]
    out: dict = {"n_pos": len(pos_a), "n_neg": len(neg_a), "auc": float(roc_auc_score(labels, scores))}
    rng = np.random.default_rng(seed)
    draws = [np.r_[rng.choice(pos_a, len(pos_a)), rng.choice(neg_a, len(neg_a))] for _ in range(bootstrap)]
    aucs = bootstrap_aucs(np.array(draws).reshape(bootstrap, -1), len(pos_a))
    out["auc_ci95"] = [float(np.percentile(aucs, 2.5)), float(np.percentile(aucs, 97.5))]
    for f in FPRS:
        out[f"tpr@{f:g}"] = tpr_at_fpr(pos_a, neg_a, f)
    if pos_p is not None and neg_p is not None:
        pp, np_ = np.asarray(pos_p, float), np.asarray(neg_p, float)
        for f in FPRS:
            out[f"tpr_analytic@{f:g}"] = float((pp <= f).mean())
            out[f"fpr_analytic@{f:g}"] = float((np_ <= f).mean())
    return out


def median(values: list[float]) -> float:
    return float(np.median(np.asarray(values, float)))


def run_metrics(folder: Path) -> dict:
    """A run's metrics from what it stores: its per-text scores (``scores.jsonl``: label 1 = generated, with the
    oracle's perplexity; 0 = human) and, for text attacks, how much each text was rewritten (``generations.jsonl``)."""
    scores = read_jsonl(folder / "scores.jsonl")
    pos = [s for s in scores if s["label"] == 1]
    neg = [s for s in scores if s["label"] == 0]
    has_p = all("p_value" in s for s in scores)  # exact P(X >= G) where the scheme has one
    result = detection_metrics(
        [s["score"] for s in pos],
        [s["score"] for s in neg],
        [s["p_value"] for s in pos] if has_p else None,
        [s["p_value"] for s in neg] if has_p else None,
    )
    if all("ppl" in s for s in pos):  # attribution scores carry none
        result["median_ppl"] = median([s["ppl"] for s in pos])
    gens = read_jsonl(folder / "generations.jsonl")
    if gens and "unigram_overlap" in gens[0]:  # a text attack: how much it rewrote, and how much meaning it kept
        from harness.report import textsim

        result["paraphrase"] = textsim.summary(
            [g["unigram_overlap"] for g in gens], [g["embedding_cosine"] for g in gens]
        )
    result["metrics_version"] = METRICS_VERSION
    return result
