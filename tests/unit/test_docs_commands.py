"""Every ``harness ...`` command line in the repository's Markdown (README, docs, the references' and benchmarks'
READMEs) and in the grid specs' header comments parses with the CLI's own parser: a renamed or misspelt option in the
documentation fails the suite.

Command lines are those of fenced shell code blocks (a line, or a part of one between ``&&``, that starts with
``harness`` or ``.../bin/harness`` after any ``VAR=value`` assignments; its ``#`` comment dropped) and a grid spec's
comment lines that start with ``harness``. Mentions in running text (```harness run```) name a command, not a line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", "benchmarks/README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/**/*.md"))]
DOCUMENTS += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("results/reference/*/README.md"))
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
SHELL_FENCES = ("", "sh", "bash", "console")  # the fences that hold command lines (not python, toml, yaml)


def command_lines(text: str) -> list[tuple[int, list[str]]]:
    """``(line number, arguments after 'harness')`` of each harness command line in ``text``'s fenced code blocks."""
    found, fenced, shell = [], False, False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            shell = fenced and stripped[3:].strip() in SHELL_FENCES
            continue
        if not shell:
            continue
        for part in stripped.split("&&"):  # (the README's lines: make a venv && install && .venv/bin/harness ...)
            words = shlex.split(part, comments=True)
            while words and ASSIGNMENT.match(words[0]):
                words = words[1:]
            if words and (words[0] == "harness" or words[0].endswith("/bin/harness")):
                found.append((number, words[1:]))
    return found


def spec_command_lines(text: str) -> list[tuple[int, list[str]]]:
    """The same for a grid spec: its comment lines (``#   harness grid ...``) that are harness command lines."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        body = line.lstrip("# ")
        if line.startswith("#") and body.startswith("harness "):
            found.append((number, shlex.split(body, comments=True)[1:]))
    return found


CASES = [(doc, number, args) for doc in DOCUMENTS for number, args in command_lines((ROOT / doc).read_text())]
CASES += [
    (str(spec.relative_to(ROOT)), number, args)
    for spec in sorted(ROOT.glob("grids/*.yaml"))
    for number, args in spec_command_lines(spec.read_text())
]


def test_the_documents_hold_command_lines():
    assert len(CASES) >= 20 and {"README.md", "docs/guide.md"} <= {doc for doc, _, _ in CASES}


@pytest.mark.parametrize("doc, number, args", CASES, ids=[f"{doc}:{number}" for doc, number, _ in CASES])
def test_a_documented_command_line_parses(doc, number, args):
    from harness.cli.parser import build_parser

    try:
        build_parser().parse_args(args)
    except SystemExit as stop:
        pytest.fail(f"{doc}:{number}: 'harness {shlex.join(args)}' does not parse (exit {stop.code})")


def test_a_misspelt_option_is_caught():
    """The check can fail: the same scan over a line with a misspelt option."""
    from harness.cli.parser import build_parser

    ((_, args),) = command_lines("```sh\nharness run --method pro --atack slerp  # a typo\n```\n")
    with pytest.raises(SystemExit):
        build_parser().parse_args(args)
