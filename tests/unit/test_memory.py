"""glibc's thresholds raised for large tensors (``harness.compute.memory``) change where tensors live, not what is
computed: two training steps of a model whose logits exceed 32 MB give bit-identical weights either way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

STEPS = r"""
import hashlib, sys, torch
from harness.compute.memory import tune_allocator
from methods.distill import kl_per_token
tuned = tune_allocator()
torch.manual_seed(0)
# A language model's shape at its ends (torch alone: a subprocess that imports transformers takes seconds to start)
nn = torch.nn
model = nn.Sequential(nn.Embedding(8192, 64), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8192))
teacher = nn.Sequential(nn.Embedding(8192, 64), nn.Linear(64, 8192)).requires_grad_(False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    batch = torch.randint(0, 8192, (16, 64))  # logits 16 x 64 x 8,192 floats: 33.5 MB
    with torch.no_grad():
        target = teacher(batch)
    kl_per_token(model(batch), target).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print(tuned, digest)
"""


def _steps(malloc: str) -> tuple[str, str]:
    env = {**os.environ, "HARNESS_MALLOC": malloc}
    out = subprocess.run([sys.executable, "-c", STEPS], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    tuned, digest = out.stdout.split()[-2:]
    return tuned, digest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_raised_thresholds_leave_training_bit_identical():
    tuned, digest = _steps("")
    untouched, reference = _steps("system")
    assert (tuned, untouched) == ("True", "False")
    assert digest == reference
