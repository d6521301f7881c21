"""LaTeX of the tables: numbers as the paper prints them (AUC coloured by its rule), the table float around a
tabular, and the tabular itself through pandas' ``Styler.to_latex`` (booktabs rules, escaping, header rows).

Two tables keep a tabular written here line by line, because Styler cannot give their layout: tab:robustness has a
``\\midrule`` between row groups (Styler separates groups by ``\\cline`` only) and a second header row of empty index
cells (Styler writes ``" &  & "`` for those); tab:ablation-horizontal is blocks of a header row and metric rows, one
block per setting, which is no single frame's rendering.
"""

from __future__ import annotations

import pandas as pd

from harness.config.errors import printable
from harness.contract.plugin import Ablation
from harness.report.collect import METRICS, MISSING, NOT_APPLICABLE

PREAMBLE = r"% needs \usepackage{booktabs} and \usepackage[table]{xcolor}; -- marks a cell with no stored run"


# LaTeX's special characters as text, replaced in one pass (so the braces of ``\textbackslash{}`` stay as they are).
SPECIALS = {
    "\\": r"\textbackslash{}",
    "^": r"\textasciicircum{}",
    "~": r"\textasciitilde{}",
    **{c: "\\" + c for c in "_%&$#{}"},
    "→": r"$\rightarrow$",  # between the links of a chain of attacks (attacks/chain.py)
}


def esc(text) -> str:
    """``text`` (a label, setting or caption, possibly read from someone else's store) as LaTeX text: every special
    character escaped, so that ``$\\foo$`` prints as it is instead of starting math mode or a command, and a control
    character or bidi override written as its escape (LaTeX stops at ESC; RLO reorders the text)."""
    return "".join(SPECIALS.get(c, c) for c in printable(str(text), keep="\n"))


GREEN_FROM, RED_BELOW = 0.8, 0.7  # the paper's colour rule for an AUC: green from 0.8, red below 0.7, yellow between


def colour(value: float) -> str:
    """The paper's colour rule for an AUC (the tables' cells, the report's heatmap)."""
    return "green" if value >= GREEN_FROM else "red" if value < RED_BELOW else "yellow"


def colour_legend() -> tuple[tuple[str, str], ...]:
    """``(colour, what it means)`` of each colour of the rule, for a legend."""
    return (
        ("green", f"AUC >= {GREEN_FROM:g}"),
        ("yellow", f"{RED_BELOW:g} <= AUC < {GREEN_FROM:g}"),
        ("red", f"AUC < {RED_BELOW:g}"),
    )


def fmt(metric: str, value, latex: bool = True) -> str:
    """A number as the tables print it: PPL to one decimal, the rest to three; an AUC in LaTeX with its colour; a
    missing cell as ``--`` (LaTeX) or ``missing``."""
    if isinstance(value, str):  # n/a, or a word (the quality gate's verdict)
        return esc(value) if latex and value != NOT_APPLICABLE else value
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


# --- each table's LaTeX (``harness.report.tables`` says which table takes which) ---------------------------------
def robustness_tex(table: pd.DataFrame, caption: str) -> str:
    """tab:robustness: a row group per category (a rule between groups), each method's metrics under its name."""
    methods = list(dict.fromkeys(table.columns.get_level_values(0)))
    metrics = list(dict.fromkeys(table.columns.get_level_values(1)))
    lines = [
        "Category & Method & Config & "
        + " & ".join(f"\\multicolumn{{{len(metrics)}}}{{c}}{{{esc(m)}}}" for m in methods)
        + r" \\",
        " & & & " + " & ".join(" & ".join(esc(x) for x in metrics) for _ in methods) + r" \\",
        r"\midrule",
    ]
    previous = None
    for (category, attack, config), row in table.iterrows():
        if previous is not None and category != previous:
            lines.append(r"\midrule")
        label = esc(category) if category != previous else ""
        cells = [fmt(metric if metric in METRICS else "tokens" if metric == "seeds" else "AUCci", row[(m, metric)])
                 for m in methods for metric in metrics]  # fmt: skip
        # (the unaltered model's row has an empty label and setting: ``attacks.identity``)
        lines.append(f"{label} & {esc(attack)} & {esc(config)} & " + " & ".join(cells) + r" \\")
        previous = category
    return table_float(hand_tabular(lines, "lll" + "c" * len(methods) * len(metrics)), caption)


def tpr_tex(table: pd.DataFrame, caption: str, label_column: str, columns: list[str]) -> str:
    """A row per index entry (under ``label_column``) with ``columns`` as rates (tab:fpr_tpr, attribution); a rate
    with an interval over training seeds (``<column>_seed_lo``, ``_seed_hi``) has it in brackets."""
    cells = pd.DataFrame({label_column: [esc(name) for name in table.index]})
    for c in columns:
        cells[c] = [fmt("AUC" if c == "AUC" else "TPR", v) for v in table[c]]
        if f"{c}_seed_lo" in table:
            cells[c] += [f" [{fmt('TPR', lo)}, {fmt('TPR', hi)}]" if lo == lo else ""
                         for lo, hi in zip(table[f"{c}_seed_lo"], table[f"{c}_seed_hi"], strict=True)]  # fmt: skip
    return table_float(tabular(cells, "l" + "c" * len(columns)), caption)


