"""The stored runs as one frame, and what tables need to know of them: which setup a run belongs to, which runs are
a method's main configuration, and what the plugins declare (labels, order, table membership).

``collect`` reads each finished run's ``spec.json`` and ``metrics.json`` into one row. Runs are grouped into *setups*
(the preset with its base model, data and training and evaluation settings; seeds are averaged), and each setup gets
its own folder of tables: numbers are never carried over from another preset or base model. Within a setup, a method's
*main* configuration is the preset's own settings for it; the other configurations feed the tables that vary them.

Nothing here names a method or an attack: their order, table membership and captions come from the plugin classes
through the registry (``harness.contract.attack.Attack``, ``harness.contract.method.WatermarkMethod``). A run whose
plugin is not installed here keeps its stored labels and goes where a model attack goes (tab:robustness, after the
known row groups).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from harness.cell import metrics
from harness.cell.scoring import BASE_CATEGORY
from harness.config.errors import HarnessError
from harness.config.settings import decoding_label, documents_prompts, plain_sampling, prompts_label
from harness.store import kinds
from harness.store.files import read_jsonl
from harness.store.stages import Store

log = logging.getLogger(__name__)

METRICS = {"AUC": "auc", "TPR@5": "tpr@0.05", "PPL": "median_ppl"}
TPRS = {"TPR@0.1%": "tpr@0.001", "TPR@1%": "tpr@0.01", "TPR@5%": "tpr@0.05", "TPR@10%": "tpr@0.1"}
QUALITY = ["rep3", "distinct1", "distinct2"]  # harness.cell.quality
MISSING = "missing"
# A cell that cannot exist: a decoding-time watermark under an attack that changes the weights it is not in.
NOT_APPLICABLE = "n/a"
# Settings that are not part of a setup: seeds are averaged; plugin defaults only say which configuration is main; the
# quality gate judges rows, it does not make them.
NOT_SETUP = {"name", "notes", "methods", "attacks", "quality_gate"}


# --- reading the store ------------------------------------------------------------------------------------------
def collect(store: Store) -> pd.DataFrame:
    """One row per finished run that verifies (a damaged, edited or unreadable one is left out with one warning
    naming it); of runs with identical labels, the newest."""
    rows = []
    for run in store.runs():
        try:
            problem = store.at(kinds.RUN, run.name).problem()
            if problem is None:
                rows.append(_row(run))
        except HarnessError as err:  # edited after it was published
            problem = str(err)
        except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError) as err:
            problem = f"unreadable ({type(err).__name__}: {err})"
        if problem is not None:
            log.warning("skipping run %s: %s", run, problem)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    stale = df[df["metrics_version"] != metrics.METRICS_VERSION]
    if len(stale):
        log.warning("%d runs hold metrics of older metric code: 'harness rescore' updates them", len(stale))
    keys = [
        "setup",
        "seed",
        "method",
        "params",
        "prompts",
        "decoding",
        "category",
        "attack",
        "attack_params",
        "attack_config",
        "control",
    ]
    dupes = df.duplicated(keys, keep="last")
    if dupes.any():
        log.warning("%d older runs with the same labels are left out (newest kept)", int(dupes.sum()))
    df = df[~dupes].reset_index(drop=True)
    df["main"] = _one_main_configuration(df)
    df["main_method"] = _main_settings(df)
    df = against_base(df, store)
    df["calibrated"], df["over_budget"] = calibrated(df, store)
    df = plugin_columns(df, store)
    order = ["setup", "method", "method_config", "category", "attack", "prompts", "decoding", "run"]
    return df.sort_values(order).reset_index(drop=True)


def plugin_columns(df: pd.DataFrame, store: Store) -> pd.DataFrame:
    """The columns methods declare (``WatermarkMethod.columns``), ``<method>.<field>``: for each run of the method,
    the mean of the field over its generated texts (empty where no text has it); no column for a method that declares
    none, so a store of other methods' runs gives the runs.csv it always did."""
    for name in sorted(df["method_name"].dropna().unique()):
        columns = getattr(plugin_class("method", name), "columns", ())
        if not columns:
            continue
        for column in columns:
            log.info("runs.csv: %s.%s: %s", name, column.field, column.description or "(declared by the method)")
            df[f"{name}.{column.field}"] = np.nan
        for i in df.index[df["method_name"] == name]:
            generated = [s for s in scores(store, df.at[i, "run"]) if s.get("label") == 1]  # (read once per run)
            for column in columns:
                values = [s[column.field] for s in generated if isinstance(s.get(column.field), int | float)]
                df.at[i, f"{name}.{column.field}"] = float(np.mean(values)) if values else np.nan
    return df


