"""Every table of the paper from stored runs only (no model is loaded), as CSV and LaTeX, and its section of the
report's page: each table is one declaration (``Table``) in ``TABLES``, which says its file, what it holds, how its
frame is built (``frames``) and printed (``latex``), its caption, how plugins join it and its section of ``harness
report``. ``setup_tables`` and ``write_tables`` make every declared table of each setup (``collect.setups``); a table
with no stored run is left out, and a cell with no stored run is written as missing ("--" in LaTeX). AUCs are
coloured by the paper's rule (``latex.colour``).

The tables, in their declaration order (this list is made from ``TABLES``):
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from harness.contract.plugin import ABLATION_LAYOUTS, ATTACK_TABLES
from harness.report import frames, html, latex
from harness.report.collect import (
    MISSING,
    NOT_APPLICABLE,
    TPRS,
    attack_tables,
    decoding_time_methods,
    documents_runs,
    in_table,
    main_runs,
    method_rank,
    plain_runs,
    plugin_class,
    setups,
)
from harness.store import files
from harness.store.files import plain_name
from harness.store.stages import Store

log = logging.getLogger(__name__)

# How plugins join a table (``Table.joined_by``): the field that names it, and the names that field may hold
# (harness/contract/plugin.py, where plugin classes check them as they are defined).
JOINED_BY = {"Attack.tables": ATTACK_TABLES, "Ablation.layout": ABLATION_LAYOUTS}


@dataclass(frozen=True, eq=False)
class Setup:
    """One setup's runs as its tables see them, with what their captions say of them."""

    part: pd.DataFrame  # the setup's runs (``collect.setups``)
    ci: bool = False  # the bootstrap interval of each AUC as columns (``harness tables --ci``)
    attributions: pd.DataFrame | None = None  # the setup's attribution rows (``collect.collect_attribution``)
    page: bool = False  # for the report's page, where every stored cell belongs (``frames.robustness``'s every_row)
    store: Store | None = None  # where the runs' per-text scores are (tab:comparison reads them; none: no such table)
    # The setup's runs at every decoding and of every prompts (``part``: plain sampling's of the documents alone).
    everything: pd.DataFrame | None = None

    @property
    def every_run(self) -> pd.DataFrame:
        """The setup's runs at every decoding and of every prompts (``part`` where none was given)."""
        return self.everything if self.everything is not None else self.part

    @cached_property
    def classes(self) -> dict[str, Any]:
        """``{method label: its class}`` (None where the method is not installed here)."""
        part = self.part
        return {label: plugin_class("method", name) for label, name in zip(part["method"], part["method_name"],
                                                                            strict=True)}  # fmt: skip

    def methods(self) -> list[str]:
        """The labels of the setup's installed methods, in the tables' order."""
        return sorted((label for label, cls in self.classes.items() if cls is not None), key=method_rank)

    @cached_property
    def about(self) -> str:
        """What every caption says of the runs: base model, preset, and the seeds averaged (naming, in a warning, the
        cells stored for fewer)."""
        part = self.part
        seeds = sorted(part["seed"].unique())
        about = f"{part['base_model'].iloc[0]}, preset {part['preset'].iloc[0]}"
        judges = sorted(j for j in part["judge"].dropna().unique()) if "judge" in part else []
        if judges:  # the model whose perplexity PPL is (the paper's: LLaMA-2-13B, another family than the marked one)
            about += f", PPL judged by {' and '.join(judges)}"
            if part["base_model"].iloc[0] in judges:  # a judge that rewards collapse toward its own favourite tokens
                about += " (the base model itself, not an independent judge)"
        if len(seeds) > 1:
            about += f", mean over seeds {', '.join(map(str, seeds))}"
            short = _cells_short_of_seeds(part, seeds)
            if short:
                about += f" where stored ({len(short)} cells have fewer)"
                log.warning("%d cells average fewer than the %d seeds stored (%s): %s", len(short), len(seeds),
                            ", ".join(map(str, seeds)), "; ".join(short[:5]))  # fmt: skip
        return about

    @cached_property
    def matched(self) -> pd.DataFrame:
        """The setup's runs of the methods a stored calibration chose a configuration for, that configuration as their
        main one (``collect.calibrated``): what the tables at matched quality read; empty where none is stored."""
        part = self.part
        if "calibrated" not in part or not part["calibrated"].any():
            return part.iloc[:0]
        part = part[part["method_name"].isin(set(part[part["calibrated"]]["method_name"]))]
        return part.assign(main=part["calibrated"])

    @cached_property
    def outside_budget(self) -> dict[str, str]:
        """Method label -> why its calibrated configuration is never ranked at matched quality: its calibration chose
        it outside the budget (``over_budget: closest``)."""
        part = self.matched
        if part.empty:
            return {}
        return {r.method: r.over_budget for r in part[part["calibrated"]].itertuples() if r.over_budget}

    def gate(self) -> str:
        """The quality gate of the setup's runs, in words (``harness.config.gate``)."""
        from harness.config.gate import QualityGate

        stated = sorted(self.part["quality_gate"].unique()) if "quality_gate" in self.part else ["{}"]
        return "; ".join(QualityGate(**json.loads(g)).describe() for g in stated)

    def configs(self) -> str:
        """Each method's main configuration, for tab:robustness's caption; and why the cells of decoding-time methods
        under model modifications are empty, where the setup has one."""
        mains = sorted({(r.method, r.method_config) for r in main_runs(self.part).itertuples()},
                       key=lambda mc: method_rank(mc[0]))  # fmt: skip
        text = "; ".join(f"{m}: {c}" for m, c in mains)
        decoding = decoding_time_methods(self.part)
        if decoding:
            text += (f". {', '.join(decoding)} watermark at decoding time, not in the weights: model modifications do "
                     f"not apply to them, so their cells under those rows say {NOT_APPLICABLE}")  # fmt: skip
        return text


