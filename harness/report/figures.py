"""The paper's figures from stored runs only (no model is loaded), as PNG and PDF: the AUC-PPL trade-off, ROC
curves, AUC against each attack's strength (``auc_vs_<attack>`` for the attacks that declare a ``Sweep``: SLERP's
ratio, fine-tuning steps), green-token ratios of the methods whose scores count green tokens, and TPR against text
length.

Each figure plots what ``harness.report.collect.collect`` found for one setup; ROC curves and green ratios read the
runs' per-text scores. Files are byte-identical when rebuilt from the same store (no timestamps in them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.config.errors import printable
from harness.contract.plugin import Sweep
from harness.report import collect
from harness.report.collect import main_runs, method_rank, natural_key, param, plain_runs, setups, unaltered
from harness.report.frames import watermark_config
from harness.store import files
from harness.store.files import plain_name
from harness.store.stages import Store


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    # text.parse_math off: labels, settings and titles come from a store, which may be someone else's, and a "$...$"
    # in one would be parsed as mathtext (an unknown "\\foo" in it stops the figure, and so the tables and the report).
    # The figures' own text has no "$" and no axis is logarithmic (whose tick labels are mathtext), so nothing is lost.
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 150, "font.size": 9, "svg.hashsalt": "harness",
                         "text.parse_math": False})  # fmt: skip
    return plt


def _save(fig, folder: Path, name: str) -> list[Path]:
    """``fig`` as ``<name>.png`` and ``<name>.pdf`` in ``folder``, each replaced whole (``files.replacing``: a full
    disk or a kill never leaves a cut figure), with no time stamp or version in them; the figure is closed after.
    Its texts are ``printable``: matplotlib has no glyph for a control character, and its warning quotes it raw."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    for text in fig.findobj(Text):  # (labels, titles and legends come from a store, which may be someone else's)
        if text.get_text() != printable(text.get_text(), keep="\n"):
            text.set_text(printable(text.get_text(), keep="\n"))
    paths = [folder / f"{name}.png", folder / f"{name}.pdf"]
    try:
        with files.replacing(paths[0]) as fh:
            fig.savefig(fh, format="png", metadata={"Software": None})
        with files.replacing(paths[1]) as fh:
            fig.savefig(fh, format="pdf", metadata={"CreationDate": None, "Producer": None, "Creator": None})
    finally:
        plt.close(fig)
    return paths


def _methods(df: pd.DataFrame) -> list[str]:
    return sorted(df["method"].unique(), key=method_rank)


def auc_ppl(part: pd.DataFrame, plt):
    """AUC against median PPL of each method's configurations (unaltered), as the paper draws its trade-off: each
    method's points joined in PPL order, the unwatermarked base's PPL as a dashed line, and labels moved apart where
    they would overlap."""
    table = watermark_config(part)
    if table.empty:
        return None
    names = dict(zip(part["method"], part["method_name"], strict=False))
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    labels = []
    for method in _methods(table.reset_index()):
        points = table.loc[method].sort_values("PPL")
        ax.plot(points["PPL"], points["AUC"], marker="o", label=method)
        varied = collect.tradeoff_settings(names.get(method))
        for config, row in points.iterrows():
            short = ", ".join(p for p in config.split(", ") if p.split("=")[0] in varied) or config
            labels.append((row["PPL"], row["AUC"], short))
    base = part[collect.base_rows(part)]["PPL"].dropna() if "attack_name" in part else pd.Series(dtype=float)
    if len(base):
        ax.axvline(float(base.median()), color="0.5", linestyle="--", linewidth=1, label="unwatermarked base PPL")
    ax.set(xlabel="median perplexity", ylabel="AUC", title="Detection vs quality (unaltered)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    _place_apart(fig, ax, labels)
    return fig


def _place_apart(fig, ax, labels: list[tuple[float, float, str]]) -> None:
    """Annotate each point with its label at the first of a few offsets where it stays inside the axes and overlaps no
    label placed before (by their boxes on the canvas), else at the first offset: deterministic, in the points'
    order."""
    renderer = fig.canvas.get_renderer()
    placed = []
    offsets = [(3, -8), (3, 4), (-3, 4), (-3, -8), (3, -16), (3, 12)]

    def annotate(x: float, y: float, text: str, dx: int, dy: int):
        note = ax.annotate(text, (x, y), fontsize=6, xytext=(dx, dy), textcoords="offset points",
                           ha="left" if dx > 0 else "right")  # fmt: skip
        return note, note.get_window_extent(renderer)

    frame = ax.get_window_extent(renderer)
    for x, y, text in labels:
        for dx, dy in offsets:
            note, box = annotate(x, y, text, dx, dy)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in placed):
                break
            note.remove()
        else:  # every offset overlaps a label: the first, kept
            note, box = annotate(x, y, text, *offsets[0])
        placed.append(box)


