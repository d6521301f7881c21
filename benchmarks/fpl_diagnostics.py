"""Why FPL helps or hurts on a given model: PRO trained with FPL exactly as ``harness run`` trains it (the harness's
training loop, schedule and clipping), logging at each step

- ``|grad L_sim|``: the norm of the CAWP loss's gradient (before clipping),
- ``|FPL|``: the norm of the FPL term ``beta * (grad L_anti(theta) - grad L_anti(theta - alpha g/|g|))`` added to it,
- ``cos``: the cosine between the two (negative: FPL pulls against CAWP's step),
- ``L_anti`` before the step and after it (the optimiser step included), on the same anti-watermarked batch: FPL's aim
  is that one normalised fine-tuning step on anti-watermarked text (``probe``, at ``theta - alpha g/|g|``) removes
  little of the watermark, i.e. that ``probe - L_anti`` stays small.

    python benchmarks/fpl_diagnostics.py [--preset tiny] [--steps N] [--alpha A] [--beta B] [--every K] [--json F]

Defaults: the preset's base model, data, training settings and PRO settings (alpha, beta, n, delta), all of its
steps (tiny: 150 steps, about 5 minutes on 2 CPU cores). To first order the FPL term is ``alpha * beta * H g / |g|``
(H the Hessian of L_anti), so its norm should grow with the product alpha x beta: compare runs with ``--alpha`` and
``--beta`` (the tiny ablation's merge AUC depends on that product alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

COLUMNS = ("step", "l_sim", "sim_grad_norm", "fpl_grad_norm", "cosine", "anti", "probe", "anti_after")
HEAD = ("step", "L_sim", "|grad L_sim|", "|FPL|", "cos", "L_anti", "probe", "L_anti after")


def run(preset_name: str, steps: int | None, alpha: float | None, beta: float | None) -> tuple[list[dict], dict]:
    import torch

    from harness.assets import data
    from harness.assets.encoder import Embedder
    from harness.assets.models import load_causal_lm, load_tokenizer, resolve
    from harness.compute.memory import tune_allocator
    from harness.compute.training import train
    from harness.config.presets import get_preset
    from methods.pro import PROParams, PROStep
    from methods.pro_policy import PolicyMLP

    tune_allocator()  # as in harness run

    preset = get_preset(preset_name)
    settings = preset.train if steps is None else preset.train.model_copy(update={"steps": steps})
    over = {k: v for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
    p = PROParams(**{**preset.methods.get("pro", {}), **over, "fpl": True})
    if not p.fpl_on:
        raise SystemExit(f"FPL is off with alpha={p.alpha}, beta={p.beta}: nothing to diagnose")
    folder = resolve(preset.base_model)
    tokenizer = load_tokenizer(folder)
    teacher = load_causal_lm(folder, "cpu", dtype="float32").eval().requires_grad_(False)
    student = load_causal_lm(folder, "cpu", dtype="float32").requires_grad_(True)
    embedder = Embedder(resolve(p.embedding_model), "cpu", cache_size=p.embed_cache, batch_size=p.embed_batch)
    torch.manual_seed(settings.seed)
    policy = PolicyMLP(embedder.dim, student.get_output_embeddings().weight.shape[0], hidden=p.policy_hidden)
    stream = data.token_stream(tokenizer, data.iter_texts(preset.train_data), max_tokens=settings.tokens)
    batches = data.packed_batches(stream, settings.seq_len, settings.batch_size, settings.seed)
    step = PROStep(p, settings, teacher, tokenizer, embedder, policy, diagnose=True)

    def after(number: int, model) -> None:  # L_anti of this step's anti-watermarked batch at the updated weights
        with torch.no_grad():
            step.diagnostics[-1]["anti_after"] = float(step.anti_loss(model))

    train(
        student, step, batches, settings, desc="PRO with FPL (diagnosed)", device="cpu", lr=p.student_lr, on_step=after
    )
    about = {"preset": preset_name, "steps": settings.steps, "alpha": p.alpha, "beta": p.beta, "delta": p.delta,
             "n": p.n, "lr": p.student_lr or settings.lr, "max_grad_norm": settings.max_grad_norm}  # fmt: skip
    return step.diagnostics, about


def summary(rows: list[dict]) -> dict:
    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in rows)

    return {
        "mean |grad L_sim|": mean("sim_grad_norm"),
        "mean |FPL|": mean("fpl_grad_norm"),
        "mean |FPL| / |grad L_sim|": statistics.fmean(
            r["fpl_grad_norm"] / max(r["sim_grad_norm"], 1e-30) for r in rows
        ),
        "mean cos": mean("cosine"),
        "steps with cos < 0": sum(r["cosine"] < 0 for r in rows) / len(rows),
        "mean probe - L_anti": statistics.fmean(r["probe"] - r["anti"] for r in rows),
        "mean L_anti after - before": statistics.fmean(r["anti_after"] - r["anti"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    ap.add_argument("--alpha", type=float, help="FPL's perturbation size (default: the preset's)")
    ap.add_argument("--beta", type=float, help="FPL's weight (default: the preset's)")
    ap.add_argument("--every", type=int, default=10, help="print every K-th step (default 10; all go to --json)")
    ap.add_argument("--json", type=Path, help="write every step's figures to this file")
    args = ap.parse_args(argv)
    rows, about = run(args.preset, args.steps, args.alpha, args.beta)
    print("\n" + ", ".join(f"{k} {v}" for k, v in about.items()) + "\n")
    print("".join(f"{h:>14}" for h in HEAD))
    for r in rows:
        if r["step"] % args.every == 0 or r["step"] in (1, len(rows)):
            print(f"{r['step']:>14}" + "".join(f"{r[c]:>14.4g}" for c in COLUMNS[1:]))
    print()
    for name, value in summary(rows).items():
        print(f"{name:<30}{value:>12.4g}")
    if args.json:
        args.json.write_text(json.dumps({"settings": about, "summary": summary(rows), "steps": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
