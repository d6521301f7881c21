"""KGW detection speed: the packed green-list table against on-the-fly lists and lm-watermarking's per-position loop.

    python benchmarks/kgw_detect.py [--texts N] [--tokens T] [--vocab V] [--loop-texts K] [--fly-texts F] [--device D]

Scores N random texts of T tokens (k = 1, gamma = 0.25, simple_1) three ways, all on the same ids:
- "lm-watermarking loop": what lm-watermarking's detector (as Gu et al. vendor it) does per scored position: seed a
  CPU generator with hash_key * previous id, draw randperm(V), test the next id against its first gamma * V entries.
  Timed on the first K texts and extrapolated to N.
- "on the fly": ``GreenLists.hits`` without a table: one randperm per distinct previous id of the batch, cached
  (on the first F texts: at V = 128,256, all N texts meet nearly every id, the table build's work done on one core).
- "packed table": ``GreenLists.hits`` with the bit-packed table of all V lists (gather + unpack), timed once with
  the table build included (first cell of a grid) and once with the table cached (every later cell).
Green counts of the three are compared on the K looped texts. Defaults: 5,000 x 200 tokens at V = 128,256 (the
table is 2 GB), K = 20: several minutes on 2 CPU cores, most of it the table build and the loop. Targets (issue 17):
the packed table at least 5x the loop including the build, at least 50x once cached.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def loop_green_counts(key, texts: list[list[int]]) -> list[int]:
    """lm-watermarking's detection, position by position (one generator seeding and one randperm per position)."""
    generator = torch.Generator(device="cpu")
    size = key.greenlist_size
    counts = []
    for ids in texts:
        green = 0
        for prev, target in zip(ids[:-1], ids[1:], strict=True):
            generator.manual_seed(key.hash_key * prev)
            green += int(target in set(torch.randperm(key.vocab_size, generator=generator)[:size].tolist()))
        counts.append(green)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=5000)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--loop-texts", type=int, default=20)
    parser.add_argument("--fly-texts", type=int, default=None, help="texts scored on the fly (default: all N)")
    parser.add_argument("--device", default="cpu", help="where the packed table is looked up (cpu or cuda)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 1 <= args.loop_texts <= args.texts:
        parser.error("--loop-texts must be in 1..--texts")

    from methods.kgw import GreenLists, KGWKey, build_green_table, load_green_table, score_sequences

    key = KGWKey(0.25, 2.0, "simple_1", args.vocab)
    g = torch.Generator().manual_seed(args.seed)
    texts = torch.randint(0, args.vocab, (args.texts, args.tokens), generator=g).tolist()
    tokens = args.texts * (args.tokens - 1)
    print(f"{args.texts} texts x {args.tokens} tokens, V = {args.vocab}, k = 1, gamma = 0.25, {torch.get_num_threads()}"
          f" threads, table lookups on {args.device}")  # fmt: skip

    start = time.perf_counter()
    looped = loop_green_counts(key, texts[: args.loop_texts])
    loop_rate = args.loop_texts * (args.tokens - 1) / (time.perf_counter() - start)

    start = time.perf_counter()
    fly = score_sequences(GreenLists(key), texts[: args.fly_texts])  # a randperm per new context: F texts
    fly_rate = len(fly) * (args.tokens - 1) / (time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "table.npy"
        start = time.perf_counter()
        build_green_table(key, path)
        table = load_green_table(path, args.device)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        packed = score_sequences(GreenLists(key, table=table), texts)
        cached_s = time.perf_counter() - start
    same = [s.num_green for s in fly] == [s.num_green for s in packed[: len(fly)]]
    same_loop = looped == [s.num_green for s in packed[: args.loop_texts]]

    row = "{:<34}{:>14}{:>12}{:>16}"
    print(row.format("detector", "tokens/s", "seconds", "vs loop"))
    print("-" * 76)
    for name, rate in (
        (f"lm-watermarking loop ({args.loop_texts} texts)", loop_rate),
        (f"on the fly ({len(fly)} texts)", fly_rate),
        ("packed table, build included", tokens / (build_s + cached_s)),
        ("packed table, cached", tokens / cached_s),
    ):
        print(row.format(name, f"{rate:,.0f}", f"{tokens / rate:,.1f}", f"{rate / loop_rate:,.1f}x"))
    print(f"table build: {build_s:.1f} s ({table.numel() / 2**20:,.0f} MiB); green counts identical: on the fly vs "
          f"packed {same}, loop vs packed {same_loop}")  # fmt: skip


if __name__ == "__main__":
    main()
