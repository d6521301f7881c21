"""Comparisons at matched quality (the paper compares methods "with the same level of perplexity"): a grid spec's
``calibration`` section sweeps one strength setting per method on the unaltered model, and a rule written in the spec
before any attack runs picks each method's configuration; the groups' ``calibrated`` entries then run that one.

The choice is a stage of the store (kind ``calibration``) whose spec names the rule, the swept values and the runs it
read, and whose ``calibration.json`` holds the whole sweep beside the choice: it is made once from the stored
unaltered runs, so re-running a grid chooses the same, and nothing is chosen again after an attack's result is seen
(attacks run only on the choice). ``harness tables`` reads these stages for the tables at matched quality.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from harness.config.errors import HarnessError
from harness.grid.spec import Cell, Grid
from harness.store import kinds
from harness.store.stages import Stage, Store

log = logging.getLogger(__name__)

VERSION = "1"
FILE = "calibration.json"


def stages(
    grid: Grid, results: Path, device: str | None = None, build: bool = True, partial: bool = False
) -> dict[str, Stage] | None:
    """Method -> its calibration stage, made here from the sweep's stored runs where not stored yet: one line naming
    a sweep cell that has not run, or a method none of whose swept values meets the rule. ``build=False`` (a dry
    run's view) builds nothing and returns None unless every run and stage is stored; with ``partial``, the methods
    whose runs and stage are stored."""
    return _stages(grid, Store(results), device, build, {}, partial)


def stored(grid: Grid, results: Path) -> tuple[dict[str, Stage] | None, set[str]]:
    """What ``harness export --grid`` copies of the calibration, building nothing: the stages of the methods whose
    sweep and choice are stored (None where none is; a grid run group by group, as on a GPU lease, has some), and the
    hashes of every run its sweep cells make, each cell planned once (the stages' own planning, then the cells it did
    not reach)."""
    from harness.cell.pipeline import Pipeline

    store, planned = Store(results), {}
    found = _stages(grid, store, None, False, planned, partial=True) or None
    for cell in grid.sweep:
        if cell not in planned:
            planned[cell] = Pipeline(cell.preset, store, plan=True).run(*cell.build())
    return found, {c.run.key for done in planned.values() for c in done}


def _stages(
    grid: Grid, store: Store, device: str | None, build: bool, planned: dict, partial: bool = False
) -> dict[str, Stage] | None:
    """``stages``, with each sweep cell's planned runs also kept in ``planned`` (cell -> its runs). ``partial`` (with
    ``build=False``): the methods whose runs and stage are stored, leaving out the others instead of returning None."""
    from harness.cell.pipeline import Pipeline
    from harness.store.files import read_jsonl

    rule = grid.spec.calibration
    out: dict[str, Stage] = {}
    for method, settings in rule.sweep.items():
        ((setting, values),) = settings.items()
        cells = [c for c in grid.sweep if c.method == method]
        measured = []
        for cell in cells:
            done = planned[cell] = Pipeline(cell.preset, store, device, plan=True).run(*cell.build())
            if not all(c.reused for c in done):
                if not build:
                    break
                raise HarnessError(
                    f"{cell.where}: the calibration's cell {cell.name(True)} is not stored: run it first"
                )
            measured.append((cell, done[0], done[-1]))
        if len(measured) < len(cells):  # (a dry run's view: a sweep cell is not stored)
            if partial:
                continue
            return None
        gate = cells[0].preset.quality_gate
        stage = store.stage(kinds.CALIBRATION, {
            "stage": kinds.CALIBRATION,
            "version": VERSION,
            "method": method,
            "setting": setting,
            "values": values,
            "rule": _rule(rule, gate),
            "runs": [[base.run.key, unaltered.run.key] for _, base, unaltered in measured],
        })  # fmt: skip
        if not build:
            if not stage.done:
                if partial:
                    continue
                return None
            out[method] = stage
            continue

        def make(folder: Path, method=method, setting=setting, values=values, measured=measured, gate=gate) -> dict:
            rows = [_row(cell, setting, base, unaltered, read_jsonl(base.run.path / "scores.jsonl"),
                         read_jsonl(unaltered.run.path / "scores.jsonl"), gate)
                    for cell, base, unaltered in measured]  # fmt: skip
            chosen = choose(method, setting, values, rows, rule.ppl_ratio_max, rule.pick, rule.over_budget)
            found = {
                "method": method,
                "setting": setting,
                "rule": describe(rule, gate),
                "chosen": chosen,
                "sweep": rows,
            }
            (folder / FILE).write_text(json.dumps(found, indent=1))
            return {}

        store.build_or_reuse(stage, f"calibration of {method}", make)
        out[method] = stage
    return out


def _rule(rule, gate) -> dict:
    """The rule as the stage's spec names it (``over_budget`` only where not the default, so that the calibrations
    stored before it existed keep their names)."""
    out = {"ppl_ratio_max": rule.ppl_ratio_max, "pick": rule.pick, "gate": gate.model_dump()}
    return out if rule.over_budget == "refuse" else out | {"over_budget": rule.over_budget}


def _row(cell: Cell, setting: str, base, unaltered, base_scores: list, scores: list, gate) -> dict:
    """One swept configuration of one seed, unaltered: its detection and its quality beside the base's."""
    from harness.cell import metrics
    from harness.cell.quality import ppl_ratio

    m, b = (json.loads((r.run.path / "metrics.json").read_text()) for r in (unaltered, base))
    ratio = ppl_ratio(m.get("median_ppl"), b.get("median_ppl"))
    try:
        bounds = metrics.ratio_interval(metrics.per_prompt(scores, "ppl"), metrics.per_prompt(base_scores, "ppl"))
    except (TypeError, ValueError):  # (a text without a perplexity)
        bounds = None
    auc_base, tpr_base = metrics.versus([s["score"] for s in scores if s["label"] == 1],
                                        [s["score"] for s in base_scores if s["label"] == 1])  # fmt: skip
    return {
        "value": dict(cell.method_settings).get(setting),
        "seed": cell.seed,
        "settings": dict(cell.method_settings),
        "run": unaltered.run.key,
        "base_run": base.run.key,
        "AUC": m["auc"],
        "TPR@1%": m["tpr@0.01"],
        "AUC_vs_base": auc_base,
        "TPR@1%_vs_base": tpr_base,
        "PPL": m.get("median_ppl"),
        "PPL_ratio": ratio,
        "PPL_ratio_ci95": None if bounds is None else list(bounds),
        "rep3": m.get("rep3"),
        "quality": gate.verdict(ratio, m.get("rep3"), b.get("rep3")),
    }