def _outside(setup: Setup) -> str:
    """The caption's words on the methods whose calibration met no budget (none: "")."""
    found = sorted(setup.outside_budget.items(), key=lambda mw: method_rank(mw[0]))
    return "".join(f"; {m}: {why}" for m, why in found)


def _configs(part: pd.DataFrame) -> str:
    """Each method's main configuration in ``part``, as a caption names them."""
    mains = sorted(
        {(r.method, r.method_config) for r in main_runs(part).itertuples()}, key=lambda mc: method_rank(mc[0])
    )
    return "; ".join(f"{m}: {c}" for m, c in mains)


def _cells_short_of_seeds(part: pd.DataFrame, seeds: list) -> list[str]:
    """The main-configuration cells (method x attack setting) stored for fewer than all of ``seeds``."""
    runs = main_runs(part)
    counts = runs.groupby(["method", "attack", "attack_config"], sort=True)["seed"].nunique()
    return [f"{m} x {(a + ' ' + c).strip() or 'unaltered'} ({n} of {len(seeds)})" for (m, a, c), n in counts.items()
            if n < len(seeds)]  # fmt: skip


@dataclass(frozen=True)
class Section:
    """A table's section of the report's page: ``heading`` over ``render(table, runs)`` (HTML; ``runs``: the setup's at
    every decoding and of every prompts, for links to them), at the top of the setup (``place`` "head") or after its
    figures ("tail")."""

    heading: str
    render: Callable[[pd.DataFrame, pd.DataFrame], str]
    place: str


