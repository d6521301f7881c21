"""Detection metrics and completion perplexity against hand computations."""

import math

import numpy as np
import pytest
import torch

from harness.cell import metrics
from harness.cell.metrics import detection_metrics, median, tpr_at_fpr


def test_perfect_separation():
    m = detection_metrics([5, 6, 7, 8], [1, 2, 3, 4], bootstrap=50)
    assert m["auc"] == 1.0
    assert all(m[f"tpr@{f:g}"] == 1.0 for f in (0.001, 0.01, 0.05, 0.1))
    assert m["auc_ci95"] == [1.0, 1.0]
    assert (m["n_pos"], m["n_neg"]) == (4, 4)


def test_same_distribution_is_near_chance():
    rng = np.random.default_rng(0)
    m = detection_metrics(rng.normal(size=2000), rng.normal(size=2000), bootstrap=50)
    assert abs(m["auc"] - 0.5) < 0.04
    assert m["auc_ci95"][0] < 0.5 < m["auc_ci95"][1]


def test_tpr_uses_the_empirical_threshold_from_negatives():
    neg = np.arange(100.0)  # negatives 0..99: a threshold just above 94 lets 5 of 100 through
    pos = np.array([94.5, 95.5, 96.5, 200.0])
    assert tpr_at_fpr(pos, neg, 0.05) == 1.0
    assert tpr_at_fpr(pos, neg, 0.04) == 0.75  # above 95 (negatives 96..99 pass): 95.5, 96.5 and 200
    assert tpr_at_fpr(pos, neg, 0.01) == 0.25  # above 98: only 200
    assert tpr_at_fpr(pos, neg, 0.001) == 0.25  # above 99: no negative at all


def test_analytic_tpr_and_its_real_fpr():
    m = detection_metrics([3, 2, 1, 0], [0, 0, 1, 1], [0.0005, 0.02, 0.2, 0.5], [0.9, 0.04, 0.5, 0.6], bootstrap=10)
    assert m["tpr_analytic@0.001"] == 0.25
    assert m["tpr_analytic@0.05"] == 0.5
    assert m["fpr_analytic@0.05"] == 0.25


def test_auc_counts_ties_as_half():
    assert detection_metrics([1, 1], [1, 1], bootstrap=5)["auc"] == 0.5


def test_median():
    assert median([100, 3, 1]) == 3 and median([4, 1, 3, 2]) == 2.5


def test_completion_perplexity_masks_the_prompt(random_llamas):
    from harness.assets.models import load_causal_lm
    from harness.compute.generation import completion_perplexity

    model = load_causal_lm(str(random_llamas[0]), "cpu")
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    completions = [[9, 10, 11], [12, 13, 14]]
    got = completion_perplexity(model, prompts, completions, batch_size=1)
    for p, c, value in zip(prompts, completions, got, strict=True):
        full = torch.tensor([p + c])
        logp = torch.log_softmax(model(input_ids=full).logits[0].float(), -1)
        nll = -sum(logp[len(p) - 1 + i, tok].item() for i, tok in enumerate(c)) / len(c)
        assert value == pytest.approx(math.exp(nll), rel=1e-4)
    other_prompt = completion_perplexity(model, [[2, 2, 2, 4]], [completions[0]], batch_size=1)[0]
    assert other_prompt != pytest.approx(got[0])  # the prompt conditions, but is not scored


def test_completion_perplexity_pads_mixed_lengths(random_llamas):
    from harness.assets.models import load_causal_lm
    from harness.compute.generation import completion_perplexity

    model = load_causal_lm(str(random_llamas[0]), "cpu")
    prompts = [[1, 2], [3, 4, 5, 6, 7], [8]]
    completions = [[9, 10, 11, 12], [13], [14, 15]]
    one_by_one = completion_perplexity(model, prompts, completions, batch_size=1)
    batched = completion_perplexity(model, prompts, completions, batch_size=3, pad_id=0)
    assert batched == pytest.approx(one_by_one, rel=1e-4)


def brute_force_tpr(pos, neg, fpr):
    """Best TPR over every threshold 'score >= thr' whose FPR on the negatives is at most ``fpr``."""
    best = 0.0
    for thr in np.r_[np.unique(np.r_[pos, neg]), np.inf]:
        if (neg >= thr).mean() <= fpr:
            best = max(best, (pos >= thr).mean())
    return best


