"""HTML of the pieces of ``harness report``'s page (``harness.report.page``): a declared table's section (the heatmap
of tab:robustness, a plain frame), which score each method reads, the other configurations' runs, the figures as
embedded PNG data, and each run's spec, versions and timings.

The heatmap is tab:robustness's own frame (``tables.TABLES``), so it shows the table's TPR at 5% FPR beside each AUC;
before the tables were declared once it rebuilt the rows itself and showed TPR at 1% FPR, the one change of the page
that came with it. Its rows are every row stored for a main configuration (the base model's reference rows and the
other tables' attacks too: every stored cell belongs on the page), each AUC coloured by the paper's rule
(``latex.colour``) and linked to its run.

A store may come from someone else, so every string read from it (run folder names, labels, settings, specs) is
escaped for where it lands: ``esc`` for text and attribute values, ``href`` for links. The page has no script of its
own, and every link is to a place in the page (``#...``), so no scheme (``javascript:``) can be put in one.
"""

from __future__ import annotations

import base64
import html
import json
import urllib.parse

import pandas as pd

from harness.config.errors import printable
from harness.config.gate import DEGENERATE, OK
from harness.report.collect import (
    DOCUMENTS,
    MISSING,
    NOT_APPLICABLE,
    PLAIN_DECODING,
    documents_runs,
    main_runs,
    plain_runs,
    plugin_class,
    prompts_runs,
    use_labels,
)
from harness.report.latex import colour, colour_legend
from harness.store.stages import Store