@dataclass(frozen=True, eq=False)
class Table:
    """One table: everything the CSV, the LaTeX and the report's section are made from. A declaration makes one table
    per setup (file ``name``), or one per subject that ``each`` lists (an attack, a method's ablation)."""

    name: str  # its file in the setup's folder (<name>.csv, .tex) unless ``each`` names them; how plugins join it
    label: str  # the paper's label
    holds: str  # what it holds, in a line
    build: Callable[[Setup, Any], pd.DataFrame]  # its frame for a setup and subject
    latex: Callable[[pd.DataFrame, str, Any], str]  # its LaTeX from its frame, caption and subject
    caption: Callable[[Setup, Any], str]
    each: Callable[[Setup], list[tuple[str, Any]]] | None = None  # (file, subject) of each of its tables in a setup
    joined_by: str | None = None  # a key of ``JOINED_BY``: plugins name it there (``name``) to have rows in it
    section: Section | None = None

    def subjects(self, setup: Setup) -> list[tuple[str, Any]]:
        """``(file, subject)`` of each of its tables in ``setup``."""
        return self.each(setup) if self.each is not None else [(self.name, None)]


# --- what each table is made of per setup, besides the setup itself ----------------------------------------------
def _attacks_joining(table: str, suffix: str = "") -> Callable[[Setup], list[tuple[str, str]]]:
    """``each`` of a table of its own per attack (``own``, ``curve``, ``flagged``): ``(file, attack)`` of each attack of
    the setup whose ``tables`` join ``table``, its file named after it plus ``suffix``."""

    def each(setup: Setup) -> list[tuple[str, str]]:
        names = sorted(n for n in setup.part["attack_name"].dropna().unique() if table in attack_tables(n))
        return [(f"{name}{suffix}", name) for name in names]

    return each


def _declared(setup: Setup) -> list[tuple[str, tuple]]:
    """``each`` of the tables attacks declare: ``(<attack>_<name>, (attack, its SettingTable))`` of each table each
    attack of the setup declares (``Attack.setting_tables``)."""
    found = []
    for name in sorted(setup.part["attack_name"].dropna().unique()):
        cls = plugin_class("attack", name)
        found += [(f"{name}_{spec.name}", (name, spec)) for spec in getattr(cls, "setting_tables", ())]
    return found


def _flagged_caption(setup: Setup, attack: str) -> str:
    cls = plugin_class("attack", attack)
    return (
        f"Texts no watermarked model wrote ({cls.description or cls.label}): the share each method's detector "
        f"flags at 1% and 5% FPR (thresholds set on human texts), and their AUC against human texts and against "
        f"the unwatermarked base's own texts, per setting, the base's own texts first ({setup.about})."
    )


def _flagged_matched_caption(setup: Setup, attack: str) -> str:
    """The spoofing table's caption, of the configurations a calibration chose: named where it names the setup."""
    caption = _flagged_caption(setup, attack).removesuffix(").")
    return (
        "At matched quality (the configuration each method's calibration chose before any attack): "
        f"{caption[0].lower()}{caption[1:]}; {_configs(setup.matched)}{_outside(setup)})."
    )


def _curve_caption(setup: Setup, attack: str) -> str:
    cls = plugin_class("attack", attack)
    sweep = getattr(cls, "sweep", None)
    what = sweep.xlabel if sweep is not None else "setting"
    control = (
        (
            ", and the AUC against the texts of the same modification of the unwatermarked base (its control: "
            "what survives beyond what the modification does to the scores)"
        )
        if getattr(cls, "controlled", False)
        else ""
    )
    return (f"AUC with its 95% bootstrap interval, TPR at 1% FPR, tokens to detect and median PPL of each method's "
            f"main configuration under {cls.description or cls.label}, per {what}, the unaltered model first"
            f"{control} ({setup.about}).")  # fmt: skip


def _comparison_caption(setup: Setup, matched: bool = False) -> str:
    """tab:comparison's caption; ``matched``: of the configurations a calibration chose (tab:comparison at matched
    quality)."""
    return (
        ("At matched quality: paired differences between methods (A - B) of the configurations their calibration chose"
         if matched else "Paired differences between methods (A - B)")
        + " under each model modification: AUC and TPR at 1% FPR against human texts, and AUC against the "
        "unwatermarked base's own texts of the same prompts (AUC vs base), 95% paired bootstrap intervals over prompts "
        "(the same prompts drawn for both methods)"
        + (", and 95% t-intervals over training seeds" if setup.part["seed"].nunique() > 1 else "")
        + f"; bold where every interval excludes zero ({setup.about})."
    )  # fmt: skip


