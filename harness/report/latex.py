"""LaTeX of the tables: numbers as the paper prints them (AUC coloured by its rule), the table float around a
tabular, and the tabular itself through pandas' ``Styler.to_latex`` (booktabs rules, escaping, header rows).

Two tables keep a tabular written here line by line, because Styler cannot give their layout: tab:robustness has a
``\\midrule`` between row groups (Styler separates groups by ``\\cline`` only) and a second header row of empty index
cells (Styler writes ``" &  & "`` for those); tab:ablation-horizontal is blocks of a header row and metric rows, one
block per setting, which is no single frame's rendering.
"""

from __future__ import annotations

import pandas as pd

from harness.report.collect import MISSING

PREAMBLE = r"% needs \usepackage{booktabs} and \usepackage[table]{xcolor}; -- marks a cell with no stored run"


# LaTeX's special characters as text, replaced in one pass (so the braces of ``\textbackslash{}`` stay as they are).
SPECIALS = {
    "\\": r"\textbackslash{}",
    "^": r"\textasciicircum{}",
    "~": r"\textasciitilde{}",
    **{c: "\\" + c for c in "_%&$#{}"},
}


def esc(text) -> str:
    """``text`` (a label, setting or caption, possibly read from someone else's store) as LaTeX text: every special
    character escaped, so that ``$\\foo$`` prints as it is instead of starting math mode or a command."""
    return "".join(SPECIALS.get(c, c) for c in str(text))


def colour(value: float) -> str:
    """The paper's colour rule for an AUC."""
    return "green" if value >= 0.8 else "red" if value < 0.7 else "yellow"


def fmt(metric: str, value, latex: bool = True) -> str:
    """A number as the tables print it: PPL to one decimal, the rest to three; an AUC in LaTeX with its colour; a
    missing cell as ``--`` (LaTeX) or ``missing``."""
    if value is None or pd.isna(value):
        return "--" if latex else MISSING
    text = f"{value:.1f}" if metric == "PPL" else f"{value:.0f}" if metric == "tokens" else f"{value:.3f}"
    if not latex:
        return text
    if metric == "AUC":
        return f"\\cellcolor{{{colour(value)}!25}}${text}$"
    return f"${text}$"


def cell_kind(column: str) -> str:
    """How a column's numbers are printed (``fmt``'s metric): AUC coloured, PPL to one decimal, token counts whole,
    others plain."""
    return column if column in ("AUC", "PPL") else "tokens" if column.startswith("tokens") else "TPR"


def table_float(tabular: str, caption: str) -> str:
    """The float the paper's tables sit in: small type, the caption above the tabular."""
    head = [PREAMBLE, r"\begin{table}[h]", r"\centering", r"\scriptsize", f"\\caption{{{esc(caption)}}}"]
    return "\n".join([*head, tabular.rstrip("\n"), r"\end{table}", ""])


def tabular(cells: pd.DataFrame, column_format: str) -> str:
    """A booktabs tabular of ``cells``, a frame of LaTeX strings whose column names are the header (escaped here),
    through ``Styler.to_latex``; the frame's index is not shown."""
    styler = cells.style.hide(axis="index").format_index(esc, axis="columns")
    return styler.to_latex(column_format=column_format, hrules=True)


def hand_tabular(lines: list[str], column_format: str) -> str:
    """A booktabs tabular of header and body lines written by the caller (for the layouts Styler cannot give)."""
    return "\n".join([f"\\begin{{tabular}}{{{column_format}}}", r"\toprule", *lines, r"\bottomrule", r"\end{tabular}"])