def test_tpr_keeps_operating_points_on_tied_scores():
    """z-scores of fixed-length texts tie a lot; no threshold may be thinned away."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        pos = rng.integers(0, 6, size=rng.integers(3, 30)).astype(float)
        neg = rng.integers(0, 4, size=rng.integers(3, 30)).astype(float)
        for f in (0.01, 0.05, 0.1, 0.3):
            assert tpr_at_fpr(pos, neg, f) == pytest.approx(brute_force_tpr(pos, neg, f)), (pos, neg, f)


# --- detection by text length -----------------------------------------------------------------------------------------
def _texts(rng, n: int, length: int, drift: float, label: int) -> list[dict]:
    """Texts whose prefix score after L tokens is a z-score of L tokens each carrying ``drift`` of signal."""
    out = []
    for _ in range(n):
        steps = rng.normal(drift, 1.0, size=length)
        prefix = list(np.cumsum(steps) / np.sqrt(np.arange(1, length + 1)))
        out.append({"label": label, "score": prefix[-1], "prefix_scores": prefix})
    return out


def test_the_length_threshold_is_the_one_tpr_at_fpr_picks():
    rng = np.random.default_rng(0)
    for fpr in (0.01, 0.05, 0.1):
        pos, neg = rng.normal(1, 1, 150), rng.normal(0, 1, 200).round(1)  # ties among the negatives
        thr = metrics._fires_above(neg, fpr)
        assert float(np.mean(pos > thr)) == metrics.tpr_at_fpr(pos, neg, fpr)


def test_tokens_to_detect_falls_with_signal_and_tpr_rises_with_length():
    rng = np.random.default_rng(1)
    neg = _texts(rng, 200, 64, 0.0, 0)
    weak = metrics.length_metrics(_texts(rng, 200, 64, 0.4, 1), neg)
    strong = metrics.length_metrics(_texts(rng, 200, 64, 0.8, 1), neg)
    assert weak["by_length"]["lengths"] == [16, 32, 48, 64]
    assert strong["tokens_to_detect@0.01"] < weak["tokens_to_detect@0.01"] <= 64
    tpr, bands = weak["by_length"]["tpr@0.01"], weak["by_length"]["tpr@0.01_ci95"]
    assert tpr == sorted(tpr) and tpr[-1] > tpr[0] + 0.2
    assert all(lo <= t <= hi for t, (lo, hi) in zip(tpr, bands, strict=True))
    none = metrics.length_metrics(_texts(rng, 100, 64, 0.0, 1), neg)
    assert none["tokens_to_detect@0.01"] is None and none["detected_by_end@0.01"] < 0.5
    # A detector that stores no prefix scores (Gu-KTH) has no length metrics; a short text's empty list reads as its
    # whole score.
    assert metrics.length_metrics([{"label": 1, "score": 1.0}], neg) is None
    short = metrics.length_metrics([{"label": 1, "score": 9.0, "prefix_scores": []}] * 3, neg)
    assert short["detected_by_end@0.01"] == 1.0


def test_unwatermarked_texts_are_flagged_at_the_stated_rate_not_at_the_rate_of_64_looks():
    """Texts from the human texts' own distribution: the share counted as detected is one whole-text test's rate
    (1%, within its binomial 99.9% interval over 2,000 texts), where "first crossing of any of 64 lengths" counts
    several times that."""
    from scipy.stats import binom

    rng = np.random.default_rng(7)
    neg = _texts(rng, 2000, 64, 0.0, 0)
    null = _texts(rng, 2000, 64, 0.0, 1)
    m = metrics.length_metrics(null, neg)
    lo, hi = binom.ppf([0.0005, 0.9995], 2000, 0.01) / 2000
    assert lo <= m["detected_by_end@0.01"] <= hi
    assert m["tokens_to_detect@0.01"] is None
    # The rule it replaces: the first of 64 per-length crossings flags far more than 1% of null texts.
    matrix = metrics._prefix_matrix(null, 64)
    thresholds = np.array([metrics._fires_above(metrics._prefix_matrix(neg, 64)[:, n], 0.01) for n in range(64)])
    assert (matrix > thresholds).any(axis=1).mean() > 3 * hi


def test_tokens_to_detect_is_the_length_from_which_a_text_stays_flagged():
    flagged = np.array(
        [
            [True, True, True, True, True],  # flagged at every length: 1
            [False, True, False, True, True],  # last miss at length 3: stays flagged from 4
            [True, True, True, True, False],  # not flagged on the whole text: never
            [False, False, False, False, True],  # flagged only at the end: 5
        ]
    )
    assert metrics.stays_detected_from(flagged).tolist() == [1.0, 4.0, np.inf, 5.0]
    # Through length_metrics: one human text scoring 0 at every length (threshold 0 at any fpr < 1), and texts
    # whose prefix scores cross and fall back.
    neg = [{"label": 0, "score": 0.0, "prefix_scores": [0.0] * 5}]
    pos = [
        {"label": 1, "score": s[-1], "prefix_scores": s} for s in ([1, 1, 1, 1, 1], [-1, 1, -1, 1, 1], [1, -1, 1, 1, 1])
    ]
    m = metrics.length_metrics(pos, neg, fpr=0.5)
    assert m["tokens_to_detect@0.5"] == 3.0 and m["detected_by_end@0.5"] == 1.0  # median of 1, 4, 3


def test_each_rows_perplexity_says_what_it_measures(tmp_path):
    """Sampled ids where the oracle shares the base tokenizer and the texts are the model's own; re-tokenized text
    after a text attack or with another oracle. A run stored before this was recorded is read from its spec."""
    assert metrics.ppl_footing(True, False) == metrics.SAMPLED_IDS
    assert metrics.ppl_footing(True, True) == metrics.ppl_footing(False, False) == metrics.RETOKENIZED
    import json

    for oracle, footing in (("builtin:tiny-lm", metrics.SAMPLED_IDS), ("other/oracle", metrics.RETOKENIZED)):
        spec = {"oracle": {"ref": oracle}, "config": {"preset": {"base_model": "builtin:tiny-lm"}}}
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        assert metrics._stored_footing(tmp_path, rewritten=False) == footing
        assert metrics._stored_footing(tmp_path, rewritten=True) == metrics.RETOKENIZED
    (tmp_path / "manifest.json").write_text(json.dumps({"report": {"ppl_on": "recorded"}}))
    assert metrics._stored_footing(tmp_path, rewritten=False) == "recorded"


def _independent_paired(pos_a, neg_a, pos_b, neg_b, bootstrap, seed, fpr=0.01):
    """The paired bootstrap as its docstring states it, one draw at a time with sklearn: the same prompt indices for
    both methods, positives and negatives and every seed (rows); the difference is the mean over seeds."""
    from sklearn.metrics import roc_auc_score, roc_curve

    def auc_tpr(pos, neg):
        labels = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
        fp, tp, _ = roc_curve(labels, np.r_[pos, neg], drop_intermediate=False)
        return roc_auc_score(labels, np.r_[pos, neg]), tp[fp <= fpr + 1e-12].max()

    n = pos_a.shape[1]
    draws = np.random.default_rng(seed).integers(0, n, size=(bootstrap, n))
    out = []
    for idx in [np.arange(n), *draws]:
        per_seed = [np.subtract(auc_tpr(pa[idx], na[idx]), auc_tpr(pb[idx], nb[idx]))
                    for pa, na, pb, nb in zip(pos_a, neg_a, pos_b, neg_b, strict=True)]  # fmt: skip
        out.append(np.mean(per_seed, axis=0))
    out = np.array(out)
    return out[0], np.percentile(out[1:], [2.5, 97.5], axis=0)


@pytest.mark.parametrize("seeds", [1, 2])
def test_paired_bootstrap_matches_an_independent_recomputation(seeds):
    """Two methods on the same 150 prompts (B shares A's prompt difficulty, with ties as z-scores of short texts
    have): the harness's vectorised paired bootstrap against a loop over draws with sklearn."""
    rng = np.random.default_rng(3)
    hard = rng.normal(size=(seeds, 150))  # what both methods' texts of one prompt share
    pos_a = np.round(hard + rng.normal(1.2, 1, size=hard.shape), 1)
    pos_b = np.round(hard + rng.normal(1.0, 1, size=hard.shape), 1)
    neg_a, neg_b = np.round(rng.normal(size=(2, seeds, 150)), 1)
    found = metrics.paired_bootstrap(pos_a, neg_a, pos_b, neg_b, bootstrap=150, seed=7)
    point, (lo, hi) = _independent_paired(pos_a, neg_a, pos_b, neg_b, bootstrap=150, seed=7)
    assert found["auc_diff"] == pytest.approx(point[0], abs=1e-12)
    assert found["tpr_diff"] == pytest.approx(point[1], abs=1e-12)
    assert found["auc_diff_ci95"] == pytest.approx([lo[0], hi[0]], abs=1e-12)
    assert found["tpr_diff_ci95"] == pytest.approx([lo[1], hi[1]], abs=1e-12)
    assert found["seeds"] == seeds and len(found["auc_diff_per_seed"]) == seeds
    assert np.mean(found["auc_diff_per_seed"]) == pytest.approx(found["auc_diff"], abs=1e-12)


