"""GaussMark detection speed: one backward pass per batch of texts (methods/gaussmark.py ``per_text_gradients``)
against one backward pass per text (the durability study's loop), on a random Llama of a chosen shape.

    python benchmarks/gaussmark_detect.py [--texts N] [--tokens T] [--batch B] [--loop-texts K] [--device D]
                                          [--hidden H] [--layers L] [--vocab V]

Both compute, per text, the projection of the log-likelihood gradient on the key and its norm over the noised weights
(every layer's MLP up and down projections here); "max rel diff" compares their z-scores on the K texts the loop
scores (its rate is extrapolated to N). Defaults: 64 texts of 64 tokens, batches of 16, a 4-layer Llama of width 256
and vocabulary 4,096; about a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--loop-texts", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if not 1 <= args.loop_texts <= args.texts:
        parser.error("--loop-texts must be in 1..--texts")

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from methods.gaussmark import GaussMarkDetector, per_text_gradients, summed_gradient, target_names

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        LlamaForCausalLM(config).save_pretrained(tmp)
        names = target_names(config, tuple(range(args.layers)), ("mlp.up_proj", "mlp.down_proj"))
        shapes = {n: [4 * args.hidden, args.hidden] if n.endswith("up_proj") else [args.hidden, 4 * args.hidden]
                  for n in names}  # fmt: skip
        det = GaussMarkDetector({"sigma": 0.02, "seed": 0, "weights": shapes}, str(Path(tmp)), args.device, None,
                                args.batch)  # fmt: skip
        g = torch.Generator().manual_seed(1)
        texts = torch.randint(0, args.vocab, (args.texts, args.tokens), generator=g).tolist()
        contexts = [[0]] * args.texts

        start = time.perf_counter()
        fast = []
        for i in range(0, args.texts, args.batch):
            fast += per_text_gradients(det, contexts[i : i + args.batch], texts[i : i + args.batch])
        batched_s = time.perf_counter() - start

        start = time.perf_counter()
        slow = []
        for context, text in zip(contexts[: args.loop_texts], texts[: args.loop_texts], strict=True):
            grads = summed_gradient(det, [context], [text])
            slow.append((sum(float((grads[n] * det.xi[n]).sum()) for n in grads),
                         sum(float((v * v).sum()) for v in grads.values())))  # fmt: skip
        loop_s = (time.perf_counter() - start) * args.texts / args.loop_texts

    z = lambda p, s: p / (0.02 * s**0.5)  # noqa: E731
    diff = max(abs(z(*a) - z(*b)) / max(abs(z(*b)), 1e-12) for a, b in zip(fast, slow, strict=False))
    tokens = args.texts * args.tokens
    print(f"{args.texts} texts x {args.tokens} tokens, {len(names)} noised matrices, {args.device}")
    row = "{:<34}{:>12}{:>12}"
    print(row.format("", "seconds", "tokens/s"))
    print(row.format(f"batched ({args.batch} texts a pass)", f"{batched_s:.2f}", f"{tokens / batched_s:.0f}"))
    print(row.format(f"per text (timed on {args.loop_texts})", f"{loop_s:.2f}", f"{tokens / loop_s:.0f}"))
    print(f"speed-up {loop_s / batched_s:.1f}x; max relative z difference {diff:.1e}")


if __name__ == "__main__":
    main()