def calibrated(df: pd.DataFrame, store: Store) -> tuple[pd.Series, pd.Series]:
    """Which runs are of a configuration that a stored calibration chose for their setup (``harness.grid.calibration``:
    each method's strength picked on the unaltered model, by its grid's rule, before any attack ran), and for each
    such run of a method its calibration chose outside the budget (``over_budget: closest``), why it is never ranked
    at matched quality ("" otherwise)."""
    from harness.grid.calibration import outside

    chosen: dict[tuple, str] = {}
    for stage in store.finished():
        if stage.kind != kinds.CALIBRATION:
            continue
        try:
            spec = json.loads((stage.path / "spec.json").read_text())
            found = json.loads((stage.path / "calibration.json").read_text())
        except (OSError, ValueError) as err:
            log.warning("skipping calibration %s: %s", stage.path, err)
            continue
        swept = {run for pair in spec["runs"] for run in pair}
        params = json.dumps(found["chosen"]["settings"], sort_keys=True)
        why = outside(found["chosen"]).removeprefix(", ")
        chosen |= {(setup, spec["method"], params): why for setup in df[df["run"].isin(swept)]["setup"]}
    keys = [(r.setup, r.method_name, r.params) for r in df.itertuples()]
    return (pd.Series([k in chosen for k in keys], index=df.index, dtype=bool),
            pd.Series([chosen.get(k, "") for k in keys], index=df.index, dtype=object))  # fmt: skip


def base_rows(df: pd.DataFrame) -> pd.Series:
    """Which runs score the unwatermarked base's texts (the control row of every method)."""
    return df["attack_name"].isna() & (df["category"] == BASE_CATEGORY)


