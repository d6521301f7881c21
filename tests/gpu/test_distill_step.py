"""On a GPU (marked ``gpu``: skipped elsewhere): a KGW distillation step of the Llama-3.2-1B shape (random weights) in
bf16 mixed precision with a bf16 teacher, with and without gradient checkpointing, through the harness's own loop and
the packed green-list table on the GPU (as the GPU presets train at V = 128,256); prints the step time after the first
step and the peak memory of each (the figures docs/guide.md's FSDP memory figure is derived from)."""

import importlib.util
import itertools
import math
import statistics
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

_SPEC = importlib.util.spec_from_file_location("shapes", Path(__file__).parents[2] / "benchmarks" / "shapes.py")
shapes = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(shapes)  # the benchmarks' shapes (benchmarks/ is not a package)


@pytest.fixture(scope="module")
def green_table(tmp_path_factory):
    """The packed green lists of the test's key at V = 128,256 (2 GB; about 26 s on 16 CPU threads), on the GPU."""
    import torch

    from methods.kgw import KGWKey, build_green_table, load_green_table

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    key = KGWKey(0.25, 2.0, "simple_1", 128_256)
    path = tmp_path_factory.mktemp("greens") / "table.npy"
    build_green_table(key, path)
    return key, load_green_table(path, "cuda")


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_llama_1b_distillation_step_in_bf16(checkpointing, green_table):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.config.settings import TrainSettings
    from methods.distill import logit_distill
    from methods.kgw import GreenLists, watermark_logits

    config = LlamaConfig(max_position_embeddings=2048, **shapes.SHAPES["llama-1b"])
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialised on the GPU: 1.5B parameters take longer to initialise on a CPU
        student = LlamaForCausalLM(config)
        teacher = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    greens = GreenLists(green_table[0], table=green_table[1])
    steps = 6
    settings = TrainSettings(steps=steps, batch_size=8, seq_len=512, lr=1e-5, mixed_precision="bf16",
                             teacher_dtype="bfloat16", gradient_checkpointing=checkpointing)  # fmt: skip

    def batches():
        g = torch.Generator().manual_seed(1)
        while True:
            yield torch.randint(0, config.vocab_size, (8, 512), generator=g)

    ends = []

    def on_step(step, model):
        torch.cuda.synchronize()
        ends.append(time.perf_counter())

    torch.cuda.reset_peak_memory_stats()
    report = logit_distill(student, teacher, lambda ids, logits: watermark_logits(greens, ids, logits), batches(),
                           settings, "1B distillation", "cuda", on_step=on_step)  # fmt: skip
    peak = torch.cuda.max_memory_allocated() / 2**30
    step_s = statistics.median(b - a for a, b in itertools.pairwise(ends))
    print(f"\n1B-shape KGW distillation, bf16, checkpointing={checkpointing}: {step_s:.3f} s/step (median after the "
          f"first), {8 * 512 / step_s:,.0f} tokens/s, peak {peak:.1f} GiB")  # fmt: skip
    assert math.isfinite(report["loss_last_10"])
