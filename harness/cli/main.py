"""The ``harness`` command: list plugins, run a method x attack cell, rebuild tables from stored runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from harness.compute import distributed
from harness.config.errors import HarnessError

log = logging.getLogger("harness")


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (and exit code 2) like every other user error."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"harness: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> Parser:
    from harness.config.presets import PRESETS
    from harness.config.registry import attacks, methods

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

    grid = sub.add_parser(
        "grid",
        help="run every cell of a grid spec (YAML) through the run store",
        description="Expand a grid spec (see grids/tiny.yaml) into method x attack cells, validate all of it, and run "
        "each cell as 'harness run' would: stored stages are reused, a failed cell is reported and the others go on, "
        "and a grid started again computes only what is missing.",
    )
    grid.add_argument("spec", type=Path, help="grid spec, e.g. grids/tiny.yaml")
    grid.add_argument("--results", type=Path, default=Path("results/runs"), help="run store (default results/runs)")
    grid.add_argument("--dry-run", action="store_true", help="list the cells and which are stored; run nothing")
    grid.add_argument("--shard", metavar="I/N", help="run shard I of N (1 <= I <= N): whole trainings per shard")
    grid.add_argument(
        "--executor",
        default="inline",
        help="inline (default: this process, one cell after another), local (submitit jobs on this machine) or "
        "slurm (submitit jobs on a Slurm cluster; the run store must be on a shared file system)",
    )
    grid.add_argument("--jobs-dir", type=Path, help="submitit's job folders (default <results>/jobs)")
    grid.add_argument("--partition", help="Slurm partition")
    grid.add_argument("--account", help="Slurm account")
    grid.add_argument("--gpus", type=int, help="GPUs per job")
    grid.add_argument("--cpus", type=int, help="CPUs per job")
    grid.add_argument("--mem-gb", type=int, help="memory per job (GB)")
    grid.add_argument("--time-min", type=int, default=240, help="time limit per job in minutes (default 240)")
    grid.add_argument("--max-parallel", type=int, help="Slurm jobs running at once")
    grid.add_argument("--device", help="torch device for inline cells (default as for 'harness run')")
    grid.add_argument("--allow-pickle", action="store_true", help="as for 'harness run'")

    tables = sub.add_parser(
        "tables",
        help="rebuild every table (CSV + LaTeX) and figure (PNG + PDF) of the paper from stored runs",
        description="Read every finished run in the store; load no model. A cell that is not stored is shown as "
        "missing.",
    )
    tables.add_argument("--results", type=Path, default=Path("results/runs"), help="run store (default results/runs)")
    tables.add_argument("--out", type=Path, default=Path("results/tables"), help="output folder")
    tables.add_argument("--ci", action="store_true", help="add the bootstrap 95%% interval of each AUC as columns")
    tables.add_argument("--no-figures", action="store_true", help="tables only")

    rescore = sub.add_parser(
        "rescore",
        help="recompute stored runs' metrics from their per-text scores after the metric code changed",
        description="Bring every run whose metrics were computed by older metric code up to date from its stored "
        "scores; load no model and detect nothing again.",
    )
    rescore.add_argument("--results", type=Path, default=Path("results/runs"), help="run store (default results/runs)")

    sub.add_parser(
        "doctor",
        help="show which optional backends work on this machine (CUDA, quantization, merging, embeddings)",
        description="One table: each optional backend, whether it works here, and why not.",
    )
    return parser


def cmd_list() -> None:
    from harness.config.presets import PRESETS
    from harness.config.registry import attacks, methods

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
    from harness.assets import models
    from harness.config import presets
    from harness.config.plugins import parse_assignments
    from harness.config.registry import attacks, methods
    from harness.run.pipeline import Pipeline, check_inputs
    from harness.store.stages import Store

    # Validate everything cheap before any model loads.
    preset = presets.apply_overrides(presets.get_preset(args.preset), parse_assignments(args.overrides, "setting"))
    method = methods.build(args.method, parse_assignments(args.method_arg, "method setting"), preset)
    attack = attacks.build(args.attack, parse_assignments(args.attack_arg, "attack setting"), preset)
    if not args.verbose:  # (after the checks above, which import no model library)
        _quiet_transformers()
    updates = {f: getattr(args, f) for f in ("base_model", "oracle_model") if getattr(args, f)}
    preset = preset.model_copy(update=updates)
    if args.allow_pickle:
        os.environ[models.ALLOW_PICKLE_ENV] = "1"
    _device_env(args)
    store = Store(args.results)
    store.check_writable()
    check_inputs(preset, (method, attack))
    cells = Pipeline(preset, store, args.device).run(method, attack)
    if not distributed.is_main():
        return  # one report per launch
    print(f"\n{args.method} x {args.attack} on preset '{preset.name}' (base model {preset.base_model})")
    print(format_cells(cells))
    print(f"\nruns stored in {store.root}/<run>; 'harness tables' rebuilds tab:robustness from them")


def cmd_tables(args) -> None:
    from harness.report.collect import collect, collect_attribution, setups
    from harness.report.tables import robustness, write_tables
    from harness.store.stages import Store

    store = Store(args.results)
    if not store.root.is_dir():
        raise HarnessError(f"no run store at '{store.root}': run 'harness run' or 'harness grid' first")
    if args.out.exists() and not args.out.is_dir():
        raise HarnessError(f"tables folder '{args.out}' is a file, not a folder")
    df = collect(store)
    written = write_tables(df, args.out, ci=args.ci, attributions=collect_attribution(store))
    if not written:
        raise HarnessError(f"no finished runs in '{store.root}' that could be read")
    if not args.no_figures:
        from harness.report.figures import write_figures

        written += write_figures(df, store, args.out)
    for name, part in setups(df).items():
        table = robustness(part)
        if table.empty:
            continue
        print(f"tab:robustness ({name}, {part['base_model'].iloc[0]}), AUC:")
        auc = table.xs("AUC", axis=1, level=1)
        print(auc.to_string(na_rep="missing", float_format=lambda v: f"{v:.3f}"), end="\n\n")
    folders = sorted({p.parent for p in written if p.parent != args.out})
    print(f"wrote {len(written)} files: {args.out / 'runs.csv'}, and in " + ", ".join(str(f) for f in folders))


def _device_env(args) -> None:
    """--device (else $HARNESS_DEVICE) for every stage of this process, checked first."""
    from harness.assets import models

    if args.device:
        models.check_device(args.device)
        os.environ["HARNESS_DEVICE"] = args.device  # every default_device() in this run (detectors too) agrees
    elif os.environ.get("HARNESS_DEVICE"):
        models.check_device(os.environ["HARNESS_DEVICE"], "HARNESS_DEVICE")


def cmd_grid(args) -> int:
    from harness.assets import models
    from harness.run import executors, grid, jobs

    if distributed.world_size() > 1:
        raise HarnessError(
            "harness grid runs each cell in one process: spread a grid with --shard or --executor, and launch "
            "'harness run' (not grid) with several processes"
        )

    spec = grid.load(args.spec)
    if not args.verbose:
        _quiet_transformers()
    shard = grid.parse_shard(args.shard) if args.shard else None
    if args.executor not in executors.EXECUTORS:
        raise HarnessError(f"unknown executor '{args.executor}'. Valid executors: {', '.join(executors.EXECUTORS)}")
    if args.allow_pickle:
        os.environ[models.ALLOW_PICKLE_ENV] = "1"
    _device_env(args)
    cells = list(spec.cells) if shard is None else grid.shard(spec.cells, *shard)
    part = f" (shard {shard[0]}/{shard[1]}: {len(cells)} of {len(spec.cells)} cells)" if shard else ""
    if args.dry_run:
        print(f"{args.spec}: {len(cells)} cells{part}, {len({c.training for c in cells})} trained models")
        stored = 0
        unknown: dict[str, str] = {}  # setup -> why its cells cannot be planned here (asked once per setup)
        for k, cell in enumerate(cells, 1):
            if cell.setup in unknown:
                state = "cannot tell (as above)"
            else:
                try:
                    rows = jobs.plan(cell, args.results, args.device)
                    done = sum(s for _, s in rows)
                    state = "stored" if done == len(rows) else f"{done}/{len(rows)} runs stored"
                    stored += done == len(rows)
                except HarnessError as err:
                    unknown[cell.setup] = str(err)
                    state = f"cannot tell ({err})"
            print(f"  {k:3d}  {cell.name(spec.several_seeds):60s} {state}")
        print(f"{stored} of {len(cells)} cells stored; {len(cells) - stored} to compute")
        return 0
    resources = executors.Resources(
        args.partition, args.account, args.gpus, args.cpus, args.mem_gb, args.time_min, args.max_parallel
    )
    start = time.time()
    summary = executors.run(spec, args.results, args.device, args.executor, shard, args.jobs_dir, resources)
    minutes, seconds = divmod(round(time.time() - start), 60)
    print(
        f"\n{args.spec}{part}: {summary['cells']} cells: {summary['reused']} reused, {summary['computed']} computed, "
        f"{summary['failed']} failed"
        + (f"; attribution {summary['attribution']}" if "attribution" in summary else "")
        + f" ({minutes} min {seconds} s)"
    )
    for name, error, trace in summary["failures"]:
        print(f"  failed: {name}: {error} (traceback: {trace})")
    if shard is not None and spec.attribution:
        print("attribution runs once every shard is done: run the grid again without --shard (every cell is reused)")
    print("'harness tables' rebuilds every table and figure from the store")
    return 1 if summary["failures"] else 0


def cmd_rescore(args) -> None:
    from harness.run.scoring import rescore_store
    from harness.store.stages import Store

    store = Store(args.results)
    if not store.root.is_dir():
        raise HarnessError(f"no run store at '{store.root}'")
    changed, total = rescore_store(store)
    print(f"{changed} of {total} stored runs rescored (the others were up to date)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.INFO
    if not distributed.is_main():  # another process of a launch: it only says what goes wrong
        level = logging.WARNING
    logging.basicConfig(level=level, format="harness: %(message)s")
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
            cmd_run(args)
        elif args.command == "grid":
            return cmd_grid(args)
        elif args.command == "tables":
            cmd_tables(args)
        elif args.command == "rescore":
            cmd_rescore(args)
        elif args.command == "doctor":
            from harness.cli.doctor import report

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
    except Exception as err:
        if distributed.is_main():
            raise
        # Another process of a launch: most often the main one stopped (with its own message) and the link to it
        # broke; one line says what this one saw, rather than a second traceback.
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"harness: process {distributed.rank()} stopped: {type(err).__name__}: {first}", file=sys.stderr)
        return 1
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