def choose(
    method: str,
    setting: str,
    values: list,
    rows: list[dict],
    ppl_ratio_max: float,
    pick: str,
    over_budget: str = "refuse",
) -> dict:
    """The rule: among the swept values whose unaltered texts pass the gate with a median PPL at most
    ``ppl_ratio_max`` times the base's for every seed, the one with the largest mean ``pick`` over seeds (the first
    in the spec's order on a tie). Returns the chosen settings, with ``within_budget``. Where none meets the budget:
    one line naming the closest value, or with ``over_budget="closest"`` that value (the smallest worst-seed PPL ratio
    among the values whose every seed passes the gate; still one line where none does), ``within_budget`` false."""
    by_value = {json.dumps(v): [r for r in rows if r["value"] == v] for v in values}

    def meets(r: dict) -> bool:
        return r["quality"] == "ok" and r["PPL_ratio"] is not None and r["PPL_ratio"] <= ppl_ratio_max

    def mean(v) -> float:
        return sum(r[pick] for r in by_value[json.dumps(v)]) / len(by_value[json.dumps(v)])

    def chose(v, inside: bool) -> dict:
        first = by_value[json.dumps(v)][0]  # (the value as the method resolved it: 8 -> 8.0)
        worst = max(r["PPL_ratio"] for r in by_value[json.dumps(v)])
        return {"settings": first["settings"], "value": first["value"], pick: mean(v), "within_budget": inside,
                "PPL_ratio": worst}  # fmt: skip

    inside = [v for v in values if all(meets(r) for r in by_value[json.dumps(v)])]
    if inside:
        return chose(max(inside, key=mean), True)  # (max keeps the first of equals: the spec's order)
    worst = {json.dumps(v): max(by_value[json.dumps(v)], key=lambda r: r["PPL_ratio"] or float("inf")) for v in values}
    gated = [v for v in values if all(r["quality"] == "ok" and r["PPL_ratio"] is not None
                                      for r in by_value[json.dumps(v)])]  # fmt: skip
    if over_budget == "closest" and gated:
        return chose(min(gated, key=lambda v: worst[json.dumps(v)]["PPL_ratio"]), False)
    closest = min(values, key=lambda v: worst[json.dumps(v)]["PPL_ratio"] or float("inf"))
    r = worst[json.dumps(closest)]
    ratio = "no PPL" if r["PPL_ratio"] is None else f"{r['PPL_ratio']:.3g}x the base's PPL"
    also = ", and none passes the gate for over_budget: closest" if over_budget == "closest" else ""
    raise HarnessError(
        f"no swept {setting} of {method} meets the calibration's budget (median PPL at most {ppl_ratio_max:g}x "
        f"the base's, inside the quality gate): the closest, {setting}={closest}, reads {ratio} ({r['quality']}){also}"
    )


