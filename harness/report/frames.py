"""The frames of the paper's tables, built from stored runs only (``collect.collect``; no model is loaded): one
function per table, its rows and columns. ``harness.report.tables`` declares which of them each setup gets, with
their captions, and writes them; ``harness.report.latex`` and ``harness.report.html`` render them.
"""

from __future__ import annotations

import json
import logging

import pandas as pd

from harness.cell import metrics
from harness.cell.scoring import BASE_ROW
from harness.config.errors import HarnessError
from harness.config.gate import DEGENERATE, OK, UNKNOWN
from harness.contract.plugin import Ablation, SettingTable
from harness.report.collect import (
    DOCUMENTS,
    METRICS,
    MISSING,
    NOT_APPLICABLE,
    PLAIN_DECODING,
    TPRS,
    base_rows,
    category_rank,
    decoding_time_methods,
    documents_runs,
    edits_weights,
    in_table,
    main_runs,
    mean_over_seeds,
    method_rank,
    natural_key,
    only_mask,
    paired_scores,
    param,
    plugin_class,
    prompts_runs,
    scores,
    spread_over_seeds,
    tradeoff_settings,
    unaltered,
    use_labels,
)
from harness.store.stages import Store

log = logging.getLogger(__name__)

ROW_KEYS = ["category", "attack", "attack_config"]  # what a row of tab:robustness is
UNALTERED_TEXTS = "unaltered"  # an attack's own table: the column of the texts before it rewrote them
COMPARISON_DRAWS = 1000  # tab:comparison's bootstrap draws (as the per-run AUC intervals: ``detection_metrics``)


def robustness(df: pd.DataFrame, ci: bool = False, every_row: bool = False) -> pd.DataFrame:
    """tab:robustness: rows are the model modifications (category, attack, setting) of the attacks that join it,
    columns each method's main configuration x (AUC, TPR@5, PPL, PPL_ratio, AUC_vs_base[, AUC_lo, AUC_hi], quality):
    ``PPL_ratio`` its median PPL over the unwatermarked base's, ``AUC_vs_base`` its texts against the base's texts
    rather than human ones (``collect.against_base``), ``quality`` the gate's verdict (``ok``, ``degenerate`` where a
    row's texts no longer count as writing, ``unknown`` where the stored run cannot tell). With ``every_row`` (the
    report's page, where every stored cell belongs) every row stored for a main configuration: the other tables'
    attacks and the unwatermarked base model's reference rows too. Where ``df`` holds several training seeds, each
    cell is the mean over its seeds, with ``seeds``, ``AUC_seed_lo`` and ``AUC_seed_hi`` (the t-interval over seeds,
    ``spread_over_seeds``) beside the text-sampling interval, and the worst verdict of its seeds."""
    metrics = list(METRICS) + ["PPL_ratio", "AUC_vs_base"] + (["AUC_lo", "AUC_hi"] if ci else [])
    part = robustness_runs(df, every_row)
    if part.empty:
        return pd.DataFrame()
    runs = part
    part = on_one_footing(part)
    verdicts = {key: worst_quality(cell["quality"]) for key, cell in part.groupby(["method", *ROW_KEYS], sort=False)}
    if df["seed"].nunique() > 1:  # several training seeds: their number and spread beside each mean
        part = spread_over_seeds(part, ["method", *ROW_KEYS], metrics, ["AUC"])
        metrics += ["seeds", "AUC_seed_lo", "AUC_seed_hi"]
    else:
        part = mean_over_seeds(part, ["method", *ROW_KEYS], metrics)
    part = part.assign(
        quality=[verdicts[key] for key in part[["method", *ROW_KEYS]].itertuples(index=False, name=None)]
    )
    metrics += ["quality"]
    table = part.pivot_table(index=ROW_KEYS, columns="method", values=metrics, aggfunc="first", dropna=False)
    table = table.swaplevel(0, 1, axis=1)
    methods = sorted(part["method"].unique(), key=method_rank)
    stored = set(part[ROW_KEYS].itertuples(index=False, name=None))
    rows = sorted(stored, key=lambda r: (category_rank(r[0]), natural_key(r[1]), natural_key(r[2])))
    table = table.reindex(
        index=pd.MultiIndex.from_tuples(rows, names=table.index.names),
        columns=pd.MultiIndex.from_product([methods, metrics], names=["method", "metric"]),
    )
    return _not_applicable(table, runs)


