"""Every table of the paper from stored runs only (no model is loaded), as CSV and LaTeX.

Tables (paper label -> file), each per setup (``collect.setups``):
  tab:robustness (robustness): the rows of every attack whose ``tables`` include "robustness", grouped by category;
  tab:fpr_tpr (fpr_tpr); tab:ft_steps (ft_steps): the featured method (``WatermarkMethod.featured``) against the best
  other under the attacks whose ``tables`` include "ft_steps"; a table of its own per attack whose ``tables`` include
  "own" (tab:dipper: dipper); each method's ``ablations`` (tab:ablation-horizontal: ablation, tab:embedding:
  embedding); tab:watermark-config (watermark_config); and the appendix's attribution (attribution).
Each table's frame is built in ``frames`` and printed in ``latex``. A cell with no stored run is written as missing
("--" in LaTeX). Colours follow the paper: AUC >= 0.8 green, < 0.7 red, yellow otherwise.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from harness.report.collect import MISSING, TPRS, attack_tables, in_table, main_runs, method_rank, plugin_class, setups
from harness.report.frames import (
    ablation,
    attribution,
    fpr_tpr,
    ft_steps,
    own,
    robustness,
    tokens_to_detect,
    variants,
    watermark_config,
)
from harness.report.latex import ablation_tex, ft_steps_tex, own_tex, robustness_tex, simple_tex, tpr_tex
from harness.store import files
from harness.store.files import plain_name

log = logging.getLogger(__name__)


# --- one setup's tables, and writing them -----------------------------------------------------------------------
def _cells_short_of_seeds(part: pd.DataFrame, seeds: list) -> list[str]:
    """The main-configuration cells (method x attack setting) stored for fewer than all of ``seeds``."""
    runs = main_runs(part)
    counts = runs.groupby(["method", "attack", "attack_config"], sort=True)["seed"].nunique()
    return [f"{m} x {(a + ' ' + c).strip() or 'unaltered'} ({n} of {len(seeds)})" for (m, a, c), n in counts.items()
            if n < len(seeds)]  # fmt: skip


def setup_tables(part: pd.DataFrame, ci: bool, attributions: pd.DataFrame | None) -> dict[str, tuple]:
    """``{file name: (table, LaTeX)}`` of one setup's runs; tables with no stored run are left out."""
    base = part["base_model"].iloc[0]
    seeds = sorted(part["seed"].unique())
    about = f"{base}, preset {part['preset'].iloc[0]}"
    if len(seeds) > 1:
        about += f", mean over seeds {', '.join(map(str, seeds))}"
        short = _cells_short_of_seeds(part, seeds)
        if short:
            about += f" where stored ({len(short)} cells have fewer)"
            log.warning("%d cells average fewer than the %d seeds stored (%s): %s", len(short), len(seeds),
                        ", ".join(map(str, seeds)), "; ".join(short[:5]))  # fmt: skip
    mains = {(r.method, r.method_config) for r in main_runs(part).itertuples()}
    mains = sorted(mains, key=lambda mc: method_rank(mc[0]))
    configs = "; ".join(f"{m}: {c}" for m, c in mains)
    classes = {
        label: plugin_class("method", name) for label, name in zip(part["method"], part["method_name"], strict=True)
    }
    out = {}

    def add(name: str, table: pd.DataFrame, latex, *args) -> None:
        if not table.empty:
            out[name] = (table, latex(table, *args))

    add(
        "robustness",
        robustness(part, ci),
        robustness_tex,
        f"AUC, TPR at 5% FPR and median PPL under model modifications ({about}; {configs}).",
    )
    add(
        "fpr_tpr", fpr_tpr(part), tpr_tex, f"TPR at fixed FPRs of the unaltered models ({about}).", "Method", list(TPRS)
    )
    for name in sorted(n for n in part["attack_name"].dropna().unique() if "own" in attack_tables(n)):
        cls = plugin_class("attack", name)
        label = cls.label if cls is not None else name
        add(name, own(part, name, ci), own_tex, f"AUC under {cls.description or label} ({about}).", label)
    for label in sorted((m for m, c in classes.items() if c is not None and c.featured), key=method_rank):
        steps = part[in_table(part, "ft_steps")]["attack_name"].dropna().unique()
        what = " and ".join(dict.fromkeys(plugin_class("attack", n).description or n for n in steps))
        caption = f"{label} under {what}, with its difference to the best other method ({about})."
        add("ft_steps", ft_steps(part, label), ft_steps_tex, caption)
    for label in sorted((m for m, c in classes.items() if c is not None), key=method_rank):
        for spec in classes[label].ablations:
            if spec.layout == "horizontal":
                add(spec.file, ablation(part, label, spec), ablation_tex, f"{spec.caption} ({about}).", spec)
            else:
                add(spec.file, variants(part, label, spec), simple_tex, f"{spec.caption} ({about}).",
                    [spec.index_name])  # fmt: skip
    add(
        "watermark_config",
        watermark_config(part),
        simple_tex,
        f"Watermark configurations and their detection and quality ({about}).",
        ["Method", "Config"],
    )
    add(
        "tokens_to_detect",
        tokens_to_detect(part),
        simple_tex,
        f"Tokens to detect (MarkMyWords' size): the median length from which a text flagged at 1% FPR on its whole "
        f"text stays flagged, the share flagged on the whole text, TPR at 1% FPR by text length, and the share of "
        f"the unwatermarked base's texts flagged on the whole text ({about}).",
        ["Method", "Config", "Category", "Attack", "Setting"],
    )
    if attributions is not None and len(attributions):
        table = attribution(attributions)
        add(
            "attribution",
            table,
            tpr_tex,
            f"Attribution: share of each model's texts (columns) flagged by each detector (rows) at its 1% FPR "
            f"threshold on human texts ({about}).",
            "Detector",
            list(table.columns),
        )
    return out