def against_base(df: pd.DataFrame, store: Store) -> pd.DataFrame:
    """Each run beside the unwatermarked base's texts of its setup, prompts and decoding (the same prompts, sampled
    the same way, judged by the same model): ``PPL_ratio`` (its median PPL over the base's, on one footing) and
    ``PPL_ratio_lo``, ``PPL_ratio_hi`` (its 95% interval, a bootstrap over the prompts: ``metrics.ratio_interval``),
    ``rep3_base``, the ``quality`` verdict of its setup's gate (``harness.config.gate``), and the model-versus-model
    columns ``AUC_vs_base`` and ``TPR@1%_vs_base``: its detector's scores of its texts against the same detector's
    scores of the base's texts (that method's and configuration's base row, of the same training seed where
    stored), where the human texts of ``AUC`` mix "model versus human" into the watermark's signal. A base row reads
    0.5 there by construction. ``AUC_vs_control``: a row of an attack that also modifies the base
    (``Attack.controlled``: distillation) against its control row's texts (the same modification of the base)."""
    from harness.cell.quality import ppl_ratio
    from harness.config.gate import QualityGate

    base = df[base_rows(df)]

    @cache
    def generated(run: str) -> tuple[float, ...]:
        return tuple(s["score"] for s in scores(store, run) if s["label"] == 1)

    @cache
    def perplexities(run: str, field: str) -> dict:  # prompt index -> the perplexity of the text written from it
        return metrics.per_prompt(scores(store, run), field)

    names = ("PPL_ratio", "PPL_ratio_lo", "PPL_ratio_hi", "rep3_base", "quality", "AUC_vs_base", "TPR@1%_vs_base")
    cols: dict[str, list] = {c: [] for c in names}
    controls = {(r.setup, r.method, r.params, r.seed, r.attack_name, r.attack_params, r.attack_config): r.run
                for r in df[df["control"]].itertuples()}  # fmt: skip
    versus_control = []
    for r in df.itertuples(index=False):
        same = base[(base["setup"] == r.setup) & (base["decoding"] == r.decoding) & (base["prompts"] == r.prompts)]
        for column, value in (("method", r.method), ("params", r.params), ("seed", r.seed)):
            if (same[column] == value).any():  # the base texts under this method's detector, settings and seed
                same = same[same[column] == value]
        ratio = bounds = rep3_base = auc = tpr = None
        if len(same):
            b = same.iloc[0]
            footing = r.PPL_on == b["PPL_on"]
            ratio = ppl_ratio(*((r.PPL, b["PPL"]) if footing else (r.PPL_retokenized, b["PPL_retokenized"])))
            if ratio is not None:
                field = "ppl" if footing else "ppl_retokenized"
                try:
                    bounds = metrics.ratio_interval(perplexities(r.run, field), perplexities(b["run"], field))
                except (OSError, TypeError, ValueError) as err:
                    log.warning("run %s: no interval of its PPL ratio (%s)", r.run, err)
            rep3_base = b["rep3"]
            if b["method"] == r.method and b["params"] == r.params:
                try:
                    auc, tpr = metrics.versus(generated(r.run), generated(b["run"]))
                except (OSError, ValueError, KeyError) as err:
                    log.warning("run %s: no model-versus-model AUC (%s)", r.run, err)
        verdict = QualityGate(**json.loads(r.quality_gate)).verdict(ratio, r.rep3, rep3_base)
        lo, hi = bounds or (None, None)
        for c, v in zip(cols, (ratio, lo, hi, rep3_base, verdict, auc, tpr), strict=True):
            cols[c].append(v)
        control = None if r.control else controls.get((r.setup, r.method, r.params, r.seed, r.attack_name,
                                                         r.attack_params, r.attack_config))  # fmt: skip
        versus_control.append(None if control is None else metrics.versus(generated(r.run), generated(control))[0])
    cols["AUC_vs_control"] = versus_control
    return df.assign(**cols)


def _one_main_configuration(df: pd.DataFrame) -> pd.Series:
    """``main``, with at most one configuration per method and setup. A run is main when its method's settings are
    its preset's (``--set methods.<method>.<key>=...`` changes the preset, so two stored "main" configurations can
    share a setup); where several are, the main one is the preset's own as the harness defines it (``harness list``),
    else the newest run's, and the others are left out of the main-configuration tables with a warning naming them,
    never averaged in."""
    from harness.config.presets import PRESETS

    main = df["main"].copy()
    for (_, method), part in df[df["main"]].groupby(["setup", "method_name"], sort=True):
        configs = part["params"].unique()
        if len(configs) < 2:
            continue
        preset = PRESETS.get(part["preset"].iloc[0])
        defined = _resolved(method, json.dumps(preset.methods.get(method, {}), sort_keys=True)) if preset else None
        newest = part.loc[part.index.max(), "params"]  # (runs are read oldest first)
        chosen = defined if defined in configs else newest
        others = part[part["params"] != chosen]
        main[others.index] = False
        labels = sorted(set(others["method_config"]))
        log.warning(
            "%s: %d runs of another main configuration (%s) share a setup with %s's %s; tables of main "
            "configurations show the latter only (runs: %s)",
            part["method"].iloc[0], len(others), "; ".join(labels), part["preset"].iloc[0],
            part[part["params"] == chosen]["method_config"].iloc[0], ", ".join(sorted(others["run"])[:5]),
        )  # fmt: skip
    return main


