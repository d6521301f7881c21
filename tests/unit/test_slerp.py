"""SLERP through mergekit equals the SLERP formula on the parameters (t = weight of the unwatermarked base)."""

import pytest
import torch
from safetensors.torch import load_file

from harness.config.registry import attacks
from harness.contract.attack import AttackContext

pytest.importorskip("mergekit")


def weights(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def slerp(t: float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Independent SLERP of a whole parameter tensor from a (t = 0) to b (t = 1), the paper's formula; a straight
    line where the two are (nearly) collinear (|cos| > 0.9995, mergekit's rule: the norms' all-ones weights)."""
    a64, b64 = a.double().flatten(), b.double().flatten()
    cos = (a64 / a64.norm() @ (b64 / b64.norm())).clamp(-1, 1)
    if cos.abs() > 0.9995:
        return ((1 - t) * a64 + t * b64).view(a.shape)
    omega = torch.acos(cos)
    return ((torch.sin((1 - t) * omega) * a64 + torch.sin(t * omega) * b64) / torch.sin(omega)).view(a.shape)


@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 1.0])
def test_slerp_matches_formula(random_llamas, tmp_path, t):
    marked, base = random_llamas
    attack = attacks.build("slerp", {"t": str(t)})
    record = attack.apply(marked, tmp_path, AttackContext(str(base), "cpu"))
    out = tmp_path / "model"
    assert record["mergekit_config"]["parameters"] == {"t": t}
    merged, a, b = weights(out), weights(marked), weights(base)
    assert merged.keys() == a.keys()
    for name in a:  # every tensor, each interpolated as a whole
        assert torch.allclose(merged[name].double(), slerp(t, a[name], b[name]), atol=1e-5), name
    if t == 0.0:
        assert all(torch.allclose(merged[k], a[k]) for k in a)
    if t == 1.0:
        assert all(torch.allclose(merged[k], b[k], atol=1e-6) for k in a)
    assert (out / "tokenizer.json").exists()
