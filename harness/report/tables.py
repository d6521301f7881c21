"""Every table of the paper from stored runs only (no model is loaded), as CSV and LaTeX.

Tables (paper label -> file), each per setup (``collect.setups``):
  tab:robustness (robustness): the rows of every attack whose ``tables`` include "robustness", grouped by category;
  tab:fpr_tpr (fpr_tpr); tab:ft_steps (ft_steps): the featured method (``WatermarkMethod.featured``) against the best
  other under the attacks whose ``tables`` include "ft_steps"; a table of its own per attack whose ``tables`` include
  "own" (tab:dipper: dipper); each method's ``ablations`` (tab:ablation-horizontal: ablation, tab:embedding:
  embedding); tab:watermark-config (watermark_config); and the appendix's attribution (attribution).
A cell with no stored run is written as missing ("--" in LaTeX). Colours follow the paper: AUC >= 0.8 green, < 0.7
red, yellow otherwise.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from harness.config.plugins import Ablation
from harness.report.collect import (
    METRICS,
    MISSING,
    TPRS,
    attack_tables,
    category_rank,
    in_table,
    main_runs,
    mean_over_seeds,
    method_rank,
    natural_key,
    only_mask,
    param,
    plugin_class,
    setups,
    tradeoff_settings,
    unaltered,
)
from harness.report.latex import cell_kind, esc, fmt, hand_tabular, table_float, tabular
from harness.run.scoring import BASE_ROW
from harness.store import files
from harness.store.files import plain_name

log = logging.getLogger(__name__)


# --- the tables -------------------------------------------------------------------------------------------------
def robustness(df: pd.DataFrame, ci: bool = False) -> pd.DataFrame:
    """tab:robustness: rows are the model modifications (category, attack, setting), columns each method's main
    configuration x (AUC, TPR@5, PPL[, AUC_lo, AUC_hi])."""
    metrics = list(METRICS) + (["AUC_lo", "AUC_hi"] if ci else [])
    part = main_runs(df)
    part = part[in_table(part, "robustness")]
    if part.empty:
        return pd.DataFrame()
    part = mean_over_seeds(part, ["method", "category", "attack", "attack_config"], metrics)
    table = part.pivot_table(index=["category", "attack", "attack_config"], columns="method", values=metrics,
                             aggfunc="first")  # fmt: skip
    table = table.swaplevel(0, 1, axis=1)
    methods = sorted(part["method"].unique(), key=method_rank)
    stored = set(zip(part["category"], part["attack"], part["attack_config"], strict=True))
    rows = sorted(stored, key=lambda r: (category_rank(r[0]), natural_key(r[1]), natural_key(r[2])))
    return table.reindex(
        index=pd.MultiIndex.from_tuples(rows, names=table.index.names),
        columns=pd.MultiIndex.from_product([methods, metrics], names=["method", "metric"]),
    )


def robustness_tex(table: pd.DataFrame, caption: str) -> str:
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
        cells = [fmt(metric if metric in METRICS else "AUCci", row[(m, metric)]) for m in methods for metric in metrics]
        # (the unaltered model's row has an empty label and setting: ``attacks.identity``)
        lines.append(f"{label} & {esc(attack)} & {esc(config)} & " + " & ".join(cells) + r" \\")
        previous = category
    return table_float(hand_tabular(lines, "lll" + "c" * len(methods) * len(metrics)), caption)


def fpr_tpr(df: pd.DataFrame) -> pd.DataFrame:
    """tab:fpr_tpr: each method's main configuration, unaltered: TPR at 0.1/1/5/10% FPR (empirical thresholds from
    the human texts; ``negatives`` says how many: 0.1% of 200 rests on no text at all)."""
    part = main_runs(df)
    part = part[unaltered(part)]
    if part.empty:
        return pd.DataFrame()
    part = mean_over_seeds(part, ["method", "method_config"], [*TPRS, "n_neg"])
    part = part.sort_values("method", key=lambda s: s.map(method_rank)).rename(columns={"n_neg": "negatives"})
    return part.set_index("method")


def tpr_tex(table: pd.DataFrame, caption: str, label_column: str, columns: list[str]) -> str:
    cells = pd.DataFrame({label_column: [esc(name) for name in table.index]})
    for c in columns:
        cells[c] = [fmt("AUC" if c == "AUC" else "TPR", v) for v in table[c]]
    return table_float(tabular(cells, "l" + "c" * len(columns)), caption)


def own(df: pd.DataFrame, attack: str, ci: bool = False) -> pd.DataFrame:
    """The table of one attack of its own (tab:dipper for DIPPER): AUC of each method's main configuration under
    each of its settings, with how much the texts were rewritten (mean unigram overlap with the original) and kept
    (mean MiniLM cosine), and for an edit the rate it applied (``edit_rate``: below its ``p`` where, say, few words
    have a synonym)."""
    part = main_runs(df)
    part = part[part["attack_name"] == attack]
    if part.empty:
        return pd.DataFrame()
    values = ["AUC", "overlap", "cosine"] + (["edit_rate"] if part["edit_rate"].notna().any() else [])
    values += ["AUC_lo", "AUC_hi"] if ci else []
    part = mean_over_seeds(part, ["method", "attack_config"], values)
    table = part.pivot_table(index="method", columns="attack_config", values=values, aggfunc="first")
    table = table.swaplevel(0, 1, axis=1)
    configs = sorted(part["attack_config"].unique(), key=natural_key)
    methods = sorted(part["method"].unique(), key=method_rank)
    return table.reindex(index=methods, columns=pd.MultiIndex.from_product([configs, values]))


def own_tex(table: pd.DataFrame, caption: str, label: str) -> str:
    configs = list(dict.fromkeys(table.columns.get_level_values(0)))
    cells = pd.DataFrame({"Watermark method": [esc(m) for m in table.index]})
    for c in configs:
        cells[f"{label} ({c})"] = [fmt("AUC", v) for v in table[(c, "AUC")]]
    return table_float(tabular(cells, "l" + "c" * len(configs)), caption)


def ft_steps(df: pd.DataFrame, featured: str) -> pd.DataFrame:
    """tab:ft_steps: the ``featured`` method under each fine-tuning dataset and step (the attacks whose ``tables``
    include "ft_steps"), with its difference to the best other method (the one with the highest mean AUC over that
    dataset's steps) in AUC, TPR@1% and TPR@10%."""
    part = main_runs(df)
    part = part[in_table(part, "ft_steps")]
    if part.empty:
        return pd.DataFrame()
    values = ["AUC", "TPR@1%", "TPR@10%"]
    part = mean_over_seeds(part, ["method", "attack", "attack_config"], values)
    rows = []
    for dataset, d in part.groupby("attack", sort=True):
        others = d[d["method"] != featured]
        best = None
        if len(others):
            means = others.groupby("method")["AUC"].mean()
            best = sorted(means.index, key=lambda m: (-means[m], method_rank(m)))[0]
        for step in sorted(d["attack_config"].unique(), key=natural_key):
            ours = d[(d["method"] == featured) & (d["attack_config"] == step)]
            theirs = d[(d["method"] == best) & (d["attack_config"] == step)] if best else d.iloc[:0]
            row = {"dataset": dataset, "step": step, "baseline": best or MISSING}
            for v in values:
                a = ours[v].iloc[0] if len(ours) else float("nan")
                b = theirs[v].iloc[0] if len(theirs) else float("nan")
                row[v] = a
                row[f"{v} vs baseline"] = a - b
            rows.append(row)
    return pd.DataFrame(rows).set_index(["dataset", "step"])


def ft_steps_tex(table: pd.DataFrame, caption: str) -> str:
    cells = pd.DataFrame({"Dataset": [esc(d) for d, _ in table.index], "Step": [esc(s) for _, s in table.index]})
    for v in ("AUC", "TPR@1%", "TPR@10%"):
        diffs = table[f"{v} vs baseline"]
        cells[v] = [
            fmt(cell_kind(v), a) + ("" if pd.isna(d) else f" ({d:+.3f})") for a, d in zip(table[v], diffs, strict=True)
        ]
    cells["Baseline"] = [esc(b) for b in table["baseline"]]
    return table_float(tabular(cells, "llcccl"), caption)


def _one_setting(df: pd.DataFrame, method: str, settings: tuple[str, ...]) -> pd.DataFrame:
    """Runs of ``method`` (a table label) whose configuration is its main one or differs from it in one of
    ``settings`` alone."""
    part = df[df["method"] == method]
    return part[only_mask(part, settings)] if len(part) else part


def ablation(df: pd.DataFrame, method: str, spec: Ablation) -> pd.DataFrame:
    """A horizontal ablation (tab:ablation-horizontal): ``method`` with each of ``spec.settings`` varied alone (the
    others as the preset's): AUC and PPL of the unaltered model, and the AUC under ``spec.under``."""
    part = _one_setting(df, method, spec.settings)
    if part.empty:
        return pd.DataFrame()
    attack, under = spec.under or (None, {})
    cls = plugin_class("method", part["method_name"].iloc[0])
    fields = cls.Params.model_fields if cls is not None else {}

    def value_of(params: str, setting: str):  # a setting added later is stored only where it is not its default
        found = param(params, setting)
        return fields[setting].default if found is None and setting in fields else found

    later = cls.Params.added_later if cls is not None else ()
    rows = []
    for setting in spec.settings:
        chosen = part[only_mask(part, (setting,))]
        values = sorted({value_of(p, setting) for p in chosen["params"]}, key=lambda v: (isinstance(v, str), v))
        if setting in later and values == [fields[setting].default]:
            continue  # a setting added later that no stored run varies: no block (stores made before it read as before)
        for value in values:
            runs = chosen[chosen["params"].map(lambda p, s=setting, v=value: value_of(p, s) == v)]
            plain = runs[unaltered(runs)]
            settings_match = runs["attack_params"].map(lambda p: all(param(p, k) == v for k, v in under.items()))
            attacked = runs[(runs["attack_name"] == attack) & settings_match]
            row = {
                "setting": setting,
                "value": value,
                "AUC": plain["AUC"].mean() if len(plain) else float("nan"),
                "PPL": plain["PPL"].mean() if len(plain) else float("nan"),
            }
            if attack is not None:
                row[spec.under_column] = attacked["AUC"].mean() if len(attacked) else float("nan")
            rows.append({**row, "main": bool(runs["main"].any())})
    return pd.DataFrame(rows).set_index(["setting", "value"])


def ablation_tex(table: pd.DataFrame, caption: str, spec: Ablation) -> str:
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


def variants(df: pd.DataFrame, method: str, spec: Ablation) -> pd.DataFrame:
    """A vertical ablation (tab:embedding): ``method`` (unaltered) with each value of ``spec.settings`` (one, as
    PRO's sentence encoder E): AUC, TPR@1%, TPR@10%."""
    part = _one_setting(df, method, spec.settings)
    part = part[unaltered(part)]
    if part.empty:
        return pd.DataFrame()
    setting = spec.settings[0]
    part = part.assign(**{setting: part["params"].map(lambda p: param(p, setting))})
    return mean_over_seeds(part, [setting], ["AUC", "TPR@1%", "TPR@10%"]).sort_values(setting).set_index(setting)


def watermark_config(df: pd.DataFrame) -> pd.DataFrame:
    """tab:watermark-config with its results (the points of the AUC-PPL figure): each method's configurations that
    differ from its main one only in the settings the paper varies (``tradeoff_settings``), unaltered."""
    part = df[unaltered(df)]
    part = part[only_mask(part, tradeoff_settings)]
    if part.empty:
        return pd.DataFrame()
    part = mean_over_seeds(part, ["method", "method_config", "main"], ["AUC", "TPR@5", "PPL"])
    order = sorted(range(len(part)), key=lambda i: (method_rank(part["method"].iloc[i]),
                                                    natural_key(part["method_config"].iloc[i])))  # fmt: skip
    return part.iloc[order].set_index(["method", "method_config"])


def tokens_to_detect(df: pd.DataFrame) -> pd.DataFrame:
    """Tokens to detect (MarkMyWords' "size"): for every stored configuration and attack row whose detector keeps
    prefix scores, the median length from which a text flagged at 1% FPR on its whole text stays flagged, the share
    flagged on the whole text, TPR at 1% FPR after a quarter, a half, three quarters and all of the text, and beside
    each row the share of the unwatermarked base model's texts flagged on their whole text by the same detector (the
    rate the 1% is to be read against)."""
    part = df[df["by_length"].notna()]
    if part.empty:
        return pd.DataFrame()
    curves = [json.loads(b) for b in part["by_length"]]
    part = part.assign(**{f"TPR@1% {n} tokens": [c["tpr@0.01"][i] for c in curves]
                          for i, n in enumerate(curves[0]["lengths"])})  # fmt: skip
    columns = ["tokens to detect", "detected", *[c for c in part.columns if c.startswith("TPR@1% ")]]
    part = part.rename(columns={"tokens_to_detect": "tokens to detect", "detected_by_end": "detected"})
    keys = ["method", "method_config", "category", "attack", "attack_config"]
    part = mean_over_seeds(part, [*keys, "attack_name"], columns)
    base = part[part["attack_name"].isna()].groupby(["method", "method_config"], sort=False)["detected"].first()
    part["base flagged"] = [base.get((m, c)) for m, c in zip(part["method"], part["method_config"], strict=True)]
    # Each configuration's rows: the base (no attack), the unaltered model, then the attacks.
    part["first"] = part["attack_name"].notna().astype(int) + (~unaltered(part)).astype(int)
    order = sorted(
        range(len(part)),
        key=lambda i: (
            method_rank(part["method"].iloc[i]),
            natural_key(part["method_config"].iloc[i]),
            part["first"].iloc[i],
            natural_key(" ".join(part[k].iloc[i] for k in ("category", "attack", "attack_config"))),
        ),
    )
    return part.iloc[order].drop(columns=["attack_name", "first"]).set_index(keys)


def simple_tex(table: pd.DataFrame, caption: str, index_names: list[str]) -> str:
    columns = [c for c in table.columns if c != "main"]
    keys = [k if isinstance(k, tuple) else (k,) for k in table.index]
    cells = pd.DataFrame({name: [esc(k[i]) for k in keys] for i, name in enumerate(index_names)})
    for c in columns:
        cells[c] = [fmt(cell_kind(c), v) for v in table[c]]
    return table_float(tabular(cells, "l" * len(index_names) + "c" * len(columns)), caption)


def attribution(df: pd.DataFrame) -> pd.DataFrame:
    """Share of each model's texts (columns) that each detector (rows) flags at its 1% FPR threshold on human
    texts: off the diagonal a false positive rate, on it the detector's own TPR."""
    if df.empty:
        return df
    table = df.pivot_table(index="detector", columns="texts", values="TPR@1%", aggfunc="first", dropna=False)
    sources = sorted(table.columns, key=lambda c: (c != BASE_ROW, method_rank(c.split(" (")[0]), c))
    detectors = sorted(table.index, key=lambda c: (method_rank(c.split(" (")[0]), c))
    return table.reindex(index=detectors, columns=sources)


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