def _featured(setup: Setup) -> list[tuple[str, str]]:
    return [("ft_steps", label) for label in setup.methods() if setup.classes[label].featured]


def _ablations(layout: str) -> Callable[[Setup], list[tuple[str, tuple]]]:
    """Each method's ablations of ``layout``: ``(file, (method label, Ablation))``."""

    def each(setup: Setup) -> list[tuple[str, tuple]]:
        return [(spec.file, (label, spec)) for label in setup.methods() for spec in setup.classes[label].ablations
                if spec.layout == layout]  # fmt: skip

    return each


def _attributions(setup: Setup) -> list[tuple[str, None]]:
    return [("attribution", None)] if setup.attributions is not None and len(setup.attributions) else []


def _decodings(setup: Setup) -> list[tuple[str, None]]:
    """The decoding table where the setup holds a run at another decoding than plain sampling (else no table and no
    section of the report: a store of plain runs reads as it always did)."""
    runs = documents_runs(setup.every_run)
    return [("decoding", None)] if "decoding" in runs and (runs["decoding"] != "").any() else []


def _prompts(setup: Setup) -> list[tuple[str, None]]:
    """The prompts table where the setup holds a run of other prompts than the preset's documents."""
    runs = setup.every_run
    return [("prompts", None)] if "prompts" in runs and (runs["prompts"] != "").any() else []


def _prompts_caption(setup: Setup) -> str:
    """The prompts table's caption: what each prompts label asked (from the setup's own settings)."""
    asked = sorted(label for label in setup.every_run["prompts"].unique() if label)
    what = {"code": "code continued (the preset's code_data: a low-entropy domain)",
            "chat": "instructions of the preset's chat_data through the model's chat template (the harness's own "
                    "models: the fine-tuning attack's instruction format), scored against the human answers' first "
                    "tokens"}  # fmt: skip
    named = "; ".join(f"{label}: {what.get(label.split(' ')[0].rstrip(','), label)}" for label in asked)
    return (
        "AUC with its 95% bootstrap interval, TPR at 1% FPR, tokens to detect and median PPL of each method's main "
        f"configuration when its models are asked otherwise than to continue the preset's documents ({named}), the "
        "same prompts for the unwatermarked base (whose TPR at 1% is the share of its texts flagged)"
        + (
            "; dAUC: the change from the documents, with a 95% interval from a bootstrap of each run's texts on its "
            "own (other prompts and human texts: no pairing)"
            if setup.store is not None
            else ""
        )
        + f" ({setup.about})."
    )


def _own_caption(setup: Setup, attack: str) -> str:
    cls = plugin_class("attack", attack)
    return f"AUC under {cls.description or cls.label} ({setup.about})."


def _steps_caption(setup: Setup, label: str) -> str:
    steps = setup.part[in_table(setup.part, "ft_steps")]["attack_name"].dropna().unique()
    what = " and ".join(dict.fromkeys(plugin_class("attack", n).description or n for n in steps))
    return f"{label} under {what}, with its difference to the best other method ({setup.about})."


