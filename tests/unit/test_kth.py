"""KTH key, watermarked sampler and detector against the reference key and direct computations."""

import random

import numpy as np
import pytest
import torch

from methods.kth import (
    KTHKey,
    KTHLogitsProcessor,
    draw_shifts,
    key_gumbel,
    key_uniforms,
    p_values,
    shifts,
    statistic_loop,
    statistics,
    watermark_argmax,
)

# torch.rand((256, V), generator=torch.Generator().manual_seed(42)) on torch 2.13 CPU (Gu et al.'s key, seed 42,
# key_len 256): {(row, column): value}, 8 significant digits.
PINS = {
    4096: {(0, 0): 0.88226926, (0, 1): 0.91500396, (17, 1234): 0.66575569, (255, 4095): 0.086373985},
    32000: {(0, 0): 0.88226926, (0, 1): 0.91500396, (17, 1234): 0.84373891, (255, 31999): 0.84806681},
}


@pytest.mark.parametrize("vocab", sorted(PINS))
def test_key_equals_reference_key(vocab):
    xi = key_uniforms(KTHKey(vocab))
    assert xi.shape == (256, vocab) and xi.dtype == torch.float32
    for (row, col), value in PINS[vocab].items():
        assert xi[row, col].item() == pytest.approx(value, rel=1e-7)
    reference = torch.rand((256, vocab), generator=torch.Generator().manual_seed(42), dtype=torch.float32)
    assert torch.equal(xi, reference)


def test_gumbel_is_the_double_log_of_the_key():
    """-log(-log(u)) of the reference key (PINS: u = 0.88226926 and 0.086373985)."""
    gumbel = key_gumbel(KTHKey(4096))
    assert gumbel[0, 0].item() == pytest.approx(2.0773797, rel=1e-6)
    assert gumbel[255, 4095].item() == pytest.approx(-0.8957078, rel=1e-6)
    assert torch.isfinite(gumbel).all()


@pytest.mark.parametrize(("m", "s", "expected"), [(256, 4, [0, 64, 128, 192]), (256, 2, [0, 128]), (256, 1, [0])])
def test_shifts_are_evenly_spaced(m, s, expected):
    key = KTHKey(100, m, num_shifts=s)
    assert shifts(key) == expected
    assert set(draw_shifts(key, 50, random.Random(7))) == set(expected)  # 50 draws reach every shift
    # Drawn as Gu et al. (random.Random(key seed).choice per text): pinned, so a change of rule shows.
    assert draw_shifts(key, 3) == {4: [0, 0, 128], 2: [0, 0, 128], 1: [0, 0, 0]}[s]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"key_len": 0}, r"key_len \(m\) must be >= 1"),
        ({"key_len": 4, "num_shifts": 0}, r"num_shifts \(s\) must be in 1..key_len=4"),
        ({"key_len": 4, "num_shifts": 5}, r"num_shifts \(s\) must be in 1..key_len=4"),
        ({"vocab_size": 1}, "vocab_size must be >= 2"),
    ],
)
def test_bad_keys_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KTHKey(**{"vocab_size": 100, **kwargs})


def test_key_round_trips_through_dict():
    key = KTHKey(1234, 64, seed=5, num_shifts=4)
    assert key.to_dict()["scheme"] == "kth"
    assert KTHKey.from_dict(key.to_dict()) == key


def test_generated_tokens_are_the_watermark_argmax(random_llamas):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(random_llamas[0]).eval()
    model_vocab = model.config.vocab_size
    key = KTHKey(model_vocab - 5, key_len=16, seed=11, num_shifts=4)  # V < logits: the extra ids must never appear
    row_shifts = draw_shifts(key, 3, random.Random(key.seed))
    prompts = torch.randint(0, key.vocab_size, (3, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=False,
            max_new_tokens=20,  # 5 + 20 > m: the key wraps around
            logits_processor=[KTHLogitsProcessor(key, row_shifts)],
            pad_token_id=model.config.pad_token_id,
        )
        logits = model(out).logits
    gumbel = key_gumbel(key)
    eos = model.generation_config.eos_token_id
    checked = 0
    for b in range(3):
        for pos in range(5, out.shape[1]):
            scores = logits[b, pos - 1, : key.vocab_size] + gumbel[(pos + row_shifts[b]) % key.key_len]
            assert out[b, pos].item() == scores.argmax().item()
            checked += 1
            if out[b, pos].item() == eos:  # the row is finished: padding follows
                break
    assert checked > 30 and out.shape[1] > 5 + key.key_len
    assert int(out[:, 5:].max()) < key.vocab_size
    # the whole-sequence sampler (Gu et al.'s distillation targets) indexes key rows by logit position
    tokens = watermark_argmax(key, logits, torch.tensor(row_shifts))
    for b in range(3):
        for t in range(25):
            expected = (logits[b, t, : key.vocab_size] + gumbel[(t + row_shifts[b]) % key.key_len]).argmax()
            assert tokens[b, t].item() == expected.item()


@pytest.mark.parametrize("method", ["min-offset", "levenshtein"])
@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_vectorised_statistic_equals_loop(method, gamma):
    rng = np.random.default_rng(0)
    for m, vocab in [(7, 50), (16, 40), (5, 120)]:  # m = 5: texts longer than the key wrap around it
        key = KTHKey(vocab, m, seed=int(rng.integers(1000)))
        xi = key_uniforms(key).numpy()
        texts = [rng.integers(0, vocab + 3, int(rng.integers(1, 22))).tolist() for _ in range(9)]  # some ids >= V
        fast = statistics(key, texts, method, gamma, chunk=4)
        slow = [statistic_loop(xi, text, method, gamma) for text in texts]
        np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-4)
        fast32 = statistics(key, texts, method, gamma, dtype="float32", chunk=3)
        np.testing.assert_allclose(fast32, slow, rtol=0, atol=1e-4)


