"""GaussMark (methods/gaussmark.py) on small random Llamas: the batched per-text gradients equal one backward pass per
text, z is standard normal under the null (over keys: each text's z is exactly N(0, 1) for a key drawn independently of
it), the key noises only the weights it names, and bad settings are one line."""

import pytest
import torch
from scipy import stats

from harness.config.errors import HarnessError
from harness.config.registry import methods
from harness.contract.method import DetectContext
from methods.gaussmark import GaussMarkDetector, noise, per_text_gradients, summed_gradient, target_names


@pytest.fixture(scope="module")
def base(random_llamas):
    from harness.assets.models import load_tokenizer

    folder = random_llamas[1]
    return folder, load_tokenizer(str(folder))


def detector(folder, tokenizer, names, sigma=0.02, seed=3, batch_size=4):
    from harness.assets.models import load_causal_lm

    modules = dict(load_causal_lm(str(folder), "cpu", dtype="float32").named_modules())
    key = {"sigma": sigma, "seed": seed, "weights": {n: list(modules[n].weight.shape) for n in names}}
    return GaussMarkDetector(key, str(folder), "cpu", tokenizer, batch_size)


def random_texts(count, vocab, seed, lengths=(5, 20)):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(*lengths, (count,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in sizes]


def test_batched_gradients_equal_one_backward_per_text(base):
    folder, tokenizer = base
    from transformers import AutoConfig

    names = target_names(AutoConfig.from_pretrained(folder), (-1, 0), ("mlp.up_proj", "self_attn.o_proj"))
    det = detector(folder, tokenizer, names)
    texts = random_texts(7, len(tokenizer), 0)
    contexts = [[tokenizer.eos_token_id, *t[:2]] for t in random_texts(7, len(tokenizer), 1)]
    found = per_text_gradients(det, contexts, texts)
    for (projection, squared), context, text in zip(found, contexts, texts, strict=True):
        grads = summed_gradient(det, [context], [text])
        # float32 gradients of another batch, summed over ~3,000 entries whose |terms| add to ~5: a few 1e-8 here,
        # up to ~1e-6 with another summation order (eps32 x log2(n) x sum|terms|); the projection is ~0.1
        assert projection == pytest.approx(sum(float((g * det.xi[n]).sum()) for n, g in grads.items()), abs=1e-5)
        assert squared == pytest.approx(sum(float((g * g).sum()) for g in grads.values()), rel=1e-5)
    scores = det.score(texts, contexts)
    for s, (projection, squared) in zip(scores, per_text_gradients(det, contexts, texts), strict=True):
        # score() runs batches of 4, the reference one batch of 7: other padded widths, so float32 forward/backward
        # values differ in the last bits (8e-8 relative seen on an AMD EPYC, 2.6e-7 absolute at one thread); z is
        # O(1) but its projection can cancel to near 0 (z = 0.02 here), hence the absolute term
        assert s["score"] == pytest.approx(projection / (0.02 * squared**0.5), rel=1e-5, abs=1e-5)
        assert s["p_value"] == pytest.approx(stats.norm.sf(s["score"]), rel=1e-9)


def test_z_is_standard_normal_under_the_null_over_keys(base):
    """Each text's gradient projected on 400 independent keys (the null: the text does not depend on the key): the
    z's mean and standard deviation lie in their 95% intervals of 0 and 1, and 1% of them exceed the 1% threshold
    within its binomial interval. (For one key, the texts' z's are correlated through their gradients: the pooled
    test handles that, see the next test.)"""
    folder, tokenizer = base
    from transformers import AutoConfig

    names = target_names(AutoConfig.from_pretrained(folder), (-1,), ("mlp.up_proj",))
    det = detector(folder, tokenizer, names)
    texts = random_texts(20, len(tokenizer), 2)
    grads = [summed_gradient(det, [[tokenizer.eos_token_id]], [t])[names[0]] for t in texts]
    z = []
    for seed in range(400):
        xi = noise(seed + 100, names[0], grads[0].shape, 0.02)
        g = grads[seed % len(grads)]
        z.append(float((xi * g).sum()) / (0.02 * float(g.norm())))
    z = torch.tensor(z)
    n = len(z)
    assert abs(float(z.mean())) < 1.96 / n**0.5
    assert abs(float(z.std()) - 1) < 1.96 * (1 / (2 * (n - 1))) ** 0.5
    flagged = int((z > stats.norm.isf(0.05)).sum())
    low, high = stats.binom.interval(0.95, n, 0.05)
    assert low <= flagged <= high


def test_the_pooled_test_is_the_summed_gradients_statistic(base):
    folder, tokenizer = base
    from transformers import AutoConfig

    names = target_names(AutoConfig.from_pretrained(folder), (-1,), ("mlp.up_proj",))
    det = detector(folder, tokenizer, names, batch_size=3)
    texts = random_texts(8, len(tokenizer), 3)
    pooled = det.pool(texts, det.score(texts))
    total = summed_gradient(det, [[tokenizer.eos_token_id]] * len(texts), texts)[names[0]]
    z = float((total * det.xi[names[0]]).sum()) / (0.02 * float(total.norm()))
    # pool() sums float32 gradients of batches of 3, the reference takes one batch of 8: z agrees to ~5e-7 relative
    # (seen up to 5.2e-7), so sf(z) only to ~6e-7, too close to approx's default 1e-6; the p-value is checked as the
    # float64 sf of the detector's own statistic instead
    assert pooled["statistic"] == pytest.approx(z, rel=1e-5)
    assert pooled["p_value"] == pytest.approx(stats.norm.sf(pooled["statistic"]), rel=1e-12)


def test_the_key_noises_only_its_weights(base, tmp_path):
    import json

    from safetensors.torch import load_file

    from harness.config.presets import TINY
    from harness.contract.method import TrainContext

    folder, _ = base
    method = methods.build("gaussmark", {"sigma": "0.05", "layers": "0", "weights": "mlp.up_proj,mlp.down_proj"})
    ctx = TrainContext(str(folder), [], TINY.train, "cpu")
    report = method.train(ctx, tmp_path)
    assert report["steps"] == 0 and report["noised_weights"] == 2
    before = load_file(str(folder / "model.safetensors"))
    after = load_file(str(tmp_path / "model" / "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"}
    for name in changed:
        drawn = noise(0, name.removesuffix(".weight"), before[name].shape, 0.05)
        assert torch.allclose(after[name] - before[name], drawn, atol=1e-6)
    key = json.loads((tmp_path / "key.json").read_text())
    assert set(key["weights"]) == {n.removesuffix(".weight") for n in changed}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"sigma": "0"}, "sigma"),
        ({"sigma": "-0.1"}, "sigma"),
        ({"sigma": "nan"}, "sigma"),
        ({"sigma": "inf"}, "sigma"),
        ({"sigma": "1e300"}, "past float32's range"),
        ({"sigma": "1e38"}, "overflow float32"),
        ({"sigma": "1e-300"}, "below float32's smallest normal number"),
        ({"layers": ""}, "name at least one"),
        ({"layers": "1,1"}, "named twice"),
        ({"layers": "x"}, "layers"),
        ({"weights": ""}, "name at least one"),
        ({"seed": "-1"}, "seed"),
        ({"batch_size": "0"}, "batch_size"),
    ],
)
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(HarnessError, match=message) as err:
        methods.build("gaussmark", settings)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"layers": "2"}, "layer 2 does not exist: the model has 2 layers"),
        ({"layers": "-3"}, "layer -3 does not exist"),
        ({"layers": "0,-2"}, "layers 0 and -2 are the same layer of this 2-layer model"),
        ({"weights": "mlp.gate"}, "'mlp.gate' is not a Linear module of a decoder layer"),
        ({"weights": "input_layernorm"}, "is not a Linear module"),
    ],
)
def test_settings_the_model_lacks_are_refused_before_work(base, settings, message):
    folder, _ = base
    with pytest.raises(HarnessError, match=message):
        methods.build("gaussmark", settings).validate(str(folder))


def test_a_key_of_another_architecture_is_refused(base, llama_builder, tmp_path):
    folder, tokenizer = base
    method = methods.build("gaussmark", {"layers": "0"})
    from harness.config.presets import TINY
    from harness.contract.method import TrainContext

    method.train(TrainContext(str(folder), [], TINY.train, "cpu"), tmp_path / "key")
    wider = llama_builder(tmp_path / "wider", 4, tokenizer, hidden_size=40)
    ctx = DetectContext(stage=None, reference_texts=None, prompt_tokens=4, new_tokens=8, device="cpu",
                        base_model=str(wider))  # fmt: skip
    with pytest.raises(HarnessError, match=r"another architecture than the base model .*\(hidden_size 32 against 40\)"):
        method.detector(tmp_path / "key", tokenizer, ctx)
