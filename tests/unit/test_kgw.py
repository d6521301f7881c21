"""KGW green lists, teacher logits and detector against independent computations and the reference code."""

import numpy as np
import pytest
import torch
from scipy.stats import binom

from methods.kgw import HASH_KEY, GreenLists, KGWKey, score_sequences, watermark_logits

# First 8 green ids and the sum of all green ids, from lm-watermarking's WatermarkBase._get_greenlist_ids (as vendored
# in Gu et al.'s watermark-learnability) run on torch 2.13 CPU with gamma 0.25 and vocab = range(V).
REFERENCE = [
    ("simple_0", [5], 32000, [958, 17083, 30553, 27350, 1329, 24091, 15003, 13468], 126782755),
    ("simple_0", [5], 4096, [1726, 2921, 2477, 2669, 937, 1650, 1013, 1371], 2109580),
    ("simple_1", [29871], 32000, [8451, 26760, 5668, 31271, 13039, 6760, 9813, 17647], 127774760),
    ("simple_1", [29871], 4096, [2819, 3675, 3256, 130, 43, 1186, 39, 1871], 2073099),
    ("simple_2", [450, 29871], 32000, [11134, 30247, 25914, 1363, 30313, 22857, 882, 10760], 128777264),
    ("simple_2", [450, 29871], 4096, [3454, 3881, 3582, 159, 1241, 4057, 2176, 250], 2100797),
    ("simple_1", [4095], 4096, [546, 3097, 2371, 3994, 563, 3476, 2995, 2520], 2079008),
]


def definition_green_ids(scheme: str, context: list[int], vocab: int, gamma: float = 0.25) -> torch.Tensor:
    """The green list straight from the definition (one CPU generator, seeded per context)."""
    seed = HASH_KEY if scheme == "simple_0" else HASH_KEY * sum(context)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return torch.randperm(vocab, generator=gen)[: int(gamma * vocab)]


@pytest.mark.parametrize(("scheme", "context", "vocab", "first", "total"), REFERENCE)
def test_green_ids_match_reference_implementation(scheme, context, vocab, first, total):
    greens = GreenLists(KGWKey(0.25, 2.0, scheme, vocab))
    ids = greens.green_ids(int(greens.seeds(torch.tensor(context))[-1]))
    assert ids[:8].tolist() == first
    assert int(ids.sum()) == total
    assert len(ids) == vocab // 4