INDEX = ".harness-tables.json"  # in --out: what the last ``harness tables`` wrote there


def forget_stale(out_dir: Path, written: list[Path]) -> list[Path]:
    """Remove what an earlier ``harness tables`` wrote into ``out_dir`` (its index) and this one did not (a setup or
    table the store no longer has: ``tiny/`` once a second setup makes it ``tiny-<hash>/``), so that nothing left
    there looks current; then record what this one wrote. Files not in the index are never touched."""
    index = out_dir / INDEX
    try:
        before = json.loads(index.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        before = []
    now = sorted(p.relative_to(out_dir).as_posix() for p in written)
    removed = []
    for rel in sorted(set(before) - set(now)):
        path = out_dir / rel
        if files.stays_inside(rel) and path.is_file():
            path.unlink()
            removed.append(path)
            for folder in path.parents:  # folders it leaves empty
                if folder == out_dir or any(folder.iterdir()):
                    break
                folder.rmdir()
    files.write_atomic(index, json.dumps({"files": now}, indent=1) + "\n")
    return removed


def _csv(table: pd.DataFrame, path: Path) -> None:
    """CSV with fixed float formatting and missing cells spelled out, so two builds are byte-identical; replaced
    whole (``files.write_atomic``), as every file ``harness tables`` writes."""
    files.write_atomic(path, table.to_csv(float_format="%.6g", na_rep=MISSING, lineterminator="\n"))


def write_tables(
    df: pd.DataFrame, out_dir: Path, ci: bool = False, attributions: pd.DataFrame | None = None
) -> list[Path]:
    """Write every table of every setup (``<out>/<setup>/<table>.csv`` and ``.tex``) plus ``runs.csv`` (every run's
    labels and metrics); return the paths written."""
    if df.empty:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "runs.csv"]
    # (main_method: derived, what ablations vary around; by_length: in tokens_to_detect)
    _csv(df.drop(columns=["main_method", "by_length"]).set_index("run"), written[0])
    for name, part in setups(df).items():
        folder = out_dir / plain_name(name)
        folder.mkdir(exist_ok=True)
        mine = None
        if attributions is not None and len(attributions):
            mine = attributions[attributions["setup"] == part["setup"].iloc[0]]
        for table_name, (table, tex) in setup_tables(part, ci, mine).items():
            csv, latex = folder / f"{plain_name(table_name)}.csv", folder / f"{plain_name(table_name)}.tex"
            _csv(table, csv)
            files.write_atomic(latex, tex)
            written += [csv, latex]
    return written
