"""Weight noise, the uninformed attacker: noise on every linear weight scaled to that tensor's spread, nothing else
touched; sigma = 0 changes no bit and scores as the unaltered model does; bad settings are one line."""

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.config.registry import attacks
from harness.contract.attack import AttackContext


def weights(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_noise_lands_on_linear_weights_only_at_its_scale(random_llamas, tmp_path):
    marked, base = random_llamas
    attack = attacks.build("weight-noise", {"sigma": "0.1", "seed": "3"})
    record = attack.apply(marked, tmp_path / "a", AttackContext(str(base), "cpu"))
    before, after = weights(marked), weights(tmp_path / "a" / "model")
    assert before.keys() == after.keys()
    linear = {k for k in before if k.endswith(".weight") and before[k].dim() == 2 and "embed" not in k}
    assert record["linear_weights"] == len(linear) and "lm_head.weight" in linear  # (an untied head is a linear)
    for name, tensor in before.items():
        if name not in linear:  # embeddings, norms: untouched
            assert torch.equal(after[name], tensor), name
            continue
        noise = (after[name] - tensor).double()
        # Gaussian of standard deviation 0.1 x the tensor's: the sample's spread within 5 of its standard errors
        # (1 / sqrt(2n) relative, for n entries)
        assert abs(noise.std() / (0.1 * tensor.double().std()) - 1) < 5 / (2 * noise.numel()) ** 0.5, name
        assert abs(noise.mean()) < 4 * noise.std() / noise.numel() ** 0.5, name
    again = attacks.build("weight-noise", {"sigma": "0.1", "seed": "3"})
    again.apply(marked, tmp_path / "b", AttackContext(str(base), "cpu"))
    other = attacks.build("weight-noise", {"sigma": "0.1", "seed": "4"})
    other.apply(marked, tmp_path / "c", AttackContext(str(base), "cpu"))
    b, c = weights(tmp_path / "b" / "model"), weights(tmp_path / "c" / "model")
    assert all(torch.equal(after[k], b[k]) for k in after)  # seeded
    assert not torch.equal(after["lm_head.weight"], c["lm_head.weight"])


def test_a_tied_output_projection_is_one_tensor_noised_once(llama_builder, tmp_path):
    folder = llama_builder(tmp_path / "tied", 5, tie_word_embeddings=True)
    attacks.build("weight-noise", {"sigma": "0.5"}).apply(folder, tmp_path / "out", AttackContext(str(folder), "cpu"))
    before, after = weights(folder), weights(tmp_path / "out" / "model")
    key = "model.embed_tokens.weight"
    noise = (after[key] - before[key]).double()
    # once: twice would be sqrt(2) x the spread
    assert abs(noise.std() / (0.5 * before[key].double().std()) - 1) < 5 / (2 * noise.numel()) ** 0.5


def test_sigma_zero_is_the_unaltered_model(random_llamas, small_preset, tmp_path):
    """At sigma = 0 the attacked model is the unaltered one bit for bit, so its row scores exactly as the unaltered
    row does (the same generations, the same scores)."""
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import methods
    from harness.store.files import read_jsonl
    from harness.store.stages import Store

    marked, base = random_llamas
    attack = attacks.build("weight-noise", {"sigma": "0"})
    attack.apply(marked, tmp_path / "a", AttackContext(str(base), "cpu"))
    assert all(torch.equal(v, weights(tmp_path / "a" / "model")[k]) for k, v in weights(marked).items())
    settings = {"train.steps": "3", "train.batch_size": "2", "train.seq_len": "16", "eval.num_prompts": "6",
                "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "3"}  # fmt: skip
    preset = small_preset(tmp_path, base, **settings)
    cells = Pipeline(preset, Store(tmp_path / "runs"), "cpu").run(methods.build("gu-kgw", {"k": "1"}), attack)
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered", "Weight noise sigma=0"]
    unaltered, noised = (read_jsonl(c.run.path / "scores.jsonl") for c in cells[1:])
    assert unaltered == noised
    metrics = [json.loads((c.run.path / "metrics.json").read_text()) for c in cells[1:]]
    assert metrics[0]["auc"] == metrics[1]["auc"]


BAD_NOISE = ["sigma=-0.1", "sigma=inf", "sigma=nan", "seed=-1", "sigma=abc", "strength=1", "sigma=1e300", "sigma=1e-99"]


@pytest.mark.parametrize("setting", BAD_NOISE)
def test_bad_noise_settings_are_one_line(cli, setting):
    out = cli("run", "--method", "gu-kgw", "--attack", "weight-noise", "--attack-arg", setting, "--dry-run")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
