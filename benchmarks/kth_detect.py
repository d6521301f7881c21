"""KTH detection speed: the vectorised statistics of methods/kth.py against the direct per-text loop.

    python benchmarks/kth_detect.py [--texts N] [--tokens T] [--key-len M] [--vocab V] [--loop-texts K]

Scores N random texts of T tokens (the cost does not depend on the ids) with both statistics, Levenshtein at
gamma = 0 as Gu et al., in float64 (the default) and float32. The plain-Python loop (``statistic_loop``) is timed on
the first K texts only and its rate extrapolated to all N; "max |diff|" compares the two on those K texts,
"identical" means within 1e-6 relative (float32 rounding on a 200-token sum is about 1e-4 absolute). Key
construction (``torch.rand`` of m x V and the cost table) is timed on its own line and excluded from the rates.
Context: Gu et al.'s Cython alignment detector ran at 217-542 tokens/s on 2 CPU cores; the target for the Levenshtein
statistic is at least 20x that (>= ~11,000 tokens/s). Defaults: 1,000 x 200 tokens, m = 256, V = 32,000; about 3
minutes on 2 CPU cores, most of it the loop.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

GU_CYTHON_TOKENS_PER_S = (217, 542)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--key-len", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--loop-texts", type=int, default=10, help="texts scored by the per-text loop")
    parser.add_argument("--chunk", type=int, default=8, help="texts per vectorised batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 1 <= args.loop_texts <= args.texts:
        parser.error("--loop-texts must be in 1..--texts")

    from methods import kth

    key = kth.KTHKey(args.vocab, args.key_len)
    start = time.perf_counter()
    xi = kth.key_uniforms(key).numpy()
    kth._uniforms(key)  # warm the cache: key construction is not part of detection
    key_s = time.perf_counter() - start
    rng = np.random.default_rng(args.seed)
    texts = rng.integers(0, args.vocab, (args.texts, args.tokens)).tolist()
    subset = texts[: args.loop_texts]
    total_tokens = args.texts * args.tokens

    print(f"{args.texts} texts x {args.tokens} tokens, m = {args.key_len}, V = {args.vocab}")
    print(f"key construction (once per key, not counted below): {key_s:.2f} s")
    print(f"loop: timed on {len(subset)} texts and extrapolated to {args.texts}")
    row = "{:<22}{:<9}{:>18}{:>12}{:>9}  {:>10}  {}"
    header = row.format("statistic", "dtype", "vectorised tok/s", "loop tok/s", "ratio", "max |diff|", "identical")
    print(header)
    print("-" * len(header))
    for method in ("min-offset", "levenshtein"):
        start = time.perf_counter()
        slow = [kth.statistic_loop(xi, text, method, 0.0) for text in subset]
        loop_rate = len(subset) * args.tokens / (time.perf_counter() - start)
        for dtype in ("float64", "float32"):
            start = time.perf_counter()
            fast = kth.statistics(key, texts, method, 0.0, dtype=dtype, chunk=args.chunk)
            rate = total_tokens / (time.perf_counter() - start)
            gap = np.abs(np.array(fast[: len(subset)]) - np.array(slow))
            diff = float(gap.max())
            same = "yes" if np.all(gap <= 1e-6 * np.abs(slow) + 1e-9) else "no"
            name = f"{method} (gamma 0)" if method == "levenshtein" else method
            ratio = f"{rate / loop_rate:.0f}x"
            print(row.format(name, dtype, f"{rate:,.0f}", f"{loop_rate:,.0f}", ratio, f"{diff:.1e}", same))
    low, high = GU_CYTHON_TOKENS_PER_S
    print(f"reference: Gu et al.'s Cython Levenshtein detector {low}-{high} tok/s; target >= {20 * high:,} tok/s")


if __name__ == "__main__":
    main()
