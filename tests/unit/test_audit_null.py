"""Every audit's stated false-positive rate, over keys drawn afresh, on texts of sources that never saw the key.

``harness detect`` says its pooled test flags a source that never saw the key with probability at most alpha, over
the draw of the key, and so does each text's own p-value. Here each scheme whose key can be drawn without training
(``WatermarkMethod.draw_key``) tests, under 60 keys (seeds 1..60), the texts of an unwatermarked random model, of a
noised copy of it (a derivative), and texts that repeat one phrase (shared n-grams: what a per-occurrence count would
add up into a false detection). At alpha = 0.1, 6 of 60 are expected; more than 14 (the binomial tail is under
0.001) fails. The measurement on the tiny
LM's real derivatives (donors, fine-tunes, a merge, a quantization) is ``benchmarks/audit_null.py`` (docs/detect.md).
"""

from __future__ import annotations

import pytest

ALPHA, KEYS, MOST = 0.1, 60, 14
SCHEMES = ("gu-kgw", "gu-kth", "gu-aar", "gaussian-bias", "gaussmark")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The base (a random model of the small row tokenizer), and each source's 30 texts of 24 tokens."""
    import torch

    from harness.assets.models import load_causal_lm
    from harness.assets.tiny import build_tokenizer
    from tests.conftest import SENTENCES, make_random_llama

    folder = tmp_path_factory.mktemp("audit-null")
    tokenizer = build_tokenizer(SENTENCES)
    base = make_random_llama(folder / "base", 3, tokenizer, num_hidden_layers=2)
    model = load_causal_lm(str(base), "cpu")
    prompts = torch.tensor([[tokenizer.bos_token_id or 0]] * 30)

    def sample(seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        out = model.generate(prompts, do_sample=True, max_new_tokens=24, min_new_tokens=24, top_k=0)
        return out[:, 1:].tolist()

    texts = {"base": sample(0)}
    with torch.no_grad():  # a derivative: the base's weights moved (as a merge or a fine-tune moves them)
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    texts["noised"] = sample(1)
    phrase = tokenizer("the quick brown fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]
    texts["repeated"] = [(phrase * 30)[i : i + 24] for i in range(30)]
    return str(base), tokenizer, texts, folder


@pytest.mark.parametrize("scheme", SCHEMES)
def test_pooled_test_holds_its_rate_over_keys_drawn_afresh(scheme, sources):
    import numpy as np

    from harness.config.registry import methods
    from harness.contract.method import read_key
    from tests.conftest import _detect_context

    base, tokenizer, texts, folder = sources
    ctx = _detect_context(folder / "stages", 8, 24, tokenizer, np.random.default_rng(0), base)
    flagged, per_text = {}, {}
    for name, seqs in texts.items():
        count, detector, total, share = 0, None, None, 0.0
        for seed in range(1, KEYS + 1):
            if scheme == "gaussmark" and detector is not None:  # (one base model loaded: the key's noise swapped)
                from scipy.stats import norm

                from methods.gaussmark import noise

                detector.xi = {n: noise(seed, n, x.shape, detector.sigma) for n, x in detector.xi.items()}
                total = total if total is not None else detector.pooled_gradient(seqs)  # (pool's, key-free)
                count += norm.sf(detector.pooled_z(total)) <= ALPHA
                continue
            key_dir = folder / f"{scheme}-{name}-{seed}"
            key_dir.mkdir()
            method = methods.build(scheme, {"seed": seed})
            method.draw_key(key_dir, base)
            if scheme == "gu-kth":  # (its detector wants reference statistics, which its pooled test does not read)
                from methods.gu_kth import KTHDetector
                from methods.kth import KTHKey

                saved = read_key(key_dir)
                detector = KTHDetector(KTHKey.from_dict(saved["key"]), saved["statistic"], saved["gamma"], [])
                pooled = detector.pool(seqs, [], null_keys=9)  # (smallest p 0.1: flagged at most 1 in 10)
                p, texts_p = pooled["p_value"], pooled["per_text_p_values"]
            else:
                detector = method.detector(key_dir, tokenizer, ctx)
                p, texts_p = detector.pool(seqs, [])["p_value"], [s["p_value"] for s in detector.score(seqs)]
            count += p <= ALPHA
            share += float(np.mean(np.asarray(texts_p) <= ALPHA))
        flagged[name] = count
        per_text[name] = share
    assert all(count <= MOST for count in flagged.values()), (scheme, flagged)
    # Each text's own p-value holds too: a key's share of flagged texts lies in [0, 1] with mean at most alpha, so
    # its sum over the keys passes MOST no more often than a binomial count does (the Bernoulli is the extreme case).
    # GaussMark's per-text z is <xi, g> / (sigma ||g||) as its pooled one, N(0, 1) over the key's noise by
    # construction; its per-text gradients (a backward pass per text and key) are not measured here.
    assert all(share <= MOST for share in per_text.values()), (scheme, per_text)


def test_a_learned_key_cannot_be_drawn(tmp_path):
    from harness.config.errors import HarnessError
    from harness.config.registry import methods

    with pytest.raises(HarnessError, match="PRO's key is learned in training"):
        methods.build("pro", {}).draw_key(tmp_path, "unused")
