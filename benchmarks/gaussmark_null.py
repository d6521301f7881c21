"""How a GaussMark key's per-text z's behave under the null, from a stored base row (nothing is trained or generated).

Per text, z = <xi, g> / (sigma |g|) is exactly N(0, 1) over keys, since the gradient g of an unwatermarked text under
the base does not depend on the key. The texts of one row share one key, so their z's are jointly N(0, C) over keys,
C the cosines between the texts' gradients: they are correlated, and the usual 95% intervals of their mean and
standard deviation (which assume independent texts) hold for fewer than 95% of keys. This prints, for the human and
the generated texts of a stored base row:

- the mean pairwise cosine and the largest eigenvalues of C (all 1 for independent texts);
- over ``--keys`` keys drawn from N(0, C): how often the independent-text intervals of the mean (0) and of the
  standard deviation (1) hold, and the per-text flag rate at 1%;
- for the stored key: its mean and mean square with their exact 95% intervals under N(0, C), beside the
  independent-text ones;
- with ``--real-keys K``: the same pass rates over the method's own keys for seeds 1..K (drawn as training draws
  them), which checks the key generator against N(0, C) (about 70 ms a key on the tiny preset's six matrices).

    python benchmarks/gaussmark_null.py RUN [--results results/runs] [--keys 20000] [--real-keys 1000]

RUN is the hash (or a unique prefix) of a GaussMark run of the unwatermarked base row (``harness tables``' runs.csv
lists them). The texts are scored as a run scores them (decoded, tokenized again, each given its prompt).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def gradients(det, contexts, sequences):
    """Each text's gradient of its log-likelihood with respect to the key's weights, flattened (texts, entries)."""
    import torch

    from methods.gaussmark import layer_signals

    inputs, outputs, _ = layer_signals(det, contexts, sequences)
    parts = [torch.einsum("bto,bti->boi", outputs[n].double(), inputs[n].double()).flatten(1) for n in det.targets]
    return torch.cat(parts, 1)


def interval_checks(z):
    """For each row of ``z`` (keys x texts): whether the independent-text 95% intervals of the mean and of the standard
    deviation (normal approximation of the chi-square) hold 0 and 1."""
    import numpy as np

    n = z.shape[1]
    mean, sd = z.mean(1), z.std(1, ddof=1)
    chi = 1.96 * math.sqrt(2 * (n - 1))
    low, high = sd * math.sqrt((n - 1) / (n - 1 + chi)), sd * math.sqrt((n - 1) / (n - 1 - chi))
    return np.abs(mean) <= 1.96 * sd / math.sqrt(n), (low <= 1) & (1 <= high)


def report(name: str, grads, xi, sigma: float, keys: int, own=None) -> None:
    import numpy as np

    z_key = ((grads @ xi) / (sigma * grads.norm(dim=1))).numpy()
    units = grads / grads.norm(dim=1, keepdim=True)
    cos = (units @ units.T).numpy()
    n = len(cos)
    eig, vec = np.linalg.eigh(cos)
    eig = np.clip(eig, 0, None)
    z = (np.random.default_rng(0).standard_normal((keys, n)) * np.sqrt(eig)) @ vec.T  # keys x texts, N(0, C)
    mean_ok, sd_ok = interval_checks(z)
    flagged = (z > 2.3263).mean(1)
    square = (z**2).mean(1)
    print(
        f"{name}: {n} texts, mean pairwise cosine {(cos.sum() - n) / (n * (n - 1)):.4f}, "
        f"largest eigenvalues of C {', '.join(f'{e:.1f}' for e in eig[::-1][:5])} (independent texts: 1)"
    )
    print(
        f"  over {keys} keys: the independent-text 95% interval holds 0 for the mean in {mean_ok.mean():.3f}, "
        f"1 for the sd in {sd_ok.mean():.3f}, both in {(mean_ok & sd_ok).mean():.3f} (independent texts: 0.95, "
        f"0.95, 0.90); flagged at 1%: {flagged.mean():.4f} on average, 5-95% of keys {np.quantile(flagged, 0.05):.3f}"
        f"-{np.quantile(flagged, 0.95):.3f}"
    )
    print(f"  the stored key: mean {z_key.mean():.3f} (exact 95% interval +-{1.96 * math.sqrt(cos.sum()) / n:.3f}, "
          f"independent +-{1.96 / math.sqrt(n):.3f}), sd {z_key.std(ddof=1):.3f}, mean square {(z_key**2).mean():.3f} "
          f"(exact 95% interval {np.quantile(square, 0.025):.3f}-{np.quantile(square, 0.975):.3f}, independent "
          f"{1 - 1.96 * math.sqrt(2 / n):.3f}-{1 + 1.96 * math.sqrt(2 / n):.3f})")  # fmt: skip
    if own is not None:
        mean_ok, sd_ok = interval_checks(own)
        print(
            f"  over the method's own keys, seeds 1..{len(own)}: the intervals hold 0 for the mean in "
            f"{mean_ok.mean():.3f}, 1 for the sd in {sd_ok.mean():.3f}, both in {(mean_ok & sd_ok).mean():.3f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a GaussMark run of the unwatermarked base row: its hash or a unique prefix")
    parser.add_argument("--results", default="results/runs", help="the run store (default results/runs)")
    parser.add_argument("--keys", type=int, default=20000, help="keys drawn from N(0, C) (default 20000)")
    parser.add_argument("--real-keys", type=int, default=0, help="also the method's own keys of seeds 1..K")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from harness.assets import models
    from harness.contract.method import read_key
    from harness.store import kinds
    from harness.store.stages import Store
    from methods.gaussmark import GaussMarkDetector

    store = Store(Path(args.results))
    found = [s for s in store.matching(args.run) if s.kind == kinds.RUN]
    if len(found) != 1:
        sys.exit(f"'{args.run}' names {len(found)} runs in {args.results}")
    spec = json.loads((found[0].path / "spec.json").read_text())
    if spec["detector"]["method"] != "gaussmark":
        sys.exit(f"run {args.run} is a run of {spec['detector']['method']}, not of gaussmark")
    key_dir = store.folder(kinds.TRAIN, spec["detector"]["key_from"])
    base = models.resolve(spec["upstream"]["train"]["base_model"]["ref"])
    tokenizer = models.load_tokenizer(base)
    det = GaussMarkDetector(read_key(key_dir), base, "cpu", tokenizer, 8)
    rows = [json.loads(line) for line in (found[0].path / "generations.jsonl").read_text().splitlines()]
    xi = torch.cat([det.xi[n].flatten() for n in det.targets]).double()
    grads = {}
    for name, field in (("human texts", "human"), ("generated texts", "completion")):
        ids = tokenizer([r[field] for r in rows], add_special_tokens=False)["input_ids"]
        grads[name] = torch.cat([
            gradients(det, [r["prompt_ids"] for r in rows[s : s + 8]], ids[s : s + 8]) for s in range(0, len(rows), 8)
        ])  # fmt: skip
    real = own_keys_z(det, grads, args.real_keys) if args.real_keys > 0 else {}
    for name, g in grads.items():
        report(name, g, xi, det.sigma, args.keys, real.get(name))
    if real:
        import numpy as np

        held = np.logical_and.reduce([np.logical_and(*interval_checks(z)) for z in real.values()])
        print(
            f"both text sets, all four intervals, over the method's own keys: {held.mean():.3f} (seed 0, the "
            "preset's, is not among them)"
        )


def own_keys_z(det, grads: dict, count: int) -> dict:
    """Each text set's z's (keys x texts) under the method's own keys of seeds 1..count, each key drawn once."""
    import numpy as np
    import torch

    from methods.gaussmark import noise

    norms = {name: g.norm(dim=1) for name, g in grads.items()}
    out = {name: [] for name in grads}
    for seed in range(1, count + 1):
        key = torch.cat([noise(seed, n, m.weight.shape, det.sigma).flatten() for n, m in det.targets.items()]).double()
        for name, g in grads.items():
            out[name].append(((g @ key) / (det.sigma * norms[name])).numpy())
    return {name: np.stack(z) for name, z in out.items()}


if __name__ == "__main__":
    main()