def _main_settings(df: pd.DataFrame) -> pd.Series:
    """The preset settings that tables vary one setting of (ablations, tab:watermark-config): those of the setup's
    main configuration for the method where one is stored, else the run's own. A run made with
    ``--set methods.pro.fpl=false`` and alpha, beta as the preset's is then no point of the alpha/beta ablation of
    the preset's PRO (it differs in fpl), where its own preset settings made it one, averaged with the main run."""
    base = df["preset_method"].copy()
    for _, part in df.groupby(["setup", "method_name"], sort=False):
        mains = part[part["main"]]
        if len(mains):
            base[part.index] = mains["preset_method"].iloc[0]
    return base


def preset_settings(preset_name: str, stored: dict, name: str | None) -> dict:
    """The preset's settings for method ``name``: as the run's spec records them, or, for a method added after the
    first stored results (``Preset.hashed`` leaves its settings out of the spec, to keep hashes), as the named preset
    gives them (none for a preset this installation does not know)."""
    from harness.config.settings import HASHED_METHOD_DEFAULTS

    methods = stored.get("methods", {})
    if name is None or name in methods or name in HASHED_METHOD_DEFAULTS:
        return methods.get(name, {})
    return _named_preset_methods(preset_name).get(name, {})


@cache
def _named_preset_methods(preset_name: str) -> dict:
    from harness.config.presets import get_preset

    try:
        return get_preset(preset_name).model_dump()["methods"]
    except (HarnessError, KeyError, ValueError):
        return {}


# Metrics that are shares (AUC, TPRs, repetition and diversity) and those that are positive (perplexities).
SHARES = ("auc", *TPRS.values(), *QUALITY)
POSITIVE = ("median_ppl", "median_ppl_retokenized")


def checked_metrics(m) -> dict:
    """A run's ``metrics.json`` as tables may read it: a mapping whose shares lie in [0, 1] and whose perplexities
    are positive, each a finite number or absent (None). A stored file edited with its contents.json (an AUC of NaN,
    7.5 or "high") is refused with the reason (``collect`` leaves the run out with one warning naming it), never
    printed as a result or met as a traceback."""
    if not isinstance(m, dict):
        raise ValueError(f"metrics.json holds a {type(m).__name__}, not a mapping")

    def number(key, value, low, high, nan=False) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and nan and math.isnan(value):
            return
        if not (ok and math.isfinite(value) and low <= value <= high):
            raise ValueError(f"metrics.json's {key} is {json.dumps(value)[:40]}, not a number in [{low}, {high}]")

    for key in SHARES + POSITIVE:
        if m.get(key) is not None:  # (a perplexity no text could be read for is NaN: WASH's re-tokenized one)
            number(key, m[key], 0, 1 if key in SHARES else math.inf, nan=key in POSITIVE)
    ci = m.get("auc_ci95")
    if not (isinstance(ci, list) and len(ci) == 2):
        raise ValueError(f"metrics.json's auc_ci95 is {json.dumps(ci)[:40]}, not a pair")
    for bound in ci:
        number("auc_ci95", bound, 0, 1)
    for key in ("n_pos", "n_neg"):
        if not (isinstance(m.get(key), int) and not isinstance(m.get(key), bool) and m[key] >= 0):
            raise ValueError(f"metrics.json's {key} is {json.dumps(m.get(key))[:40]}, not a count")
    return m