TABLES: tuple[Table, ...] = (
    Table(
        "robustness",
        "tab:robustness",
        "AUC, TPR at 5% FPR and median PPL of each method's main configuration under the model modifications of the "
        "attacks that join it, in row groups by category",
        build=lambda setup, _: frames.robustness(setup.part, setup.ci, every_row=setup.page),
        latex=lambda table, caption, _: latex.robustness_tex(table, caption),
        caption=lambda setup, _: (
            f"AUC, TPR at 5% FPR and median PPL{frames.ppl_note(setup.part, setup.page)} under model modifications, "
            f"with PPL over the unwatermarked base's, the AUC against the base's own texts and the quality gate's "
            f"verdict ({setup.gate()}; a degenerate row is never ranked) ({setup.about}; {setup.configs()})."
        ),
        joined_by="Attack.tables",
        # On the page, every row stored for a main configuration (the base's reference rows and other tables'
        # attacks too), as a heatmap whose cells link to their runs.
        section=Section("AUC and TPR at 5% FPR of each method's main configuration", html.heatmap, "head"),
    ),
    Table(
        "matched",
        "tab:robustness at matched quality",
        "tab:robustness of the configurations a calibration chose (each method's strength picked on the unaltered "
        "model by its grid's rule, before any attack)",
        build=lambda setup, _: pd.DataFrame() if setup.matched.empty else frames.robustness(setup.matched, setup.ci),
        latex=lambda table, caption, _: latex.robustness_tex(table, caption),
        caption=lambda setup, _: (
            "At matched quality: AUC, TPR at 5% FPR and median PPL under model modifications of the configuration each "
            "method's calibration chose on the unaltered model before any attack (the grid's rule; harness grid "
            f"prints the sweep), with PPL over the base's, the AUC against the base's own texts and the quality gate's "
            f"verdict ({setup.gate()}) ({setup.about}; {_configs(setup.matched)}){_outside(setup)}."
        ),
    ),
    Table(
        "matched_comparison",
        "tab:comparison at matched quality",
        "tab:comparison of the configurations a calibration chose",
        build=lambda setup, _: (
            pd.DataFrame()
            if setup.store is None or setup.matched.empty
            else frames.comparison(setup.matched, setup.store, unranked=setup.outside_budget)
        ),  # fmt: skip
        latex=lambda table, caption, _: latex.comparison_tex(table, caption),
        caption=lambda setup, _: _comparison_caption(setup, matched=True),
    ),
    Table(
        "comparison",
        "tab:comparison",
        "the difference in AUC and in TPR at 1% FPR between every two methods under each row of tab:robustness, "
        "with a paired bootstrap interval over prompts (and an interval over training seeds where there are several)",
        build=lambda setup, _: pd.DataFrame() if setup.store is None else frames.comparison(setup.part, setup.store),
        latex=lambda table, caption, _: latex.comparison_tex(table, caption),
        caption=lambda setup, _: _comparison_caption(setup),
        section=Section(
            "Paired differences between methods (A - B; bootstrap over prompts, t-interval over seeds)",
            lambda table, _: html.frame(table),
            "head",
        ),
    ),
    Table(
        "decoding",
        "the decoding table (not in the paper)",
        "each row of tab:robustness, the unwatermarked base's included, at every decoding it was stored at (greedy, "
        "temperature, top-k, top-p, min-p, repetition penalty) beside plain sampling at temperature 1",
        build=lambda setup, _: frames.decoding(setup.every_run, setup.store),
        latex=lambda table, caption, _: latex.simple_tex(table, caption, ["Decoding", "Category", "Attack", "Setting"]),
        caption=lambda setup, _: (
            "AUC with its 95% bootstrap interval, TPR at 1% FPR and median PPL of each method's main configuration "
            "when its models decode otherwise than by plain sampling at temperature 1 (the same settings for the "
            "unwatermarked base, whose TPR at 1% is the share of its texts flagged), the transforms applied in a "
            "user's order after the watermark: repetition penalty, temperature, top-k, top-p, min-p"
            + (
                "; dAUC: the change from plain sampling, with its 95% paired bootstrap interval over prompts"
                if setup.store is not None
                else ""
            )
            + f" ({setup.about})."
        ),
        each=_decodings,
        section=Section("Decoding settings", html.decoding, "tail"),
    ),
    Table(
        "prompts",
        "the prompts table (not in the paper)",
        "each row of tab:robustness, the unwatermarked base's included, with every other prompts it was stored with "
        "(code continuation, chat instructions, with a system prompt) beside the preset's documents, with tokens to "
        "detect",
        build=lambda setup, _: frames.prompts(setup.every_run, setup.store),
        latex=lambda table, caption, _: latex.simple_tex(table, caption, ["Prompts", "Category", "Attack", "Setting"]),
        caption=lambda setup, _: _prompts_caption(setup),
        each=_prompts,
        section=Section("Prompts: code and chat", html.prompts, "tail"),
    ),
    Table(
        "fpr_tpr",
        "tab:fpr_tpr",
        "TPR at 0.1/1/5/10% FPR of each method's main configuration, unaltered",
        build=lambda setup, _: frames.fpr_tpr(setup.part),
        latex=lambda table, caption, _: latex.tpr_tex(table, caption, "Method", list(TPRS)),
        caption=lambda setup, _: f"TPR at fixed FPRs of the unaltered models ({setup.about}).",
    ),
    Table(
        "own",
        "tab:dipper for DIPPER",
        "a table of its own per attack that joins it, named after it: AUC under each of its settings, with the PPL "
        "of the rewrites and of the texts before them (both tokenized again) and how much the texts were rewritten "
        "and kept",
        build=lambda setup, attack: frames.own(setup.part, attack, setup.ci),
        latex=lambda table, caption, attack: latex.own_tex(table, caption, plugin_class("attack", attack).label),
        caption=_own_caption,
        each=_attacks_joining("own"),
        joined_by="Attack.tables",
    ),
    Table(
        "curve",
        "the distillation table for distillation (not in the paper)",
        "a table of its own per swept attack that joins it, named <attack>_curve: per setting (distillation's N "
        "teacher texts), each method's AUC with its interval, TPR at 1% FPR, tokens to detect and median PPL, the "
        "unaltered model first",
        build=lambda setup, attack: frames.curve(setup.part, attack),
        latex=lambda table, caption, _: latex.simple_tex(table, caption, ["Setting"]),
        caption=_curve_caption,
        each=_attacks_joining("curve", "_curve"),
        joined_by="Attack.tables",
        section=Section("Swept attacks (the distillation table)", lambda table, _: html.frame(table), "tail"),
    ),
    Table(
        "flagged",
        "the spoofing table (not in the paper)",
        "a table of its own per attack that joins it, named <attack>_flagged: per setting (spoofing's N and strength), "
        "each method's share of the attack's texts flagged at 1% and 5% FPR and their AUC against human and base "
        "texts, the unwatermarked base's own texts first",
        build=lambda setup, attack: frames.flagged(setup.part, attack),
        latex=lambda table, caption, _: latex.simple_tex(table, caption, ["Setting"]),
        caption=_flagged_caption,
        each=_attacks_joining("flagged", "_flagged"),
        joined_by="Attack.tables",
        section=Section(
            "Texts that should not be flagged (the spoofing table)", lambda table, _: html.frame(table), "tail"
        ),  # fmt: skip
    ),
    Table(
        "flagged_matched",
        "the spoofing table at matched quality (not in the paper)",
        "the spoofing table of the configurations a calibration chose, named <attack>_flagged_matched, where the setup "
        "stores a calibration",
        build=lambda setup, attack: frames.flagged(setup.matched, attack),
        latex=lambda table, caption, _: latex.simple_tex(table, caption, ["Setting"]),
        caption=_flagged_matched_caption,
        # (none in a setup without a stored calibration: no section saying so on the page)
        each=lambda setup: [] if setup.matched.empty else _attacks_joining("flagged", "_flagged_matched")(setup),
        section=Section(
            "Texts that should not be flagged, at matched quality", lambda table, _: html.frame(table), "tail"
        ),  # fmt: skip
    ),
    Table(
        "declared",
        "the tables attacks declare (not in the paper)",
        "a table per SettingTable an attack declares (Attack.setting_tables), named <attack>_<name>: per setting of "
        "the attack, after its first row, the runs.csv columns it names for each method's main configuration",
        build=lambda setup, subject: frames.declared(setup.part, *subject),
        latex=lambda table, caption, _: latex.simple_tex(table, caption, ["Setting"]),
        caption=lambda setup, subject: f"{subject[1].caption} ({setup.about}).",
        each=_declared,
        section=Section("Tables the attacks declare", lambda table, _: html.frame(table), "tail"),
    ),
    Table(
        "ft_steps",
        "tab:ft_steps",
        "the featured method (``WatermarkMethod.featured``) at each output of the attacks that join it, against the "
        "best other method",
        build=lambda setup, label: frames.ft_steps(setup.part, label),
        latex=lambda table, caption, _: latex.ft_steps_tex(table, caption),
        caption=_steps_caption,
        each=_featured,
        joined_by="Attack.tables",
    ),
    Table(
        "horizontal",
        "tab:ablation-horizontal",
        "each method's horizontal ablations (``WatermarkMethod.ablations``), a file each",
        build=lambda setup, ablation: frames.ablation(setup.part, *ablation),
        latex=lambda table, caption, ablation: latex.ablation_tex(table, caption, ablation[1]),
        caption=lambda setup, ablation: f"{ablation[1].caption} ({setup.about}).",
        each=_ablations("horizontal"),
        joined_by="Ablation.layout",
    ),
    Table(
        "vertical",
        "tab:embedding",
        "each method's vertical ablations (``WatermarkMethod.ablations``), a file each",
        build=lambda setup, ablation: frames.variants(setup.part, *ablation),
        latex=lambda table, caption, ablation: latex.simple_tex(table, caption, [ablation[1].index_name]),
        caption=lambda setup, ablation: f"{ablation[1].caption} ({setup.about}).",
        each=_ablations("vertical"),
        joined_by="Ablation.layout",
    ),
    Table(
        "watermark_config",
        "tab:watermark-config",
        "each method's configurations that vary the settings it trades detection for quality by, unaltered",
        build=lambda setup, _: frames.watermark_config(setup.part),
        latex=lambda table, caption, _: latex.simple_tex(table, caption, ["Method", "Config"]),
        caption=lambda setup, _: f"Watermark configurations and their detection and quality ({setup.about}).",
    ),
    Table(
        "tokens_to_detect",
        "tokens to detect",
        "MarkMyWords' size, with TPR at 1% FPR by text length, of every row whose detector keeps prefix scores",
        build=lambda setup, _: frames.tokens_to_detect(setup.part),
        latex=lambda table, caption, _: latex.simple_tex(
            table, caption, ["Method", "Config", "Category", "Attack", "Setting"]
        ),
        caption=lambda setup, _: (
            "Tokens to detect (MarkMyWords' size): the median length from which a text flagged "
            "at 1% FPR on its whole text stays flagged, the share flagged on the whole text, TPR at 1% FPR by text "
            f"length, and the share of the unwatermarked base's texts flagged on the whole text ({setup.about})."
        ),
        section=Section("Tokens to detect (1% FPR)", lambda table, _: html.frame(table), "tail"),
    ),
    Table(
        "attribution",
        "the appendix's attribution",
        "the share of each model's texts that each detector flags at its 1% FPR, where the store holds attribution "
        "stages",
        build=lambda setup, _: frames.attribution(setup.attributions),
        latex=lambda table, caption, _: latex.tpr_tex(table, caption, "Detector", list(table.columns)),
        caption=lambda setup, _: (
            "Attribution: share of each model's texts (columns) flagged by each detector (rows) "
            f"at its 1% FPR threshold on human texts ({setup.about})."
        ),
        each=_attributions,
        section=Section(
            "Attribution (share of each model's texts flagged at 1% FPR)", lambda table, _: html.frame(table), "tail"
        ),
    ),
)
__doc__ += "".join(
    f"  {t.label} ({t.name}): {t.holds}"
    + (f"; a plugin joins it by naming {t.name!r} in its {t.joined_by}" if t.joined_by else "")
    + ".\n"
    for t in TABLES
)


