"""``harness report``: one self-contained HTML page of a run store, to open from disk in any browser.

Built from the store alone (no model loads), like the tables: per setup, a heatmap of AUC and TPR@1% of each method's
main configuration under every attack (the paper's colour rule), every other configuration's runs, the figures (ROC
curves, AUC against each attack's strength, TPR by text length, ...) embedded as PNG data, tokens to detect, the
attribution matrix, and every run's spec, versions and timings one click away. A cell with no stored run says so. No
script, stylesheet or font is fetched: the page needs no network.

A store may come from someone else, so every string read from it (run folder names, labels, settings, specs) is
escaped for where it lands: ``esc`` for text and attribute values, ``href`` for links. The page has no script of its
own, and every link is to a place in the page (``#...``), so no scheme (``javascript:``) can be put in one.
"""

from __future__ import annotations

import base64
import html
import json
import urllib.parse
from pathlib import Path

import pandas as pd

from harness.report.collect import MISSING, category_rank, main_runs, method_rank, natural_key, plugin_class, setups
from harness.report.latex import colour
from harness.store import files
from harness.store.stages import Store

COLOURS = {"green": "#b9e3b2", "yellow": "#fbefa8", "red": "#f2b8b5"}  # the paper's rule: >= 0.8, < 0.7, between
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; padding: 0 1.5em; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: center; }
th.row, td.row { text-align: left; }
td.missing { color: #999; font-style: italic; }
td a { color: inherit; text-decoration: none; }
figure { display: inline-block; margin: 0 1em 1em 0; vertical-align: top; }
figure img { max-width: 560px; border: 1px solid #eee; }
details { margin: 2px 0; } summary { cursor: pointer; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 12px; }
.legend span { padding: 1px 8px; margin-right: 6px; }
"""


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def esc(value) -> str:
    """``value`` as HTML text or a quoted attribute's value: ``&``, ``<``, ``>``, ``"`` and ``'`` escaped."""
    return html.escape(str(value), quote=True)


def href(anchor: str) -> str:
    """An ``href`` attribute's value linking to the element whose ``id`` is ``esc(anchor)``: a fragment, percent-encoded
    (a browser decodes it to find the id), so it never starts a scheme and holds no quote; plain names are unchanged."""
    return esc("#" + urllib.parse.quote(anchor, safe=""))


RUN_ORDER = ["method", "method_config", "category", "attack", "attack_config"]  # the order runs are listed in


def attack_label(attack: str, config: str) -> str:
    return f"{attack} {config}".strip() or "unaltered"


def heatmap(part: pd.DataFrame) -> str:
    """Rows: every attack row stored for a main configuration; columns: methods x (AUC, TPR@1%). Each cell links to
    its run; a cell with no stored run says so."""
    runs = main_runs(part).sort_values("seed")
    methods = sorted(runs["method"].unique(), key=method_rank)
    rows = sorted({(r.category, r.attack, r.attack_config) for r in runs.itertuples()},
                  key=lambda r: (category_rank(r[0]), natural_key(r[1]), natural_key(r[2])))  # fmt: skip
    head = "".join(f'<th colspan="2">{esc(m)}</th>' for m in methods)
    out = ['<table class="heatmap">', f'<tr><th class="row">category</th><th class="row">attack</th>{head}</tr>',
           "<tr><th></th><th></th>" + "<th>AUC</th><th>TPR@1%</th>" * len(methods) + "</tr>"]  # fmt: skip
    for category, attack, config in rows:
        cells = []
        for method in methods:
            hit = runs[(runs["method"] == method) & (runs["category"] == category) & (runs["attack"] == attack)
                       & (runs["attack_config"] == config)]  # fmt: skip
            if hit.empty:
                cells.append(f'<td class="missing" colspan="2">{MISSING}</td>')
                continue
            auc, tpr, run = hit["AUC"].mean(), hit["TPR@1%"].mean(), hit["run"].iloc[0]
            seeds = f" (mean of {len(hit)} seeds)" if len(hit) > 1 else ""
            style, title = f' style="background:{COLOURS[colour(auc)]}"', esc(f"run {run}{seeds}")
            cells.append(f'<td class="cell"{style} title="{title}"><a href="{href("run-" + run)}">{auc:.3f}</a></td>'
                         f"<td>{tpr:.3f}</td>")  # fmt: skip
        label = attack_label(attack, config)
        out.append(f'<tr><td class="row">{esc(category)}</td><td class="row">{esc(label)}</td>{"".join(cells)}</tr>')
    out.append("</table>")
    rule = (("green", "AUC >= 0.8"), ("yellow", "0.7 <= AUC < 0.8"), ("red", "AUC < 0.7"))
    legend = "".join(f'<span style="background:{COLOURS[c]}">{t}</span>' for c, t in rule)
    return "\n".join(out) + f'<p class="legend">{legend}</p>'


def detection_scores(part: pd.DataFrame) -> str:
    """Which score each method that offers several (``WatermarkMethod.score_setting``: PRO's paper and centred scores)
    reads in this setup's rows, as their settings say."""
    out = []
    for name, runs in part.groupby("method_name", sort=True):
        cls = plugin_class("method", name)
        if cls is None or cls.score_setting is None:
            continue
        setting, readings = cls.score_setting
        default = cls.Params.model_fields[setting].default
        counts = runs["params"].map(lambda p, s=setting, d=default: json.loads(p).get(s, d)).value_counts()
        said = "; ".join(f"{plural(int(n), 'run')} with {esc(readings.get(k, k))}" for k, n in counts.items())
        out.append(f"<p>{esc(runs['method'].iloc[0])}'s rows: {said}. A row with another score than "
                   f"{esc(readings.get(default, default))} says so in its configuration.</p>")  # fmt: skip
    return "\n".join(out)


def other_configurations(part: pd.DataFrame) -> str:
    """Every run of a configuration that is not its method's main one (other settings, ablations), a row each with
    its AUC linked to its run: the heatmap shows main configurations only, and every stored cell belongs on the page."""
    others = part[~part["run"].isin(main_runs(part)["run"])]
    if others.empty:
        return "<p>none stored</p>"
    out = ['<table class="others">', "<tr><th>method</th><th>configuration</th><th>attack</th><th>AUC</th>"
           "<th>TPR@1%</th></tr>"]  # fmt: skip
    for _, r in others.sort_values(RUN_ORDER).iterrows():
        attack = attack_label(r["attack"], r["attack_config"])
        link = f'<a href="{href("run-" + r["run"])}">{r["AUC"]:.3f}</a>'
        out.append(f"<tr><td>{esc(r['method'])}</td><td>{esc(r['method_config'])}</td><td>{esc(attack)}</td>"
                   f"<td>{link}</td><td>{r['TPR@1%']:.3f}</td></tr>")  # fmt: skip
    out.append("</table>")
    return "\n".join(out)


def frame(table: pd.DataFrame) -> str:
    if table.empty:
        return "<p>none stored</p>"
    return table.to_html(float_format=lambda v: f"{v:.3f}", na_rep=MISSING, border=0, escape=True)


def figures(part: pd.DataFrame, store: Store) -> str:
    from harness.report.figures import png_bytes, setup_figures

    out = []
    for name, fig in setup_figures(part, store).items():
        data = base64.b64encode(png_bytes(fig)).decode()
        out.append(f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{data}"><figcaption>{esc(name)}'
                   "</figcaption></figure>")  # fmt: skip
    return "\n".join(out) or "<p>no figure: nothing stored to plot</p>"


def run_details(part: pd.DataFrame, store: Store) -> str:
    out = []
    for r in part.sort_values(RUN_ORDER).itertuples():
        folder = store.root / r.run
        spec = json.loads((folder / "spec.json").read_text())
        manifest = json.loads((folder / "manifest.json").read_text())
        about = {k: manifest.get(k) for k in ("started", "seconds", "git_sha", "host", "versions", "report")}
        label = f"{r.method} ({r.method_config}) / {attack_label(r.attack, r.attack_config)}"
        out.append(f'<details id="run-{esc(r.run)}"><summary>{esc(label)}: AUC {r.AUC:.3f}, run {esc(r.run)}'
                   f"</summary><pre>{esc(json.dumps(spec, indent=1))}</pre><pre>{esc(json.dumps(about, indent=1))}"
                   "</pre></details>")  # fmt: skip
    return "\n".join(out)


def page(df: pd.DataFrame, store: Store, attributions: pd.DataFrame | None) -> str:
    """The whole page."""
    from harness.report.frames import attribution, tokens_to_detect

    body = [
        f"<h1>Watermark robustness: {esc(store.root)}</h1>",
        f"<p>{plural(len(df), 'stored run')} in {plural(len(setups(df)), 'setup')}. Every number below is read from "
        "the store.</p>",
    ]
    for name, part in setups(df).items():
        body += [
            f'<h2 id="setup-{esc(name)}">{esc(name)}: {esc(part["base_model"].iloc[0])}, preset '
            f"{esc(part['preset'].iloc[0])}</h2>",
            "<h3>AUC and TPR at 1% FPR of each method's main configuration</h3>",
            heatmap(part),
            detection_scores(part),
            "<h3>Other configurations (settings, ablations)</h3>",
            other_configurations(part),
            "<h3>Figures</h3>",
            figures(part, store),
            "<h3>Tokens to detect (1% FPR)</h3>",
            frame(tokens_to_detect(part)),
        ]  # fmt: skip
        mine = (
            None
            if attributions is None or attributions.empty
            else attributions[attributions["setup"] == part["setup"].iloc[0]]
        )
        if mine is not None and len(mine):
            body += ["<h3>Attribution (share of each model's texts flagged at 1% FPR)</h3>", frame(attribution(mine))]
        body += ["<h3>Runs (spec, versions, timings)</h3>", run_details(part, store)]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>harness report</title>'
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")  # fmt: skip


def write_report(store: Store, out: Path) -> Path:
    from harness.report.collect import collect, collect_attribution

    df = collect(store)
    if df.empty:
        from harness.config.errors import HarnessError

        raise HarnessError(f"no finished runs in '{store.root}' that could be read")
    files.write_atomic(out, page(df, store, collect_attribution(store)))  # whole or not at all: never a cut page
    return out
