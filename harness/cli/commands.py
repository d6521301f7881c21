"""What each ``harness`` subcommand does, once its arguments are parsed: every input is checked before any costly
work, and a problem is a ``HarnessError`` that ``harness.cli.main`` prints as one line."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from harness.compute import distributed
from harness.config.errors import HarnessError, printable


def cmd_list() -> None:
    from harness.config.presets import PRESETS
    from harness.config.registry import attacks, methods

    for registry in (methods, attacks):
        print(f"{registry.kind}s:")
        for name, target in registry.entries().items():
            if target is None:
                print(f"  {name:14s} planned (not implemented yet)")
                continue
            try:
                cls = registry.load(name)
            except HarnessError as err:  # (a broken outside plugin: said, and the others and the presets listed)
                print(f"  {name:14s} cannot be used: {printable(str(err))}")
                continue
            fields = cls.Params.model_fields.items()
            broken = _default_outside_its_limits(fields)
            if broken:  # (an outside plugin's default that breaks its own limit: every run of it would be refused)
                print(f"  {name:14s} cannot be used with its defaults: {printable(broken)}")
                continue
            settings = ", ".join(
                f"{k}=(required)" if f.is_required() else f"{k}={f.get_default(call_default_factory=True)!r}"
                for k, f in fields
            )  # (a default_factory's value, not pydantic's placeholder)
            settings = settings or "-"
            needs = ", ".join([f"pip extra [{e}]" for e in cls.requires.values()] + ["CUDA"] * cls.needs_cuda)
            print(f"  {name:14s} {settings}" + (f"   (needs {needs})" if needs else ""))
        for name, target in registry.clashes().items():
            print(
                f"  {name:14s} cannot be used: the installed {registry.kind} {target} has a built-in's name (rename it)"
            )
    print("presets:")
    for p in PRESETS.values():
        print(f"  {p.name:14s} {p.base_model}: {p.notes}")
        for name, values in {**p.methods, **p.attacks}.items():
            print(f"  {'':14s}   {name}: " + ", ".join(f"{k}={v!r}" for k, v in values.items()))


def _default_outside_its_limits(fields) -> str | None:
    """The first setting whose default its own field's limits refuse (``steps: int = Field(-5, ge=0)``), said in a
    few words; None where every default holds (a model-wide rule, e.g. 'give at least one donor', is no default's)."""
    from typing import Annotated

    from pydantic import TypeAdapter, ValidationError

    for key, field in fields:
        if field.is_required() or field.default_factory is not None:
            continue
        annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        try:
            TypeAdapter(annotation).validate_python(field.default)
        except ValidationError as err:
            return f"{key}={field.default!r}: {err.errors()[0]['msg']}"
    return None


def format_cells(cells, gate=None) -> str:
    """The printed table of a run's rows (the base's first, where it is one of them): detection against human texts
    and against the base's own texts (``vs base``), perplexity beside the base's, and the quality ``gate``'s verdict
    (``harness.config.gate``; default: the default gate)."""
    import pandas as pd

    from harness.cell.metrics import RETOKENIZED, retokenized_ppl, versus
    from harness.cell.quality import ppl_ratio
    from harness.cell.scoring import BASE_ROW
    from harness.config.gate import OK, QualityGate
    from harness.store.files import read_jsonl

    # A text attack's row measures PPL on its text tokenized again: beside one, every row is shown on that footing.
    footings = {c.metrics.get("ppl_on") for c in cells}
    mixed = RETOKENIZED in footings and len(footings) > 1

    def ppl_value(m: dict) -> float | None:
        return retokenized_ppl(m) if mixed else m.get("median_ppl")

    def generated(c) -> list[float]:
        return [s["score"] for s in read_jsonl(c.run.path / "scores.jsonl") if s["label"] == 1]

    base = next((c for c in cells if c.row == BASE_ROW), None)
    base_scores = generated(base) if base is not None else []
    base_ppl = ppl_value(base.metrics) if base is not None else None
    gate = gate or QualityGate()
    rows, verdicts = [], []
    for c in cells:
        value = ppl_value(c.metrics)
        ratio = ppl_ratio(value, base_ppl)
        verdict = gate.verdict(ratio, c.metrics.get("rep3"), base.metrics.get("rep3") if base else None)
        verdicts.append((c.row, verdict))
        auc_base, tpr_base = versus(generated(c), base_scores)
        rows.append({
            "model": c.row,
            "AUC": f"{c.metrics['auc']:.3f}",
            "AUC 95% CI": "[{:.3f}, {:.3f}]".format(*c.metrics["auc_ci95"]),
            "TPR@1%": f"{c.metrics['tpr@0.01']:.3f}",
            "vs base AUC": "missing" if auc_base is None else f"{auc_base:.3f}",
            "median PPL": "missing" if value is None else f"{value:.2f}",
            "PPL/base": "missing" if ratio is None else f"{ratio:.2f}",
            "text": verdict.split(":", 1)[0],
            "run": c.run.key + (" (reused)" if c.reused else ""),
        })  # fmt: skip
    table = pd.DataFrame(rows).to_string(index=False)
    table += (
        "\nvs base AUC: each model's texts against the base's own texts under the same detector (0.5: nothing "
        f"beyond the base's)\ntext: the quality gate's verdict ({gate.describe()})"
    )
    for row, verdict in verdicts:
        if verdict != OK:
            table += f"\n! {row}: {verdict}" + (": not to be ranked" if verdict.startswith("degenerate") else "")
    if mixed:
        table += (
            "\nmedian PPL of each row's text tokenized again, as a text attack's rows are measured (the ids a model "
            "sampled read otherwise, even for the same text); missing: a run scored before that was stored"
        )
    warning = analytic_fpr_warning(cells)
    return table + (f"\n{warning}" if warning else "")


def analytic_fpr_warning(cells, level: float = 0.01) -> str | None:
    """A line when the detector's own p-value flags the human texts at ``level`` far more often than ``level``
    (binomial tail under 0.1%): then a per-text p-value is no false-positive rate on this text (one key on a narrow
    domain, whose texts share frequent n-grams, moves them all together), while the TPR columns, whose thresholds
    are set on the human texts, hold."""
    from scipy.stats import binom

    for c in cells:
        fpr, n = c.metrics.get(f"fpr_analytic@{level:g}"), c.metrics.get("n_neg")
        if fpr is None or not n:
            continue
        if binom.sf(round(fpr * n) - 1, n, level) < 1e-3:
            return (
                f"! the detector's own p-value flags {fpr:.1%} of the {n} human texts at {level:g} (expected "
                f"{level:.0%}): on this text its per-text p-values are not false-positive rates; the TPR columns "
                "set their thresholds on the human texts and hold ('harness detect' decides on pooled texts)"
            )
    return None


def preset_settings(args) -> list[str]:
    """``--set`` items with each ``--decode KEY=VALUE``, ``--prompts`` and ``--system-prompt`` as the ``eval.KEY=VALUE``
    it sets (a setting given both ways is refused as given twice)."""
    from harness.config.params import parse_assignments
    from harness.config.settings import decode_overrides

    decode = decode_overrides(parse_assignments(args.decode, "decoding setting"))
    if args.system_prompt is not None:
        decode |= {"eval.prompts": args.prompts or "chat", "eval.system_prompt": args.system_prompt}
    elif args.prompts is not None:
        decode["eval.prompts"] = args.prompts
    return [*args.overrides, *(f"{k}={v}" for k, v in decode.items())]


def cmd_run(args) -> None:
    from harness.assets import models
    from harness.cell.checks import check_inputs
    from harness.cell.pipeline import Pipeline
    from harness.config import presets
    from harness.config.params import parse_assignments
    from harness.config.registry import attacks, methods
    from harness.config.settings import apply_overrides
    from harness.store.stages import Store

    # Validate everything cheap before any model loads.
    preset = apply_overrides(presets.get_preset(args.preset), parse_assignments(preset_settings(args), "setting"))
    method = methods.build(args.method, parse_assignments(args.method_arg, "method setting"), preset)
    attack = attacks.build(args.attack, parse_assignments(args.attack_arg, "attack setting"), preset)
    if args.then:  # a chain: --attack is its first link
        links = [(args.attack, args.attack_arg), *args.then]
        settings = [{"attack": name, "settings": parse_assignments(given, f"{name} setting")} for name, given in links]
        attack = attacks.build("chain", {"links": settings}, preset)
    if not args.verbose:  # (after the checks above, which import no model library)
        _quiet_transformers()
    updates = {f: getattr(args, f) for f in ("base_model", "oracle_model") if getattr(args, f)}
    preset = preset.model_copy(update=updates)
    if args.allow_pickle:
        os.environ[models.ALLOW_PICKLE_ENV] = "1"
    _device_env(args)
    if args.dry_run:
        _dry_run(args, preset, (method, attack))
        return
    store = Store(args.results)
    store.check_writable()
    check_inputs(preset, (method, attack))
    cells = Pipeline(preset, store, args.device).run(method, attack)
    if not distributed.is_main():
        return  # one report per launch
    what = attack.table_label() if args.then else attack.name
    used = (("prompts", preset.eval.prompts_label()), ("decoding", preset.eval.decoding_label()))
    used_text = "".join(f"; {name}: {label}" for name, label in used if label)
    print(f"\n{args.method} x {what} on preset '{preset.name}' (base model {preset.base_model}{used_text})")
    print(format_cells(cells, preset.quality_gate))
    print(f"\nruns stored in {store.root}/<run>; 'harness tables' rebuilds tab:robustness from them")


def _dry_run(args, preset, plugins) -> None:
    """``harness run --dry-run``: the run's inputs checked as a run checks them, building nothing, then each run it
    would make, stored (and verified) or to compute; a built-in model this machine lacks is named with its cost."""
    from harness.assets import models
    from harness.cell.checks import check_inputs
    from harness.grid import jobs
    from harness.store.stages import Store

    check_inputs(preset, plugins, build=False)
    Store(args.results).check_writable(create=False)
    attack = plugins[1]
    print(f"{args.method} x {attack.table_label() if args.then else attack.name} on preset '{preset.name}' "
          f"(base model {preset.base_model}): inputs checked")  # fmt: skip
    missing = jobs.unbuilt_models(preset, plugins)
    if missing:
        for ref in missing:
            print(f"{ref} is not built on this machine: the run will build it once ({models.build_cost(ref)})")
        print("every run is to compute (none can be stored before the models it reads are built)")
        return
    rows = jobs.plan_runs(preset, plugins, args.results, args.device)
    for row, stored in rows:
        print(f"  {row:40s} {'stored' if stored else 'to compute'}")
    done = sum(stored for _, stored in rows)
    print(f"{done} of {len(rows)} runs stored in {args.results}; {len(rows) - done} to compute")


def cmd_tables(args) -> None:
    from harness.report.collect import collect, collect_attribution, setups
    from harness.report.frames import robustness
    from harness.report.tables import forget_stale, write_tables
    from harness.store import files
    from harness.store.stages import Store

    store = Store(args.results)
    if not store.root.is_dir():
        raise HarnessError(f"no run store at '{store.root}': run 'harness run' or 'harness grid' first")
    inside = store.part_holding(args.out)
    if inside is not None:
        raise HarnessError(f"--out '{args.out}' is {inside}: write the tables beside the store, not into it")
    files.check_writable(args.out, "tables folder")
    df = collect(store)
    try:
        written = write_tables(df, args.out, ci=args.ci, attributions=collect_attribution(store), store=store)
        if not written:
            raise HarnessError(f"no finished runs in '{store.root}' that could be read")
        if not args.no_figures:
            from harness.report.figures import write_figures

            written += write_figures(df, store, args.out)
        removed = forget_stale(args.out, written)
    except OSError as err:
        raise HarnessError(f"cannot write the tables into '{args.out}': {err.strerror or err}") from None
    if removed:
        print(f"removed {len(removed)} files an earlier 'harness tables' wrote into {args.out} for setups or tables "
              f"the store no longer has (e.g. {removed[0]})")  # fmt: skip
    for name, part in setups(df).items():
        table = robustness(part)
        if table.empty:
            continue
        # (labels come from the store, which may be someone else's: shown with their control characters escaped)
        print(printable(f"tab:robustness ({name}, {part['base_model'].iloc[0]}), AUC:"))
        auc = table.xs("AUC", axis=1, level=1)
        print(printable(auc.to_string(na_rep="missing", float_format=lambda v: f"{v:.3f}"), keep="\n"), end="\n\n")
    folders = sorted({p.parent for p in written if p.parent != args.out})
    print(f"wrote {len(written)} files: {args.out / 'runs.csv'}, and in " + ", ".join(str(f) for f in folders))


def _device_env(args) -> None:
    """--device (else $HARNESS_DEVICE) for every stage of this process, checked first."""
    from harness.assets import models

    if args.device:
        models.check_device(args.device)
        os.environ["HARNESS_DEVICE"] = args.device  # every default_device() in this run (detectors too) agrees
    elif os.environ.get("HARNESS_DEVICE"):
        models.check_device(os.environ["HARNESS_DEVICE"], "HARNESS_DEVICE")


def cmd_grid(args) -> int:
    from harness.assets import models
    from harness.grid import executors, jobs
    from harness.grid import spec as grid
    from harness.store import files

    if distributed.world_size() > 1:
        raise HarnessError(
            "harness grid runs each cell in one process: spread a grid with --shard or --executor, and launch "
            "'harness run' (not grid) with several processes"
        )

    spec = grid.load(args.spec)
    if args.group:
        spec = grid.only_groups(spec, args.group)
    files.check_cache()  # (before the cells' checks, which would name a cell for it)
    if not args.verbose:
        _quiet_transformers()
    shard = grid.parse_shard(args.shard) if args.shard is not None else None
    resources = executors.Resources(
        args.partition, args.account, args.gpus, args.cpus, args.mem_gb, args.time_min, args.max_parallel
    )
    executors.check_options(args.executor, resources)
    if args.executor != "inline":  # (submitit writes its job folders there before the first cell)
        files.check_writable(args.jobs_dir or args.results / "jobs", "jobs folder", create=not args.dry_run)
    if args.allow_pickle:
        os.environ[models.ALLOW_PICKLE_ENV] = "1"
    _device_env(args)
    if args.dry_run:  # (a run checks, and makes, its folder before any cell)
        from harness.store.stages import Store

        Store(args.results).check_writable(create=False)
    if spec.sweep and not args.dry_run:  # the calibration first: its cells, then its choice
        spec = _calibrated(spec, args, shard, resources)
        if spec is None:
            return 0
    elif spec.sweep:
        from harness.grid import calibration

        sweep = list(spec.sweep) if shard is None else grid.shard(spec.sweep, *shard)
        jobs.check_cells(sweep + list(spec.provisional), build=False, results=args.results)
        print(f"{args.spec}: calibration, {len(sweep)} cells of each swept configuration, unaltered")
        for k, entry in enumerate(jobs.dry_run(sweep, args.results, args.device), 1):
            print(f"  {k:3d}  {entry.cell.name(spec.several_seeds):60s} {entry.state}")
        chosen = calibration.stored_choice(spec, args.results, partial=True)
        if chosen is None:
            print(f"the calibration's choice is not stored: {', '.join(spec.waiting)} wait for it")
        else:
            settings = {m: c["settings"] for m, c in chosen.items()}
            labels = _chosen_labels(spec, settings)
            print("the calibration chose " + "; ".join(f"{m}: {s}{calibration.outside(chosen[m])}" for m, s in labels))
            spec = grid.with_choice(spec, settings)
            if spec.waiting:  # (a grid run group by group: the other methods' choices are not stored yet)
                print(f"not chosen yet: {', '.join(spec.waiting)} wait for it")
    cells = list(spec.cells) if shard is None else grid.shard(spec.cells, *shard)
    part = f" (shard {shard[0]}/{shard[1]}: {len(cells)} of {len(spec.cells)} cells)" if shard else ""
    if args.group:
        part = f" (groups {', '.join(args.group)}){part}"
    if args.dry_run:
        jobs.check_cells(cells, build=False, results=args.results)  # what the grid checks first (one line here too)
        print(f"{args.spec}: {len(cells)} cells{part}, {len({c.training for c in cells})} trained models")
        planned = []
        for k, entry in enumerate(jobs.dry_run(cells, args.results, args.device), 1):
            print(f"  {k:3d}  {entry.cell.name(spec.several_seeds):60s} {entry.state}")
            planned.append(entry)
        stored = sum(entry.stored for entry in planned)
        print(f"{stored} of {len(cells)} cells stored; {len(cells) - stored} to compute")
        for ref in dict.fromkeys(ref for entry in planned for ref in entry.builds):
            print(f"{ref} is not built on this machine: the grid will build it once ({models.build_cost(ref)})")
        return 0
    start = time.time()
    summary = executors.run(spec, args.results, args.device, args.executor, shard, args.jobs_dir, resources)
    minutes, seconds = divmod(round(time.time() - start), 60)
    print(
        f"\n{args.spec}{part}: {summary['cells']} cells: {summary['reused']} reused, {summary['computed']} computed, "
        f"{summary['failed']} failed"
        + (f"; attribution {summary['attribution']}" if "attribution" in summary else "")
        + f" ({minutes} min {seconds} s)"
    )
    for name, error, trace in summary["failures"]:
        print(f"  failed: {name}: {error} (traceback: {trace})")
    if shard is not None and spec.attribution:
        print("attribution runs once every shard is done: run the grid again without --shard (every cell is reused)")
    print("'harness tables' rebuilds every table and figure from the store")
    return 1 if summary["failures"] else 0


def _calibrated(spec, args, shard, resources):
    """Run a grid's calibration (its sweep cells, then the rule, ``harness.grid.calibration``) and print the sweep and
    the choice; the grid with its ``calibrated`` entries as chosen, or None where a shard must wait for the others'
    sweep cells."""
    from dataclasses import replace

    from harness.grid import calibration, executors, jobs
    from harness.grid import spec as grid

    # The cells the choice will make, checked before the sweep's trainings (an attack the method cannot take would
    # otherwise stop the grid only once they are done)
    jobs.check_cells(list(spec.provisional), build=False, results=args.results)
    sweep = replace(spec, cells=spec.sweep, attribution=())
    summary = executors.run(sweep, args.results, args.device, args.executor, shard, args.jobs_dir, resources)
    if summary["failures"]:
        for name, error, trace in summary["failures"]:
            print(f"  failed: {name}: {error} (traceback: {trace})")
        raise HarnessError(f"{args.spec}: {summary['failed']} calibration cells failed: nothing else runs")
    if shard is not None and not all(e.stored for e in jobs.dry_run(list(spec.sweep), args.results, args.device)):
        print("the calibration waits for the other shards' sweep cells: run this shard again once they are done")
        return None
    found = calibration.stages(spec, args.results, args.device)
    print(f"\ncalibration ({calibration.describe(spec.spec.calibration, spec.sweep[0].preset.quality_gate)}):")
    for method, stage in found.items():
        print(calibration.summary(method, stage))
    return grid.with_choice(spec, calibration.chosen_settings(found))


def _chosen_labels(spec, chosen: dict[str, dict]) -> list[tuple[str, str]]:
    """(method, its chosen configuration's label) for printing."""
    from harness.config.registry import methods

    return [(m, methods.build(m, s, spec.sweep[0].preset).config_label()) for m, s in chosen.items()]


def cmd_report(args) -> None:
    from harness.report.page import write_report
    from harness.store import files
    from harness.store.stages import Store

    store = Store(args.results)
    if not store.root.is_dir():
        raise HarnessError(f"no run store at '{store.root}': run 'harness run' or 'harness grid' first")
    if args.out.suffix.lower() not in (".html", ".htm"):
        raise HarnessError(f"--out '{args.out}' must name an .html file")
    inside = store.part_holding(args.out.parent)
    if inside is not None and args.out.parent.resolve() != store.root.resolve():  # (a page beside the runs is none)
        raise HarnessError(f"--out '{args.out}' is in {inside}: write the report beside the store's runs")
    files.check_writable(args.out.parent if str(args.out.parent) else Path("."), "report folder")
    try:
        written = write_report(store, args.out)
    except OSError as err:
        raise HarnessError(f"cannot write the report '{args.out}': {err.strerror or err}") from None
    print(f"wrote {written} ({written.stat().st_size // 1024} KB): open it in a browser, no network needed")


def cmd_export(args) -> None:
    from harness.store.export import export
    from harness.store.stages import Store

    store = Store(args.results)
    if not store.root.is_dir():
        raise HarnessError(f"no run store at '{store.root}'")
    only = None if args.grid is None else grid_runs(args.grid, args.results)
    copied, left_out = export(store, args.dest, keep_texts=args.keep_texts, only=only)
    without = "" if args.keep_texts else " (without their texts)"
    print(f"exported {copied} runs and attribution results to {args.dest}{without}")
    if only is not None and copied < len(only):
        print(f"! {len(only) - copied} of the grid's {len(only)} runs are not stored: the export holds the rest")
    if left_out:
        raise HarnessError(f"{len(left_out)} damaged or edited stages were not exported (named above): {left_out[0]}")


def grid_runs(path: Path, results: Path) -> set[str]:
    """The hashes of the runs the grid at ``path`` makes in the store ``results`` (its calibration's sweep, and its
    cells with the stored choice) and of its calibration stages, building nothing."""
    from harness.cell.pipeline import Pipeline
    from harness.grid import calibration
    from harness.grid import spec as grid
    from harness.store.stages import Store

    spec = grid.load(path)
    keys: set[str] = set()
    if spec.sweep:  # its calibration stages too: the matched tables read them
        found, keys = calibration.stored(spec, results)
        keys |= {stage.key for stage in (found or {}).values()}
        spec = grid.with_choice(spec, calibration.chosen_settings(found)) if found is not None else None
    cells = list(spec.cells) if spec is not None else []
    store = Store(results)
    return keys | {c.run.key for cell in cells for c in Pipeline(cell.preset, store, plan=True).run(*cell.build())}


def cmd_rescore(args) -> None:
    from harness.cell.scoring import rescore_store
    from harness.store.stages import Store

    store = Store(args.results)
    if not store.root.is_dir():
        raise HarnessError(f"no run store at '{store.root}'")
    skipped = []
    if args.prefix_scores:
        from harness.cell.migrate import fill_prefix_scores

        if not args.verbose:
            _quiet_transformers()
        _device_env(args)
        filled, lacking, skipped = fill_prefix_scores(store, args.device)
        print(
            f"prefix scores added to {filled} of the {lacking} stored runs that lacked them and whose detector has them"
        )
    changed, total, left = rescore_store(store)
    skipped += left
    print(f"{changed} of {total} stored runs rescored (the others were up to date)")
    if skipped:
        raise HarnessError(
            f"{len(skipped)} runs could not be rescored and were left as they are (why: above): {skipped[0]}"
        )


def cmd_detect(args) -> int:
    if not args.json:
        report, rows = _audit(args)
        print(format_audit(report, rows, args.show))
        return 0
    # --json: standard output holds the JSON alone. Libraries that print while loading a model (gptqmodel's banner)
    # write to standard error meanwhile.
    with contextlib.redirect_stdout(sys.stderr):
        report, rows = _audit(args)
    print(json.dumps({**report, "texts": rows}, indent=2))
    return 0


def _audit(args) -> tuple[dict, list[dict]]:
    """``harness detect``'s work (``harness.audit.detect``): its report and the per-text rows."""
    from harness.audit.detect import Request

    asked = [f for f, v in (("--decode", args.decode), ("--prompts", args.prompts),
                            ("--system-prompt", args.system_prompt)) if v]  # fmt: skip
    if args.texts is not None and asked:  # (else a setting that changes nothing would key a detection of its own)
        raise HarnessError(
            f"{asked[0]} says how a model is asked or samples, and --texts gives texts already written: drop it, or "
            "give --model to have a suspect model write"
        )
    request = Request(
        args.results, args.alpha, key=args.key, method=args.method, method_args=args.method_arg, model=args.model,
        texts_file=args.texts, preset=args.preset, overrides=preset_settings(args), num_texts=args.num_texts,
    )  # fmt: skip
    if not args.verbose:
        _quiet_transformers()
    _device_env(args)
    return request.decide(args.device)


def format_audit(report: dict, rows: list[dict], show: int) -> str:
    import pandas as pd

    d, key = report["decision"], report["key"]
    table = pd.DataFrame(
        [{"text": r["i"], "tokens": r["tokens"], "score": f"{r['score']:.3f}",
          "p-value": f"{r['p_value']:.2g}" if r.get("p_value") is not None else "-",
          "begins": printable(r["text"][:50].replace("\n", " "))} for r in rows[:show]]
    )  # fmt: skip
    shown = table.to_string(index=False) if show and rows else ""  # --show 0: no table, not "Empty DataFrame"
    more = f"... {len(rows) - show} more texts in {report['scores']}" if len(rows) > show else ""
    if d["p_value"] is None:  # a scheme with no null of its own (harness.audit.verdict.NO_NULL)
        base = d["against_base"]
        tested = f"{d['texts']} texts, {d['tokens']} tokens scored; against the base: AUC {base['auc']:.3f}"
        verdict = f"none: {d['test']}"
    else:
        tested = f"{d['texts']} texts, {d['tokens']} tokens tested; {d['test']}; statistic {d['statistic']:.3f}"
        verdict = (
            f"WATERMARKED: p = {d['p_value']:.3g} < alpha = {d['alpha']:g}"
            if d["watermarked"]
            else f"not shown to be watermarked: p = {d['p_value']:.3g} >= alpha = {d['alpha']:g}"
        ) + f" (this test flags a source that never saw the key with probability at most {d['alpha']:g}, over keys)"
    lines = [
        f"key: {key['method']} ({key['config']}), train stage {key['train_stage']}, base model {key['base_model']}",
        f"{report['source']['kind']}: {report['source']['ref']}"
        + (f" (asked {report['source']['prompts']})" if report["source"].get("prompts") else "")
        + (f" (sampled with {report['source']['decoding']})" if report["source"].get("decoding") else ""),
        *(part for part in (shown, more) if part),
        "",
        tested,
        f"human texts' median score: {d['human_median_score']:.3f} ({d['human_texts']} texts)"
        + (f"; the base model's: {d['reference_median_score']:.3f}" if "reference_median_score" in d else ""),
        f"decision: {verdict}",
        *(
            [f"the key is a published one ({key['published']}): this verdict is no evidence against anyone who could "
             "know the key (its p-values hold over keys the source could not know; anyone who knows this one can "
             "write text it flags, or train it into a model)"] if key.get("published") else []
        ),
        *_quality_lines(report.get("quality")),
    ]  # fmt: skip
    return printable("\n".join(lines), keep="\n\t")  # texts (and names from a store) are shown, never obeyed


def _quality_lines(quality: dict | None) -> list[str]:
    """What ``harness detect`` says of the suspect's texts beside the base's (``audit.detect.suspect_quality``)."""
    if quality is None:
        return []
    said = (f"its texts: median PPL {quality['median_ppl']:.2f}, {quality['ppl_ratio']:.2f}x the base model's, under "
            f"{quality['judge']}; repeated 3-grams {quality['rep3']:.3f} (the base's {quality['base_rep3']:.3f}): "
            f"{quality['verdict']}")  # fmt: skip
    if quality["verdict"].startswith("degenerate"):
        said += ("\n! the suspect's texts fail the quality gate: they no longer count as writing, and a decision on "
                 "them says nothing of a model anyone would use")  # fmt: skip
    return [said]


def _quiet_transformers() -> None:
    """transformers 5 draws a progress bar for every weight load and the hub client logs every retry; our bars
    and our one-line errors are the ones that matter (-v shows theirs)."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()
