"""Every speed figure of the project in one command, each as a ratio against a reference measured in the same run.

    python benchmarks/all.py [--only NAME ...] [--device D]

Runs, one after the other, with sizes for the device (a CPU by default, CUDA when torch sees a GPU):
- kgw_detect: KGW green lists, the packed table (build included, and cached) and on the fly, vs lm-watermarking's
  per-position loop;
- kth_detect: KTH detection, vectorised, vs the per-text loop;
- train_step: the training step of each method vs plain fine-tuning (and PRO detection with a cold and warm cache);
- generate: the harness's sampler vs HF generate at batch 128 (Gu et al.'s setting), and the perplexity scorer, each
  also against the arithmetic bound of its forward passes.
On 2 CPU cores the whole takes about 8 minutes. Each script also runs alone with its own options (see its --help).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Sizes per device: on a CPU small enough for minutes; on a GPU the paper's (5,000 x 200 tokens, V = 128,256).
SIZES = {
    "cpu": {
        "kgw_detect": ["--texts", "200", "--vocab", "32000", "--loop-texts", "10"],
        "kth_detect": ["--texts", "200", "--loop-texts", "5"],
        "train_step": ["--steps", "3"],
        "generate": [],
    },
    "cuda": {
        "kgw_detect": [
            "--texts",
            "5000",
            "--vocab",
            "128256",
            "--loop-texts",
            "20",
            "--fly-texts",
            "200",
            "--device",
            "cuda",
        ],
        "kth_detect": ["--texts", "1000", "--loop-texts", "10"],
        "train_step": ["--steps", "5"],
        "generate": [
            "--prompts",
            "5000",
            "--prompt-tokens",
            "50",
            "--new-tokens",
            "200",
            "--reference-prompts",
            "512",
        ],  # fmt: skip
    },
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(SIZES["cpu"]), help="run only these benchmarks")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when torch sees a GPU")
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    failed = []
    for name, options in SIZES[device].items():
        if args.only and name not in args.only:
            continue
        command = [sys.executable, str(HERE / f"{name}.py"), *options]
        print(f"\n=== {name} ({device}): {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        done = subprocess.run(command, check=False, env={**os.environ, "HARNESS_DEVICE": device})
        print(f"--- {name}: {time.perf_counter() - start:.0f} s" + ("" if done.returncode == 0 else " FAILED"))
        if done.returncode:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