def worst_quality(verdicts) -> str:
    """The gate's word for a cell of several runs (seeds): degenerate where any is, else unknown where any is."""
    words = {str(v).split(":", 1)[0] for v in verdicts}
    return next((w for w in (DEGENERATE, UNKNOWN) if w in words), OK)


DECODING_METRICS = ["AUC", "AUC_lo", "AUC_hi", "TPR@1%", "PPL"]


def decoding(df: pd.DataFrame, store: Store | None = None) -> pd.DataFrame:
    """The decoding table: each row of tab:robustness, the unwatermarked base's included, stored at another decoding
    than plain sampling at temperature 1 (``decoding``), beside the same row at plain sampling; a row per (decoding,
    category, attack, setting), plain sampling first, and per method's main configuration its AUC with its bootstrap
    interval, TPR at 1% FPR (on the base's row: the share of its texts flagged, the false-positive rate a decoding
    leaves) and median PPL (mean over seeds where several). With the runs' ``store``, also ``dAUC`` and its interval:
    the change from plain sampling, a paired bootstrap over prompts (the same prompts and human texts: only the
    generated texts differ) as in tab:comparison, over the training seeds both hold. Empty where every run sampled
    plainly."""
    df = documents_runs(df)  # (another decoding of other prompts: a row of the prompts table)
    if "decoding" not in df or (df["decoding"] == "").all():
        return pd.DataFrame()
    compare = None if store is None else lambda a, b: metrics.paired_bootstrap(
        *paired_scores(store, a, b)[0], bootstrap=COMPARISON_DRAWS)  # fmt: skip
    return _beside(main_runs(df), "decoding", PLAIN_DECODING, DECODING_METRICS, compare,
                   "decoding table, %s at %s: not compared with plain sampling: %s")  # fmt: skip


PROMPTS_METRICS = ["AUC", "AUC_lo", "AUC_hi", "TPR@1%", "tokens_to_detect", "PPL"]


def prompts(df: pd.DataFrame, store: Store | None = None) -> pd.DataFrame:
    """The prompts table: each row of tab:robustness, the unwatermarked base's included, stored with other prompts
    than the preset's documents (code, chat instructions; at the decoding named after them where not plain sampling),
    beside the same row on the documents; a row per (prompts, category, attack, setting), the documents first, and per
    method's main configuration its AUC with its bootstrap interval, TPR at 1% FPR (on the base's row: the share of
    its texts flagged), tokens to detect and median PPL (mean over seeds where several). With the runs' ``store``,
    also ``dAUC`` and its interval: the change from the documents, a bootstrap of each run on its own
    (``metrics.independent_bootstrap``: other prompts, other human texts, nothing to pair). Empty where every run
    continued the documents."""
    if "prompts" not in df or (df["prompts"] == "").all():
        return pd.DataFrame()
    part = prompts_runs(main_runs(df))
    part = part.assign(prompts=use_labels(part))  # (other prompts named with their decoding where one is set)
    compare = None if store is None else lambda a, b: metrics.independent_bootstrap(
        [_pos_neg(store, r) for r in a], [_pos_neg(store, r) for r in b], bootstrap=COMPARISON_DRAWS)  # fmt: skip
    return _beside(part, "prompts", DOCUMENTS, PROMPTS_METRICS, compare,
                   "prompts table, %s with %s: not compared with the documents: %s")  # fmt: skip


