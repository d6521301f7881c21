"""Generation speed: the harness's sampler (per-prompt draws, batch "auto" by default) against Gu et al.'s setting,
transformers' ``generate`` with multinomial sampling at batch 128, on the same prompts and model.

    python benchmarks/generate.py [--model REF] [--prompts N] [--prompt-tokens P] [--new-tokens T] [--batch B]
                                  [--reference-prompts K] [--device D] [--random-shape llama-1b|smollm2-135m]

Both draw exactly T new tokens per prompt (top-k 0, top-p 1, temperature 1). The reference is timed on the first K
prompts (K >= 128: whole batches) and its rate compared with the harness's on all N. On a GPU the peak memory of each
is printed too. Defaults: the tiny preset's model, 512 x (32 + 64) tokens, K = 256: about a minute on 2 CPU cores.
Target (issue 17, on a GPU at the paper's size, 5,000 x 200 new tokens): at least 4x the reference.
"""

from __future__ import annotations

import argparse
import time

import torch
from shapes import SHAPES, random_llama


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
    parser.add_argument("--batch", default="auto", help="the harness's batch size (an integer or auto)")
    parser.add_argument("--reference-prompts", type=int, default=256)
    parser.add_argument("--reference-batch", type=int, default=128)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="auto", help="model weights' dtype (auto: as stored)")
    parser.add_argument("--random-shape", choices=sorted(SHAPES), help="a real model's shape, random weights")
    args = parser.parse_args()
    if not 1 <= args.reference_prompts <= args.prompts:
        parser.error("--reference-prompts must be in 1..--prompts")

    from harness.assets import models
    from harness.compute.generation import sample
    from harness.compute.memory import tune_allocator
    from harness.config.presets import EvalSettings

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

    used: dict = {}
    settings = EvalSettings(num_prompts=args.prompts, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                            batch_size=args.batch)  # fmt: skip
    ref_s, ref_mem = timed(lambda: reference(model, prompts[: args.reference_prompts], args.new_tokens,
                                             args.reference_batch))  # fmt: skip
    ours_s, ours_mem = timed(
        lambda: sample(model, prompts.tolist(), settings, model.config.eos_token_id, "gen", 0, used)
    )
    ref_rate = args.reference_prompts * args.new_tokens / ref_s
    ours_rate = args.prompts * args.new_tokens / ours_s

    row = "{:<48}{:>16}{:>10}{:>12}"
    print(row.format("sampler", "new tokens/s", "vs ref", "peak GiB"))
    print("-" * 86)
    for name, rate, mem in (
        (f"HF generate, batch {args.reference_batch} ({args.reference_prompts} prompts)", ref_rate, ref_mem),
        (f"harness sample, batch {args.batch} -> {used['batch_size']}", ours_rate, ours_mem),
    ):
        print(row.format(name, f"{rate:,.0f}", f"{rate / ref_rate:.2f}x", "-" if mem is None else f"{mem:.1f}"))


if __name__ == "__main__":
    main()
