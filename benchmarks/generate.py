"""Generation speed: the harness's sampler (per-prompt draws, batch "auto" by default) against Gu et al.'s setting,
transformers' ``generate`` with multinomial sampling at batch 128, on the same prompts and model.

    python benchmarks/generate.py [--model REF] [--prompts N] [--prompt-tokens P] [--new-tokens T] [--batch B]
                                  [--reference-prompts K] [--device D] [--random-shape llama-1b|smollm2-135m]

Both draw exactly T new tokens per prompt (top-k 0, top-p 1, temperature 1). The reference is timed on the first K
prompts (K >= 128: whole batches) and its rate compared with the harness's on all N; ``--batch`` takes a list
(``auto,16,256``) for one harness row per batch size. The perplexity scorer (``completion_perplexity``, at
``--ppl-batch``, the presets' 32 by default) is timed on the harness's texts, in tokens read per second.

Each row is also put against the arithmetic bound of its forward passes on this device: its matrix-product FLOPs per
token (torch's FlopCounterMode on a few prompts, eager attention, the KV cache as it runs) at the rate of one large
matrix product in the model's dtype (2,048-square, 8,192 on a GPU, timed in the same run). "of bound" near 1 means
the model's arithmetic is all that is left; on a CPU at small shapes the per-step work around the model (the
generation loop, the sampler's noise, small matrices) is most of the time. On a GPU the peak memory of each is
printed too. Defaults: the tiny preset's model, 512 x (32 + 64) tokens, K = 256: about a minute on 2 CPU cores.
Target (issue 17, on a GPU at the paper's size, 5,000 x 200 new tokens): at least 4x the reference.
"""

from __future__ import annotations

import argparse
import time

import torch
from shapes import SHAPES, random_llama
from train_step import eager_attention, synchronize


def reference(model, prompts: torch.Tensor, new_tokens: int, batch: int) -> None:
    """Gu et al.'s evaluation sampling: HF generate, do_sample, top_k 0, top_p 1, at a fixed batch size."""
    for start in range(0, len(prompts), batch):
        ids = prompts[start : start + batch].to(model.device)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
                           temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           pad_token_id=model.config.eos_token_id)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny-lm")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", default="auto", help="the harness's batch sizes (integers or auto, comma-separated)")
    parser.add_argument("--ppl-batch", type=int, default=32, help="the perplexity scorer's batch size")
    parser.add_argument("--reference-prompts", type=int, default=256)
    parser.add_argument("--reference-batch", type=int, default=128)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="auto", help="model weights' dtype (auto: as stored)")
    parser.add_argument("--random-shape", choices=sorted(SHAPES), help="a real model's shape, random weights")
    args = parser.parse_args()
    if not 1 <= args.reference_prompts <= args.prompts:
        parser.error("--reference-prompts must be in 1..--prompts")

    from harness.assets import models
    from harness.compute.generation import completion_perplexity, sample
    from harness.compute.memory import tune_allocator
    from harness.config.settings import EvalSettings

    tuned = tune_allocator()  # as every harness process (HARNESS_MALLOC=system: glibc's defaults)
    device = args.device or models.default_device()
    if args.random_shape:
        dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
        model = random_llama(args.random_shape, device, dtype)
        args.model = f"{args.random_shape} shape (random weights)"
    else:
        model = models.load_causal_lm(models.resolve(args.model), device, dtype=args.dtype)
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = torch.randint(3, vocab, (args.prompts, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    cuda = model.device.type == "cuda"
    print(f"{args.model} on {model.device}: {args.prompts} prompts x ({args.prompt_tokens} + {args.new_tokens}) tokens,"
          f" {torch.get_num_threads()} CPU threads, glibc thresholds {'raised' if tuned else 'as they are'}"
          )  # fmt: skip

    def timed(fn) -> tuple[float, float | None]:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, (torch.cuda.max_memory_allocated() / 2**30 if cuda else None)

    batches = [b.strip() for b in args.batch.split(",")]
    settings = {b: EvalSettings(num_prompts=args.prompts, prompt_tokens=args.prompt_tokens,
                                new_tokens=args.new_tokens, batch_size=b) for b in batches}  # fmt: skip
    eos = model.config.eos_token_id
    dtype = next(model.parameters()).dtype
    size = 8192 if cuda else 2048  # a GPU does a 2,048-square product in microseconds: launch time, not arithmetic
    peak = matmul_rate(model.device, dtype, size)
    k = min(8, args.prompts)  # prompts whose FLOPs are counted
    few = prompts[:k].tolist()
    per_new_token = counted(lambda: sample(model, few, settings[batches[0]], eos, "count", 0)) / (k * args.new_tokens)

    ref_s, ref_mem = timed(lambda: reference(model, prompts[: args.reference_prompts], args.new_tokens,
                                             args.reference_batch))  # fmt: skip
    rows = [(f"HF generate, batch {args.reference_batch} ({args.reference_prompts} prompts)",
             args.reference_prompts * args.new_tokens / ref_s, per_new_token, ref_mem)]  # fmt: skip
    ref_rate = rows[0][1]
    texts: list = []
    for b in batches:
        used: dict = {}
        ours_s, ours_mem = timed(lambda b=b, used=used: texts.append(
            sample(model, prompts.tolist(), settings[b], eos, "gen", 0, used)))  # fmt: skip
        rows.append((f"harness sample, batch {b} -> {used['batch_size']}", args.prompts * args.new_tokens / ours_s,
                     per_new_token, ours_mem))  # fmt: skip

    read, scored = prompts.tolist(), texts[-1]
    width = args.prompt_tokens + args.new_tokens
    per_read_token = counted(lambda: completion_perplexity(model, read[:k], scored[:k], k)) / (k * width)
    ppl_s, ppl_mem = timed(lambda: completion_perplexity(model, read, scored, args.ppl_batch))
    rows.append((f"perplexity scorer, batch {args.ppl_batch} (tokens read)",
                 args.prompts * width / ppl_s, per_read_token, ppl_mem))  # fmt: skip

    print(f"matrix products: {peak / 1e9:,.0f} GFLOP/s ({dtype}, {size:,}-square); FLOPs per token: sampling "
          f"{per_new_token / 1e6:,.1f} M, scoring {per_read_token / 1e6:,.1f} M")  # fmt: skip
    row = "{:<52}{:>14}{:>9}{:>14}{:>10}{:>10}"
    print(row.format("", "tokens/s", "vs ref", "bound tok/s", "of bound", "peak GiB"))
    print("-" * 109)
    for name, rate, flops, mem in rows:
        bound = peak / flops
        ratio = f"{rate / ref_rate:.2f}x" if name.startswith(("HF", "harness")) else "-"
        print(row.format(name, f"{rate:,.0f}", ratio, f"{bound:,.0f}", f"{rate / bound:.2f}",
                         "-" if mem is None else f"{mem:.1f}"))  # fmt: skip


def matmul_rate(device, dtype, size: int, repeats: int = 10) -> float:
    """FLOP/s of the best of ``repeats`` ``size``-square matrix products in ``dtype`` on ``device`` (after one warm-up):
    the pace of this device's dense arithmetic, measured in the run it is compared in."""
    device = str(device)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    best = float("inf")
    for i in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        if i:
            best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def counted(fn) -> float:
    """Matrix-product FLOPs of ``fn()`` (torch's FlopCounterMode; eager attention, whose products it can count)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, eager_attention():
        fn()
    return counter.get_total_flops()


if __name__ == "__main__":
    main()