def _beside(part: pd.DataFrame, column: str, plain: str, values: list[str], compare, warning: str) -> pd.DataFrame:
    """The rows of tab:robustness that ``part`` holds with another ``column`` than "" (a decoding, other prompts),
    beside the same rows at "" (named ``plain``): a row per (``column``, category, attack, setting), ``plain``
    first, and per method ``values`` (means over seeds). With ``compare`` (``(runs, plain runs) -> {"auc_diff",
    "auc_diff_ci95"}``, one run per seed both hold), ``dAUC`` and its interval beside them."""
    asked = set(part[part[column] != ""][ROW_KEYS].itertuples(index=False, name=None))
    part = part[[row in asked for row in part[ROW_KEYS].itertuples(index=False, name=None)]]
    part = on_one_footing(part).assign(**{column: lambda d: d[column].replace("", plain)})
    keys = [column, *ROW_KEYS]
    values = list(values)
    means = mean_over_seeds(part, ["method", *keys], values)
    if compare is not None:
        means = means.merge(_changes(part, keys, plain, compare, warning), on=["method", *keys], how="left")
        values += ["dAUC", "dAUC_lo", "dAUC_hi"]
    methods = sorted(means["method"].unique(), key=method_rank)
    table = means.pivot_table(index=keys, columns="method", values=values, aggfunc="first", dropna=False)
    table.columns = [f"{method} {metric}" for metric, method in table.columns]
    rows = sorted(set(means[keys].itertuples(index=False, name=None)),
                  key=lambda r: (r[0] != plain, natural_key(r[0]), category_rank(r[1]), natural_key(r[2]),
                                 natural_key(r[3])))  # fmt: skip
    columns = [f"{m} {metric}" for m in methods for metric in values]
    return table.reindex(index=pd.MultiIndex.from_tuples(rows, names=keys), columns=columns)


def _changes(part: pd.DataFrame, keys: list[str], plain: str, compare, warning: str) -> pd.DataFrame:
    """``dAUC`` = AUC at each ``keys[0]`` - AUC at ``plain`` of the same method and row, with its 95% interval
    (``compare``), over the seeds both hold; missing where a pair is not comparable (``warning`` says why)."""
    runs = {(r.method, getattr(r, keys[0]), r.category, r.attack, r.attack_config, r.seed): r.run
            for r in part.itertuples()}  # fmt: skip
    out = []
    for (method, *key), cell in part.groupby(["method", *keys], sort=False):
        if key[0] == plain:
            continue
        seeds = sorted(s for s in cell["seed"] if (method, plain, *key[1:], s) in runs)
        try:
            if not seeds:
                raise ValueError(f"no run at {plain} of the same seed")
            found = compare([runs[(method, *key, s)] for s in seeds], [runs[(method, plain, *key[1:], s)]
                                                                       for s in seeds])  # fmt: skip
        except (ValueError, OSError, KeyError) as err:
            log.warning(warning, method, key[0], err)
            continue
        out.append({"method": method, **dict(zip(keys, key, strict=True)), "dAUC": found["auc_diff"],
                    "dAUC_lo": found["auc_diff_ci95"][0], "dAUC_hi": found["auc_diff_ci95"][1]})  # fmt: skip
    return pd.DataFrame(out, columns=["method", *keys, "dAUC", "dAUC_lo", "dAUC_hi"])


def _pos_neg(store: Store, run: str) -> tuple[list[float], list[float]]:
    """A run's stored scores of its generated and of its human texts."""
    rows = scores(store, run)
    return [s["score"] for s in rows if s["label"] == 1], [s["score"] for s in rows if s["label"] == 0]


def robustness_runs(df: pd.DataFrame, every_row: bool = False) -> pd.DataFrame:
    """The runs of tab:robustness (``robustness``)."""
    part = main_runs(df)
    return part if every_row else part[in_table(part, "robustness")]


def mixed_footings(part: pd.DataFrame) -> bool:
    """Whether ``part``'s PPLs were measured on more than one footing (``PPL_on``: a text attack's rows, measured on
    their text tokenized again, beside rows measured on the ids their model sampled)."""
    return part["PPL_on"].nunique(dropna=True) > 1


def on_one_footing(part: pd.DataFrame) -> pd.DataFrame:
    """``part`` with its PPLs on one footing: where they mix two (``mixed_footings``), every row's PPL on its text
    tokenized again (``PPL_retokenized``; missing for a run scored before it was stored): the same text measured on
    the ids a model sampled reads otherwise, as a sampled sequence is often not the tokenizer's own split of it."""
    return part.assign(PPL=pd.to_numeric(part["PPL_retokenized"])) if mixed_footings(part) else part