def _row(run: Path) -> dict:
    spec = json.loads((run / "spec.json").read_text())
    m = checked_metrics(json.loads((run / "metrics.json").read_text()))
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
        "preset_method": json.dumps(preset_settings(spec["preset"], preset, name), sort_keys=True),
        # (a control row, the attack applied to the unwatermarked base, is no configuration's: ``Attack.controlled``)
        "main": not cfg["attack"].get("control")
        and only(name, params, preset_settings(spec["preset"], preset, name), ()),  # fmt: skip
        "control": bool(cfg["attack"].get("control")),
        "params": json.dumps(params, sort_keys=True),
        "decoding": decoding_label(preset.get("eval", {})),  # "": plain sampling at temperature 1
        "prompts": prompts_label(preset.get("eval", {})),  # "": the preset's documents
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
        "edit_rate": (m.get("paraphrase") or {}).get("applied_rate"),  # a text edit's rate as applied
        "judge": (spec.get("oracle") or {}).get("ref"),  # the model whose perplexity PPL is
        "PPL_on": m.get("ppl_on"),  # sampled ids or re-tokenized text: compare PPL on the same footing only
        "PPL_retokenized": metrics.retokenized_ppl(m),  # on re-tokenized text, the footing of text attacks' rows
        # Detection by text length (None where the detector keeps no prefix scores, or the run predates them).
        "tokens_to_detect": m.get(f"tokens_to_detect@{metrics.LENGTH_FPR:g}"),
        "detected_by_end": m.get(f"detected_by_end@{metrics.LENGTH_FPR:g}"),
        "by_length": json.dumps(m["by_length"]) if m.get("by_length") else None,
        **{k: m.get(k) for k in QUALITY},  # repetition and diversity of its generated texts (metrics version 4)
        "quality_gate": json.dumps(preset.get("quality_gate") or {}, sort_keys=True),  # "{}": the default gate
        "metrics_version": m.get("metrics_version", "0"),
        "run": run.name,
    }


def collect_attribution(store: Store) -> pd.DataFrame:
    """One row per stored attribution stage: detector (method, configuration), whose texts, share flagged."""
    rows = []
    for folder in store.attributions():
        try:
            stage = store.at(kinds.ATTRIBUTION, folder.name)
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
        except (HarnessError, OSError, ValueError, KeyError, TypeError, RecursionError) as err:
            log.warning("skipping attribution %s: %s", folder, f"{type(err).__name__}: {err}")
    return pd.DataFrame(rows)


def heldout_ppl(store: Store) -> dict[str, float]:
    """Model id -> its perplexity on held-out human text, from the store's utility stages (harness/cell/utility.py)."""
    found = {}
    for stage in store.finished():
        if stage.kind == kinds.UTILITY:
            spec = json.loads((stage.path / "spec.json").read_text())
            found[spec["model"]] = json.loads((stage.path / kinds.UTILITY_FILE).read_text())["heldout_ppl"]
    return found


def model_of_run(store: Store, run: str) -> str | None:
    """The id of the model whose generations a run scored (None: a text attack's rewrites)."""
    spec = json.loads((store.root / run / "spec.json").read_text())
    return (spec.get("upstream", {}).get("generate") or {}).get("model")


def scores(store: Store, run: str) -> list[dict]:
    """A run's stored per-text scores (a line that is no JSON object: one line naming the run and the line)."""
    out = []
    for number, line in enumerate((store.root / run / "scores.jsonl").read_text().splitlines(), 1):
        if line:
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                row = None
            if not isinstance(row, dict):
                raise HarnessError(f"run {run}: scores.jsonl line {number} is not a JSON object: the run is damaged")
            out.append(row)
    return out


# --- setups and configurations -----------------------------------------------------------------------------------
def setup_key(preset: dict) -> str:
    """What makes runs comparable: the preset's settings (base model, data, training, evaluation) without its seed
    and name. Short hash."""
    kept = {k: v for k, v in preset.items() if k not in NOT_SETUP}
    kept["train"] = {k: v for k, v in kept.get("train", {}).items() if k != "seed"}
    if "eval" in kept:  # how the models sampled and what they were asked are the run's ``decoding`` and ``prompts``
        kept["eval"] = documents_prompts(plain_sampling(kept["eval"]))  # (every one shares the setup)
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:8]


PLAIN_DECODING = "temperature=1"  # how the decoding table names plain sampling (``EvalSettings.decoding_label`` "")
DOCUMENTS = "documents"  # how the prompts table names the preset's documents (``EvalSettings.prompts_label`` "")