@pytest.mark.parametrize("scheme", ["simple_0", "simple_1", "simple_2"])
def test_batched_masks_equal_definition_at_every_position(scheme):
    vocab = 500
    key = KGWKey(0.25, 2.0, scheme, vocab)
    width = key.context_width
    ids = torch.randint(0, vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    masks = GreenLists(key).masks(ids)
    assert masks.shape == (3, 12 - width + 1, vocab)
    for b in range(3):
        for j in range(width - 1, 12):
            expected = torch.zeros(vocab, dtype=torch.bool)
            expected[definition_green_ids(scheme, ids[b, j - width + 1 : j + 1].tolist(), vocab)] = True
            assert torch.equal(masks[b, j - width + 1], expected)


def test_simple_0_is_one_fixed_list():
    masks = GreenLists(KGWKey(0.25, 1.0, "simple_0", 300)).masks(torch.tensor([[1, 2, 3, 250, 7]]))
    expected = torch.zeros(300, dtype=torch.bool)
    expected[definition_green_ids("simple_0", [1], 300)] = True
    assert int(masks[0, 0].sum()) == 75 and torch.equal(masks[0, 0], expected)
    assert all(torch.equal(masks[0, 0], row) for row in masks[0])


def test_watermark_logits_add_delta_on_green_and_pad_extra_logits():
    vocab, model_width = 100, 128  # a model may have more logits than the tokenizer has ids
    key = KGWKey(0.25, 1.5, "simple_1", vocab)
    greens = GreenLists(key)
    ids = torch.tensor([[3, 17, 42]])
    logits = torch.randn(1, 3, model_width)
    out = watermark_logits(greens, ids, logits)
    for j in range(3):
        green = torch.zeros(model_width, dtype=torch.bool)
        green[definition_green_ids("simple_1", [int(ids[0, j])], vocab)] = True
        assert torch.allclose(out[0, j][green], logits[0, j][green] + 1.5)
        assert torch.equal(out[0, j][~green], logits[0, j][~green])
    assert torch.equal(out[..., vocab:], logits[..., vocab:])


def test_simple_2_teacher_leaves_first_position_unchanged():
    key = KGWKey(0.25, 2.0, "simple_2", 100)
    logits = torch.randn(2, 5, 100)
    out = watermark_logits(GreenLists(key), torch.randint(0, 100, (2, 5)), logits)
    assert torch.equal(out[:, 0], logits[:, 0])
    assert not torch.equal(out[:, 1], logits[:, 1])


def test_excluded_ids_are_never_green_and_blank_their_contexts():
    key = KGWKey(0.25, 2.0, "simple_1", 200, excluded_ids=(0, 5))
    masks = GreenLists(key).masks(torch.tensor([[5, 9, 0, 11]]))
    assert not masks[..., [0, 5]].any()
    assert not masks[0, 0].any() and not masks[0, 2].any()  # contexts ending in an excluded id
    assert masks[0, 1].sum() > 0


def _green_walk(key: KGWKey, length: int) -> list[int]:
    """A sequence in which every scored token is green for its context."""
    seq = [7] * key.context_width
    greens = GreenLists(key)
    while len(seq) < length:
        seq.append(int(definition_green_ids(key.seeding_scheme, seq[-key.context_width :], key.vocab_size)[0]))
        assert greens.masks(torch.tensor(seq[-key.context_width - 1 : -1]))[-1, seq[-1]]
    return seq


@pytest.mark.parametrize("scheme", ["simple_0", "simple_1", "simple_2"])
def test_detector_counts_green_tokens_of_the_completion(scheme):
    key = KGWKey(0.25, 2.0, scheme, 300)
    seq = _green_walk(key, 40)
    score = score_sequences(GreenLists(key), [seq])[0]
    t = 40 - key.context_width
    assert (score.num_scored, score.num_green) == (t, t)
    assert score.z_score == pytest.approx((t - 0.25 * t) / (t * 0.25 * 0.75) ** 0.5)
    units = len({(GreenLists(key).hash(torch.tensor(seq[i : i + key.context_width])).item(), seq[i + key.context_width])
                 for i in range(t)})  # fmt: skip
    assert (score.units, score.units_green) == (units, units)
    assert score.p_value == pytest.approx(0.25**units, rel=1e-9, abs=0)  # P(X >= U) with every unit green
    assert score.p_value_gu == 0.0  # Gu et al.'s P(X > t): impossible, so zero


def test_detector_matches_brute_force_on_random_text():
    key = KGWKey(0.25, 2.0, "simple_1", 300)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (2, 10, 57)]
    for seq, score in zip(seqs, score_sequences(GreenLists(key), seqs), strict=True):
        green = sum(
            int(seq[t] in set(definition_green_ids("simple_1", [seq[t - 1]], 300).tolist())) for t in range(1, len(seq))
        )
        assert (score.num_scored, score.num_green) == (len(seq) - 1, green)
        n = len(seq) - 1
        exact = sum(binom.pmf(j, n, 0.25) for j in range(green, n + 1))  # P(X >= G) from its definition
        assert score.p_value_gu == pytest.approx(exact - binom.pmf(green, n, 0.25))
        pairs = {(seq[t - 1], seq[t]) for t in range(1, len(seq))}  # simple_1: a seed per previous token
        units = sum(b in set(definition_green_ids("simple_1", [a], 300).tolist()) for a, b in pairs)
        assert (score.units, score.units_green) == (len(pairs), units)
        assert score.p_value == pytest.approx(sum(binom.pmf(j, len(pairs), 0.25) for j in range(units, len(pairs) + 1)))


def test_p_value_counts_a_repeated_phrase_once():
    """A text that repeats one phrase repeats its green luck: the p-value counts each (seed, token) pair once, so ten
    copies of a phrase are no more evidence than one; the z-score (and Gu et al.'s number) count every position."""
    key = KGWKey(0.25, 2.0, "simple_1", 300)
    phrase = _green_walk(key, 6)
    once, ten = score_sequences(GreenLists(key), [phrase, phrase * 10])
    assert ten.num_scored == 10 * len(phrase) - 1 and ten.z_score > 2.5 * once.z_score
    assert ten.units == once.units + 1  # the phrase's pairs, and the join from its last token to its first
    assert ten.p_value >= once.p_value * 0.25 and ten.p_value_gu < once.p_value**5


def test_ignore_repeated_ngrams_counts_each_bigram_once():
    key = KGWKey(0.25, 2.0, "simple_1", 300)
    seq = _green_walk(key, 3) * 5  # the same two bigrams (plus the joins) over and over
    repeated = score_sequences(GreenLists(key), [seq], ignore_repeated_ngrams=True)[0]
    bigrams = {tuple(seq[i : i + 2]) for i in range(len(seq) - 1)}
    green = sum(b in set(definition_green_ids("simple_1", [a], 300).tolist()) for a, b in bigrams)
    assert (repeated.num_scored, repeated.num_green) == (len(bigrams), green)
    assert repeated.num_scored == 3 < len(seq) - 1  # the walk's two bigrams and the join, each once