def ppl_note(df: pd.DataFrame, every_row: bool = False) -> str:
    """What tab:robustness's caption says of its PPL where its rows mix footings (``on_one_footing``); else nothing."""
    if not mixed_footings(robustness_runs(df, every_row)):
        return ""
    return " (of each row's texts tokenized again, as a text attack's rows are measured)"


def comparison(df: pd.DataFrame, store: Store, unranked: dict[str, str] | None = None) -> pd.DataFrame:
    """tab:comparison: for every row of tab:robustness (``ROW_KEYS``) and every pair of methods with runs in it (A
    before B in the tables' order), ``AUC_A - AUC_B`` and ``TPR@1%_A - TPR@1%_B`` with the 95% interval of a paired
    bootstrap over prompts (``metrics.paired_bootstrap``: the same prompts drawn for both methods) and whether it
    excludes zero; and ``dAUC_vs_base``, the same difference with each method's texts read against the base's own
    texts of the same prompts under its detector (its base row) instead of the human texts: the model-versus-model
    column, which isolates the watermark from "model versus human". Pairs are made of the runs' shared training seeds;
    with several, the difference is the mean over seeds, its paired interval resamples prompts once for every seed
    (the text-sampling interval of that mean), and ``*_seed_lo``, ``*_seed_hi`` are the 95% t-interval of the
    per-seed differences (``metrics.seed_interval``; a two-level bootstrap over three seeds has ten distinct seed
    draws, too few for a percentile interval). ``*_excludes_0``: every interval shown excludes zero, on the same side.
    Scores are read from the store (``collect.paired_scores``), which verifies that both runs scored the same prompts
    and human texts; a pair that is not comparable keeps its row with no numbers and the reason in ``note``, and so
    does a pair with a row outside the quality gate (``collect.against_base``): degenerate text is never ranked.
    ``unranked``: method -> why none of its pairs is ordered (at matched quality, a method outside the budget)."""
    part = robustness_runs(df)
    if part.empty:
        return pd.DataFrame()
    several = df["seed"].nunique() > 1
    bases = {(r.method, r.params, r.seed): r.run for r in df[base_rows(df)].itertuples()}
    rows = []
    for row, cell in part.groupby(ROW_KEYS, sort=False):
        methods = sorted(cell["method"].unique(), key=method_rank)
        for i, a in enumerate(methods):
            for b in methods[i + 1 :]:
                out = {**dict(zip(["category", "attack", "setting"], row, strict=True)), "A": a, "B": b}
                rows.append(out | _compared(store, cell, bases, a, b, several, df["seed"].nunique(), unranked or {}))
    if not rows:
        return pd.DataFrame()
    order = sorted(range(len(rows)), key=lambda k: (category_rank(rows[k]["category"]), natural_key(rows[k]["attack"]),
                                                   natural_key(rows[k]["setting"]), method_rank(rows[k]["A"]),
                                                   method_rank(rows[k]["B"])))  # fmt: skip
    columns = ["seeds"]
    for name in COMPARED:
        columns += [f"d{name}", f"d{name}_lo", f"d{name}_hi"]
        columns += [f"d{name}_seed_lo", f"d{name}_seed_hi"] if several else []
        columns += [f"{name}_excludes_0"]
    table = pd.DataFrame([rows[k] for k in order]).set_index(["category", "attack", "setting", "A", "B"])
    return table.reindex(columns=[*columns, "paired_on", "note"])


COMPARED = ("AUC", "TPR@1%", "AUC_vs_base")  # tab:comparison's differences (``comparison``)