def setup_tables(
    part: pd.DataFrame, ci: bool, attributions: pd.DataFrame | None, store: Store | None = None
) -> dict[str, tuple]:
    """``{file name: (table, LaTeX)}`` of one setup's runs, every declared table; tables with no stored run are left
    out (tab:comparison, which reads per-text scores, where no ``store`` is given)."""
    setup = Setup(plain_runs(part), ci, attributions, store=store, everything=part)
    out = {}
    for table in TABLES:
        for name, subject in table.subjects(setup):
            frame = table.build(setup, subject)
            if not frame.empty:
                out[name] = (frame, table.latex(frame, table.caption(setup, subject), subject))
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
    whole (``files.write_atomic``), as every file ``harness tables`` writes. Text that a spreadsheet would run as a
    formula is defused (``defused``)."""
    files.write_atomic(path, defused(table).to_csv(float_format="%.6g", na_rep=MISSING, lineterminator="\n"))


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what Excel, LibreOffice and Sheets read as a formula


def _defuse(value):
    """A text cell that starts as a formula, prefixed with ``'`` (OWASP's advice for CSV injection): a store's labels
    come from whoever made it, and ``=HYPERLINK(...)`` in a method label would run when the CSV is opened. Numbers
    (``-0.5``) and every other value stay as they are."""
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def _cell(value):
    """A cell of a text column as the CSV writes it: a number as the float columns are written (``%.6g``; pandas
    writes a float in a text column as ``1.0``), text defused."""
    return format(value, ".6g") if isinstance(value, float) and value == value else _defuse(value)


def defused(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``_defuse`` applied to its text cells, row labels and column labels, and the numbers of its text
    columns (a decoding-time method's, which hold ``NOT_APPLICABLE`` beside AUCs) written as the float columns'."""

    def labels(index: pd.Index) -> pd.Index:
        if isinstance(index, pd.MultiIndex):
            return index.set_levels([level.map(_defuse) for level in index.levels])
        return index.map(_defuse)

    out = table.copy()
    for k in range(out.shape[1]):  # (by position: labels may repeat) text columns, str or object dtype
        if not pd.api.types.is_numeric_dtype(out.dtypes.iloc[k]):
            out.isetitem(k, out.iloc[:, k].map(_cell))
    out.index, out.columns = labels(out.index), labels(out.columns)
    return out


