"""glibc's thresholds raised for large tensors (``harness.compute.memory``) change where tensors live, not what is
computed: two training steps of a model whose logits exceed 32 MB give bit-identical weights either way. Memory a
step frees is used again by the next without page faults, however much it is, and ``release`` gives it back. Each
stage records its resident peak."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

STEPS = r"""
import hashlib, sys, torch
from harness.compute.memory import tune_allocator
from methods.distill import kl_per_token
tuned = tune_allocator()
# One thread: with several, a matrix product's split can follow the machine's load (two runs of this script under a
# busy test suite once differed in the last bits with the same allocator), which is not what is tested here.
torch.set_num_threads(1)
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


def _printed(script: str, malloc: str, count: int) -> list[str]:
    """The last ``count`` words ``script`` prints, run in a fresh process with ``HARNESS_MALLOC=malloc``."""
    env = {**os.environ, "HARNESS_MALLOC": malloc}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[-count:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_raised_thresholds_leave_training_bit_identical():
    tuned, digest = _printed(STEPS, "", 2)
    untouched, reference = _printed(STEPS, "system", 2)
    assert (tuned, untouched) == ("True", "False")
    assert digest == reference


REUSE = r"""
import ctypes, resource
from harness.compute.memory import KEEP, free_heap, release, tune_allocator
tuned = tune_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes, libc.memset.argtypes = (ctypes.c_void_p,), (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
def step():  # a step's transient tensors: two of 600 MB, together more than the 1 GiB glibc kept when it trimmed
    blocks = [libc.malloc(600 << 20) for _ in range(2)]
    for block in blocks:
        libc.memset(block, 1, 600 << 20)
    for block in reversed(blocks):
        libc.free(block)
step()
before = faults()
step()
refaults = faults() - before
kept, held = (free_heap() or 0) > KEEP, rss()
print(tuned, refaults, kept, release(), held - rss() > KEEP)  # the last: more than KEEP went back
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and mallinfo2")
def test_a_step_reuses_what_the_last_freed_and_the_stage_gives_it_back():
    pages = (1200 << 20) // os.sysconf("SC_PAGE_SIZE")  # what one step touches
    tuned, refaults, kept, released, back = _printed(REUSE, "", 5)
    assert tuned == "True" and int(refaults) < pages // 20, refaults  # kept for the next step, not faulted in again
    assert (kept, released, back) == ("True", "True", "True")  # given back once the stage is over
    tuned, refaults, _, released, _ = _printed(REUSE, "system", 5)
    assert (tuned, released) == ("False", "False") and int(refaults) > pages // 2, refaults  # glibc's own way


PEAKS = r"""
import json, sys
from harness.compute.memory import stage_peak
from harness.store.stages import Store
big, small = 400 << 20, 100 << 20
with stage_peak() as outer:
    block = bytearray(big); block[::4096] = b"x" * len(block[::4096]); del block
    with stage_peak() as inner:
        block = bytearray(small); block[::4096] = b"x" * len(block[::4096]); del block
store = Store(sys.argv[1])
def build(folder):
    block = bytearray(small); block[::4096] = b"x" * len(block[::4096])
    return {}
store.build_or_reuse(store.stage("train", {"peak": 1}), "a stage", build)
manifest = json.loads(next(store.root.glob("stages/train/*/manifest.json")).read_text())
print(json.dumps([outer["rss_bytes"], inner["rss_bytes"], manifest["peak_memory"]["rss_bytes"], big, small]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the resident peak is read from /proc (Linux)")
def test_stage_peak_reads_each_stage_and_folds_nested_ones(tmp_path):
    """Each stage's manifest records its resident peak: a stage that touched 100 MB reports at least that and less
    than a 400 MB block its process had touched and freed before it began (the peak is reset at each stage's start);
    a stage inside another folds its peak into the enclosing one's."""
    out = subprocess.run([sys.executable, "-c", PEAKS, str(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "HARNESS_MALLOC": "system"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    outer, inner, stage, big, small = json.loads(out.stdout.strip().splitlines()[-1])
    assert outer >= big and small <= inner < big and small <= stage < big


@pytest.mark.parametrize("value", ["sytem", "glibc", "1", "off"])
def test_an_unknown_malloc_setting_is_one_line_before_any_work(value, cli, monkeypatch):
    """A typo of ``system`` would leave the tuned allocator in place in silence."""
    monkeypatch.setenv("HARNESS_MALLOC", value)
    out = cli("list")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "HARNESS_MALLOC" in out.stderr
    monkeypatch.setenv("HARNESS_MALLOC", "System")  # (case does not matter)
    assert cli("list").returncode == 0