def _compared(
    store: Store,
    cell: pd.DataFrame,
    bases: dict,
    a: str,
    b: str,
    several: bool,
    stored_seeds: int,
    unranked: dict[str, str],
) -> dict:
    """One row of ``comparison``: methods ``a`` and ``b`` in ``cell`` (one row of tab:robustness, its runs);
    ``bases``: the base rows' runs by (method, settings, seed); ``unranked``: as ``comparison``'s."""
    runs = {(r.method, r.seed): r for r in cell.itertuples()}
    seeds = sorted({s for m, s in runs if m == a} & {s for m, s in runs if m == b})
    out: dict = {"seeds": len(seeds), "paired_on": "", "note": ""}
    failed = [f"{r.method} (seed {r.seed}) {r.quality}" for (m, s), r in sorted(runs.items())
              if m in (a, b) and s in seeds and str(r.quality).startswith(DEGENERATE)]  # fmt: skip
    failed = [f"{m} {unranked[m]}" for m in (a, b) if unranked.get(m)] or failed  # (a budget's reason first and alone)
    if failed:  # texts that no longer count as writing, or a method outside its budget: named, never ordered
        out["note"] = "not ranked: " + "; ".join(failed)
        return out
    try:
        if not seeds:
            raise ValueError(f"no training seed stored for both ({a}: {_seeds(runs, a)}; {b}: {_seeds(runs, b)})")
        mine = {m: [runs[(m, s)].run for s in seeds] for m in (a, b)}
        scores, out["paired_on"] = paired_scores(store, mine[a], mine[b])
        found = {"": metrics.paired_bootstrap(*scores, bootstrap=COMPARISON_DRAWS)}
    except (ValueError, OSError, KeyError) as err:
        out["note"] = f"not compared: {err}"
        where = " ".join(cell.iloc[0][["attack", "attack_config"]]).strip() or "unaltered"
        log.warning("tab:comparison, %s vs %s (%s): %s", a, b, where, out["note"])
        return out
    try:  # the same difference against each method's base row (its detector on the base's texts of these prompts)
        base = {m: [bases[(m, runs[(m, s)].params, s)] for s in seeds] for m in (a, b)}
        pos_a, _, base_a, _ = paired_scores(store, mine[a], base[a])[0]
        pos_b, _, base_b, _ = paired_scores(store, mine[b], base[b])[0]
        found["_vs_base"] = metrics.paired_bootstrap(pos_a, base_a, pos_b, base_b, bootstrap=COMPARISON_DRAWS)
    except (ValueError, OSError, KeyError):
        pass  # no base row stored for every seed: that column stays empty
    for name in COMPARED:
        key, column = ("tpr", "") if name == "TPR@1%" else ("auc", name.removeprefix("AUC"))
        if column not in found:
            continue
        diff, bounds = found[column][f"{key}_diff"], found[column][f"{key}_diff_ci95"]
        out |= dict(zip([f"d{name}", f"d{name}_lo", f"d{name}_hi"], [diff, *bounds], strict=True))
        if several:
            out[f"d{name}_seed_lo"], out[f"d{name}_seed_hi"] = metrics.seed_interval(
                found[column][f"{key}_diff_per_seed"])  # fmt: skip
            bounds = [*bounds, out[f"d{name}_seed_lo"], out[f"d{name}_seed_hi"]]
        shown = [v for v in bounds if v == v]  # (the seed interval of a single seed is missing)
        out[f"{name}_excludes_0"] = all(v > 0 for v in shown) or all(v < 0 for v in shown)
    if len(seeds) < stored_seeds:
        out["note"] = f"seeds {', '.join(map(str, seeds))} only"
    return out


def _seeds(runs: dict, method: str) -> str:
    return ", ".join(str(s) for m, s in sorted(runs) if m == method) or "no run"


