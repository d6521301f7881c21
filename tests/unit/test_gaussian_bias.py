"""The distilled Gaussian bias (methods/gaussian_bias.py): z is exactly N(0, 1) under the null (over keys), the pooled
test reads the distinct tokens of all texts, distillation moves the student's logits along the bias, bad settings are
one line."""

import pytest
import torch
from scipy import stats

from harness.config.errors import HarnessError
from harness.config.registry import methods
from methods.gaussian_bias import BiasDetector, bias


def test_z_is_standard_normal_under_the_null_over_keys():
    g = torch.Generator().manual_seed(0)
    texts = [torch.randint(0, 500, (int(n),), generator=g).tolist() for n in torch.randint(5, 60, (50,), generator=g)]
    z = torch.tensor([BiasDetector({"seed": key, "size": 500, "std": 0.6}).score([texts[key % 50]])[0]["score"]
                      for key in range(1000)])  # fmt: skip
    n = len(z)
    assert abs(float(z.mean())) < 1.96 / n**0.5
    assert abs(float(z.std()) - 1) < 1.96 * (1 / (2 * (n - 1))) ** 0.5
    low, high = stats.binom.interval(0.95, n, 0.05)
    assert low <= int((z > stats.norm.isf(0.05)).sum()) <= high


def test_scores_and_the_pooled_test_read_distinct_tokens():
    det = BiasDetector({"seed": 4, "size": 100, "std": 0.5})
    b = bias(4, 100, 0.5)
    (row,) = det.score([[3, 3, 7, 9, 7]])
    assert row["scored"] == 3 and row["score"] == pytest.approx(float(b[[3, 7, 9]].sum()) / (0.5 * 3**0.5))
    pooled = det.pool([[3, 7], [7, 9, 11]], [])
    assert pooled["tokens"] == 4 and pooled["statistic"] == pytest.approx(float(b[[3, 7, 9, 11]].sum()) / (0.5 * 2))
    assert pooled["p_value"] == pytest.approx(stats.norm.sf(pooled["statistic"]))


def test_distillation_moves_the_students_logits_along_the_bias(random_llamas, small_preset, tmp_path):
    from harness.assets.models import load_causal_lm
    from harness.contract.method import TrainContext

    _, base = random_llamas
    preset = small_preset(tmp_path, base, **{"train.steps": "30", "train.batch_size": "4", "train.seq_len": "16",
                                              "train.lr": "3e-3"})  # fmt: skip
    from harness.assets import data

    method = methods.build("gaussian-bias", {"std": "2", "seed": "1"})
    ctx = TrainContext(str(base), data.iter_texts(preset.train_data), preset.train, "cpu")
    method.train(ctx, tmp_path / "out")
    ids = torch.arange(2, 30).view(1, -1)
    with torch.no_grad():
        shift = (load_causal_lm(str(tmp_path / "out" / "model"), "cpu", "float32")(ids).logits
                 - load_causal_lm(str(base), "cpu", "float32")(ids).logits).mean((0, 1))  # fmt: skip
    b = bias(1, shift.numel(), 2.0)
    assert float(torch.corrcoef(torch.stack([shift - shift.mean(), b]))[0, 1]) > 0.5


@pytest.mark.parametrize("settings", [{"std": "0"}, {"std": "-1"}, {"std": "nan"}, {"std": "inf"}, {"seed": "-2"},
                                      {"delta": "1"}, {"std": "1e39"}, {"std": "1e-50"}])  # fmt: skip
def test_bad_settings_are_one_line(settings):
    with pytest.raises(HarnessError) as err:
        methods.build("gaussian-bias", settings)
    assert "\n" not in str(err.value)
