"""Tables from stored runs only (no model is loaded): the paper's ``tab:robustness`` as CSV and LaTeX.

Rows are modifications (category, attack, setting); columns are method x {AUC, TPR@5%, PPL}; one table per preset.
Colours follow the paper: AUC >= 0.8 green, < 0.7 red, yellow otherwise.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pandas as pd

from harness.errors import HarnessError
from harness.store import Stage, Store

log = logging.getLogger(__name__)

CATEGORY_ORDER = ["Reference", "Unaltered", "Quantization", "Pruning", "Merging", "Finetuning", "Paraphrase"]
METRICS = {"AUC": "auc", "TPR@5": "tpr@0.05", "PPL": "median_ppl"}


def collect(store: Store) -> pd.DataFrame:
    """One row per finished run: its labels and headline metrics (newest run wins for identical labels). A run that
    fails verification (damaged, edited, unreadable) is left out with one warning naming it."""
    rows = []
    for run in store.runs():
        try:
            problem = Stage("run", {}, run.name, run, store.root).problem()
            if problem is None:
                rows.append(_row(run))
        except HarnessError as err:  # edited after it was published
            problem = str(err)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
            problem = f"unreadable ({type(err).__name__}: {err})"
        if problem is not None:
            log.warning("skipping run %s: %s", run, problem)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    keys = ["preset", "base_model", "method", "method_config", "category", "attack", "attack_config"]
    dupes = df.duplicated(keys, keep="last")
    if dupes.any():
        log.warning("%d older runs with the same labels are left out (newest kept)", int(dupes.sum()))
    return df[~dupes].reset_index(drop=True)


def _row(run: Path) -> dict:
    spec = json.loads((run / "spec.json").read_text())
    m = json.loads((run / "metrics.json").read_text())
    cfg = spec["config"]
    return {
        "preset": spec["preset"],
        "base_model": cfg["preset"]["base_model"],
        "method": cfg["method"]["label"],
        "method_config": cfg["method"]["config_label"],
        "category": cfg["attack"]["category"],
        "attack": cfg["attack"]["label"],
        "attack_config": cfg["attack"]["config_label"],
        **{k: m.get(v) for k, v in METRICS.items()},
        "TPR@1": m.get("tpr@0.01"),
        "AUC_lo": m["auc_ci95"][0],
        "AUC_hi": m["auc_ci95"][1],
        "n_pos": m["n_pos"],
        "n_neg": m["n_neg"],
        "run": run.name,
    }


def robustness(df: pd.DataFrame) -> pd.DataFrame:
    """Pivot one preset's runs into the shape of ``tab:robustness``."""
    df = df.copy()
    several = df.groupby("method")["method_config"].nunique()
    df["column"] = [
        f"{m} ({c})" if several[m] > 1 else m for m, c in zip(df["method"], df["method_config"], strict=True)
    ]
    table = df.pivot_table(
        index=["category", "attack", "attack_config"],
        columns="column",
        values=list(METRICS),
        aggfunc="first",
    )
    table = table.swaplevel(0, 1, axis=1)
    methods = sorted(df["column"].unique())
    rank = {c: i for i, c in enumerate(CATEGORY_ORDER)}  # unknown categories go last, alphabetically
    rows = sorted(table.index, key=lambda r: (rank.get(r[0], len(rank)), r[0], r[1], natural_key(r[2])))
    return table.reindex(
        index=pd.MultiIndex.from_tuples(rows, names=table.index.names),
        columns=pd.MultiIndex.from_product([methods, list(METRICS)]),
    )


def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside a label by value: ``t=0.3`` < ``t=0.5``, ``s=300`` < ``s=1200``."""
    parts = re.split(r"(\d+(?:\.\d+)?)", text)
    return tuple((0, float(p)) if i % 2 else (1, p) for i, p in enumerate(parts) if p)


def _cell(metric: str, value: float) -> str:
    if pd.isna(value):
        return "--"
    if metric == "AUC":
        colour = "green" if value >= 0.8 else "red" if value < 0.7 else "yellow"
        return f"\\cellcolor{{{colour}!25}}${value:.3f}$"
    return f"${value:.3f}$" if metric != "PPL" else f"${value:.1f}$"


def to_latex(table: pd.DataFrame, caption: str) -> str:
    """A LaTeX table (booktabs, colortbl) with the paper's layout and colour rule."""
    methods = list(dict.fromkeys(table.columns.get_level_values(0)))
    esc = lambda s: str(s).replace("_", r"\_").replace("%", r"\%")  # noqa: E731
    lines = [
        r"% needs \usepackage{booktabs} and \usepackage[table]{xcolor}",
        r"\begin{table}[h]",
        r"\centering",
        r"\scriptsize",
        f"\\caption{{{esc(caption)}}}",
        f"\\begin{{tabular}}{{lll{'ccc' * len(methods)}}}",
        r"\toprule",
        "Category & Method & Config & " + " & ".join(f"\\multicolumn{{3}}{{c}}{{{esc(m)}}}" for m in methods) + r" \\",
        " & & & " + " & ".join(" & ".join(METRICS) for _ in methods) + r" \\",
        r"\midrule",
    ]
    previous = None
    for (category, attack, config), row in table.iterrows():
        if previous is not None and category != previous:
            lines.append(r"\midrule")
        label = esc(category) if category != previous else ""
        cells = [_cell(metric, row[(m, metric)]) for m in methods for metric in METRICS]
        lines.append(f"{label} & {esc(attack)} & {esc(config)} & " + " & ".join(cells) + r" \\")
        previous = category
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def write_tables(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Write ``robustness-<preset>.csv`` and ``.tex`` (plus ``runs.csv``, every run's metrics) for the runs of
    ``collect``; return the paths."""
    if df.empty:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "runs.csv"]
    df.to_csv(written[0], index=False)
    for preset, part in df.groupby("preset"):
        table = robustness(part)
        csv, tex = out_dir / f"robustness-{preset}.csv", out_dir / f"robustness-{preset}.tex"
        table.to_csv(csv)
        base = part["base_model"].iloc[0]
        tex.write_text(to_latex(table, f"AUC, TPR at 5% FPR and median PPL under model modifications ({base})."))
        written += [csv, tex]
    return written
