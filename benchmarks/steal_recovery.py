"""How much of a KGW key watermark stealing recovers from N of the watermarked model's texts (``attacks/stealing.py``).

Decoding-time KGW's green lists are known exactly, so the stolen estimate can be checked pair by pair: for each N,
the share of the estimate's boosted (context, token) pairs that are green for their context (chance: gamma), over
all of them and over the 100 and 1,000 highest-scored, with how many contexts the estimate covers; and its recall:
the share of the green tokens the watermarked model writes in its evaluation texts (each a use of a (context, token)
pair) whose pair the estimate holds, which is what scrubbing can take off. The estimate is the
one ``steal-scrub`` and ``steal-spoof`` build (the same stage: reused by a grid that runs them with the same
settings), here from the preset's decoding-time KGW (``kgw-decoding``, its preset delta unless ``--delta``) and the
base's texts as the reference.

    python benchmarks/steal_recovery.py [--preset tiny] [--texts 100,300,1000,3000] [--delta 2] [--results DIR]
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
    parser.add_argument("--results", type=Path, default=Path("results/runs"))
    args = parser.parse_args()

    import torch

    from attacks.stealing import load_estimate, recovered
    from harness.cell.pipeline import Pipeline
    from harness.config import presets
    from harness.config.registry import attacks, methods
    from harness.store.stages import Store
    from methods.kgw import GreenLists, KGWKey

    preset = presets.get_preset(args.preset)
    pipe = Pipeline(preset, Store(args.results))
    method = methods.build("kgw-decoding", {} if args.delta is None else {"delta": str(args.delta)}, preset)
    trained = pipe.train(method)
    (unaltered_out,) = pipe.attack(attacks.build("none", {}), trained)
    sampler = ({"method": method.name, "key_from": trained.key},
               lambda tokenizer: method.logits_processors(trained.path, tokenizer))  # fmt: skip
    unaltered = (unaltered_out, pipe.generate(unaltered_out.path, unaltered_out.model_id, "Unaltered", sampler))
    key = KGWKey.from_dict(method.detection_key(pipe.tokenizer)["detector"])
    greens = GreenLists(key)

    def green(context: int, token: int) -> bool:
        return bool(greens.masks(torch.tensor([context]))[0, token])

    print(f"\n{method.label} ({method.config_label()}, gamma {key.gamma:g}: chance) on {preset.name}; the base's "
          "texts as the reference; share of the estimate's boosted pairs that are green\n")  # fmt: skip
    from harness.store.files import read_jsonl

    uses = [(ids[i - 1], ids[i]) for g in read_jsonl(unaltered[1].path / "generations.jsonl")
            for ids in [g["prompt_ids"][-1:] + g["completion_ids"]] for i in range(1, len(ids))]  # fmt: skip
    green_uses = [pair for pair in uses if green(*pair)]
    print(f"(the unaltered model's {len(uses):,} tokens of evaluation text hold {len(green_uses):,} green ones)\n")
    print("| N | pairs | contexts | all | top 1,000 | top 100 | green uses held | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in [int(x) for x in args.texts.split(",")]:
        start = time.time()
        attack = attacks.build("steal-scrub", {"texts": str(n)}, preset)
        estimate = load_estimate(attack.steal(pipe, unaltered)["folder"])
        pairs, contexts = len(estimate["scores"]), len(set(estimate["contexts"].tolist()))
        shares = [recovered(estimate, green, top) for top in (None, 1000, 100)]
        held = set(zip(estimate["contexts"].tolist(), estimate["tokens"].tolist(), strict=True))
        recall = sum(pair in held for pair in green_uses) / max(len(green_uses), 1)
        print(f"| {n:,} | {pairs:,} | {contexts:,} | " + " | ".join(f"{s:.3f}" for s in shares)
              + f" | {recall:.3f} | {time.time() - start:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
