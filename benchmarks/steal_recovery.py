"""How much of a KGW key watermark stealing recovers from N of the watermarked model's texts (``attacks/stealing.py``).

Decoding-time KGW's green lists are known exactly, so the stolen estimate can be checked pair by pair: for each N,
the share of the estimate's boosted (context, token) pairs that are green for their context (chance: gamma), over
all of them and over the 100 and 1,000 highest-scored, with how many contexts the estimate covers; and its recall:
the share of the green tokens the watermarked model writes in its evaluation texts (each a use of a (context, token)
pair) whose pair the estimate holds, which is what scrubbing can take off. The estimate is the
one ``steal-scrub`` and ``steal-spoof`` build (the same stage: reused by a grid that runs them with the same
settings), here from the preset's decoding-time KGW (``kgw-decoding``, its preset delta unless ``--delta``) and the
base's texts as the reference.

``--k 2`` seeds the scheme's green lists by the two tokens before (Gu-KGW's k = 2: Additive-LeftHash, so a list
depends on the two ids' sum), and ``--context 1,2`` steals with contexts of one and of two tokens. The share of an
estimate's pairs that are green is defined where its context holds the scheme's (``-`` where it is narrower: the list
of a pair then depends on a token the estimate does not see); for every width, "held uses green" is the share of the
evaluation texts' tokens whose (context, token) pair the estimate holds that are green (what a scrub or a spoof acts
on; the texts' own green share is printed above the table for comparison).

    python benchmarks/steal_recovery.py [--preset tiny] [--texts 100,300,1000,3000] [--delta 2] [--k 1]
        [--context 1] [--results DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--texts", default="100,300,1000,3000")
    parser.add_argument("--delta", type=float, help="the decoding-time KGW's delta (default: the preset's)")
    parser.add_argument("--k", type=int, help="the tokens that seed a green list (default: the preset's)")
    parser.add_argument("--context", default="1", help="comma-separated widths of the stolen contexts")
    parser.add_argument("--results", type=Path, default=Path("results/runs"))
    args = parser.parse_args()

    import numpy as np
    import torch

    from attacks.stealing import context_keys, load_estimate, recovered
    from harness.cell.pipeline import Pipeline
    from harness.config import presets
    from harness.config.registry import attacks, methods
    from harness.store.stages import Store
    from methods.kgw import GreenLists, KGWKey

    preset = presets.get_preset(args.preset)
    pipe = Pipeline(preset, Store(args.results))
    settings = {"delta": args.delta, "k": args.k}
    method = methods.build("kgw-decoding", {k: str(v) for k, v in settings.items() if v is not None}, preset)
    trained = pipe.train(method)
    (unaltered_out,) = pipe.attack(attacks.build("none", {}), trained)
    sampler = ({"method": method.name, "key_from": trained.key},
               lambda tokenizer: method.logits_processors(trained.path, tokenizer))  # fmt: skip
    unaltered = (unaltered_out, pipe.generate(unaltered_out.path, unaltered_out.model_id, "Unaltered", sampler))
    key = KGWKey.from_dict(method.detection_key(pipe.tokenizer)["detector"])
    greens, k = GreenLists(key), key.context_width

    def green(window: tuple[int, ...], token: int) -> bool:
        """Whether ``token`` is green after ``window`` (at least the scheme's ``k`` ids, the last ``k`` read)."""
        return bool(greens.masks(torch.tensor(window[-k:]))[0, token])

    from harness.store.files import read_jsonl

    widths = [int(w) for w in args.context.split(",")]
    wide = max(widths + [k])
    texts = [g["prompt_ids"][-wide:] + g["completion_ids"] for g in read_jsonl(unaltered[1].path / "generations.jsonl")]
    # every token of the evaluation texts written after a full context of the widest width: (the ids before, itself)
    uses = [(tuple(ids[i - wide : i]), ids[i]) for ids in texts for i in range(wide, len(ids))]
    is_green = [green(window, token) for window, token in uses]
    print(f"\n{method.label} ({method.config_label()}, gamma {key.gamma:g}: chance) on {preset.name}; the base's "
          f"texts as the reference. The unaltered model's {len(uses):,} tokens of evaluation text hold "
          f"{sum(is_green):,} green ones ({sum(is_green) / max(len(uses), 1):.3f}).\n")  # fmt: skip
    print("| N | context | pairs | contexts | all green | top 1,000 | top 100 | green uses held | held uses green | "
          "seconds |")  # fmt: skip
    print("| --- " * 10 + "|")
    for n in [int(x) for x in args.texts.split(",")]:
        for width in widths:
            start = time.time()
            attack = attacks.build("steal-scrub", {"texts": str(n), "context": str(width)}, preset)
            estimate = load_estimate(attack.steal(pipe, unaltered)["folder"])
            vocab = int(estimate.get("vocab", key.vocab_size))
            pairs, contexts = len(estimate["scores"]), len(set(estimate["contexts"].tolist()))

            def window_of(context: int, width: int = width, vocab: int = vocab) -> tuple[int, ...]:
                return tuple(context // vocab ** (width - 1 - j) % vocab for j in range(width))  # (context_keys)

            shares = ([recovered(estimate, lambda c, t: green(window_of(c), t), top) for top in (None, 1000, 100)]
                      if width >= k else [None] * 3)  # fmt: skip
            held = set(zip(estimate["contexts"].tolist(), estimate["tokens"].tolist(), strict=True))
            acted = [g for (window, token), g in zip(uses, is_green, strict=True)
                     if (int(context_keys(np.asarray(window[-width:]), vocab)), token) in held]  # fmt: skip
            recall = sum(acted) / max(sum(is_green), 1)
            print(f"| {n:,} | {width} | {pairs:,} | {contexts:,} | "
                  + " | ".join("-" if s is None else f"{s:.3f}" for s in shares)
                  + f" | {recall:.3f} | {sum(acted) / max(len(acted), 1):.3f} | {time.time() - start:.0f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
