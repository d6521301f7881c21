"""Every table of the paper from stored runs only (no model is loaded), as CSV and LaTeX.

``collect`` reads each finished run's ``spec.json`` and ``metrics.json`` into one row. Runs are grouped into *setups*
(the preset with its base model, data and training and evaluation settings; seeds are averaged), and each setup gets
its own folder of tables: numbers are never carried over from another preset or base model. Within a setup, a method's
*main* configuration is the preset's own settings for it; the other configurations feed the tables that vary them.

Tables (paper label -> file):
  tab:robustness (robustness), tab:fpr_tpr (fpr_tpr), tab:dipper (dipper), tab:ft_steps (ft_steps),
  tab:ablation-horizontal (ablation), tab:embedding (embedding), tab:watermark-config (watermark_config), and the
  appendix's attribution (attribution). A cell with no stored run is written as missing ("--" in LaTeX).
Colours follow the paper: AUC >= 0.8 green, < 0.7 red, yellow otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from functools import cache
from pathlib import Path

import pandas as pd

from harness.config.errors import HarnessError
from harness.report import metrics
from harness.store.stages import Stage, Store

log = logging.getLogger(__name__)

CATEGORY_ORDER = ["Reference", "Unaltered", "Quantization", "Pruning", "Merging", "Finetuning", "Paraphrase"]
MODIFICATIONS = ["Unaltered", "Quantization", "Pruning", "Merging", "Finetuning"]  # rows of tab:robustness
METHOD_ORDER = ["Gu-KTH", "Gu-KGW", "Gloaguen-KGW", "PRO"]  # the paper's column order; others follow by name
METRICS = {"AUC": "auc", "TPR@5": "tpr@0.05", "PPL": "median_ppl"}
TPRS = {"TPR@0.1%": "tpr@0.001", "TPR@1%": "tpr@0.01", "TPR@5%": "tpr@0.05", "TPR@10%": "tpr@0.1"}
MISSING = "missing"
# Tables of one method's settings (PRO's, in the paper): which settings each varies.
ABLATION = ("PRO", ("alpha", "beta"))
EMBEDDING = ("PRO", ("embedding_model",))
FT_STEPS_METHOD = "PRO"  # tab:ft_steps: this method against the best other one
# Settings that are not part of a setup: seeds are averaged; plugin defaults only say which configuration is main.
NOT_SETUP = {"name", "notes", "methods", "attacks"}


# --- reading the store ------------------------------------------------------------------------------------------
def collect(store: Store) -> pd.DataFrame:
    """One row per finished run that verifies (a damaged, edited or unreadable one is left out with one warning
    naming it); of runs with identical labels, the newest."""
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
    stale = df[df["metrics_version"] != metrics.METRICS_VERSION]
    if len(stale):
        log.warning("%d runs hold metrics of older metric code: 'harness rescore' updates them", len(stale))
    keys = ["setup", "seed", "method", "params", "category", "attack", "attack_params", "attack_config"]
    dupes = df.duplicated(keys, keep="last")
    if dupes.any():
        log.warning("%d older runs with the same labels are left out (newest kept)", int(dupes.sum()))
    return (
        df[~dupes].sort_values(["setup", "method", "method_config", "category", "attack", "run"]).reset_index(drop=True)
    )


def _row(run: Path) -> dict:
    spec = json.loads((run / "spec.json").read_text())
    m = json.loads((run / "metrics.json").read_text())
    cfg = spec["config"]
    preset = cfg["preset"]
    method = cfg["method"]
    name, params = method.get("name"), method.get("params", {})
    return {
        "preset": spec["preset"],
        "setup": setup_key(preset),
        "base_model": preset["base_model"],
        "seed": preset.get("train", {}).get("seed", 0),
        "method": method["label"],
        "method_config": method["config_label"],
        "method_name": name,
        "preset_method": json.dumps(preset.get("methods", {}).get(name, {}), sort_keys=True),
        "main": only(name, params, preset.get("methods", {}).get(name, {}), ()),
        "params": json.dumps(params, sort_keys=True),
        "category": cfg["attack"]["category"],
        "attack": cfg["attack"]["label"],
        "attack_name": cfg["attack"].get("name"),
        "attack_config": cfg["attack"]["config_label"],
        "attack_params": json.dumps(cfg["attack"].get("params", {}), sort_keys=True),
        **{k: m.get(v) for k, v in METRICS.items()},
        **{k: m.get(v) for k, v in TPRS.items()},
        "AUC_lo": m["auc_ci95"][0],
        "AUC_hi": m["auc_ci95"][1],
        "n_pos": m["n_pos"],
        "n_neg": m["n_neg"],
        "overlap": (m.get("paraphrase") or {}).get("mean_unigram_overlap"),
        "cosine": (m.get("paraphrase") or {}).get("mean_embedding_cosine"),
        "metrics_version": m.get("metrics_version", "0"),
        "run": run.name,
    }


def setup_key(preset: dict) -> str:
    """What makes runs comparable: the preset's settings (base model, data, training, evaluation) without its seed
    and name. Short hash."""
    kept = {k: v for k, v in preset.items() if k not in NOT_SETUP}
    kept["train"] = {k: v for k, v in kept.get("train", {}).items() if k != "seed"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:8]


@cache
def _resolved(name: str, settings: str) -> str | None:
    """The resolved settings (JSON) of method ``name`` built from ``settings`` (JSON); None if it does not build."""
    from harness.config.registry import methods

    try:
        return json.dumps(methods.build(name, json.loads(settings)).params.model_dump(), sort_keys=True)
    except HarnessError:
        return None


def only(name: str | None, params: dict, preset_settings: dict, settings: tuple[str, ...]) -> bool:
    """Whether a run's method is its preset's main configuration with at most ``settings`` changed (settings that
    derive from those, such as KGW's special-token handling from k, may change with them)."""
    if name is None:
        return False
    chosen = {k: params[k] for k in settings if k in params}
    built = _resolved(name, json.dumps({**preset_settings, **chosen}, sort_keys=True))
    return built is not None and built == json.dumps(params, sort_keys=True)


def _only(df: pd.DataFrame, settings: tuple[str, ...]) -> pd.Series:
    """``only`` for every run of ``df``."""
    return pd.Series(
        [only(n, json.loads(p), json.loads(d), settings) for n, p, d in zip(df["method_name"], df["params"],
                                                                              df["preset_method"], strict=True)],
        index=df.index, dtype=bool,
    )  # fmt: skip


def setups(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{folder name: runs}``: ``<preset>`` for a preset's one setup, ``<preset>-<setup hash>`` where a preset has
    several (another base model, other settings)."""
    out = {}
    for preset, part in df.groupby("preset", sort=True):
        keys = sorted(part["setup"].unique())
        for key in keys:
            out[preset if len(keys) == 1 else f"{preset}-{key}"] = part[part["setup"] == key]
    return out


# --- formatting -------------------------------------------------------------------------------------------------
def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside a label by value: ``t=0.3`` < ``t=0.5``, ``s=300`` < ``s=1200``."""
    parts = re.split(r"(\d+(?:\.\d+)?)", str(text))
    return tuple((0, float(p)) if i % 2 else (1, p) for i, p in enumerate(parts) if p)


def method_rank(label: str) -> tuple:
    return (METHOD_ORDER.index(label), "") if label in METHOD_ORDER else (len(METHOD_ORDER), label)


def esc(text) -> str:
    return str(text).replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")


def colour(value: float) -> str:
    """The paper's colour rule for an AUC."""
    return "green" if value >= 0.8 else "red" if value < 0.7 else "yellow"


def fmt(metric: str, value, latex: bool = True) -> str:
    if value is None or pd.isna(value):
        return "--" if latex else MISSING
    text = f"{value:.1f}" if metric == "PPL" else f"{value:.3f}"
    if not latex:
        return text
    if metric == "AUC":
        return f"\\cellcolor{{{colour(value)}!25}}${text}$"
    return f"${text}$"


def _csv(table: pd.DataFrame, path: Path) -> None:
    """CSV with fixed float formatting and missing cells spelled out, so two builds are byte-identical."""
    table.to_csv(path, float_format="%.6g", na_rep=MISSING, lineterminator="\n")


def _tex(lines: list[str], caption: str, columns: str) -> str:
    head = [
        r"% needs \usepackage{booktabs} and \usepackage[table]{xcolor}; -- marks a cell with no stored run",
        r"\begin{table}[h]",
        r"\centering",
        r"\scriptsize",
        f"\\caption{{{esc(caption)}}}",
        f"\\begin{{tabular}}{{{columns}}}",
        r"\toprule",
    ]
    return "\n".join([*head, *lines, r"\bottomrule", r"\end{tabular}", r"\end{table}", ""])


def _main(df: pd.DataFrame) -> pd.DataFrame:
    """Each method's main configuration (the preset's settings for it)."""
    return df[df["main"]]


def _mean(df: pd.DataFrame, keys: list[str], values: list[str]) -> pd.DataFrame:
    """Average over seeds (one seed: the values themselves)."""
    return df.groupby(keys, sort=False, dropna=False)[values].mean().reset_index()


# --- the tables -------------------------------------------------------------------------------------------------
def robustness(df: pd.DataFrame, ci: bool = False) -> pd.DataFrame:
    """tab:robustness: rows are the model modifications (category, attack, setting), columns each method's main
    configuration x (AUC, TPR@5, PPL[, AUC_lo, AUC_hi])."""
    metrics = list(METRICS) + (["AUC_lo", "AUC_hi"] if ci else [])
    part = _main(df)
    part = part[part["category"].isin(MODIFICATIONS)]
    if part.empty:
        return pd.DataFrame()
    part = _mean(part, ["method", "category", "attack", "attack_config"], metrics)
    table = part.pivot_table(index=["category", "attack", "attack_config"], columns="method", values=metrics,
                             aggfunc="first")  # fmt: skip
    table = table.swaplevel(0, 1, axis=1)
    methods = sorted(part["method"].unique(), key=method_rank)
    rank = {c: i for i, c in enumerate(CATEGORY_ORDER)}
    stored = set(zip(part["category"], part["attack"], part["attack_config"], strict=True))
    rows = sorted(stored, key=lambda r: (rank.get(r[0], len(rank)), r[0], natural_key(r[1]), natural_key(r[2])))
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
        attack_cell = "" if category == "Unaltered" else esc(attack)
        config_cell = "" if category == "Unaltered" else esc(config)
        lines.append(f"{label} & {attack_cell} & {config_cell} & " + " & ".join(cells) + r" \\")
        previous = category
    return _tex(lines, caption, "lll" + "c" * len(methods) * len(metrics))


def fpr_tpr(df: pd.DataFrame) -> pd.DataFrame:
    """tab:fpr_tpr: each method's main configuration, unaltered: TPR at 0.1/1/5/10% FPR (empirical thresholds from
    the human texts; ``negatives`` says how many: 0.1% of 200 rests on no text at all)."""
    part = _main(df)
    part = part[part["category"] == "Unaltered"]
    if part.empty:
        return pd.DataFrame()
    part = _mean(part, ["method", "method_config"], [*TPRS, "n_neg"])
    part = part.sort_values("method", key=lambda s: s.map(method_rank)).rename(columns={"n_neg": "negatives"})
    return part.set_index("method")


def tpr_tex(table: pd.DataFrame, caption: str, label_column: str, columns: list[str]) -> str:
    lines = [f"{esc(label_column)} & " + " & ".join(esc(c) for c in columns) + r" \\", r"\midrule"]
    for name, row in table.iterrows():
        cells = [fmt("AUC" if c == "AUC" else "TPR", row[c]) for c in columns]
        lines.append(f"{esc(name)} & " + " & ".join(cells) + r" \\")
    return _tex(lines, caption, "l" + "c" * len(columns))


def dipper(df: pd.DataFrame, ci: bool = False) -> pd.DataFrame:
    """tab:dipper: AUC of each method's main configuration under each DIPPER setting, with how much the paraphraser
    rewrote (mean unigram overlap with the original) and kept (mean MiniLM cosine)."""
    part = _main(df)
    part = part[part["attack_name"] == "dipper"]
    if part.empty:
        return pd.DataFrame()
    values = ["AUC", "overlap", "cosine"] + (["AUC_lo", "AUC_hi"] if ci else [])
    part = _mean(part, ["method", "attack_config"], values)
    table = part.pivot_table(index="method", columns="attack_config", values=values, aggfunc="first")
    table = table.swaplevel(0, 1, axis=1)
    configs = sorted(part["attack_config"].unique(), key=natural_key)
    methods = sorted(part["method"].unique(), key=method_rank)
    return table.reindex(index=methods, columns=pd.MultiIndex.from_product([configs, values]))


def dipper_tex(table: pd.DataFrame, caption: str) -> str:
    configs = list(dict.fromkeys(table.columns.get_level_values(0)))
    lines = ["Watermark method & " + " & ".join(f"DIPPER ({esc(c)})" for c in configs) + r" \\", r"\midrule"]
    for method, row in table.iterrows():
        lines.append(f"{esc(method)} & " + " & ".join(fmt("AUC", row[(c, "AUC")]) for c in configs) + r" \\")
    return _tex(lines, caption, "l" + "c" * len(configs))


def ft_steps(df: pd.DataFrame) -> pd.DataFrame:
    """tab:ft_steps: PRO under each fine-tuning dataset and step, with its difference to the best other method (the
    one with the highest mean AUC over that dataset's steps) in AUC, TPR@1% and TPR@10%."""
    part = _main(df)
    part = part[part["category"] == "Finetuning"]
    if part.empty:
        return pd.DataFrame()
    values = ["AUC", "TPR@1%", "TPR@10%"]
    part = _mean(part, ["method", "attack", "attack_config"], values)
    rows = []
    for dataset, d in part.groupby("attack", sort=True):
        others = d[d["method"] != FT_STEPS_METHOD]
        best = None
        if len(others):
            means = others.groupby("method")["AUC"].mean()
            best = sorted(means.index, key=lambda m: (-means[m], method_rank(m)))[0]
        for step in sorted(d["attack_config"].unique(), key=natural_key):
            ours = d[(d["method"] == FT_STEPS_METHOD) & (d["attack_config"] == step)]
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
    lines = [r"Dataset & Step & AUC & TPR@1\% & TPR@10\% & Baseline \\", r"\midrule"]
    for (dataset, step), row in table.iterrows():
        cells = []
        for v in ("AUC", "TPR@1%", "TPR@10%"):
            diff = row[f"{v} vs baseline"]
            extra = "" if pd.isna(diff) else f" ({diff:+.3f})"
            cells.append(fmt("AUC" if v == "AUC" else "TPR", row[v]) + extra)
        lines.append(f"{esc(dataset)} & {esc(step)} & " + " & ".join(cells) + f" & {esc(row['baseline'])}" + r" \\")
    return _tex(lines, caption, "llcccl")


def _one_setting(df: pd.DataFrame, method: str, settings: tuple[str, ...]) -> pd.DataFrame:
    """Runs of ``method`` whose configuration is its main one or differs from it in one of ``settings`` alone."""
    part = df[df["method"] == method]
    return part[_only(part, settings)] if len(part) else part


def _value(params: str, key: str):
    return json.loads(params).get(key)


def ablation(df: pd.DataFrame) -> pd.DataFrame:
    """tab:ablation-horizontal: PRO with alpha varied (beta as the preset's) and with beta varied (alpha as the
    preset's): AUC and PPL of the unaltered model, AUC after SLERP with the base at t = 0.5."""
    method, settings = ABLATION
    part = _one_setting(df, method, settings)
    if part.empty:
        return pd.DataFrame()
    rows = []
    for setting in settings:
        chosen = part[_only(part, (setting,))]
        values = sorted({_value(p, setting) for p in chosen["params"]})
        for value in values:
            runs = chosen[chosen["params"].map(lambda p, s=setting, v=value: _value(p, s) == v)]
            unaltered = runs[runs["category"] == "Unaltered"]
            merged = runs[(runs["attack_name"] == "slerp") & runs["attack_params"].map(lambda p: _value(p, "t") == 0.5)]
            rows.append(
                {
                    "setting": setting,
                    "value": value,
                    "AUC": unaltered["AUC"].mean() if len(unaltered) else float("nan"),
                    "PPL": unaltered["PPL"].mean() if len(unaltered) else float("nan"),
                    "Merge AUC": merged["AUC"].mean() if len(merged) else float("nan"),
                    "main": bool(runs["main"].any()),
                }
            )
    return pd.DataFrame(rows).set_index(["setting", "value"])


def ablation_tex(table: pd.DataFrame, caption: str) -> str:
    blocks = []
    for setting in dict.fromkeys(table.index.get_level_values(0)):
        part = table.loc[setting]
        head = [f"$\\{setting}$" if setting in ("alpha", "beta") else esc(setting)]
        head += [f"\\textbf{{{v:g}}}" if row["main"] else f"{v:g}" for v, row in part.iterrows()]
        blocks.append(" & ".join(head) + r" \\")
        blocks.append(r"\midrule")
        for metric in ("AUC", "PPL", "Merge AUC"):
            cells = [fmt("PPL" if metric == "PPL" else "AUC", row[metric]) for _, row in part.iterrows()]
            blocks.append(f"{metric} & " + " & ".join(cells) + r" \\")
        blocks.append(r"\midrule")
    width = max((len(table.loc[s]) for s in dict.fromkeys(table.index.get_level_values(0))), default=0)
    return _tex(blocks[:-1], caption, "l" + "c" * width)


def embedding(df: pd.DataFrame) -> pd.DataFrame:
    """tab:embedding: PRO (unaltered) with each sentence encoder E: AUC, TPR@1%, TPR@10%."""
    method, settings = EMBEDDING
    part = _one_setting(df, method, settings)
    part = part[part["category"] == "Unaltered"]
    if part.empty:
        return pd.DataFrame()
    part = part.assign(embedding_model=part["params"].map(lambda p: _value(p, settings[0])))
    return (
        _mean(part, ["embedding_model"], ["AUC", "TPR@1%", "TPR@10%"])
        .sort_values("embedding_model")
        .set_index("embedding_model")
    )


def watermark_config(df: pd.DataFrame) -> pd.DataFrame:
    """tab:watermark-config with its results (the points of the AUC-PPL figure): each method's configurations that
    differ from its main one only in the settings the paper varies (``tradeoff_settings``), unaltered."""
    part = df[df["category"] == "Unaltered"]
    keep = [
        only(n, json.loads(p), json.loads(d), _tradeoff_settings(n))
        for n, p, d in zip(part["method_name"], part["params"], part["preset_method"], strict=True)
    ]
    part = part[keep]
    if part.empty:
        return pd.DataFrame()
    part = _mean(part, ["method", "method_config", "main"], ["AUC", "TPR@5", "PPL"])
    order = sorted(range(len(part)), key=lambda i: (method_rank(part["method"].iloc[i]),
                                                    natural_key(part["method_config"].iloc[i])))  # fmt: skip
    return part.iloc[order].set_index(["method", "method_config"])


@cache
def _tradeoff_settings(name: str | None) -> tuple[str, ...]:
    """The settings method ``name`` varies for tab:watermark-config (``WatermarkMethod.tradeoff_settings``)."""
    from harness.config.registry import methods

    try:
        return tuple(methods.load(name).tradeoff_settings) if name else ()
    except HarnessError:
        return ()


def simple_tex(table: pd.DataFrame, caption: str, index_names: list[str]) -> str:
    columns = [c for c in table.columns if c != "main"]
    lines = [" & ".join(esc(n) for n in [*index_names, *columns]) + r" \\", r"\midrule"]
    for key, row in table.iterrows():
        keys = key if isinstance(key, tuple) else (key,)
        cells = [fmt("PPL" if c == "PPL" else "AUC" if c == "AUC" else "TPR", row[c]) for c in columns]
        lines.append(" & ".join([*(esc(k) for k in keys), *cells]) + r" \\")
    return _tex(lines, caption, "l" * len(index_names) + "c" * len(columns))


def collect_attribution(store: Store) -> pd.DataFrame:
    """One row per stored attribution stage: detector (method, configuration), whose texts, share flagged."""
    rows = []
    for done in sorted((store.root / "stages" / "attribution").glob("*/DONE")):
        folder = done.parent
        try:
            stage = Stage("attribution", {}, folder.name, folder, store.root)
            problem = stage.problem()
            if problem is not None:
                log.warning("skipping attribution %s: %s", folder, problem)
                continue
            spec = json.loads((folder / "spec.json").read_text())
            m = json.loads((folder / "metrics.json").read_text())
            labels = spec["labels"]
            rows.append(
                {
                    "preset": spec["preset"],
                    "setup": setup_key(spec["preset_settings"]),
                    "detector": f"{labels['detector']['method']} ({labels['detector']['config']})",
                    "texts": labels["source"]["label"],
                    **{k: m.get(v) for k, v in TPRS.items()},
                    "AUC": m.get("auc"),
                }
            )
        except (HarnessError, OSError, ValueError, KeyError, TypeError) as err:
            log.warning("skipping attribution %s: %s", folder, f"{type(err).__name__}: {err}")
    return pd.DataFrame(rows)


def attribution(df: pd.DataFrame) -> pd.DataFrame:
    """Share of each model's texts (columns) that each detector (rows) flags at its 1% FPR threshold on human
    texts: off the diagonal a false positive rate, on it the detector's own TPR."""
    if df.empty:
        return df
    table = df.pivot_table(index="detector", columns="texts", values="TPR@1%", aggfunc="first", dropna=False)
    sources = sorted(table.columns, key=lambda c: (c != "Unwatermarked base", method_rank(c.split(" (")[0]), c))
    detectors = sorted(table.index, key=lambda c: (method_rank(c.split(" (")[0]), c))
    return table.reindex(index=detectors, columns=sources)


# --- writing ----------------------------------------------------------------------------------------------------
def write_tables(
    df: pd.DataFrame, out_dir: Path, ci: bool = False, attributions: pd.DataFrame | None = None
) -> list[Path]:
    """Write every table of every setup (``<out>/<setup>/<table>.csv`` and ``.tex``) plus ``runs.csv`` (every run's
    labels and metrics); return the paths written."""
    if df.empty:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "runs.csv"]
    _csv(df.set_index("run"), written[0])
    for name, part in setups(df).items():
        folder = out_dir / name
        folder.mkdir(exist_ok=True)
        mine = None
        if attributions is not None and len(attributions):
            mine = attributions[attributions["setup"] == part["setup"].iloc[0]]
        for table_name, (table, tex) in setup_tables(part, ci, mine).items():
            csv = folder / f"{table_name}.csv"
            _csv(table, csv)
            (folder / f"{table_name}.tex").write_text(tex)
            written += [csv, folder / f"{table_name}.tex"]
    return written


def setup_tables(part: pd.DataFrame, ci: bool, attributions: pd.DataFrame | None) -> dict[str, tuple]:
    """``{file name: (table, LaTeX)}`` of one setup's runs; tables with no stored run are left out."""
    base = part["base_model"].iloc[0]
    seeds = sorted(part["seed"].unique())
    about = f"{base}, preset {part['preset'].iloc[0]}"
    if len(seeds) > 1:
        about += f", mean over seeds {', '.join(map(str, seeds))}"
    mains = sorted({(r.method, r.method_config) for r in _main(part).itertuples()}, key=lambda mc: method_rank(mc[0]))
    configs = "; ".join(f"{m}: {c}" for m, c in mains)
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
    add("dipper", dipper(part, ci), dipper_tex, f"AUC under DIPPER paraphrasing ({about}).")
    add(
        "ft_steps",
        ft_steps(part),
        ft_steps_tex,
        f"{FT_STEPS_METHOD} under fine-tuning steps s, with its difference to the best other method ({about}).",
    )
    add(
        "ablation",
        ablation(part),
        ablation_tex,
        f"Ablation of PRO's alpha and beta: AUC and PPL unaltered, AUC after SLERP t = 0.5 ({about}).",
    )
    add(
        "embedding",
        embedding(part),
        simple_tex,
        f"PRO under different embedding models ({about}).",
        ["Embedding model"],
    )
    add(
        "watermark_config",
        watermark_config(part),
        simple_tex,
        f"Watermark configurations and their detection and quality ({about}).",
        ["Method", "Config"],
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