def plain_runs(part: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``part`` whose models continued the preset's documents by plain sampling at temperature 1 (the
    paper's protocol, every table's but the decoding and prompts tables'): a run at other decoding settings or of
    other prompts shares its setup and is another row of those tables."""
    for column in ("decoding", "prompts"):
        if column in part:
            part = part[part[column] == ""]
    return part


def use_labels(part: pd.DataFrame) -> pd.Series:
    """How each run of ``part`` used its models beyond plain sampling of the preset's documents: its prompts, then its
    decoding (``chat, top_p=0.9``); "" for the paper's protocol."""
    columns = [part[c] for c in ("prompts", "decoding") if c in part]
    return pd.Series([", ".join(x for x in used if x) for used in zip(*columns, strict=True)] if columns else
                     [""] * len(part), index=part.index, dtype=object)  # fmt: skip


def prompts_runs(part: pd.DataFrame) -> pd.DataFrame:
    """The runs of the prompts table: those of other prompts than the documents (at any decoding), and the documents'
    at plain sampling (another decoding of the documents is the decoding table's)."""
    return part[(part["prompts"] != "") | (part["decoding"] == "")]


def documents_runs(part: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``part`` whose models continued the preset's documents (at any decoding)."""
    return part[part["prompts"] == ""] if "prompts" in part else part


def setups(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{folder name: runs}``: ``<preset>`` for a preset's one setup, ``<preset>-<setup hash>`` where a preset has
    several (another base model, other settings)."""
    out = {}
    for preset, part in df.groupby("preset", sort=True):
        keys = sorted(part["setup"].unique())
        for key in keys:
            out[preset if len(keys) == 1 else f"{preset}-{key}"] = part[part["setup"] == key]
    return out


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


def only_mask(df: pd.DataFrame, settings: tuple[str, ...] | Callable[[str | None], tuple[str, ...]]) -> pd.Series:
    """``only`` for every run of ``df``, against its setup's main configuration (``main_method``); ``settings`` may
    be a function of the method's name (``tradeoff_settings``)."""
    per_method = settings if callable(settings) else lambda _: settings
    return pd.Series(
        [only(n, json.loads(p), json.loads(d), per_method(n)) for n, p, d in zip(df["method_name"], df["params"],
                                                                                   df["main_method"], strict=True)],
        index=df.index, dtype=bool,
    )  # fmt: skip


def main_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Each method's main configuration (the preset's settings for it)."""
    return df[df["main"]]


def mean_over_seeds(df: pd.DataFrame, keys: list[str], values: list[str]) -> pd.DataFrame:
    """Average over seeds (one seed: the values themselves)."""
    return df.groupby(keys, sort=False, dropna=False)[values].mean().reset_index()


def spread_over_seeds(df: pd.DataFrame, keys: list[str], values: list[str], spread: list[str]) -> pd.DataFrame:
    """``mean_over_seeds``, with for each of ``spread`` the 95% t-interval over the cell's training seeds
    (``metrics.seed_interval``, within [0, 1]: ``<value>_seed_lo``, ``<value>_seed_hi``; missing for a cell of one
    seed) and the number of seeds each cell averages (``seeds``). The text-sampling interval of a cell of several seeds
    (``AUC_lo``, ``AUC_hi``) stays the mean of its seeds' own bounds: one training's interval, beside the spread
    between trainings."""
    out = mean_over_seeds(df, keys, values)
    groups = df.groupby(keys, sort=False, dropna=False)
    out["seeds"] = groups["seed"].nunique().to_numpy()
    for v in spread:
        bounds = groups[v].agg(lambda s: metrics.seed_interval(s.to_numpy(float), within=(0.0, 1.0)))
        out[f"{v}_seed_lo"] = [b[0] for b in bounds]
        out[f"{v}_seed_hi"] = [b[1] for b in bounds]
    return out


def _eval_spec(spec: dict) -> dict | None:
    """The evaluation that chose a run's prompts and human texts (its generate stage's ``eval``, ``eval_data`` and
    tokenizer), found in the run's upstream specs (a text attack's rewrites sit between); None where none is stored."""
    todo = [spec.get("upstream")]
    while todo:
        node = todo.pop(0)
        if isinstance(node, dict):
            if "eval_data" in node and "eval" in node:  # (how the texts were sampled does not choose the prompts)
                found = {k: node.get(k) for k in ("eval", "eval_data", "tokenizer")}
                if isinstance(found["eval"], dict):
                    found["eval"] = plain_sampling(found["eval"])
                return found
            todo += list(node.values())
    return None


@cache
def _by_prompt(root: Path, run: str) -> tuple[dict, dict, str | None, dict | None]:
    """A run's stored scores by prompt index (``{i: score}`` of its generated and of its human texts, each ``i`` once),
    a digest of its prompts and human texts per ``i`` (None where its texts are not stored: an export), and its
    evaluation spec (``_eval_spec``)."""
    folder = root / run
    pos, neg = {}, {}
    for s in read_jsonl(folder / "scores.jsonl"):
        side = pos if s["label"] == 1 else neg
        if s["i"] in side:
            raise ValueError(f"text {s['i']} is scored twice")
        side[s["i"]] = float(s["score"])
    digest = None
    gens = folder / "generations.jsonl"
    if gens.is_file():
        rows = read_jsonl(gens)
        if rows and all("prompt_ids" in g and "human_ids" in g for g in rows):
            shown = sorted((g["i"], g["prompt_ids"], g["human_ids"]) for g in rows)
            digest = hashlib.sha256(json.dumps(shown).encode()).hexdigest()
    return pos, neg, digest, _eval_spec(json.loads((folder / "spec.json").read_text()))


def paired_scores(store: Store, runs_a: list[str], runs_b: list[str]) -> tuple[list, str]:
    """The scores of two methods' runs (one per training seed, the same seeds in the same order) on the same prompts,
    as ``metrics.paired_bootstrap`` takes them: ``([pos_a, neg_a, pos_b, neg_b] as seeds x prompts lists, what the
    pairing was checked on)``. Pairing is verified from what the runs store, never assumed: every run scores each
    prompt's generated and human text once, on the same prompt indices, and the prompts and human texts behind them
    are the same (their evaluation spec, and their token ids wherever every run still holds its texts). Raises
    ValueError saying why two runs are not comparable."""
    read = [[_by_prompt(store.root, r) for r in runs] for runs in (runs_a, runs_b)]
    first = read[0][0]
    keys = sorted(first[0])
    digests = {r[2] for side in read for r in side}
    specs = [r[3] for side in read for r in side]
    for name, side in zip((runs_a, runs_b), read, strict=True):
        for run, (pos, neg, _, spec) in zip(name, side, strict=True):
            if set(pos) != set(neg):
                raise ValueError(f"run {run} does not score a generated and a human text for every prompt")
            if sorted(pos) != keys:
                raise ValueError(f"runs {runs_a[0]} and {run} score different prompt indices")
            if spec is not None and first[3] is not None and spec != first[3]:
                raise ValueError(f"runs {runs_a[0]} and {run} were evaluated on different settings or data")
    if None not in digests and len(digests) > 1:
        raise ValueError(f"runs {', '.join(runs_a + runs_b)} continue different prompts or human texts")
    if None in specs and None in digests:
        raise ValueError(f"run {runs_a[0]} stores neither its texts nor its evaluation spec")
    # What every run records, its evaluation spec, names the pairing; an export keeps it (and drops the texts, whose
    # ids are compared as well wherever all runs still hold them), so the table reads the same from a store and its
    # export.
    on = "evaluation spec" if None not in specs else "prompt ids"
    pos_a, neg_a = [[r[0][i] for i in keys] for r in read[0]], [[r[1][i] for i in keys] for r in read[0]]
    pos_b, neg_b = [[r[0][i] for i in keys] for r in read[1]], [[r[1][i] for i in keys] for r in read[1]]
    return [pos_a, neg_a, pos_b, neg_b], on


def param(params: str, key: str):
    """The value of setting ``key`` in a run's stored settings (JSON)."""
    return json.loads(params).get(key)


