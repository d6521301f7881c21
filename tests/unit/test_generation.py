"""The evaluation sampler: exact draws from softmax(logits / T), keyed by prompt, so a prompt's text does not depend on
its batch or on which process of a launch samples it; and the automatic batch size."""

import pytest
import torch

from harness.compute.generation import GumbelPerPrompt, hash32, hash32_int32, sample
from harness.config.settings import EvalSettings


@pytest.mark.parametrize(("seed", "step", "temperature"), [(0, 0, 1.0), (1, 7, 0.7), (42, 199, 1.3)])
def test_draws_follow_the_softmax(seed, step, temperature):
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -3.0])
    n = 200_000
    noise = GumbelPerPrompt(seed, torch.arange(n), 5, temperature)
    picks = noise(torch.zeros(n, 5 + step, dtype=torch.long), logits.expand(n, -1)).argmax(-1)
    observed = torch.bincount(picks, minlength=6).double()
    expected = torch.softmax(logits.double() / temperature, -1) * n
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, chi2  # 5 degrees of freedom: p < 0.001 above 20.5


def test_draws_differ_by_prompt_step_and_seed():
    logits = torch.zeros(4, 1000)
    ids = torch.zeros(4, 10, dtype=torch.long)
    a = GumbelPerPrompt(0, torch.arange(4), 5, 1.0)(ids, logits).argmax(-1)
    assert len(set(a.tolist())) == 4
    assert not torch.equal(a, GumbelPerPrompt(1, torch.arange(4), 5, 1.0)(ids, logits).argmax(-1))
    assert not torch.equal(a, GumbelPerPrompt(0, torch.arange(4), 5, 1.0)(ids[:, :9], logits).argmax(-1))


def test_hash_is_32_bit_and_avalanches():
    x = torch.arange(100_000)
    h = hash32(x)
    assert int(h.min()) >= 0 and int(h.max()) < 2**32 and len(set(h.tolist())) == len(x)
    flipped = hash32(x ^ 1) ^ h  # one input bit flipped: about half the output bits change
    bits = sum(((flipped >> b) & 1).double().mean() for b in range(32)) / 32
    assert 0.45 < float(bits) < 0.55


def test_the_int32_hash_gives_the_int64_definitions_bits():
    edges = [0, 1, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 0x7FEB352D, 0x846CA68B]
    drawn = torch.randint(0, 2**32, (1_000_000,), generator=torch.Generator().manual_seed(0))
    x = torch.cat([torch.tensor(edges), drawn])
    assert torch.equal(hash32_int32(x.to(torch.int32)).long() & 0xFFFFFFFF, hash32(x))


def test_the_noise_is_the_hashed_gumbel_of_its_definition():
    """The processor's noise, bit for bit, as its docstring defines it (int64 arithmetic throughout): texts sampled
    by this sampler version never change with how the noise is computed."""
    seed, prompt_len, temperature, vocab = 7, 5, 0.7, 1000
    rows = torch.tensor([0, 3, 2**31 + 5, 123456])
    scores = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(1))
    ids = torch.zeros(len(rows), prompt_len + 3, dtype=torch.long)  # step 3
    got = GumbelPerPrompt(seed, rows, prompt_len, temperature)(ids, scores)
    key = hash32(rows ^ hash32(torch.tensor(seed) ^ 0x5BD1E995))
    key = hash32(key ^ hash32(torch.tensor(3) + 0x165667B1))
    bits = hash32(key[:, None] ^ hash32(torch.arange(vocab) ^ 0x27D4EB2F)[None, :]) >> 8
    expected = scores / temperature - torch.log(-torch.log((bits.float() + 0.5) / 2**24))
    assert torch.equal(got, expected)


def test_a_prompt_gets_its_text_in_any_batch(random_llamas):
    from harness.assets import models

    model = models.load_causal_lm(str(random_llamas[0]), "cpu")
    prompts = torch.randint(3, 300, (7, 5), generator=torch.Generator().manual_seed(0)).tolist()
    e = EvalSettings(num_prompts=7, prompt_tokens=5, new_tokens=10, batch_size=7)
    whole = sample(model, prompts, e, None, "t")
    assert whole == sample(model, prompts, e.model_copy(update={"batch_size": 3}), None, "t")
    assert whole[4:] == sample(model, prompts[4:], e, None, "t", first_index=4)  # a second process's share
    assert whole != sample(model, prompts, e.model_copy(update={"seed": 1}), None, "t")
    assert all(len(t) == 10 for t in whole)


def test_auto_batch_halves_until_a_batch_fits_and_keeps_the_texts(random_llamas):
    from harness.assets import models

    model = models.load_causal_lm(str(random_llamas[0]), "cpu")
    prompts = torch.randint(3, 300, (10, 5), generator=torch.Generator().manual_seed(1)).tolist()
    e = EvalSettings(num_prompts=10, prompt_tokens=5, new_tokens=6, batch_size=10)
    expected = sample(model, prompts, e, None, "t")

    generate, sizes = model.generate, []

    def small_memory(input_ids, **kw):  # a GPU on which at most 3 prompts fit
        sizes.append(len(input_ids))
        if len(input_ids) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return generate(input_ids=input_ids, **kw)

    model.generate = small_memory
    used = {}
    assert sample(model, prompts, e.model_copy(update={"batch_size": "auto"}), None, "t", used=used) == expected
    assert sizes[:3] == [10, 5, 2] and used["batch_size"] == 2  # a CPU's 256 capped at 10 prompts, then halved
    with pytest.raises(torch.OutOfMemoryError):  # a fixed batch size is the user's: never changed behind them
        sample(model, prompts, e, None, "t")
