"""``harness report``: one self-contained HTML page of a run store, to open from disk in any browser.

Built from the store alone (no model loads), like the tables: per setup, the sections of the declared tables
(``tables.TABLES``: tab:robustness as a heatmap at the top; tokens to detect and the attribution matrix after the
figures), which score each method reads, every other configuration's runs, the figures (ROC curves, AUC against each
attack's strength, TPR by text length, ...) embedded as PNG data, and every run's spec, versions and timings one click
away. A cell with no stored run says so. No script, stylesheet or font is fetched: the page needs no network. Every
string read from the store is escaped where it lands (``html``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.report.collect import plain_runs, setups
from harness.report.html import STYLE, detection_scores, esc, figures, other_configurations, plural, run_details
from harness.report.tables import TABLES, Setup
from harness.store import files
from harness.store.stages import Store


def table_sections(setup: Setup, place: str) -> list[str]:
    """The sections of the declared tables whose ``Section.place`` is ``place``, in declaration order (headings are
    the declarations' own text, not the store's). A declaration that makes a table per subject (an attack's curve,
    spoofing or declared table) names each under its heading, by its file and its caption (escaped: a plugin's and
    the store's text), as several would otherwise stand under one heading with nothing to tell them apart."""
    out = []
    for table in TABLES:
        if table.section is not None and table.section.place == place:
            for file, subject in table.subjects(setup):
                rendered = table.section.render(table.build(setup, subject), setup.every_run)
                if table.each is None:
                    out += [f"<h3>{table.section.heading}</h3>", rendered]
                else:
                    named = f"<h3>{table.section.heading}: <code>{esc(file)}</code></h3>"
                    out += [named, f"<p>{esc(table.caption(setup, subject))}</p>", rendered]
    return out


def page(df: pd.DataFrame, store: Store, attributions: pd.DataFrame | None) -> str:
    """The whole page."""
    body = [
        f"<h1>Watermark robustness: {esc(store.root)}</h1>",
        f"<p>{plural(len(df), 'stored run')} in {plural(len(setups(df)), 'setup')}. Every number below is read from "
        "the store.</p>",
    ]
    for name, part in setups(df).items():
        mine = (
            None
            if attributions is None or attributions.empty
            else attributions[attributions["setup"] == part["setup"].iloc[0]]
        )
        everything, part = part, plain_runs(part)  # (other decodings and prompts: their tables' rows)
        setup = Setup(part, attributions=mine, page=True, store=store, everything=everything)
        body += [
            f'<h2 id="setup-{esc(name)}">{esc(name)}: {esc(part["base_model"].iloc[0])}, preset '
            f"{esc(part['preset'].iloc[0])}</h2>",
            *table_sections(setup, "head"),
            detection_scores(part),
            "<h3>Other configurations (settings, ablations)</h3>",
            other_configurations(part),
            "<h3>Figures</h3>",
            figures(everything, store),
            *table_sections(setup, "tail"),
            "<h3>Runs (spec, versions, timings)</h3>",
            run_details(everything, store),
        ]  # fmt: skip
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
