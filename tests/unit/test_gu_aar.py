"""Gu-AAR's key, decoding and detector (methods/aar.py, methods/gu_aar.py) against the construction of Gu et al.'s
``watermarks/aar/aar_watermark.py`` (chenchenygu/watermark-learnability), written out here from its description:
checked bit for bit against their module itself on the tiny LM's tokenizer at k = 1, 2, 3 when this was written
(key tables, Gumbel noise, processor outputs and p-values equal; a text of at most k tokens: theirs NaN, ours 1).
The exact p-value holds its rate under the null; bad settings are one line."""

import numpy as np
import pytest
import torch
from scipy import stats

from harness.config.errors import HarnessError
from harness.config.registry import methods
from methods.aar import AARKey, AARLogitsProcessor, decoding_gumbel, detection_uniforms, score_sequence
from methods.gu_aar import AARDetector

KEY = AARKey(vocab_size=300, k=2, seed=42)


def test_the_key_is_their_table():
    generator = torch.Generator()
    generator.manual_seed(42)
    u = torch.rand((600, 300), generator=generator, dtype=torch.float32)
    assert torch.equal(detection_uniforms(KEY), torch.clamp(u, min=1e-20, max=1 - 1e-20))
    assert torch.equal(decoding_gumbel(KEY), -torch.log(torch.clamp(-torch.log(torch.clamp(u, min=1e-20)), min=1e-20)))


def test_decoding_adds_the_gumbel_row_of_the_summed_context():
    processor = AARLogitsProcessor(KEY)
    g = torch.Generator().manual_seed(0)
    ids, scores = torch.randint(0, 300, (4, 6), generator=g), torch.randn(4, 310, generator=g)
    out = processor(ids, scores)
    rows = ids[:, -2:].sum(-1)
    assert torch.equal(out[:, :300], scores[:, :300] + decoding_gumbel(KEY)[rows])
    assert torch.isinf(out[:, 300:]).all()
    assert torch.equal(processor(ids[:, :1], scores), scores)  # fewer than k tokens: as it is


def test_the_detector_is_theirs_and_the_exact_p_value_counts_pairs_once():
    u = detection_uniforms(KEY)
    ids = [5, 7, 5, 7, 5, 7, 9, 11]
    s = score_sequence(u, 2, ids)
    running = np.float32(0)
    for i in range(2, len(ids)):  # their loop: a float32 running sum
        running += np.float32(-torch.log(1 - u[ids[i - 2] + ids[i - 1], ids[i]]))
    assert s.score == float(running) and s.scored == 6
    assert s.p_value_gu == stats.gamma.sf(float(running), 6)
    pairs = {(ids[i - 2] + ids[i - 1], ids[i]) for i in range(2, len(ids))}
    assert s.distinct == len(pairs) == 4
    total = sum(float(-torch.log(1 - u[r, t]).double()) for r, t in pairs)
    assert s.p_value == pytest.approx(stats.gamma.sf(total, 4), rel=1e-12)
    assert score_sequence(u, 2, [1, 2]).p_value == 1.0


def test_the_exact_p_value_holds_its_rate_over_keys():
    g = torch.Generator().manual_seed(1)
    texts = [torch.randint(0, 50, (30,), generator=g).tolist() for _ in range(20)]  # repeats of pairs are common
    flagged = {"p_value": 0, "p_value_gu": 0}
    n = 600
    for seed in range(n):
        row = AARDetector(AARKey(50, 1, seed)).score([texts[seed % 20]])[0]
        for name in flagged:
            flagged[name] += row[name] < 0.05
    low, high = stats.binom.interval(0.99, n, 0.05)
    assert low <= flagged["p_value"] <= high, flagged


@pytest.mark.parametrize("settings", [{"k": "0"}, {"k": "-1"}, {"seed": "-1"}, {"generate_batch": "0"},
                                      {"seq_len": "1"}, {"gamma": "0.2"}])  # fmt: skip
def test_bad_settings_are_one_line(settings):
    with pytest.raises(HarnessError) as err:
        methods.build("gu-aar", settings)
    assert "\n" not in str(err.value)


def test_a_key_table_too_large_is_refused_before_work(llama_builder, tmp_path, monkeypatch):
    from harness.assets import models
    from harness.assets.tiny import build_tokenizer

    folder = llama_builder(tmp_path / "m", 0, build_tokenizer(["a b c d e f g"] * 4, vocab_size=300))
    methods.build("gu-aar", {"k": "2"}).validate(str(folder))  # a small table is fine
    monkeypatch.setattr(models, "vocab_length", lambda ref: 128_256)  # LLaMA-3's tokenizer
    with pytest.raises(HarnessError, match="key table for 128256 tokens at k=1 is 61 GiB"):
        methods.build("gu-aar", {"k": "1"}).validate(str(folder))