def _not_applicable(table: pd.DataFrame, part: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``NOT_APPLICABLE`` in the cells of decoding-time methods (a watermark not in the weights) under
    the rows of attacks that change the weights: no such run can exist, so the cell says why it is empty rather than
    that a run is missing."""
    decoding = decoding_time_methods(part)
    if not decoding:
        return table
    model_rows = {(r.category, r.attack, r.attack_config) for r in part.drop_duplicates(ROW_KEYS).itertuples()
                  if edits_weights(r.attack_name, r.attack_params)}  # fmt: skip
    rows = [row for row in table.index if row in model_rows]
    for column in [c for c in table.columns if c[0] in decoding]:
        table[column] = table[column].astype(object)
        table.loc[rows, column] = NOT_APPLICABLE
    return table


def fpr_tpr(df: pd.DataFrame) -> pd.DataFrame:
    """tab:fpr_tpr: each method's main configuration, unaltered: TPR at 0.1/1/5/10% FPR (empirical thresholds from
    the human texts; ``negatives`` says how many: 0.1% of 200 rests on no text at all). With several training seeds,
    the mean over seeds, their number and each TPR's t-interval over seeds (``<TPR>_seed_lo``, ``<TPR>_seed_hi``)."""
    part = main_runs(df)
    part = part[unaltered(part)]
    if part.empty:
        return pd.DataFrame()
    if df["seed"].nunique() > 1:  # several training seeds: each TPR's t-interval over them (``spread_over_seeds``)
        part = spread_over_seeds(part, ["method", "method_config"], [*TPRS, "n_neg"], list(TPRS))
    else:
        part = mean_over_seeds(part, ["method", "method_config"], [*TPRS, "n_neg"])
    part = part.sort_values("method", key=lambda s: s.map(method_rank)).rename(columns={"n_neg": "negatives"})
    return part.set_index("method")


def own(df: pd.DataFrame, attack: str, ci: bool = False) -> pd.DataFrame:
    """The table of one attack of its own (tab:dipper for DIPPER): AUC of each method's main configuration under
    each of its settings, with the rewrites' median PPL, how much the texts were rewritten (mean unigram overlap with
    the original) and kept (mean MiniLM cosine), and for an edit the rate it applied (``edit_rate``: below its ``p``
    where, say, few words have a synonym); first, the PPL of the texts before the attack, on the rewrites' footing
    (their text tokenized again: ``on_one_footing``)."""
    mains = main_runs(df)
    part = mains[mains["attack_name"] == attack]
    if part.empty:
        return pd.DataFrame()
    values = ["AUC", "PPL", "overlap", "cosine"] + (["edit_rate"] if part["edit_rate"].notna().any() else [])
    values += ["AUC_lo", "AUC_hi"] if ci else []
    part = mean_over_seeds(part, ["method", "attack_config"], values)
    table = part.pivot_table(index="method", columns="attack_config", values=values, aggfunc="first")
    table = table.swaplevel(0, 1, axis=1)
    configs = sorted(part["attack_config"].unique(), key=natural_key)
    methods = sorted(part["method"].unique(), key=method_rank)
    table = table.reindex(index=methods, columns=pd.MultiIndex.from_product([configs, values]))
    # The unaltered texts' PPL measured as the rewrites' is (tokenized again): what each setting's PPL compares with.
    before = mains[unaltered(mains)].assign(PPL=lambda d: pd.to_numeric(d["PPL_retokenized"]))
    before = mean_over_seeds(before, ["method"], ["PPL"]).set_index("method")["PPL"]
    table.insert(0, (UNALTERED_TEXTS, "PPL"), before.reindex(methods).to_numpy())
    return table


CURVE_METRICS = ["AUC", "AUC_lo", "AUC_hi", "TPR@1%", "tokens_to_detect", "PPL"]


def curve(df: pd.DataFrame, attack: str) -> pd.DataFrame:
    """The table of a swept attack of its own (the distillation table for ``distill``): a row per setting of
    ``attack`` (its N teacher texts), the unaltered model first, and per method's main configuration its AUC with its
    bootstrap interval, TPR at 1% FPR, tokens to detect and median PPL (means over seeds where several)."""
    mains = main_runs(df)
    part = mains[mains["attack_name"] == attack]
    if part.empty:
        return pd.DataFrame()
    before = mains[unaltered(mains) & mains["method"].isin(part["method"])].assign(attack_config=UNALTERED_TEXTS)
    # Against the same modification of the unwatermarked base, where the attack makes one (``Attack.controlled``).
    values = CURVE_METRICS + (["AUC_vs_control"] if part.get("AUC_vs_control", pd.Series()).notna().any() else [])
    return per_setting(before, UNALTERED_TEXTS, part, values)