def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside a label by value: ``t=0.3`` < ``t=0.5``, ``s=300`` < ``s=1200``."""
    parts = re.split(r"(\d+(?:\.\d+)?)", str(text))
    return tuple((0, float(p)) if i % 2 else (1, p) for i, p in enumerate(parts) if p)


# --- what the plugins declare -------------------------------------------------------------------------------------
def decoding_time_methods(part: pd.DataFrame) -> list[str]:
    """The labels of ``part``'s methods that watermark at decoding time (not in the weights), sorted."""
    return [label for label, name in sorted(set(zip(part["method"], part["method_name"], strict=True)))
            if getattr(plugin_class("method", name), "decoding_time", False)]  # fmt: skip


@cache
def edits_weights(name: str | None, params: str) -> bool | None:
    """Whether the stored attack ``name`` with ``params`` (its runs' JSON) changes the model rather than its texts
    (``Attack.edits_weights``: a chain does where any link does); None where the plugin is not installed here or
    does not take those settings any more."""
    from harness.config.registry import attacks

    if plugin_class("attack", name) is None:
        return None
    try:
        return attacks.build(name, json.loads(params)).edits_weights()
    except (HarnessError, ValueError, TypeError):
        return None


@cache
def plugin_class(kind: str, name: str | None):
    """The class registered as method or attack ``name`` (``kind``), or None where it is not installed here (or cannot
    be imported). A class that is installed but declares what cannot be (an unknown table name) is an error."""
    from harness.config.registry import PluginLoadError, attacks, methods

    if not isinstance(name, str):  # the base model's rows: no attack (None, or NaN in a frame)
        return None
    registry = methods if kind == "method" else attacks
    try:
        registry.check(name)
    except HarnessError:
        return None
    try:
        return registry.load(name)
    except PluginLoadError:
        return None


