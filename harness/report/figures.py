"""The paper's figures from stored runs only (no model is loaded), as PNG and PDF: the AUC-PPL trade-off, ROC
curves, AUC against the SLERP ratio and against fine-tuning steps, and green-token ratios of the KGW methods.

Each figure plots what ``harness.tables.collect`` found for one setup; ROC curves and green ratios read the runs'
per-text scores. Files are byte-identical when rebuilt from the same store (no timestamps in them).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from harness.report.tables import _main, _tradeoff_settings, _value, method_rank, natural_key, setups, watermark_config
from harness.store.stages import Store


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 150, "font.size": 9, "svg.hashsalt": "harness"})
    return plt


def _save(fig, folder: Path, name: str) -> list[Path]:
    paths = [folder / f"{name}.png", folder / f"{name}.pdf"]
    fig.savefig(paths[0], metadata={"Software": None})
    fig.savefig(paths[1], metadata={"CreationDate": None, "Producer": None, "Creator": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


def _scores(store: Store, run: str) -> list[dict]:
    return [json.loads(line) for line in (store.root / run / "scores.jsonl").read_text().splitlines() if line]


def _methods(df: pd.DataFrame) -> list[str]:
    return sorted(df["method"].unique(), key=method_rank)


def auc_ppl(part: pd.DataFrame, plt):
    """AUC against median PPL of each method's configurations (unaltered), one line per method."""
    table = watermark_config(part)
    if table.empty:
        return None
    names = dict(zip(part["method"], part["method_name"], strict=False))
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    for method in _methods(table.reset_index()):
        points = table.loc[method].sort_values("PPL")
        ax.plot(points["PPL"], points["AUC"], marker="o", label=method)
        varied = _tradeoff_settings(names.get(method))
        for config, row in points.iterrows():
            short = ", ".join(p for p in config.split(", ") if p.split("=")[0] in varied) or config
            ax.annotate(short, (row["PPL"], row["AUC"]), fontsize=6, xytext=(3, -8), textcoords="offset points")
    ax.set(xlabel="median perplexity", ylabel="AUC", title="Detection vs quality (unaltered)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def roc(part: pd.DataFrame, store: Store, plt):
    """ROC curve of each method's main configuration, unaltered, from its stored per-text scores."""
    from sklearn.metrics import roc_curve

    runs = _main(part)
    runs = runs[runs["category"] == "Unaltered"]
    if runs.empty:
        return None
    fig, ax = plt.subplots(figsize=(3.6, 3.4))
    for method in _methods(runs):
        run = runs[runs["method"] == method].sort_values("seed")["run"].iloc[0]
        scores = _scores(store, run)
        fpr, tpr, _ = roc_curve([s["label"] for s in scores], [s["score"] for s in scores], drop_intermediate=False)
        auc = runs[runs["method"] == method]["AUC"].iloc[0]
        ax.plot(fpr, tpr, label=f"{method} (AUC {auc:.3f})")
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=0.8)
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (unaltered)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def auc_vs_slerp(part: pd.DataFrame, plt):
    """AUC against the SLERP ratio t (t = 0: the watermarked model itself), with bootstrap intervals."""
    runs = _main(part)
    merged = runs[runs["attack_name"] == "slerp"]
    if merged.empty:
        return None
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    for method in _methods(merged):
        mine = runs[runs["method"] == method]
        points = [(0.0, r) for r in mine[mine["category"] == "Unaltered"].itertuples()]
        points += [(_value(r.attack_params, "t"), r) for r in mine[mine["attack_name"] == "slerp"].itertuples()]
        points.sort(key=lambda p: p[0])
        t = np.array([p[0] for p in points])
        auc = np.array([p[1].AUC for p in points])
        err = np.array([[p[1].AUC - p[1].AUC_lo for p in points], [p[1].AUC_hi - p[1].AUC for p in points]])
        ax.errorbar(t, auc, yerr=err, marker="o", capsize=2, label=method)
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=0.8)
    ax.set(xlabel="SLERP t (weight of the unwatermarked base)", ylabel="AUC", title="Merging with the base")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def auc_vs_finetune(part: pd.DataFrame, plt):
    """AUC against fine-tuning steps (step 0: the unaltered model), one panel per fine-tuning dataset."""
    runs = _main(part)
    tuned = runs[runs["category"] == "Finetuning"]
    if tuned.empty:
        return None
    datasets = sorted(tuned["attack"].unique())
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.2), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        for method in _methods(tuned):
            mine = runs[runs["method"] == method]
            points = [(0, r.AUC) for r in mine[mine["category"] == "Unaltered"].itertuples()]
            points += [
                (int(natural_key(r.attack_config)[-1][1]), r.AUC)
                for r in mine[(mine["category"] == "Finetuning") & (mine["attack"] == dataset)].itertuples()
            ]
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=0.8)
        ax.set(xlabel="fine-tuning steps", ylabel="AUC", title=f"Fine-tuning on {dataset}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def green_ratio(part: pd.DataFrame, store: Store, plt):
    """Histograms of the green-token share of generated and human texts under each KGW method's main configuration
    (unaltered): runs whose scores count green tokens."""
    runs = _main(part)
    runs = runs[runs["category"] == "Unaltered"]
    panels = []
    for method in _methods(runs):
        run = runs[runs["method"] == method].sort_values("seed")["run"].iloc[0]
        scores = [s for s in _scores(store, run) if s.get("scored")]
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


def write_figures(df: pd.DataFrame, store: Store, out_dir: Path) -> list[Path]:
    """Every figure of every setup into ``<out>/<setup>/figures/``; return the paths written."""
    if df.empty:
        return []
    plt = _pyplot()
    written: list[Path] = []
    for name, part in setups(df).items():
        folder = out_dir / name / "figures"
        figures = {
            "auc_ppl": auc_ppl(part, plt),
            "roc": roc(part, store, plt),
            "auc_vs_slerp": auc_vs_slerp(part, plt),
            "auc_vs_finetune": auc_vs_finetune(part, plt),
            "green_ratio": green_ratio(part, store, plt),
        }
        for figure_name, fig in figures.items():
            if fig is not None:
                folder.mkdir(parents=True, exist_ok=True)
                written += _save(fig, folder, figure_name)
    return written