def per_setting(first: pd.DataFrame, label: str, part: pd.DataFrame, values: list[str]) -> pd.DataFrame:
    """A table of an attack of its own: a row per setting of the attack's runs ``part``, after the row ``label`` of
    the runs ``first`` (the unaltered model's, the base's own texts; left out where there are none), and per method
    each of ``values`` (means over seeds where several), the methods in the registry's order."""
    means = mean_over_seeds(pd.concat([first, part]), ["method", "attack_config"], values)
    table = means.pivot_table(index="attack_config", columns="method", values=values, aggfunc="first",
                              dropna=False)  # fmt: skip
    table.columns = [f"{method} {metric}" for metric, method in table.columns]
    rows = ([label] if len(first) else []) + sorted(set(part["attack_config"]), key=natural_key)
    methods = sorted(means["method"].unique(), key=method_rank)
    return table.reindex(index=pd.Index(rows, name="setting"),
                         columns=[f"{m} {metric}" for m in methods for metric in values])  # fmt: skip


def declared(df: pd.DataFrame, attack: str, spec: SettingTable) -> pd.DataFrame:
    """A table ``attack`` declares (``SettingTable``): a row per setting of its runs after ``spec.first``'s row, and
    per method's main configuration each of ``spec.values`` (means over seeds where several). A method's own column
    (``<method>.<field>``) is missing where the method's runs have none; any other name must be a column of the runs."""
    mains = main_runs(df)
    part = mains[mains["attack_name"] == attack]
    if part.empty:
        return pd.DataFrame()
    unknown = [v for v in spec.values if v not in part and "." not in v]
    if unknown:
        raise HarnessError(
            f"attack {attack}'s table '{spec.name}' names {unknown[0]!r}, which is no column of runs.csv (a metric "
            "such as AUC, TPR@1% or PPL_ratio, or a method's <method>.<field>)"
        )
    absent = {v: float("nan") for v in spec.values if v not in part}
    if spec.first == "unaltered":
        first, label = mains[unaltered(mains)], UNALTERED_TEXTS
    elif spec.first == "base":
        first, label = mains[base_rows(mains)], BASE_TEXTS
    else:
        first, label = mains.iloc[:0], ""
    first = first[first["method"].isin(part["method"])].assign(attack_config=label, **absent)
    return per_setting(first, label, part.assign(**absent), list(spec.values))


FLAGGED_METRICS = ["TPR@1%", "TPR@5%", "AUC", "AUC_vs_base"]
BASE_TEXTS = "the base's own texts"  # the flagged table's first row


def flagged(df: pd.DataFrame, attack: str) -> pd.DataFrame:
    """The table of an attack whose texts should not be flagged (spoofing: the base decoded toward a stolen
    estimate): a row per setting of ``attack``, the unwatermarked base's own texts first, and per method's main
    configuration the share flagged at 1% and 5% FPR (thresholds on the human texts), the AUC against human texts
    and against the base's own texts (means over seeds where several)."""
    mains = main_runs(df)
    part = mains[mains["attack_name"] == attack]
    if part.empty:
        return pd.DataFrame()
    base = mains[base_rows(mains) & mains["method"].isin(part["method"])].assign(attack_config=BASE_TEXTS)
    return per_setting(base, BASE_TEXTS, part, [v for v in FLAGGED_METRICS if v in part])


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


def attribution(df: pd.DataFrame) -> pd.DataFrame:
    """Share of each model's texts (columns) that each detector (rows) flags at its 1% FPR threshold on human
    texts: off the diagonal a false positive rate, on it the detector's own TPR."""
    if df.empty:
        return df
    table = df.pivot_table(index="detector", columns="texts", values="TPR@1%", aggfunc="first", dropna=False)
    sources = sorted(table.columns, key=lambda c: (c != BASE_ROW, method_rank(c.split(" (")[0]), c))
    detectors = sorted(table.index, key=lambda c: (method_rank(c.split(" (")[0]), c))
    return table.reindex(index=detectors, columns=sources)