def describe(rule, gate) -> str:
    """The rule in words, as the stage and ``harness calibrate`` state it."""
    return (f"the largest mean {rule.pick} over seeds among the swept values whose unaltered texts have a median PPL "
            f"at most {rule.ppl_ratio_max:g}x the base's and pass the quality gate ({gate.describe()})"
            + ("; where none does, the value with the smallest PPL ratio inside the gate, marked outside the budget"
               if rule.over_budget == "closest" else ""))  # fmt: skip


def summary(method: str, stage: Stage) -> str:
    """A method's sweep and choice as ``harness grid`` prints them."""
    found = json.loads((stage.path / FILE).read_text())
    lines = [f"  {method}: {found['setting']:>8}  seed    AUC  vs base AUC  PPL/base  (95% CI)      text"]
    for r in found["sweep"]:
        ratio = "missing" if r["PPL_ratio"] is None else f"{r['PPL_ratio']:.2f}"
        bounds = r.get("PPL_ratio_ci95")  # (a calibration stored before the interval has none)
        ci = f"[{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else ""
        lines.append(f"  {'':{len(method)}}  {r['value']!s:>8}  {r['seed']:>4}  {r['AUC']:.3f}  "
                     f"{r['AUC_vs_base']:11.3f}  {ratio:>8}  {ci:12}  {r['quality'].split(':')[0]}")  # fmt: skip
    lines.append(f"  {method}: chose {found['setting']}={found['chosen']['value']}{outside(found['chosen'])}")
    return "\n".join(lines)


def outside(chosen: dict) -> str:
    """What a choice outside the budget says after its value ("" for one inside; a calibration stored before
    ``over_budget`` existed chose inside)."""
    if chosen.get("within_budget", True):
        return ""
    ratio = f"{chosen['PPL_ratio']:.2f}x the base's PPL"
    return f", outside the budget (the closest: {ratio}; never ranked at matched quality)"


def choices(found: dict[str, Stage]) -> dict[str, dict]:
    """Method -> its calibration's choice (``settings``, ``value``, ``within_budget``...)."""
    return {method: json.loads((stage.path / FILE).read_text())["chosen"] for method, stage in found.items()}


def chosen_settings(found: dict[str, Stage]) -> dict[str, dict]:
    """Method -> the settings its calibration chose (what the groups' ``calibrated`` entries run)."""
    return {method: chosen["settings"] for method, chosen in choices(found).items()}


def stored_choice(grid: Grid, results: Path, partial: bool = False) -> dict[str, dict] | None:
    """Method -> its calibration's choice (``settings``, ``value``, ``within_budget``...) where every one of its runs
    and stages is stored, else None; builds nothing. ``partial``: the methods whose choice is stored (None where none
    is)."""
    found = stages(grid, results, build=False, partial=partial)
    return choices(found) if found else None