def write_tables(
    df: pd.DataFrame,
    out_dir: Path,
    ci: bool = False,
    attributions: pd.DataFrame | None = None,
    store: Store | None = None,
) -> list[Path]:
    """Write every table of every setup (``<out>/<setup>/<table>.csv`` and ``.tex``) plus ``runs.csv`` (every run's
    labels and metrics); return the paths written. ``store``: the runs' store, for the tables that read per-text
    scores (tab:comparison)."""
    if df.empty:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "runs.csv"]
    # (main_method: derived, what ablations vary around; by_length: in tokens_to_detect; decoding and prompts: only
    # where a run sampled otherwise than plainly or was asked otherwise, so that a store of plain runs writes the
    # runs.csv it always did)
    # (quality_gate: said by each table's caption; calibrated and over_budget: the tables at matched quality)
    derived = ["main_method", "by_length", "quality_gate", "calibrated", "over_budget"]
    derived += [c for c in ("decoding", "prompts") if c in df and (df[c] == "").all()]
    _csv(df.drop(columns=derived).set_index("run"), written[0])
    for name, part in setups(df).items():
        folder = out_dir / plain_name(name)
        folder.mkdir(exist_ok=True)
        mine = None
        if attributions is not None and len(attributions):
            mine = attributions[attributions["setup"] == part["setup"].iloc[0]]
        for table_name, (table, tex) in setup_tables(part, ci, mine, store).items():
            csv, latex = folder / f"{plain_name(table_name)}.csv", folder / f"{plain_name(table_name)}.tex"
            _csv(table, csv)
            files.write_atomic(latex, tex)
            written += [csv, latex]
    return written
