"""Detection and quality metrics (paper Section 4.1): ROC AUC, TPR at fixed FPRs, median perplexity; and a run's
metrics from what it stores, which is all ``harness rescore`` and the tables read."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.store.files import read_jsonl

FPRS = (0.001, 0.01, 0.05, 0.1)
# Bump when the code that turns stored per-text scores into metrics changes: runs keep their hash and are brought up
# to date from their scores (``harness rescore``), with no detector or model loaded.
# 2: TPR by text length and tokens to detect; 3: tokens to detect as MarkMyWords' size; 4: repetition and diversity
METRICS_VERSION = "4"
LENGTH_FPR = 0.01  # the FPR at which tokens-to-detect and TPR by length are read


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


def versus(pos, neg) -> tuple[float | None, float | None]:
    """ROC AUC and TPR at 1% FPR of scores ``pos`` against scores ``neg`` (None, None where either is empty): a
    model's texts against the unwatermarked base's under the same detector, the model-versus-model reading."""
    if len(pos) == 0 or len(neg) == 0:
        return None, None
    from sklearn.metrics import roc_auc_score

    p, n = np.asarray(pos, float), np.asarray(neg, float)
    return float(roc_auc_score(np.r_[np.ones(len(p)), np.zeros(len(n))], np.r_[p, n])), tpr_at_fpr(p, n, 0.01)


def per_prompt(rows: list[dict], field: str) -> dict:
    """Prompt index -> ``field`` (a perplexity) of the generated text written from it, from a run's score rows."""
    return {s["i"]: s.get(field) for s in rows if s["label"] == 1 and "i" in s}


