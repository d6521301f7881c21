"""On a GPU (marked ``gpu``: skipped elsewhere): a KGW distillation step of the Llama-3.2-1B shape (random weights) in
bf16 mixed precision with a bf16 teacher, with and without gradient checkpointing, through the harness's own loop;
prints the step time and peak memory of each (issue 17: the figures the README's FSDP memory estimate rests on)."""

import math
import time

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_llama_1b_distillation_step_in_bf16(checkpointing):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.config.presets import TrainSettings
    from methods.distill import logit_distill
    from methods.kgw import GreenLists, KGWKey, watermark_logits

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    config = LlamaConfig(vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048,
                         tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialised on the GPU: 1.5B parameters take longer to initialise on a CPU
        student = LlamaForCausalLM(config)
        teacher = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    greens = GreenLists(KGWKey(0.25, 2.0, "simple_1", config.vocab_size))
    steps = 4
    settings = TrainSettings(steps=steps, batch_size=8, seq_len=512, lr=1e-5, mixed_precision="bf16",
                             teacher_dtype="bfloat16", gradient_checkpointing=checkpointing)  # fmt: skip

    def batches():
        g = torch.Generator().manual_seed(1)
        while True:
            yield torch.randint(0, config.vocab_size, (8, 512), generator=g)

    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    report = logit_distill(student, teacher, lambda ids, logits: watermark_logits(greens, ids, logits), batches(),
                           settings, "1B distillation", "cuda")  # fmt: skip
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"\n1B-shape KGW distillation, bf16, checkpointing={checkpointing}: "
          f"{(time.perf_counter() - start) / steps:.3f} s/step (first step included), peak {peak:.1f} GiB")  # fmt: skip
    assert math.isfinite(report["loss_last_10"])
