"""The ``harness`` command: list plugins, run a method x attack cell, rebuild tables from stored runs."""

from __future__ import annotations

import logging
import os
import sys
import warnings

from harness.cli import commands
from harness.cli.parser import build_parser
from harness.compute import distributed, imports, memory
from harness.config.errors import HarnessError, printable

log = logging.getLogger("harness")


class Printable(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:  # noqa: D102
        return printable(super().format(record), keep="\n\t")


class Shown:
    """Standard output with every character a terminal acts on written as its escape (``printable``; lines and tabs
    kept): cell names, labels, paths and texts that the harness prints come from specs, stores and files, which
    may be someone else's."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text, keep="\n\t"))

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Python's warnings as Python shows them, escaped as the harness's own output is: a library's warning may quote
    content (matplotlib names a label's glyph it has no font for, raw)."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    try:
        (file or sys.stderr).write(printable(text, keep="\n\t"))
    except OSError:  # (as Python's own: a closed or gone stderr loses the warning, never the command)
        pass


def configure_logging(verbose: bool, main_process: bool = True) -> None:
    """The harness's progress lines at INFO on stderr (``-v``: DEBUG, with the libraries' own logs); another process
    of a launch only says what goes wrong."""
    level = logging.DEBUG if verbose else logging.INFO
    if not main_process:  # another process of a launch: it only says what goes wrong
        level = logging.WARNING
    handler = logging.StreamHandler()  # (paths and names in messages are shown, never obeyed: harness.config.errors)
    handler.setFormatter(Printable("harness: %(message)s"))
    if not verbose:  # libraries that log through the root logger (mergekit's plan: "Skipping optional weight
        # lm_head.weight" on every tied-embedding model) speak only of what goes wrong; the harness logs by name
        handler.addFilter(lambda record: record.name != "root" or record.levelno >= logging.WARNING)
    logging.basicConfig(level=level, handlers=[handler])
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
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    stdout, shown = sys.stdout, warnings.showwarning
    sys.stdout, warnings.showwarning = Shown(sys.stdout), show_warning
    try:
        return _main(argv)
    finally:
        sys.stdout, warnings.showwarning = stdout, shown


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    imports.defer_hqq_import()  # before transformers is imported: a shorter start-up (harness/compute/imports.py)
    try:  # (the environment's settings first: logging asks which process of a launch this is)
        distributed.check_setting()
        memory.check_setting()
        if "HARNESS_ALLOW_PICKLE" in os.environ:  # (models.ALLOW_PICKLE_ENV: its module is imported only when set)
            from harness.assets import models

            models.pickle_allowed()
    except HarnessError as err:
        print(f"harness: error: {printable(str(err))}", file=sys.stderr)
        return 2
    configure_logging(args.verbose, distributed.is_main())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        memory.tune_allocator()  # before any model is built or loaded (harness/compute/memory.py)
        if args.command == "list":
            commands.cmd_list()
        elif args.command == "run":
            commands.cmd_run(args)
        elif args.command == "grid":
            return commands.cmd_grid(args)
        elif args.command == "tables":
            commands.cmd_tables(args)
        elif args.command == "detect":
            return commands.cmd_detect(args)
        elif args.command == "report":
            commands.cmd_report(args)
        elif args.command == "export":
            commands.cmd_export(args)
        elif args.command == "rescore":
            commands.cmd_rescore(args)
        elif args.command == "doctor":
            from harness.cli.doctor import report

            print(report())
    except HarnessError as err:  # one line: a path or a text quoted in it cannot break it, or act on the terminal
        print(f"harness: error: {printable(str(err))}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