COLOURS = {"green": "#b9e3b2", "yellow": "#fbefa8", "red": "#f2b8b5"}  # how the page shades ``latex.colour``'s colours
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; padding: 0 1.5em; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: center; }
th.row, td.row { text-align: left; }
td.missing { color: #999; font-style: italic; }
.degenerate { background: repeating-linear-gradient(45deg, #eee, #eee 4px, #fff 4px, #fff 8px); color: #777; }
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
    """``value`` as HTML text or a quoted attribute's value: ``&``, ``<``, ``>``, ``"`` and ``'`` escaped, and every
    control character or bidi override shown as its escape (``\u202e`` would reorder what the reader sees)."""
    return html.escape(printable(str(value), keep="\n\t"), quote=True)


def href(anchor: str) -> str:
    """An ``href`` attribute's value linking to the element whose ``id`` is ``esc(anchor)``: a fragment, percent-encoded
    (a browser decodes it to find the id), so it never starts a scheme and holds no quote; plain names are unchanged."""
    return esc("#" + urllib.parse.quote(anchor, safe=""))


RUN_ORDER = ["method", "method_config", "category", "attack", "attack_config"]  # the order runs are listed in


def attack_label(attack: str, config: str) -> str:
    return f"{attack} {config}".strip() or "unaltered"


def heatmap(table: pd.DataFrame, part: pd.DataFrame) -> str:
    """tab:robustness (``frames.robustness``) as the page shows it: its rows, its methods x (AUC, TPR@5%), each AUC
    coloured by the paper's rule and linked to its run in ``part`` (the first seed's; with several seeds its title
    gives the AUC's interval over them); a cell with no stored run says so."""
    runs: dict[tuple, list[str]] = {}  # (method, category, attack, setting) -> its runs, by seed
    for r in main_runs(plain_runs(part)).sort_values("seed").itertuples():  # (tab:robustness samples plainly)
        runs.setdefault((r.method, r.category, r.attack, r.attack_config), []).append(r.run)
    methods = [] if table.empty else list(dict.fromkeys(table.columns.get_level_values(0)))
    head = "".join(f'<th colspan="2">{esc(m)}</th>' for m in methods)
    out = ['<table class="heatmap">', f'<tr><th class="row">category</th><th class="row">attack</th>{head}</tr>',
           "<tr><th></th><th></th>" + "<th>AUC</th><th>TPR@5%</th>" * len(methods) + "</tr>"]  # fmt: skip
    for (category, attack, config), row in table.iterrows():
        cells = []
        for method in methods:
            cell = runs.get((method, category, attack, config))
            if not cell and isinstance(row[(method, "AUC")], str) and row[(method, "AUC")] == NOT_APPLICABLE:
                why = esc(f"{method} watermarks at decoding time, not in the weights: this attack does not apply")
                cells.append(f'<td class="missing" colspan="2" title="{why}">{NOT_APPLICABLE}</td>')
                continue
            if not cell:
                cells.append(f'<td class="missing" colspan="2">{MISSING}</td>')
                continue
            auc, tpr = row[(method, "AUC")], row[(method, "TPR@5")]
            seeds = ""
            if len(cell) > 1:
                lo, hi = (row.get((method, f"AUC_seed_{end}"), float("nan")) for end in ("lo", "hi"))
                seeds = f" (mean of {len(cell)} seeds; AUC over seeds [{lo:.3f}, {hi:.3f}])"
            style, title = f' style="background:{COLOURS[colour(auc)]}"', esc(f"run {cell[0]}{seeds}")
            quality = row.get((method, "quality"), OK)
            if quality == DEGENERATE:  # its texts no longer count as writing: shown, never coloured as a result
                style, title = ' class="degenerate"', esc(f"degenerate text (the quality gate; runs.csv says why): "
                                                          f"run {cell[0]}{seeds}")  # fmt: skip
            cells.append(f'<td class="cell"{style} title="{title}"><a href="{href("run-" + cell[0])}">{auc:.3f}</a>'
                         f"{'&#8224;' if quality == DEGENERATE else ''}</td><td>{tpr:.3f}</td>")  # fmt: skip
        label = attack_label(attack, config)
        out.append(f'<tr><td class="row">{esc(category)}</td><td class="row">{esc(label)}</td>{"".join(cells)}</tr>')
    out.append("</table>")
    legend = "".join(f'<span style="background:{COLOURS[c]}">{t}</span>' for c, t in colour_legend())
    legend += '<span class="degenerate">&#8224; degenerate text: outside the quality gate, never ranked</span>'
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


def decoding(table: pd.DataFrame, part: pd.DataFrame) -> str:
    """The decoding table (``frames.decoding``) as the page shows it: its rows and columns, each AUC linked to its run
    in ``part`` (the first seed's), as the heatmap links its cells, so that every stored run is reached from a
    number."""
    runs = documents_runs(part)
    return _linked(table, runs, runs["decoding"].replace("", PLAIN_DECODING), "decoding")


def prompts(table: pd.DataFrame, part: pd.DataFrame) -> str:
    """The prompts table (``frames.prompts``) as the page shows it, each AUC linked to its run as in ``decoding``."""
    runs = prompts_runs(part)
    return _linked(table, runs, use_labels(runs).replace("", DOCUMENTS), "prompts")


def _linked(table: pd.DataFrame, part: pd.DataFrame, labels: pd.Series, css: str) -> str:
    """``table`` (rows keyed by (``labels``' label, category, attack, setting), columns ``<method> <metric>``) with
    each AUC linked to the first seed's run of its key in ``part``."""
    if table.empty:
        return "<p>none stored</p>"
    runs: dict[tuple, str] = {}  # (method, label, category, attack, setting) -> its first seed's run
    for r in main_runs(part.assign(use_label=labels)).sort_values("seed").itertuples():
        runs.setdefault((r.method, r.use_label, r.category, r.attack, r.attack_config), r.run)
    head = "".join(f"<th>{esc(name)}</th>" for name in [*table.index.names, *table.columns])
    out = [f'<table class="{css}">', f"<tr>{head}</tr>"]
    for key, row in table.iterrows():
        cells = [f'<td class="row">{esc(k)}</td>' for k in key]
        for column in table.columns:
            method, metric = column.rsplit(" ", 1)
            value, run = row[column], runs.get((method, *key))
            shown = ".1f" if metric == "tokens_to_detect" else ".3f"  # (a count of tokens, a median over texts)
            text = f"{value:{shown}}" if isinstance(value, float) and value == value else MISSING
            if metric == "AUC" and run is not None and text != MISSING:
                text = f'<a href="{href("run-" + run)}">{text}</a>'
            cells.append(f"<td>{text}</td>")
        out.append(f"<tr>{''.join(cells)}</tr>")
    out.append("</table>")
    return "\n".join(out)


def frame(table: pd.DataFrame) -> str:
    if table.empty:
        return "<p>none stored</p>"
    shown = lambda v: printable(v, keep="\n") if isinstance(v, str) else v  # noqa: E731  (as ``esc`` shows text)
    table = table.map(shown).rename(index=shown, columns=shown)
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
        try:  # (what a run says of its making; its numbers are read and checked before, in collect)
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError, RecursionError):
            manifest = None
        manifest = manifest if isinstance(manifest, dict) else {}
        about = {k: manifest.get(k) for k in ("started", "seconds", "git_sha", "host", "versions", "report")}
        if "peak_memory" in manifest:  # (runs made before peaks were recorded have none)
            about["peak_memory"] = manifest["peak_memory"]
        label = f"{r.method} ({r.method_config}) / {attack_label(r.attack, r.attack_config)}"
        out.append(f'<details id="run-{esc(r.run)}"><summary>{esc(label)}: AUC {r.AUC:.3f}, run {esc(r.run)}'
                   f"</summary><pre>{esc(json.dumps(spec, indent=1))}</pre><pre>{esc(json.dumps(about, indent=1))}"
                   "</pre></details>")  # fmt: skip
    return "\n".join(out)
