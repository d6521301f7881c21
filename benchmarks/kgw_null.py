"""How one KGW key's per-text z-scores behave on human text, against other keys (nothing is trained or generated).

Over keys, a human text's KGW z-score is about N(0, 1): its green count is that of lists drawn independently of it.
The texts of a corpus share frequent (context, token) units (bigrams at k = 1: docstring boilerplate, code; tokens at
k = 0), and one key makes each of those green or red for every text at once, so over one key's texts the z-scores
share an offset: their mean has a standard deviation over keys of sqrt(sum_u c_u^2) / (n sqrt(T)) (c_u: the
occurrences of unit u among the n texts of T scored tokens each), not 1 / sqrt(n), and a per-text p-value is then no
false-positive rate for that key. This prints, for
the preset's Gu-KGW key and ``--keys`` other hash keys, on the human continuations a run scores (decoded and
tokenized again):

- the key's mean z over the texts, their sd, and the share under p = 0.01;
- the pooled test ``harness detect`` decides by (each distinct (seed, token) pair of all texts once);
- over the other keys, the spread of the mean z beside the one predicted from the unit counts, and where the
  preset key falls among them.

    python benchmarks/kgw_null.py [--preset smol] [--set eval_data.path=builtin:small-corpus] [--texts 1000]
        [--new-tokens 200] [--method-arg k=1] [--keys 50]

Measured for ``results/reference/smol-gpu/`` (SmolLM2's tokenizer, the small corpus's held-out documents, 1,000 texts
of 200 tokens after 32, k = 1, gamma 0.25; ``--set eval_data.path=builtin:small-corpus --keys 150``, 8 minutes on 2
cores): the preset key's mean z 1.383, the 150 others' -0.013 with sd 0.450, 0.438 predicted.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import Counter


def human_texts(preset, count: int) -> tuple[object, list[list[int]]]:
    """The base tokenizer and the first ``count`` human continuations of the preset's evaluation prompts, decoded and
    tokenized again as a run scores them."""
    from harness.assets import data
    from harness.assets.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve(preset.base_model))
    texts = data.load_texts(preset.eval_data)
    prompts = data.eval_prompts(tokenizer, texts, count, preset.eval.prompt_tokens, preset.eval.new_tokens)
    decoded = [tokenizer.decode(p["human_ids"], skip_special_tokens=True) for p in prompts]
    return tokenizer, [ids for ids in tokenizer(decoded, add_special_tokens=False)["input_ids"] if ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smol")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as harness run's --set")
    parser.add_argument("--method-arg", action="append", default=[], metavar="KEY=VALUE", help="Gu-KGW's, e.g. k=0")
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--keys", type=int, default=50, help="other hash keys to compare the preset's with")
    args = parser.parse_args()

    import torch

    from harness.config import presets
    from harness.config.params import parse_assignments
    from harness.config.registry import methods
    from harness.config.settings import apply_overrides
    from methods.kgw import GreenLists, pooled_score, score_sequences

    torch.set_num_threads(1)  # (the green lists are drawn one context at a time)
    overrides = {"eval.new_tokens": str(args.new_tokens), **parse_assignments(args.set, "setting")}
    preset = apply_overrides(presets.get_preset(args.preset), overrides)
    tokenizer, seqs = human_texts(preset, args.texts)
    method = methods.build("gu-kgw", parse_assignments(args.method_arg, "method setting"), preset)
    preset_key = method.key(tokenizer, method.params.detector_drop_special)
    width = 0 if preset_key.seeding_scheme == "simple_0" else preset_key.context_width  # (k = 0: one list for all)
    start = preset_key.context_width  # the first position the detector scores
    counts = Counter((tuple(s[i - width : i]), s[i]) for s in seqs for i in range(start, len(s)))
    mean_len = statistics.mean(len(s) - start for s in seqs)
    predicted = sum(c * c for c in counts.values()) ** 0.5 / (len(seqs) * mean_len**0.5)
    top = sum(c for _, c in counts.most_common(100)) / sum(counts.values())
    print(f"{len(seqs)} human texts of {mean_len + start:.0f} tokens ({preset.eval_data.path}, {preset.base_model}); "
          f"{len(counts):,} distinct (context, token) units at k = {width}, the 100 most frequent {top:.1%} of the "
          "occurrences")  # fmt: skip

    def measure(key) -> dict:
        lists = GreenLists(key)
        scores = score_sequences(lists, seqs)
        z = [s.z_score for s in scores]
        pooled = pooled_score(lists, seqs)
        return {"mean": statistics.mean(z), "sd": statistics.stdev(z),
                "flagged": sum(s.p_value < 0.01 for s in scores) / len(scores), "pooled_p": pooled.p_value}  # fmt: skip

    began = time.perf_counter()
    mine = measure(preset_key)
    print(f"\npreset key (hash key {preset_key.hash_key}, {preset_key.seeding_scheme}, gamma {preset_key.gamma:g}): "
          f"mean z {mine['mean']:.3f}, sd {mine['sd']:.3f}, {mine['flagged']:.1%} of the texts under p = 0.01; "
          f"pooled test p = {mine['pooled_p']:.3g}")  # fmt: skip
    generator = torch.Generator().manual_seed(999)
    hash_keys = torch.randint(1, 2**31 - 1, (args.keys,), generator=generator).tolist()
    others = []
    for i, hash_key in enumerate(hash_keys, 1):
        key = dataclasses.replace(preset_key, hash_key=hash_key)
        others.append(measure(key))
        if i % 10 == 0 or i == len(hash_keys):
            print(f"  {i} other keys ({time.perf_counter() - began:.0f} s)", flush=True)
    means = [o["mean"] for o in others]
    above = sum(m >= mine["mean"] for m in means)
    print(f"\nover {len(others)} other keys: mean z {statistics.mean(means):+.3f} (sd {statistics.stdev(means):.3f}, "
          f"from {min(means):+.3f} to {max(means):+.3f}); predicted sd from the unit counts {predicted:.3f}, "
          f"{1 / len(seqs) ** 0.5:.3f} if tokens were independent")  # fmt: skip
    flagged = sorted(o["flagged"] for o in others)
    print(f"share of texts under p = 0.01: median {statistics.median(flagged):.1%}, from {flagged[0]:.1%} to "
          f"{flagged[-1]:.1%}; pooled test p under 0.01 for {sum(o['pooled_p'] < 0.01 for o in others)} of "
          f"{len(others)} keys")  # fmt: skip
    away = (mine["mean"] - statistics.mean(means)) / statistics.stdev(means)
    print(
        f"the preset key's mean z is {away:+.1f} sd from the others' mean; {above} of {len(others)} other keys reach it"
    )


if __name__ == "__main__":
    main()