def own_tex(table: pd.DataFrame, caption: str, label: str) -> str:
    """An attack's own table (tab:dipper): a row per method, the AUC under each setting (``label`` and setting)."""
    configs = [c for c in dict.fromkeys(table.columns.get_level_values(0)) if (c, "AUC") in table.columns]
    cells = pd.DataFrame({"Watermark method": [esc(m) for m in table.index]})
    for c in configs:
        cells[f"{label} ({c})"] = [fmt("AUC", v) for v in table[(c, "AUC")]]
    return table_float(tabular(cells, "l" + "c" * len(configs)), caption)


def ft_steps_tex(table: pd.DataFrame, caption: str) -> str:
    """tab:ft_steps: each value with its difference to the best other method in brackets."""
    cells = pd.DataFrame({"Dataset": [esc(d) for d, _ in table.index], "Step": [esc(s) for _, s in table.index]})
    for v in ("AUC", "TPR@1%", "TPR@10%"):
        diffs = table[f"{v} vs baseline"]
        cells[v] = [
            fmt(cell_kind(v), a) + ("" if pd.isna(d) else f" ({d:+.3f})") for a, d in zip(table[v], diffs, strict=True)
        ]
    cells["Baseline"] = [esc(b) for b in table["baseline"]]
    return table_float(tabular(cells, "llcccl"), caption)


def ablation_tex(table: pd.DataFrame, caption: str, spec: Ablation) -> str:
    """tab:ablation-horizontal: a block per setting, its values (the main one bold) over a row per metric."""
    blocks = []
    metrics = [c for c in table.columns if c != "main"]
    for setting in dict.fromkeys(table.index.get_level_values(0)):
        part = table.loc[setting]
        head = [spec.settings_tex.get(setting, esc(setting))]
        shown = [f"{v:g}" if isinstance(v, int | float) else esc(str(v)) for v in part.index]
        head += [f"\\textbf{{{v}}}" if row["main"] else v for v, (_, row) in zip(shown, part.iterrows(), strict=True)]
        blocks.append(" & ".join(head) + r" \\")
        blocks.append(r"\midrule")
        for metric in metrics:
            cells = [fmt("PPL" if metric == "PPL" else "AUC", row[metric]) for _, row in part.iterrows()]
            blocks.append(f"{metric} & " + " & ".join(cells) + r" \\")
        blocks.append(r"\midrule")
    width = max((len(table.loc[s]) for s in dict.fromkeys(table.index.get_level_values(0))), default=0)
    return table_float(hand_tabular(blocks[:-1], "l" + "c" * width), caption)


def simple_tex(table: pd.DataFrame, caption: str, index_names: list[str]) -> str:
    """A row per index entry (its parts under ``index_names``) with every column but ``main`` as numbers."""
    columns = [c for c in table.columns if c != "main"]
    keys = [k if isinstance(k, tuple) else (k,) for k in table.index]
    cells = pd.DataFrame({name: [esc(k[i]) for k in keys] for i, name in enumerate(index_names)})
    for c in columns:
        cells[c] = [fmt(cell_kind(c), v) for v in table[c]]
    return table_float(tabular(cells, "l" * len(index_names) + "c" * len(columns)), caption)


def comparison_tex(table: pd.DataFrame, caption: str) -> str:
    """tab:comparison: a row per row of tab:robustness and pair of methods, each difference with its paired interval
    (and its interval over seeds where there are several), bold where every interval excludes zero."""
    keys = list(table.index)
    cells = pd.DataFrame({name: [esc(k[i]) for k in keys] for i, name in enumerate(["Category", "Attack", "Setting",
                                                                                      "A", "B"])})  # fmt: skip
    cells["Seeds"] = [fmt("tokens", v) for v in table["seeds"]]
    names = [n for n in ("AUC", "TPR@1%", "AUC_vs_base") if f"d{n}" in table]
    for name in names:

        def shown(row, name=name) -> str:
            if pd.isna(row[f"d{name}"]):
                return "--"
            text = f"{row[f'd{name}']:+.3f} [{row[f'd{name}_lo']:+.3f}, {row[f'd{name}_hi']:+.3f}]"
            if f"d{name}_seed_lo" in row and not pd.isna(row[f"d{name}_seed_lo"]):
                text += f" seeds [{row[f'd{name}_seed_lo']:+.3f}, {row[f'd{name}_seed_hi']:+.3f}]"
            return f"\\textbf{{{text}}}" if bool(row[f"{name}_excludes_0"]) else text

        label = "AUC vs base" if name == "AUC_vs_base" else name
        cells[f"{label} A - B"] = [shown(row) for _, row in table.iterrows()]
    cells["Note"] = [esc(n) for n in table["note"]]
    return table_float(tabular(cells, "lllll" + "c" * (1 + len(names)) + "l"), caption)