def test_statistic_definitions_on_a_hand_case():
    key = KTHKey(3, 2, seed=0)
    xi = key_uniforms(key).numpy().astype(np.float64)
    tokens = [2, 0, 2]
    by_offset = [sum(np.log(1 - xi[(t + j) % 2, x]) for t, x in enumerate(tokens)) for j in range(2)]
    assert statistics(key, [tokens], "min-offset")[0] == pytest.approx(min(by_offset), abs=1e-12)
    # gamma = 0 with one token: the alignment may match it to any key row of the window or skip it for free
    single = statistics(key, [[1]], "levenshtein")[0]
    assert single == pytest.approx(min(np.log(1 - xi[0, 1]), np.log(1 - xi[1, 1])), abs=1e-12)


def test_watermarked_text_scores_lower_than_random_text():
    key = KTHKey(200, 32, seed=1)
    logits = torch.randn(20, 40, 200, generator=torch.Generator().manual_seed(2))
    marked = watermark_argmax(key, logits, 5).tolist()
    plain = torch.randint(0, 200, (20, 40), generator=torch.Generator().manual_seed(3)).tolist()
    for method in ("min-offset", "levenshtein"):
        assert max(statistics(key, marked, method)) < min(statistics(key, plain, method))


def test_bad_inputs_raise():
    key = KTHKey(10, 4)
    with pytest.raises(ValueError, match="length 0"):
        statistics(key, [[1, 2], []])
    with pytest.raises(ValueError, match="negative"):
        statistics(key, [[1, -2]])
    with pytest.raises(ValueError, match="unknown"):
        statistics(key, [[1]], "edit")
    with pytest.raises(ValueError, match="length 0"):
        statistic_loop(key_uniforms(key).numpy(), [], "min-offset")


def test_p_values():
    reference = [3.0, 1.0, 2.0, 2.0]
    # (1 + #{ref < d}) / (N + 1) with N = 4
    assert p_values([0.5, 1.0, 2.0, 2.5, 10.0], reference) == pytest.approx([0.2, 0.2, 0.4, 0.8, 1.0])
    rng = np.random.default_rng(0)
    ref = rng.normal(size=99)
    got = np.array(p_values(rng.normal(size=500) * 3, ref))
    assert got.min() >= 1 / 100 and got.max() <= 1.0
    with pytest.raises(ValueError):
        p_values([1.0], [])


def test_the_permutation_test_on_threads_is_the_one_on_one_thread(monkeypatch):
    """The null keys scored on several threads give the same sums, in the same order, bit for bit."""
    import methods.kth as kth

    key = kth.KTHKey(vocab_size=300, key_len=32, seed=5)
    rng = np.random.default_rng(1)
    texts = [rng.integers(0, 300, int(n)).tolist() for n in rng.integers(4, 20, 12)]
    calls = []
    monkeypatch.setattr(kth, "null_workers", lambda key: 1)
    alone = kth.permutation_p(key, texts, "levenshtein", 0.0, 9)
    monkeypatch.setattr(kth, "null_workers", lambda key: 3)
    threads = kth.permutation_p(key, texts, "levenshtein", 0.0, 9, progress=calls.append)
    assert threads == alone and calls == [1] * 9
    assert 1 <= kth.null_workers(kth.KTHKey(vocab_size=128256, key_len=256, seed=0)) <= 5  # 394 MB a key in 2 GiB