def test_paired_bootstrap_sees_what_unpaired_intervals_cannot():
    """B is A's scores lowered a little on every prompt: the per-method intervals overlap, the paired one excludes
    zero; A against itself is exactly zero."""
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(1, 1, 200), rng.normal(0, 1, 200)
    lower = pos - 0.1
    a, b = detection_metrics(pos, neg), detection_metrics(lower, neg)
    assert a["auc_ci95"][0] < b["auc_ci95"][1]  # overlapping
    found = metrics.paired_bootstrap(pos, neg, lower, neg)
    assert 0 < found["auc_diff_ci95"][0] <= found["auc_diff"] <= found["auc_diff_ci95"][1]
    same = metrics.paired_bootstrap(pos, neg, pos, neg)
    assert same["auc_diff"] == 0 and same["auc_diff_ci95"] == [0, 0] and same["tpr_diff_ci95"] == [0, 0]
    with pytest.raises(ValueError, match="one shape"):
        metrics.paired_bootstrap(pos, neg, pos[:-1], neg[:-1])


def test_seed_interval_is_the_t_interval():
    lo, hi = metrics.seed_interval([0.50, 0.52, 0.57])
    mean, sd = np.mean([0.50, 0.52, 0.57]), np.std([0.50, 0.52, 0.57], ddof=1)
    assert (lo, hi) == pytest.approx((mean - 4.302653 * sd / math.sqrt(3), mean + 4.302653 * sd / math.sqrt(3)))
    assert all(math.isnan(v) for v in metrics.seed_interval([0.9]))
    assert metrics.seed_interval([0.0, 0.1, 0.5], within=(0.0, 1.0))[0] == 0.0  # a rate's interval stays in [0, 1]