def ratio_interval(ppl: dict, base_ppl: dict, bootstrap: int = 1000, seed: int = 0) -> tuple[float, float] | None:
    """A 95% percentile interval of a row's median PPL over its base's (the quality gate's ratio) from a bootstrap
    over the prompts both continued (``ppl``, ``base_ppl``: prompt index -> the perplexity of the text written from
    it), each draw taking the same prompts on both sides; None where they share fewer than two prompts or a value is
    not a positive number. At 100 texts of a 135M model sampled at temperature 1 the median moves by tens of percent
    from draw to draw: the interval says how far the gate's reading can be trusted."""
    shared = sorted(set(ppl) & set(base_ppl))
    a, b = (np.asarray([d[i] for i in shared], float) for d in (ppl, base_ppl))
    if len(shared) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all() and (b > 0).all()):
        return None
    draws = np.random.default_rng(seed).integers(0, len(shared), size=(bootstrap, len(shared)))
    ratios = np.median(a[draws], axis=1) / np.median(b[draws], axis=1)
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def paired_bootstrap(pos_a, neg_a, pos_b, neg_b, bootstrap: int = 1000, seed: int = 0, fpr: float = 0.01) -> dict:
    """The difference between methods A and B evaluated on the same prompts, ``AUC_A - AUC_B`` and ``TPR@fpr_A -
    TPR@fpr_B``, with 95% percentile intervals from a *paired* bootstrap over prompts.

    Each argument is indexed by prompt: column ``i`` is the score of the text generated from (``pos_*``), or of the
    human continuation of (``neg_*``), prompt ``i``; the caller checks that both methods' ``i`` are the same prompts.
    A 2-D argument has a row per training seed (the same seeds, in the same order, for A and B), and the difference
    is the mean over seeds of each seed's difference. Every draw resamples prompt indices with replacement once,
    ``np.random.default_rng(seed).integers(0, n, size=(bootstrap, n))`` row by row, and takes the same indices for
    both methods, for positives and negatives and for every seed: what the two methods share (a prompt that is easy
    for both) cancels, which an interval per method cannot see. TPR is ``tpr_at_fpr``'s (empirical threshold from the
    drawn negatives). Returns ``auc_diff``, ``tpr_diff`` (point estimates on all prompts), their ``*_ci95``, and
    ``auc_diff_per_seed``, ``tpr_diff_per_seed`` (each seed's point difference), ``n`` and ``seeds``."""
    arrays = [np.atleast_2d(np.asarray(x, float)) for x in (pos_a, neg_a, pos_b, neg_b)]
    if len({a.shape for a in arrays}) != 1 or arrays[0].shape[1] == 0:
        raise ValueError(f"paired scores need one shape, one score per prompt: {[a.shape for a in arrays]}")
    seeds, n = arrays[0].shape
    rng = np.random.default_rng(seed)
    draws = np.vstack([np.arange(n), rng.integers(0, n, size=(bootstrap, n))])  # row 0: every prompt once

    def per_draw(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p, q = pos[draws], neg[draws]
        return bootstrap_aucs(np.hstack([p, q]), n), (p > _fires_above(q, fpr)[:, None]).mean(axis=1)

    auc_d, tpr_d = np.zeros((seeds, len(draws))), np.zeros((seeds, len(draws)))
    for s in range(seeds):
        auc_a, tpr_a = per_draw(arrays[0][s], arrays[1][s])
        auc_b, tpr_b = per_draw(arrays[2][s], arrays[3][s])
        auc_d[s], tpr_d[s] = auc_a - auc_b, tpr_a - tpr_b
    out: dict = {"n": n, "seeds": seeds}
    for name, d in (("auc", auc_d), ("tpr", tpr_d)):
        mean = d.mean(axis=0)
        out[f"{name}_diff"] = float(mean[0])
        out[f"{name}_diff_ci95"] = [float(np.percentile(mean[1:], 2.5)), float(np.percentile(mean[1:], 97.5))]
        out[f"{name}_diff_per_seed"] = [float(v) for v in d[:, 0]]
    return out


def independent_bootstrap(runs_a: list, runs_b: list, bootstrap: int = 1000, seed: int = 0) -> dict:
    """``AUC_A - AUC_B`` where A and B were evaluated on different prompts and human texts (chat instructions against
    documents, code against prose), with a 95% percentile interval from a bootstrap that resamples each run's
    generated and human texts on its own: nothing is shared, so nothing cancels, and the interval is wider than a
    paired one would be. ``runs_*``: ``(pos, neg)`` score lists, one per training seed (the same seeds for A and B);
    the difference is the mean over seeds. Returns ``auc_diff`` (on all texts), ``auc_diff_ci95`` and ``seeds``."""
    if len(runs_a) != len(runs_b) or not runs_a:
        raise ValueError(f"the same training seeds on both sides: {len(runs_a)} and {len(runs_b)} runs")
    rng = np.random.default_rng(seed)

    def aucs(pos, neg) -> np.ndarray:  # row 0: every text once; then ``bootstrap`` resamples
        pos, neg = np.asarray(pos, float), np.asarray(neg, float)
        if len(pos) == 0 or len(neg) == 0:
            raise ValueError("a run without generated or human scores")
        p = np.vstack([pos, rng.choice(pos, (bootstrap, len(pos)))])
        q = np.vstack([neg, rng.choice(neg, (bootstrap, len(neg)))])
        return bootstrap_aucs(np.hstack([p, q]), len(pos))

    diff = np.mean([aucs(*a) - aucs(*b) for a, b in zip(runs_a, runs_b, strict=True)], axis=0)
    return {"auc_diff": float(diff[0]), "seeds": len(runs_a),
            "auc_diff_ci95": [float(np.percentile(diff[1:], 2.5)), float(np.percentile(diff[1:], 97.5))]}  # fmt: skip


def seed_interval(values, within: tuple[float, float] = (-1.0, 1.0)) -> tuple[float, float]:
    """95% t-interval of the mean of ``values`` (one per training seed), cut to ``within`` (a rate cannot leave [0, 1],
    a difference of rates [-1, 1]); NaN with fewer than two. A bootstrap over three seeds has ten distinct resamples
    and a percentile interval far too narrow; the t-interval's width (t = 4.30 at two degrees of freedom) is the
    honest price of few seeds."""
    from scipy.stats import t

    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if len(v) < 2:
        return float("nan"), float("nan")
    half = float(t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return max(within[0], float(v.mean() - half)), min(within[1], float(v.mean() + half))


def _prefix_matrix(texts: list[dict], longest: int) -> np.ndarray:
    """Texts x lengths: each text's score over its first 1 .. ``longest`` tokens; past its own length (a paraphrase,
    deleted words), or where it stores none, its whole score."""
    out = np.empty((len(texts), longest))
    for row, s in zip(out, texts, strict=True):
        prefix = s.get("prefix_scores") or [s["score"]]
        row[: len(prefix)] = prefix[:longest]
        row[len(prefix) :] = prefix[-1]
    return out


def _fires_above(neg: np.ndarray, fpr: float):
    """The score a text must exceed to be flagged at the empirical threshold that ``tpr_at_fpr`` picks: at most
    ``floor(fpr * n)`` negatives lie at or above any threshold above it. ``neg`` 2-D: one threshold per row (an array,
    as ``paired_bootstrap`` takes them for its draws)."""
    neg = np.asarray(neg)
    allowed = int(np.floor(fpr * neg.shape[-1] + 1e-9))
    if allowed >= neg.shape[-1]:
        return np.full(neg.shape[:-1], -np.inf) if neg.ndim > 1 else -np.inf
    above = -np.sort(-neg, axis=-1)[..., allowed]
    return above if neg.ndim > 1 else float(above)


def stays_detected_from(flagged: np.ndarray) -> np.ndarray:
    """Per text (rows of a texts x lengths boolean matrix of "flagged at this length"): the length from which it stays
    flagged to its end, i.e. one more than the last length at which it is not (1 if flagged at every length); inf
    where it is not flagged on the whole text. MarkMyWords' "size" (``VerifierOutput.get_size``) is the same event:
    a text counts only if its whole-text test fires, so the share counted is that one test's rate, not the rate of
    the first of many looks; MarkMyWords reports the 0-based index of the last unflagged prefix, which is this
    length minus 2 (and 0 for a text flagged at every length, 1 here)."""
    lengths = flagged.shape[1]
    last_miss = lengths - 1 - np.argmax(~flagged[:, ::-1], axis=1)  # 0-based index of the last unflagged length
    first = np.where(flagged.all(axis=1), 1.0, last_miss + 2.0)
    return np.where(flagged[:, -1], first, np.inf)


def length_metrics(pos: list[dict], neg: list[dict], fpr: float = LENGTH_FPR, full: int | None = None) -> dict | None:
    """How detection grows with text length, from the texts' prefix scores (the detector's score over their first L
    tokens); None where the detector stores none (Gu-KTH, whose statistic is not a running one). Every length is
    read at its own threshold: the human texts' prefix scores of that length at ``fpr`` (``tpr_at_fpr``'s rule).

    ``by_length``: TPR at ``fpr`` at a quarter, a half, three quarters and all of ``full`` tokens (the setup's
    ``eval.new_tokens``, so that every run of a setup is read at the same lengths; default: the generated texts'
    median length), with Clopper-Pearson 95% intervals; each point is one test at ``fpr``.
    ``detected_by_end``: the share flagged on the whole text (its longest length), one test at ``fpr``: on
    unwatermarked text it is ``fpr`` up to sampling error.
    ``tokens_to_detect``: MarkMyWords' "size": the median over generated texts of the length from which a text flagged
    on its whole text stays flagged to its end (``stays_detected_from``; texts not flagged count as infinite, so it
    is None where fewer than half are flagged). It is not the first length at which a text crosses its threshold:
    that looks ``full`` times and flags unwatermarked text far above ``fpr``."""
    from scipy.stats import beta

    if not pos or not neg or not all("prefix_scores" in s for s in pos + neg):
        return None
    full = full or max(1, int(np.median([len(s["prefix_scores"]) or 1 for s in pos])))
    longest = max(full, *(len(s["prefix_scores"]) for s in pos + neg))
    neg_m, pos_m = _prefix_matrix(neg, longest), _prefix_matrix(pos, longest)
    thresholds = np.array([_fires_above(neg_m[:, n], fpr) for n in range(longest)])
    flagged = pos_m > thresholds
    lengths = sorted({max(1, round(full * q / 4)) for q in (1, 2, 3, 4)})
    tprs, bands = [], []
    for n in lengths:
        k = int(flagged[:, n - 1].sum())
        tprs.append(k / len(pos))
        lo = float(beta.ppf(0.025, k, len(pos) - k + 1)) if k > 0 else 0.0
        hi = float(beta.ppf(0.975, k + 1, len(pos) - k)) if k < len(pos) else 1.0
        bands.append([lo, hi])
    ttd = float(np.median(stays_detected_from(flagged)))
    return {
        f"tokens_to_detect@{fpr:g}": None if np.isinf(ttd) else ttd,
        f"detected_by_end@{fpr:g}": float(flagged[:, -1].mean()),
        "by_length": {"lengths": lengths, f"tpr@{fpr:g}": tprs, f"tpr@{fpr:g}_ci95": bands},
    }


def _new_tokens(folder: Path) -> int | None:
    """The evaluation's completion length from the stored spec of a run (or of an attribution stage)."""
    import json

    try:
        spec = json.loads((folder / "spec.json").read_text())
    except (OSError, ValueError):
        return None
    preset = spec.get("config", {}).get("preset") or spec.get("preset_settings") or {}
    return preset.get("eval", {}).get("new_tokens")


SAMPLED_IDS, RETOKENIZED = "sampled ids", "re-tokenized text"


def rewritten(gens: list[dict]) -> bool:
    """Whether generations are a text attack's rewrites (each records how much it rewrote)."""
    return bool(gens) and "unigram_overlap" in gens[0]


def ppl_footing(oracle_shares_tokenizer: bool, rewritten: bool) -> str:
    """What a row's perplexity is measured on: the ids the model sampled where the oracle shares the base tokenizer
    and the texts are the model's own; the decoded text tokenized again where a text attack rewrote it or the
    oracle's tokenizer is another. The two differ even for the same text (a sampled sequence is often not the
    tokenizer's own split of its text): compare PPL only between rows measured on the same footing."""
    return SAMPLED_IDS if oracle_shares_tokenizer and not rewritten else RETOKENIZED


def retokenized_ppl(m: dict) -> float | None:
    """A run's median PPL (``metrics.json``: ``m``) of its decoded texts tokenized again, the footing every row can be
    measured on (a text attack's has no other): its own PPL where it was measured so, else the one stored beside the
    sampled ids' (None for a run scored before both were)."""
    return m.get("median_ppl") if m.get("ppl_on") == RETOKENIZED else m.get("median_ppl_retokenized")


def _stored_footing(folder: Path, rewritten: bool) -> str:
    """A stored run's ``ppl_footing``: from its manifest, or for runs scored before it was recorded, by whether its
    oracle is its base model (both are named in its spec)."""
    import json

    try:
        recorded = json.loads((folder / "manifest.json").read_text()).get("report", {}).get("ppl_on")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded:
        return recorded
    try:
        spec = json.loads((folder / "spec.json").read_text())
        shares = spec["oracle"]["ref"] == spec["config"]["preset"]["base_model"]
    except (OSError, ValueError, KeyError, TypeError):
        shares = False
    return ppl_footing(shares, rewritten)


def median(values: list[float]) -> float:
    return float(np.median(np.asarray(values, float)))


def run_metrics(folder: Path, new_tokens: int | None = None, ppl_on: str | None = None) -> dict:
    """A run's metrics from what it stores: its per-text scores (``scores.jsonl``: label 1 = generated, with the
    oracle's perplexity; 0 = human) and, for text attacks, how much each text was rewritten (``generations.jsonl``).
    ``new_tokens``: the evaluation's completion length (default: read from the stored spec); ``ppl_on``: what the
    perplexity was measured on (``ppl_footing``; default: as the stored run records it)."""
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
    result.update(length_metrics(pos, neg, full=new_tokens or _new_tokens(folder)) or {})
    gens = read_jsonl(folder / "generations.jsonl")
    if all("ppl" in s for s in pos):  # attribution scores carry none
        result["median_ppl"] = median([s["ppl"] for s in pos])
        result["ppl_on"] = ppl_on or _stored_footing(folder, rewritten(gens))
        if all("ppl_retokenized" in s for s in pos):  # a sampled-ids row's PPL on its decoded text tokenized again
            result["median_ppl_retokenized"] = median([s["ppl_retokenized"] for s in pos])
    if gens and all("completion_ids" in g for g in gens):  # repetition and diversity of the generated texts
        from harness.cell.quality import text_quality

        result.update(text_quality([g["completion_ids"] for g in gens]))
    if rewritten(gens):  # a text attack: how much it rewrote, and how much meaning it kept
        from harness.assets import textsim

        applied = [g["edit"] for g in gens] if all("edit" in g for g in gens) else None
        result["paraphrase"] = textsim.summary(
            [g["unigram_overlap"] for g in gens], [g["embedding_cosine"] for g in gens], applied
        )
    result["metrics_version"] = METRICS_VERSION
    return result
