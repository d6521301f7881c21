"""The ``harness`` command line: its subcommands and options (argparse)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.config.errors import printable

DOC = "The ``harness`` command: list plugins, run a method x attack cell, rebuild tables from stored runs."


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (and exit code 2) like every other user error."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"harness: error: {printable(message)} (see '{self.prog} --help')\n")


def a_path(text: str) -> Path:
    """A path argument: the empty string is refused (``Path("")`` is the current folder, where an unset variable
    in ``--out "$DIR"`` would write the tables or copy the store)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name a file or folder ('.' for this one)")
    return Path(text)


def count(text: str) -> int:
    """A whole number >= 0 (argparse's ``type``: its error is one line naming the option)."""
    if not (text.strip().isascii() and text.strip().isdigit() and len(text.strip()) <= 18):
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 10**18, not {text[:40]!r}")
    return int(text)


class ThenLink(argparse.Action):
    """``--then ATTACK`` starts another link of a chain; ``--then-arg KEY=VALUE`` gives the latest one a setting. Both
    fill one list, ``[(attack, [settings...]), ...]``, in the order given."""

    def __call__(self, parser, namespace, value, option_string=None):
        links = list(getattr(namespace, self.dest, None) or [])
        if option_string == "--then":
            links.append((value, []))
        elif not links:
            parser.error("--then-arg sets a setting of the latest --then attack: give --then ATTACK before it")
        else:
            links[-1] = (links[-1][0], [*links[-1][1], value])
        setattr(namespace, self.dest, links)


def add_results(parser) -> None:
    """The run store option every command that reads or writes runs takes."""
    parser.add_argument("--results", type=a_path, default=Path("results/runs"), help="run store (default results/runs)")


def add_decode(parser) -> None:
    parser.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="how every model of the run samples, repeatable: greedy=true, temperature=0.7, top_k=50, top_p=0.9, "
        "min_p=0.05, repetition_penalty=1.2 (default: plain sampling at temperature 1)",
    )


def add_prompts(parser) -> None:
    from harness.config.settings import PROMPT_KINDS

    parser.add_argument(
        "--prompts",
        choices=PROMPT_KINDS,
        help="what every model of the run is asked: documents to continue (default: the preset's eval_data), code "
        "to continue (its code_data: a low-entropy domain), or chat: instructions of its chat_data through the "
        "model's chat template, answers scored against human answers",
    )
    parser.add_argument(
        "--system-prompt",
        metavar="TEXT",
        help="a system turn before every chat instruction (implies --prompts chat)",
    )


def add_device(parser, help: str) -> None:  # noqa: A002 (argparse's own name)
    """The torch device option of the commands that compute."""
    parser.add_argument("--device", help=help)


def add_overrides(parser, help: str) -> None:  # noqa: A002 (argparse's own name)
    """``--set SECTION.KEY=VALUE``: the preset settings a command's user overrides, repeatable."""
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="overrides", help=help)


