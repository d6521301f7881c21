"""The ``harness`` command: list plugins, run a method x attack cell, rebuild tables from stored runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from harness.errors import HarnessError

log = logging.getLogger("harness")


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (and exit code 2) like every other user error."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"harness: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> Parser:
    from harness.config import PRESETS
    from harness.registry import attacks, methods

    parser = Parser(prog="harness", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    sub.add_parser(
        "list",
        help="list watermark methods, attacks and presets",
        description="List methods, attacks "
        "and presets with their settings; names marked 'planned' are not implemented yet.",
    )

    run = sub.add_parser(
        "run",
        help="train (or reuse) a watermarked model, attack it, and print detection and quality metrics",
        description="Evaluate the unwatermarked base, the unaltered watermarked model and the attacked model with "
        "the method's detector. Every stage is stored and reused on the next identical command.",
    )
    run.add_argument("--method", required=True, help=f"watermark method: {', '.join(methods.names())}")
    run.add_argument("--attack", default="none", help=f"attack (default none): {', '.join(attacks.names())}")
    run.add_argument(
        "--attack-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="attack setting, repeatable, e.g. --attack-arg t=0.5",
    )
    run.add_argument(
        "--method-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="method setting over the preset's, repeatable, e.g. --method-arg k=1",
    )
    run.add_argument("--preset", default="tiny", help=f"settings preset (default tiny): {', '.join(PRESETS)}")
    run.add_argument("--base-model", help="base model: a local folder or a Hugging Face id (overrides the preset)")
    run.add_argument("--oracle-model", help="perplexity oracle: a local folder or a Hugging Face id")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        dest="overrides",
        help="override a preset setting, repeatable, e.g. --set train.steps=50",
    )
    run.add_argument("--results", type=Path, default=Path("results/runs"), help="run store (default results/runs)")
    run.add_argument(
        "--device",
        help="torch device: cpu, cuda or cuda:N (default: $HARNESS_DEVICE, else cuda if available, else cpu)",
    )
    run.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also load models whose weights are pickles (pytorch_model.bin), which can run code: only ones you trust",
    )

    tables = sub.add_parser(
        "tables",
        help="rebuild tab:robustness (CSV + LaTeX) from stored runs",
        description="Read every finished run in the store; load no model.",
    )
    tables.add_argument("--results", type=Path, default=Path("results/runs"), help="run store (default results/runs)")
    tables.add_argument("--out", type=Path, default=Path("results/tables"), help="output folder")

    sub.add_parser(
        "doctor",
        help="show which optional backends work on this machine (CUDA, quantization, merging, embeddings)",
        description="One table: each optional backend, whether it works here, and why not.",
    )
    return parser


def cmd_list() -> None:
    from harness.config import PRESETS
    from harness.registry import attacks, methods

    for registry in (methods, attacks):
        print(f"{registry.kind}s:")
        for name, target in registry.entries().items():
            if target is None:
                print(f"  {name:14s} planned (not implemented yet)")
                continue
            cls = registry.load(name)
            settings = ", ".join(f"{k}={f.default!r}" for k, f in cls.Params.model_fields.items()) or "-"
            needs = ", ".join([f"pip extra [{e}]" for e in cls.requires.values()] + ["CUDA"] * cls.needs_cuda)
            print(f"  {name:14s} {settings}" + (f"   (needs {needs})" if needs else ""))
    print("presets:")
    for p in PRESETS.values():
        print(f"  {p.name:14s} {p.base_model}: {p.notes}")
        for name, values in {**p.methods, **p.attacks}.items():
            print(f"  {'':14s}   {name}: " + ", ".join(f"{k}={v!r}" for k, v in values.items()))


def format_cells(cells) -> str:
    import pandas as pd

    rows = [
        {
            "model": c.row,
            "AUC": f"{c.metrics['auc']:.3f}",
            "AUC 95% CI": "[{:.3f}, {:.3f}]".format(*c.metrics["auc_ci95"]),
            "TPR@1%": f"{c.metrics['tpr@0.01']:.3f}",
            "TPR@5%": f"{c.metrics['tpr@0.05']:.3f}",
            "median PPL": f"{c.metrics['median_ppl']:.2f}",
            "texts": f"{c.metrics['n_pos']}+{c.metrics['n_neg']}",
            "run": c.run.key + (" (reused)" if c.reused else ""),
        }
        for c in cells
    ]
    return pd.DataFrame(rows).to_string(index=False)


def cmd_run(args) -> None:
    from harness import config, data, models
    from harness.pipeline import Pipeline
    from harness.plugins import parse_assignments
    from harness.registry import attacks, methods
    from harness.store import Store

    # Validate everything cheap before any model loads.
    preset = config.apply_overrides(config.get_preset(args.preset), parse_assignments(args.overrides, "setting"))
    method = methods.build(
        args.method, {**preset.methods.get(args.method, {}), **parse_assignments(args.method_arg, "method setting")}
    )
    attack = attacks.build(
        args.attack, {**preset.attacks.get(args.attack, {}), **parse_assignments(args.attack_arg, "attack setting")}
    )
    updates = {f: getattr(args, f) for f in ("base_model", "oracle_model") if getattr(args, f)}
    preset = preset.model_copy(update=updates)
    if args.allow_pickle:
        os.environ[models.ALLOW_PICKLE_ENV] = "1"
    if args.device:
        models.check_device(args.device)
        os.environ["HARNESS_DEVICE"] = args.device  # every default_device() in this run (detectors too) agrees
    elif os.environ.get("HARNESS_DEVICE"):
        models.check_device(os.environ["HARNESS_DEVICE"], "HARNESS_DEVICE")
    store = Store(args.results)
    store.check_writable()
    plugins = (method, attack)
    refs = [ref for p in plugins for ref in p.model_refs().values()]
    for ref in dict.fromkeys((preset.base_model, preset.oracle_model, *refs)):
        models.check(ref)
    for plugin in plugins:
        plugin.validate(preset.base_model)
    for source in (preset.train_data, preset.eval_data, *(s for p in plugins for s in p.data_refs().values())):
        data.check(source)
    cells = Pipeline(preset, store, args.device).run(method, attack)
    print(f"\n{args.method} x {args.attack} on preset '{preset.name}' (base model {preset.base_model})")
    print(format_cells(cells))
    print(f"\nruns stored in {store.root}/<run>; 'harness tables' rebuilds tab:robustness from them")


def cmd_tables(args) -> None:
    from harness.store import Store
    from harness.tables import collect, robustness, write_tables

    store = Store(args.results)
    if not store.root.is_dir():
        raise HarnessError(f"no run store at '{store.root}': run 'harness run' first")
    if args.out.exists() and not args.out.is_dir():
        raise HarnessError(f"tables folder '{args.out}' is a file, not a folder")
    df = collect(store)
    written = write_tables(df, args.out)
    if not written:
        raise HarnessError(f"no finished runs in '{store.root}' that could be read")
    for preset, part in df.groupby("preset"):
        print(f"tab:robustness, preset '{preset}':")
        print(robustness(part).round(3).to_string(na_rep="--"), end="\n\n")
    print("wrote " + ", ".join(str(p) for p in written))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="harness: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Libraries' own chatter (torchao, which transformers imports with every model once the quantization extras are
    # installed, warns about CUDA kernels it cannot load on a CPU); -v shows it.
    noisy_loggers = (
        "transformers",
        "mergekit",
        "accelerate",
        "datasets",
        "httpx",
        "huggingface_hub",
        "torchao",
        "bitsandbytes",
        "gptqmodel",
        "llmcompressor",
        "compressed_tensors",
        "torch.utils._pytree",
        "hqq",
    )
    for noisy in noisy_loggers:
        logging.getLogger(noisy).setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    try:
        if args.command == "list":
            cmd_list()
        elif args.command == "run":
            if not args.verbose:
                _quiet_transformers()
            cmd_run(args)
        elif args.command == "tables":
            cmd_tables(args)
        elif args.command == "doctor":
            from harness.doctor import report

            print(report())
    except HarnessError as err:
        print(f"harness: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness: interrupted; finished stages are kept and will be reused", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


def _quiet_transformers() -> None:
    """transformers 5 draws a progress bar for every weight load and the hub client logs every retry; our bars
    and our one-line errors are the ones that matter (-v shows theirs)."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()


if __name__ == "__main__":
    sys.exit(main())