def roc(part: pd.DataFrame, store: Store, plt):
    """ROC curve of each method's main configuration, unaltered, from its stored per-text scores."""
    from sklearn.metrics import roc_curve

    runs = main_runs(part)
    runs = runs[unaltered(runs)]
    if runs.empty:
        return None
    fig, ax = plt.subplots(figsize=(3.6, 3.4))
    for method in _methods(runs):
        run = runs[runs["method"] == method].sort_values("seed")["run"].iloc[0]
        scores = collect.scores(store, run)
        fpr, tpr, _ = roc_curve([s["label"] for s in scores], [s["score"] for s in scores], drop_intermediate=False)
        auc = runs[runs["method"] == method]["AUC"].iloc[0]
        ax.plot(fpr, tpr, label=f"{method} (AUC {auc:.3f})")
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=0.8)
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (unaltered)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def auc_vs(part: pd.DataFrame, attack: str, sweep: Sweep, plt):
    """AUC against ``attack``'s strength (x = 0: the unaltered model), one line per method, one panel per table
    label (e.g. per fine-tuning dataset) where ``sweep.panels``; with bootstrap intervals where ``error_bars``."""
    runs = main_runs(part)
    swept = runs[runs["attack_name"] == attack]
    if swept.empty:
        return None
    labels = sorted(swept["attack"].unique()) if sweep.panels else [None]
    size = (4.2 * len(labels), 3.2)
    if sweep.panels:
        fig, axes = plt.subplots(1, len(labels), figsize=size, squeeze=False)
        axes = list(axes[0])
    else:
        fig, ax = plt.subplots(figsize=size)
        axes = [ax]

    def x(row) -> float:
        if sweep.setting is not None:
            return param(row.attack_params, sweep.setting)
        return int(natural_key(row.attack_config)[-1][1])

    for ax, label in zip(axes, labels, strict=True):
        for method in _methods(swept):
            mine = runs[runs["method"] == method]
            points = [(0.0 if sweep.error_bars else 0, r) for r in mine[unaltered(mine)].itertuples()]
            mine = mine[mine["attack_name"] == attack]
            if label is not None:
                mine = mine[mine["attack"] == label]
            points += [(x(r), r) for r in mine.itertuples()]
            if sweep.error_bars:
                points.sort(key=lambda p: p[0])
                err = [[p[1].AUC - p[1].AUC_lo for p in points], [p[1].AUC_hi - p[1].AUC for p in points]]
                ax.errorbar(np.array([p[0] for p in points]), np.array([p[1].AUC for p in points]),
                            yerr=np.array(err), marker="o", capsize=2, label=method)  # fmt: skip
            else:
                pairs = sorted((p[0], p[1].AUC) for p in points)
                ax.plot([p[0] for p in pairs], [p[1] for p in pairs], marker="o", label=method)
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=0.8)
        ax.set(xlabel=sweep.xlabel, ylabel="AUC", title=sweep.title.format(label=label))
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def green_ratio(part: pd.DataFrame, store: Store, plt):
    """Histograms of the green-token share of generated and human texts under each KGW method's main configuration
    (unaltered): runs whose scores count green tokens."""
    runs = main_runs(part)
    runs = runs[unaltered(runs)]
    panels = []
    for method in _methods(runs):
        run = runs[runs["method"] == method].sort_values("seed")["run"].iloc[0]
        scores = [s for s in collect.scores(store, run) if s.get("scored")]
        if scores and all("green" in s for s in scores):
            panels.append((method, scores))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.0), squeeze=False)
    bins = np.linspace(0, 1, 26)
    for ax, (method, scores) in zip(axes[0], panels, strict=True):
        for label, name in ((0, "human"), (1, "generated")):
            ratio = [s["green"] / s["scored"] for s in scores if s["label"] == label]
            ax.hist(ratio, bins=bins, alpha=0.6, label=name)
        ax.set(xlabel="green-token ratio", ylabel="texts", title=method)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def tpr_by_length(part: pd.DataFrame, plt):
    """TPR at 1% FPR against text length (tokens), one panel per method's main configuration, one line per row
    (unaltered and each attack), with Clopper-Pearson 95% bands: runs whose detector keeps prefix scores."""
    import json

    runs = main_runs(part)
    runs = runs[runs["by_length"].notna()]
    base = runs[runs["attack_name"].isna()]  # the unwatermarked base: the rate the 1% is read against
    runs = runs[runs["attack_name"].notna()]
    if runs.empty:
        return None
    runs = runs.assign(first=unaltered(runs))
    methods = _methods(runs)
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 3.4), squeeze=False)
    for ax, method in zip(axes[0], methods, strict=True):
        mine = runs[runs["method"] == method]
        rows = sorted({(not r.first, r.attack, r.attack_config) for r in mine.itertuples()},
                      key=lambda k: (k[0], natural_key(f"{k[1]} {k[2]}")))  # fmt: skip
        for _, attack, config in rows:
            row = mine[(mine["attack"] == attack) & (mine["attack_config"] == config)].sort_values("seed").iloc[0]
            curve = json.loads(row["by_length"])
            lo, hi = np.array(curve["tpr@0.01_ci95"]).T
            label = f"{attack} {config}".strip() or "unaltered"
            (line,) = ax.plot(curve["lengths"], curve["tpr@0.01"], marker="o", label=label)
            ax.fill_between(curve["lengths"], lo, hi, color=line.get_color(), alpha=0.15)
        mine_base = base[base["method"] == method].sort_values("seed")
        if not mine_base.empty:
            curve = json.loads(mine_base.iloc[0]["by_length"])
            ax.plot(curve["lengths"], curve["tpr@0.01"], color="0.4", linestyle="--", marker="x",
                    label="unwatermarked base (flag rate)")  # fmt: skip
        ax.axhline(0.01, color="0.6", linewidth=0.6, linestyle=":")
        ax.set(xlabel="completion tokens", ylabel="TPR at 1% FPR", title=method, ylim=(-0.02, 1.02))
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def auc_utility(part: pd.DataFrame, store: Store, plt):
    """Per method, the AUC of every attacked model against its retained utility (perplexity on held-out human text),
    the attack that declares itself the reference (``Attack.reference_curve``: weight noise) as a curve: an attack
    below it removes more watermark than that of the same utility cost. Drawn where the store holds utility stages
    (runs made before them have none)."""
    ppl = collect.heldout_ppl(store)
    if not ppl:
        return None
    runs = part[part["attack_name"].notna()].copy()
    runs["utility"] = [ppl.get(collect.model_of_run(store, run)) for run in runs["run"]]
    runs = runs[runs["utility"].notna()]
    declares = lambda attribute: runs["attack_name"].map(  # noqa: E731
        lambda name: bool(getattr(collect.plugin_class("attack", name), attribute, False))
    )
    runs["reference"], runs["unaltered"] = declares("reference_curve"), declares("identity")
    used = collect.use_labels(runs)  # a run at another decoding or of other prompts: a point of its own, so named
    if (used != "").any():
        other = used != ""
        rows = runs["attack"].where(~runs["unaltered"], "unaltered")
        runs.loc[other, "attack"] = rows[other] + " [" + used[other] + "]"
        runs.loc[other, ["reference", "unaltered"]] = False
    if runs.empty or runs["unaltered"].all():
        return None
    from matplotlib.ticker import LogFormatter

    names = _methods(runs)
    styles = attack_styles(sorted(runs.loc[~runs["unaltered"] & ~runs["reference"], "attack"].unique()))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, method in zip(axes[0], names, strict=True):
        mine = runs[runs["method"] == method]
        unaltered_, reference = mine[mine["unaltered"]], mine[mine["reference"]]
        if len(reference):
            line = pd.concat([unaltered_, reference]).sort_values("utility")
            label = f"{reference['attack'].iloc[0]} (reference)"
            ax.plot(line["utility"], line["AUC"], color="0.5", marker=".", label=label)
        for attack, points in mine[~mine["unaltered"] & ~mine["reference"]].groupby("attack", sort=True):
            colour, marker = styles[attack]
            ax.scatter(points["utility"], points["AUC"], s=14, color=colour, marker=marker, label=attack)
        ax.scatter(unaltered_["utility"], unaltered_["AUC"], marker="*", s=90, color="black", label="unaltered")
        ax.set(xscale="log", xlabel="held-out perplexity of the model", ylabel="AUC", title=method)
        # Plain numbers: the default log labels are mathtext ("$10^{2}$"), shown raw with text.parse_math off.
        ax.xaxis.set_major_formatter(LogFormatter())
        ax.xaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.4)))
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def attack_styles(attacks: list[str]) -> dict[str, tuple[str, str]]:
    """A (colour, marker) per attack, each pair distinct, the same attack alike in every panel: matplotlib's ten
    default colours alone repeat from the eleventh attack (the tiny grids have 15)."""
    return {a: (f"C{i % 10}", MARKERS[(i // 10) % len(MARKERS)]) for i, a in enumerate(attacks)}


def setup_figures(runs: pd.DataFrame, store: Store) -> dict:
    """``{name: matplotlib figure}`` of one setup's runs (figures with nothing to plot left out); close them after.
    Every figure draws the runs of plain sampling of the documents but the utility figure, which also places each
    run at another decoding or of other prompts (the same model, so the same utility) as a point of its own."""
    part = plain_runs(runs)
    plt = _pyplot()
    figures = {"auc_ppl": auc_ppl(part, plt), "roc": roc(part, store, plt)}
    for attack in sorted(part["attack_name"].dropna().unique()):
        sweep = getattr(collect.plugin_class("attack", attack), "sweep", None)
        if sweep is not None:
            figures[plain_name(f"auc_vs_{attack}")] = auc_vs(part, attack, sweep, plt)
    figures["green_ratio"] = green_ratio(part, store, plt)
    figures["tpr_by_length"] = tpr_by_length(part, plt)
    figures["auc_utility"] = auc_utility(runs, store, plt)
    return {name: fig for name, fig in figures.items() if fig is not None}


def write_figures(df: pd.DataFrame, store: Store, out_dir: Path) -> list[Path]:
    """Every figure of every setup into ``<out>/<setup>/figures/``; return the paths written."""
    if df.empty:
        return []
    written: list[Path] = []
    for name, part in setups(df).items():
        folder = out_dir / plain_name(name) / "figures"
        for figure_name, fig in setup_figures(part, store).items():
            folder.mkdir(parents=True, exist_ok=True)
            written += _save(fig, folder, figure_name)
    return written


def png_bytes(fig) -> bytes:
    """A figure as PNG bytes (no timestamp: the same figure gives the same bytes), closed after."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()