@cache
def _registry_order(kind: str, attribute: str) -> dict[str, int]:
    """``{value: rank}`` of a class attribute (a method's ``label``, an attack's ``category``) in the order the
    registry lists its plugins, each value ranked where it first appears."""
    from harness.config.registry import attacks, methods

    order: dict[str, int] = {}
    for name in (methods if kind == "method" else attacks).ordered():
        cls = plugin_class(kind, name)
        if cls is not None:
            order.setdefault(getattr(cls, attribute), len(order))
    return order


def method_rank(label: str) -> tuple:
    """Sort key of a method's table label: the registry's order, then unknown labels by name."""
    order = _registry_order("method", "label")
    return (order[label], "") if label in order else (len(order), label)


def category_rank(category: str) -> tuple:
    """Sort key of a row group: the order in which the registry's attacks first name it, then by name."""
    order = _registry_order("attack", "category")
    return (order.get(category, len(order)), category)


def attack_tables(name: str | None) -> tuple[str, ...]:
    """The tables an attack's rows go in (``Attack.tables``); the base model's rows go in none of them."""
    if not isinstance(name, str):
        return ()
    cls = plugin_class("attack", name)
    return cls.tables if cls is not None else ("robustness",)


def in_table(df: pd.DataFrame, table: str) -> pd.Series:
    """Which runs of ``df`` were made by an attack whose rows go in ``table``."""
    return df["attack_name"].map(lambda name: table in attack_tables(name)).astype(bool)


def tradeoff_settings(name: str | None) -> tuple[str, ...]:
    """The settings method ``name`` varies for tab:watermark-config (``WatermarkMethod.tradeoff_settings``)."""
    cls = plugin_class("method", name)
    return tuple(cls.tradeoff_settings) if cls is not None else ()


def unaltered(df: pd.DataFrame) -> pd.Series:
    """Which runs of ``df`` evaluate the unaltered watermarked model (an attack that declares ``identity``)."""
    identity = df["attack_name"].map(lambda name: bool(getattr(plugin_class("attack", name), "identity", False)))
    return identity.astype(bool)