def test_detector_rejects_too_short_text():
    with pytest.raises(ValueError, match="need more than 2 tokens"):
        score_sequences(GreenLists(KGWKey(0.25, 2.0, "simple_2", 50)), [[1, 2]])


def test_key_round_trip():
    key = KGWKey(0.25, 2.0, "simple_1", 4096, excluded_ids=(0,))
    assert KGWKey.from_dict(key.to_dict()) == key


def test_batched_hits_equal_full_masks_with_exclusions():
    key = KGWKey(0.25, 2.0, "simple_1", 120, excluded_ids=(0, 7))
    greens = GreenLists(key)
    ids = torch.randint(0, 130, (5, 30), generator=torch.Generator().manual_seed(1))  # some ids beyond the vocab
    ids[0, :5] = torch.tensor([0, 7, 3, 0, 9])
    masks = greens.masks(ids[:, :-1], width=130)
    expected = masks.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    windows = ids.unfold(1, 2, 1).reshape(-1, 2)
    assert torch.equal(greens.hits(windows[:, :1], windows[:, 1]), expected.reshape(-1))


def test_exact_p_value_is_calibrated_where_gus_is_not():
    """The detector's p-values of a text of 64 distinct tokens for every green count G: the exact P(X >= G) holds its
    level under H0 (P(p <= a) <= a with G ~ Binomial(64, gamma)); Gu et al.'s P(X > G) rejects more often than its
    level."""
    n, gamma = 64, 0.25
    key = KGWKey(gamma, 2.0, "simple_0", 300)  # one fixed green list: a text's green count is chosen freely
    green_ids = set(definition_green_ids("simple_0", [0], 300).tolist())
    greens, reds = sorted(green_ids), sorted(set(range(300)) - green_ids)
    texts = [[reds[-1]] + greens[:g] + reds[: n - g] for g in range(n + 1)]  # the first token is context only
    scores = score_sequences(GreenLists(key), texts)
    assert [(s.num_scored, s.num_green, s.units) for s in scores] == [(n, g, n) for g in range(n + 1)]
    exact = np.array([s.p_value for s in scores])
    gu = np.array([s.p_value_gu for s in scores])
    assert exact == pytest.approx(binom.sf(np.arange(n + 1) - 1, n, gamma), rel=1e-9, abs=0)
    under_h0 = binom.pmf(np.arange(n + 1), n, gamma)  # how often each green count occurs without a watermark
    for level in (0.01, 0.05):
        assert under_h0[exact <= level].sum() <= level
        assert under_h0[gu <= level].sum() > level  # anti-conservative


@pytest.mark.parametrize("scheme", ["simple_0", "simple_1"])
@pytest.mark.parametrize("excluded", [(), (0, 7, 4095)])
def test_packed_table_lookup_equals_the_green_lists(tmp_path, scheme, excluded):
    from methods.kgw import build_green_table, load_green_table

    key = KGWKey(0.25, 2.0, scheme, 4096, excluded_ids=excluded)
    build_green_table(key, tmp_path / "table.npy", workers=2)
    table = load_green_table(tmp_path / "table.npy")
    assert table.shape == (4096 if scheme == "simple_1" else 1, 512) and table.dtype == torch.uint8
    plain, packed = GreenLists(key), GreenLists(key, table=table)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4096, (4, 64), generator=g)
    ids[0, :3] = torch.tensor([0, 7, 4095])  # excluded ids as contexts and as targets
    assert torch.equal(plain.masks(ids, width=4100), packed.masks(ids, width=4100))  # padded logits never green
    contexts = torch.randint(0, 4096, (2000, 1), generator=g)
    targets = torch.randint(0, 4100, (2000,), generator=g)  # some past the vocabulary
    assert torch.equal(plain.hits(contexts, targets), packed.hits(contexts, targets))
    assert (packed.masks(ids).sum(-1) <= key.greenlist_size).all()


def test_green_table_is_a_stage_shared_by_the_keys_of_one_scheme(tmp_path):
    from methods.kgw import green_lists

    built = []

    def stage(kind, spec, build, what):
        folder = tmp_path / kind / str(hash(str(spec)))
        if not folder.exists():
            folder.mkdir(parents=True)
            built.append(build(folder))
        return folder

    teacher = green_lists(KGWKey(0.25, 2.0, "simple_1", 4096, excluded_ids=(0,)), stage)
    detector = green_lists(KGWKey(0.25, 2.0, "simple_1", 4096), stage)
    assert len(built) == 1 and teacher.table is not None and detector.table is not None
    assert green_lists(KGWKey(0.25, 2.0, "simple_2", 4096), stage).table is None  # k = 2: on the fly