def add_method_args(parser, help: str) -> None:  # noqa: A002 (argparse's own name)
    """``--method-arg KEY=VALUE``: settings of the watermark method, repeatable."""
    parser.add_argument("--method-arg", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_allow_pickle(parser, help: str) -> None:  # noqa: A002 (argparse's own name)
    """The opt-in of the commands that load models to weights stored as pickles."""
    parser.add_argument("--allow-pickle", action="store_true", help=help)


def build_parser() -> Parser:
    """``harness [-v] COMMAND ...``: each command's options come from its ``add_*_command``, in the order ``--help``
    lists the commands."""
    parser = Parser(prog="harness", description=DOC)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_list_command(commands)
    add_run_command(commands)
    add_grid_command(commands)
    add_tables_command(commands)
    add_detect_command(commands)
    add_report_command(commands)
    add_export_command(commands)
    add_rescore_command(commands)
    add_doctor_command(commands)
    return parser


def add_list_command(commands) -> None:
    commands.add_parser(
        "list",
        help="list watermark methods, attacks and presets",
        description="List methods, attacks "
        "and presets with their settings; names marked 'planned' are not implemented yet.",
    )


def add_run_command(commands) -> None:
    from harness.config.presets import PRESETS
    from harness.config.registry import methods

    run = commands.add_parser(
        "run",
        help="train (or reuse) a watermarked model, attack it, and print detection and quality metrics",
        description="Evaluate the unwatermarked base, the unaltered watermarked model and the attacked model with "
        "the method's detector. Every stage is stored and reused on the next identical command.",
    )
    run.add_argument("--method", required=True, help=f"watermark method: {', '.join(methods.names())}")
    add_attack_chain(run)
    add_method_args(run, "method setting over the preset's, repeatable, e.g. --method-arg k=1")
    run.add_argument("--preset", default="tiny", help=f"settings preset (default tiny): {', '.join(PRESETS)}")
    run.add_argument("--base-model", help="base model: a local folder or a Hugging Face id (overrides the preset)")
    run.add_argument("--oracle-model", help="perplexity oracle: a local folder or a Hugging Face id")
    add_overrides(run, "override a preset setting, repeatable, e.g. --set train.steps=50")
    add_decode(run)
    add_prompts(run)
    add_results(run)
    run.add_argument(
        "--dry-run", action="store_true", help="check the inputs and list the runs, stored or to compute; run nothing"
    )
    add_device(run, "torch device: cpu, cuda or cuda:N (default: $HARNESS_DEVICE, else cuda if available, else cpu)")
    add_allow_pickle(
        run, "also load models whose weights are pickles (pytorch_model.bin), which can run code: only ones you trust"
    )


def add_attack_chain(run) -> None:
    """``run``'s attack, its settings, and the attacks chained after it (``ThenLink``)."""
    from harness.config.registry import attacks

    run.add_argument("--attack", default="none", help=f"attack (default none): {', '.join(attacks.names())}")
    run.add_argument(
        "--attack-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="attack setting, repeatable, e.g. --attack-arg t=0.5",
    )
    run.add_argument(
        "--then",
        action=ThenLink,
        default=[],
        metavar="ATTACK",
        dest="then",
        help="another attack on what the one before made, repeatable: a chain (attacks/chain.py), e.g. --attack "
        "finetune --then slerp --then-arg t=0.5 --then gguf",
    )
    run.add_argument(
        "--then-arg",
        action=ThenLink,
        metavar="KEY=VALUE",
        dest="then",
        help="a setting of the latest --then attack, repeatable",
    )


def add_grid_command(commands) -> None:
    grid = commands.add_parser(
        "grid",
        help="run every cell of a grid spec (YAML) through the run store",
        description="Expand a grid spec (see grids/tiny.yaml) into method x attack cells, validate all of it, and run "
        "each cell as 'harness run' would: stored stages are reused, a failed cell is reported and the others go on, "
        "and a grid started again computes only what is missing.",
    )
    grid.add_argument("spec", type=a_path, help="grid spec, e.g. grids/tiny.yaml")
    add_results(grid)
    grid.add_argument("--dry-run", action="store_true", help="list the cells and which are stored; run nothing")
    grid.add_argument(
        "--group", action="append", metavar="NAME", help="run only this group of the spec (repeat for several)"
    )
    grid.add_argument("--shard", metavar="I/N", help="run shard I of N (1 <= I <= N <= 10,000): whole trainings each")
    add_executor_options(grid)
    add_device(grid, "torch device for inline cells (default as for 'harness run')")
    add_allow_pickle(grid, "as for 'harness run'")


def add_executor_options(grid) -> None:
    """Where ``grid`` runs its cells (here, or as submitit jobs) and what each job is given."""
    grid.add_argument(
        "--executor",
        default="inline",
        help="inline (default: this process, one cell after another), local (submitit jobs on this machine) or "
        "slurm (submitit jobs on a Slurm cluster; the run store must be on a shared file system)",
    )
    grid.add_argument("--jobs-dir", type=a_path, help="submitit's job folders (default <results>/jobs)")
    grid.add_argument("--partition", help="Slurm partition")
    grid.add_argument("--account", help="Slurm account")
    grid.add_argument("--gpus", type=int, help="GPUs per job")
    grid.add_argument("--cpus", type=int, help="CPUs per job")
    grid.add_argument("--mem-gb", type=int, help="memory per job (GB)")
    grid.add_argument("--time-min", type=int, help="time limit per job in minutes (default 240)")
    grid.add_argument("--max-parallel", type=int, help="Slurm jobs running at once")


def add_tables_command(commands) -> None:
    tables = commands.add_parser(
        "tables",
        help="rebuild every table (CSV + LaTeX) and figure (PNG + PDF) of the paper from stored runs",
        description="Read every finished run in the store; load no model. A cell that is not stored is shown as "
        "missing.",
    )
    add_results(tables)
    tables.add_argument("--out", type=a_path, default=Path("results/tables"), help="output folder")
    tables.add_argument("--ci", action="store_true", help="add the bootstrap 95%% interval of each AUC as columns")
    tables.add_argument("--no-figures", action="store_true", help="tables only")


def add_detect_command(commands) -> None:
    detect = commands.add_parser(
        "detect",
        help="audit a suspect model (or a file of texts) against a stored watermark key: per-text scores and one "
        "decision",
        description="Score texts with the detector of a trained watermark and test them together: a model is made to "
        "continue the evaluation prompts of the key's setup; texts come from a file. The decision is one p-value for "
        "all texts (the scheme's pooled test, or a calibration against human texts where it has none).",
    )
    add_key_and_suspect(detect)
    detect.add_argument("--preset", help="the setup (prompts, lengths; default: that of the key's stored runs)")
    add_overrides(detect, "override a setting of the setup, as for 'harness run'")
    add_decode(detect)
    add_prompts(detect)
    detect.add_argument("--num-texts", type=int, help="texts to generate (and human texts to calibrate against)")
    detect.add_argument("--alpha", type=float, default=0.01, help="the false-positive rate of the decision (0.01)")
    detect.add_argument("--json", action="store_true", help="print the result and every text's score as JSON")
    detect.add_argument("--show", type=count, default=20, help="texts shown in the table (default 20)")
    add_results(detect)
    add_device(detect, "torch device (default as for 'harness run')")
    add_allow_pickle(detect, "as for 'harness run'")


def add_key_and_suspect(detect) -> None:
    """Which watermark key ``detect`` tests (its training, or the method that finds it) and what it tests: a model or
    a file of texts, exactly one."""
    detect.add_argument("--key", help="the trained watermark: its train stage's hash (or a unique prefix) or folder")
    detect.add_argument("--method", help="or: the method whose stored training with these settings holds the key")
    add_method_args(detect, "with --method")
    suspect = detect.add_mutually_exclusive_group(required=True)
    suspect.add_argument("--model", help="the suspect model: a local folder, a .gguf file or a Hugging Face id")
    suspect.add_argument("--texts", type=a_path, help="texts to score: .txt (one per line) or .jsonl ('text' field)")


def add_report_command(commands) -> None:
    report = commands.add_parser(
        "report",
        help="one self-contained HTML page of the store: heatmap, figures, tokens to detect, attribution, every run",
        description="Read every finished run in the store (no model loads) and write one HTML file that opens from "
        "disk with no network: figures embedded, no script or font fetched.",
    )
    add_results(report)
    report.add_argument("--out", type=a_path, default=Path("results/report.html"), help="the HTML file to write")


def add_export_command(commands) -> None:
    export = commands.add_parser(
        "export",
        help="copy a store's runs and attribution results, without their generated texts, into another store",
        description="Copy every finished run and attribution stage that verifies into DEST, leaving out the "
        "generated texts (generations.jsonl) unless --keep-texts: 'harness tables' and 'harness report' read the copy "
        "as they read the store; models and other stages stay behind, so it cannot be rescored or extended.",
    )
    export.add_argument("dest", type=a_path, help="the store to write (made if missing)")
    add_results(export)
    export.add_argument("--keep-texts", action="store_true", help="copy generations.jsonl too")
    export.add_argument("--grid", type=a_path, help="only the runs this grid spec makes (its sweep and its cells)")


def add_rescore_command(commands) -> None:
    rescore = commands.add_parser(
        "rescore",
        help="recompute stored runs' metrics from their per-text scores after the metric code changed",
        description="Bring every run whose metrics were computed by older metric code up to date from its stored "
        "scores; load no model and detect nothing again (but with --prefix-scores).",
    )
    add_results(rescore)
    rescore.add_argument(
        "--prefix-scores",
        action="store_true",
        help="also add the per-length scores (tokens to detect, TPR by length) to runs scored before detectors kept "
        "them: each run's detector scores its stored texts again (no generation; needs its train stage here)",
    )
    add_device(rescore, "torch device for --prefix-scores (default as for 'harness run')")


def add_doctor_command(commands) -> None:
    commands.add_parser(
        "doctor",
        help="show which optional backends work on this machine (CUDA, quantization, merging, embeddings)",
        description="One table: each optional backend, whether it works here, and why not.",
    )
