"""Grids: a YAML spec of methods x attacks expanded into cells, each one ``harness run`` through the run store.

A spec (``grids/tiny.yaml`` is the example to copy)::

    preset: tiny                  # a preset name
    overrides: {train.steps: 50}  # optional: section.key -> value, as --set
    seeds: [0, 1]                 # optional: train.seed values, each a copy of the grid (default: the preset's)
    groups:                       # named blocks; the cells of a block are its methods x its attacks
      robustness:
        methods:
          gu-kgw: [{}]            # a list of settings over the preset's; {} = the preset's own
          pro: [{}, {delta: 0.5}]
        attacks:                  # optional, default {none: [{}]}
          slerp: [{t: 0.1}, {t: 0.5}]
    attribution: robustness       # optional: a group whose models' detectors are applied to each other's texts

The whole spec is validated (keys, names, settings, models and data) before any cell runs, and an error names the
line. Cells that several groups share run once. Every cell is a ``Pipeline.run``: stored stages are reused, so a
grid started again after a crash recomputes only what was not finished.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.config import presets
from harness.config.errors import HarnessError

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Group(_Strict):
    overrides: dict[str, Any] = {}  # over the spec's, for this group only (e.g. another base model)
    methods: dict[str, list[dict[str, Any]]] = Field(min_length=1)
    attacks: dict[str, list[dict[str, Any]]] = {"none": [{}]}


class GridSpec(_Strict):
    preset: str
    overrides: dict[str, Any] = {}
    seeds: list[int] | None = Field(None, min_length=1)
    groups: dict[str, Group] = Field(min_length=1)
    attribution: str | None = None


@dataclass(frozen=True)
class Cell:
    """One method configuration x one attack configuration on one resolved preset: one ``harness run``."""

    preset: presets.Preset = field(compare=False)
    seed: int
    method: str
    method_settings: tuple  # ((key, value), ...) over the preset's defaults, as the spec gave them
    attack: str
    attack_settings: tuple
    setup: str = ""  # the resolved preset as JSON: cells of different presets differ (set by ``make``)

    @classmethod
    def make(cls, preset: presets.Preset, seed: int, method: str, ms: tuple, attack: str, ats: tuple) -> Cell:
        return cls(preset, seed, method, ms, attack, ats, preset.model_dump_json())

    def build(self):
        """The method and attack plugins of this cell (validated)."""
        from harness.config.registry import attacks, methods

        m = methods.build(self.method, dict(self.method_settings), self.preset)
        a = attacks.build(self.attack, dict(self.attack_settings), self.preset)
        return m, a

    @property
    def training(self) -> tuple:
        """What identifies the trained model this cell uses (cells that share it share one training)."""
        return (self.setup, self.method, self.method_settings)

    def name(self, with_seed: bool = False) -> str:
        m, a = self.build()
        seed = f" seed={self.seed}" if with_seed else ""
        attack = "none" if a.identity else f"{a.name}({a.config_label()})"
        return f"{m.name}({m.config_label()}) x {attack}{seed}"


@dataclass(frozen=True)
class Grid:
    spec: GridSpec
    source: str
    cells: tuple[Cell, ...]
    attribution: tuple[Cell, ...]  # one unaltered cell per detector of the attribution group

    @property
    def several_seeds(self) -> bool:
        return len({c.seed for c in self.cells}) > 1


def _lines(text: str) -> dict[tuple, int]:
    """Line number (1-based) of every key and item of a YAML document, by path: ``("groups", "x", "methods")``."""
    import yaml

    found: dict[tuple, int] = {}

    def walk(node, path: tuple) -> None:
        found.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                found[(*path, str(key.value))] = key.start_mark.line + 1
                walk(value, (*path, str(key.value)))
        elif isinstance(node, yaml.SequenceNode):
            for i, value in enumerate(node.value):
                walk(value, (*path, i))

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, ())
    return found


def _where(source: str, lines: dict[tuple, int], path: tuple) -> str:
    """``file:line`` of the deepest part of ``path`` that the document has."""
    path = tuple(p if isinstance(p, int) else str(p) for p in path)
    while path and path not in lines:
        path = path[:-1]
    return f"{source}:{lines.get(path, 1)}"


def load(path: Path) -> Grid:
    """Read, validate and expand a grid spec; a problem anywhere is one ``HarnessError`` naming the line."""
    import yaml

    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise HarnessError(f"no grid spec at '{path}'") from None
    except (OSError, UnicodeDecodeError) as err:
        raise HarnessError(f"cannot read grid spec '{path}': {err}") from None
    try:
        raw = yaml.safe_load(text)
        lines = _lines(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and start is not None:  # e.g. an unclosed bracket: say where it opened
            problem += f" ({context} that starts on line {start.line + 1})"
        raise HarnessError(f"{source}{line}: malformed YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise HarnessError(f"{source}:1: a grid spec is a mapping with 'preset' and 'groups' (see grids/tiny.yaml)")
    try:
        spec = GridSpec(**raw)
    except ValidationError as err:
        e = err.errors()[0]
        loc = e["loc"]
        what = ".".join(str(p) for p in loc) or "spec"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        raise HarnessError(f"{_where(source, lines, loc)}: {what}: {msg}") from None
    except TypeError as err:  # a non-string key at the top level
        raise HarnessError(f"{source}:1: {err}") from None
    return expand(spec, source, lines)


def expand(spec: GridSpec, source: str = "<grid>", lines: dict | None = None) -> Grid:
    """The cells of a validated spec, in the order that trains each model once (grouped by training, in the order
    the spec names them); every plugin and setting is checked here."""
    lines = lines or {}
    at = lambda *path: _where(source, lines, path)  # noqa: E731
    try:
        base = presets.get_preset(spec.preset)
    except HarnessError as err:
        raise HarnessError(f"{at('preset')}: {err}") from None
    try:
        base = presets.apply_overrides(base, _strings(spec.overrides))
    except HarnessError as err:
        raise HarnessError(f"{at('overrides')}: {err}") from None
    seeds = spec.seeds or [base.train.seed]
    if len(set(seeds)) != len(seeds):
        raise HarnessError(f"{at('seeds')}: a seed is listed twice")
    cells: dict[Cell, None] = {}
    by_group: dict[str, list[Cell]] = {}
    for group_name, group in spec.groups.items():
        try:
            preset = presets.apply_overrides(base, _strings(group.overrides))
        except HarnessError as err:
            raise HarnessError(f"{at('groups', group_name, 'overrides')}: {err}") from None
        if not group.attacks:
            raise HarnessError(f"{at('groups', group_name, 'attacks')}: no attacks (use {{none: [{{}}]}})")
        for seed in seeds:
            seeded = preset.model_copy(update={"train": preset.train.model_copy(update={"seed": seed})})
            for method, method_list in group.methods.items():
                if not method_list:
                    raise HarnessError(f"{at('groups', group_name, 'methods', method)}: no settings (use [{{}}])")
                for i, ms in enumerate(method_list):
                    m = _plugin("method", seeded, method, ms, at("groups", group_name, "methods", method, i))
                    for attack, attack_list in group.attacks.items():
                        if not attack_list:
                            raise HarnessError(
                                f"{at('groups', group_name, 'attacks', attack)}: no settings (use [{{}}])"
                            )
                        for j, ats in enumerate(attack_list):
                            a = _plugin("attack", seeded, attack, ats, at("groups", group_name, "attacks", attack, j))
                            # Cells are told apart by their resolved settings: {} and the preset's own values are one
                            # cell, trained once, on one shard.
                            cell = Cell.make(seeded, seed, method, _frozen(m.params.model_dump()), attack,
                                             _frozen(a.params.model_dump()))  # fmt: skip
                            cells.setdefault(cell)
                            by_group.setdefault(group_name, []).append(cell)
    ordered = sorted(cells, key=_training_order(list(cells)))
    attribution: list[Cell] = []
    if spec.attribution is not None:
        if spec.attribution not in spec.groups:
            raise HarnessError(f"{at('attribution')}: no group '{spec.attribution}' (groups: {', '.join(spec.groups)})")
        for cell in by_group[spec.attribution]:
            unaltered = Cell.make(cell.preset, cell.seed, cell.method, cell.method_settings, "none", ())
            if unaltered not in attribution:
                attribution.append(unaltered)
    return Grid(spec, source, tuple(ordered), tuple(attribution))


def _strings(overrides: dict[str, Any]) -> dict[str, str]:
    """YAML override values as the ``--set`` strings they stand for."""
    import json

    def text(value: Any) -> str:
        if value is None:
            return "none"
        if isinstance(value, bool):
            return str(value).lower()
        return json.dumps(value) if isinstance(value, list | dict) else str(value)

    return {str(k): text(v) for k, v in overrides.items()}


def _frozen(settings: dict) -> tuple:
    return tuple(sorted((str(k), _hashable(v)) for k, v in settings.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _plugin(kind: str, preset: presets.Preset, name: str, settings: Any, where: str):
    """The validated plugin ``name`` with ``settings`` over the preset's; errors name the spec's line."""
    from harness.config.registry import attacks, methods

    if not isinstance(settings, dict):
        raise HarnessError(f"{where}: settings must be a mapping like {{k: 1}}, not {settings!r}")
    registry = methods if kind == "method" else attacks
    try:
        return registry.build(name, settings, preset)
    except HarnessError as err:
        raise HarnessError(f"{where}: {err}") from None


def _training_order(cells: list[Cell]):
    """Sort key: cells of one training together, trainings in the order the spec first names them."""
    first: dict[tuple, int] = {}
    for c in cells:
        first.setdefault(c.training, len(first))
    return lambda c: (first[c.training], cells.index(c))


def parse_shard(text: str) -> tuple[int, int]:
    """``i/n`` (1 <= i <= n) -> (i, n)."""
    i, sep, n = text.partition("/")
    if not sep or not i.strip().isdigit() or not n.strip().isdigit():
        raise HarnessError(f"bad shard '{text}': expected i/n with 1 <= i <= n, e.g. 1/4")
    i_, n_ = int(i), int(n)
    if n_ < 1 or not 1 <= i_ <= n_:
        raise HarnessError(f"bad shard '{text}': expected i/n with 1 <= i <= n, e.g. 1/4")
    return i_, n_


def shard(cells: tuple[Cell, ...], i: int, n: int) -> list[Cell]:
    """Shard ``i`` of ``n``: whole trainings (a model and all its attacks stay on one machine), dealt out greedily by
    number of cells, largest first, ties in spec order: the same split on every machine."""
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.training, []).append(c)
    loads = [0] * n
    mine: list[Cell] = []
    order = sorted(enumerate(groups.values()), key=lambda kv: (-len(kv[1]), kv[0]))
    for _, group in order:
        target = min(range(n), key=lambda k: (loads[k], k))
        loads[target] += len(group)
        if target == i - 1:
            mine.extend(group)
    return [c for c in cells if c in set(mine)]


# --- running -----------------------------------------------------------------------------------------------------
def check_cells(cells: list[Cell]) -> None:
    """The inputs of every cell (models, data, plugins' own checks), once per distinct preset and plugin."""
    from harness.run.pipeline import check_inputs

    seen: set = set()
    for cell in cells:
        m, a = cell.build()
        key = (cell.preset.model_dump_json(), m.name, str(m.params), a.name, str(a.params))
        if key not in seen:
            seen.add(key)
            check_inputs(cell.preset, (m, a))


def plan(cell: Cell, results: Path, device: str | None) -> list[tuple[str, bool]]:
    """``(row, stored)`` of each run the cell makes, building nothing."""
    from harness.run.pipeline import Pipeline
    from harness.store.stages import Store

    m, a = cell.build()
    pipe = Pipeline(cell.preset, Store(results), device, plan=True)
    return [(c.row, c.run.done) for c in pipe.run(m, a)]


def run_cell(cell: Cell, results: str, device: str | None) -> dict:
    """Run one cell (the unit a job runs); never raises for the cell's own failure: the grid goes on."""
    from harness.run.pipeline import Pipeline
    from harness.store.stages import Store

    try:
        m, a = cell.build()
        done = Pipeline(cell.preset, Store(Path(results)), device).run(m, a)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001  (one failed cell must not stop the others; its traceback is kept)
        return _failed(err)
    return {
        "status": "reused" if all(c.reused for c in done) else "computed",
        "rows": [(c.row, c.metrics.get("auc")) for c in done],
    }


def train_cell(cell: Cell, results: str, device: str | None) -> dict:
    """Train (or reuse) the model of a cell: the first wave of a cluster grid, so that its cells do not all wait on
    one training."""
    from harness.run.pipeline import Pipeline
    from harness.store.stages import Store

    try:
        m, _ = cell.build()
        pipe = Pipeline(cell.preset, Store(Path(results)), device)
        pipe.prompts  # noqa: B018
        pipe.train(m)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001  (one failure must not stop the grid; its traceback is kept)
        return _failed(err)
    return {"status": "ok"}


def attribute(cells: tuple[Cell, ...], results: str, device: str | None) -> dict:
    """Every detector of ``cells`` on the stored texts of every model of ``cells`` and of the base (generating
    nothing new: the cells' unaltered generations are stored once the cells have run)."""
    from harness.config.registry import attacks
    from harness.run.pipeline import Pipeline
    from harness.store.stages import Store

    try:
        store = Store(Path(results))
        pipes = {c: Pipeline(c.preset, store, device) for c in cells}
        none = attacks.build("none", {})
        sources = []  # (label dict, generation stage)
        first = pipes[cells[0]]
        base_gen = first.generate(first.base["path"], f"base:{first.base['fingerprint']}", "base model")
        sources.append(({"label": "Unwatermarked base", "method": None, "config": None}, base_gen))
        trained = {}
        for c in cells:
            m, _ = c.build()
            trained[c] = (m, pipes[c].train(m))
            (out,) = pipes[c].attack(none, trained[c][1])
            gen = pipes[c].generate(out.path, out.model_id, out.row)
            label = {"label": f"{m.label} ({m.config_label()})", "method": m.label, "config": m.config_label(),
                     "train": trained[c][1].key}  # fmt: skip
            sources.append((label, gen))
        for c in cells:
            m, stage = trained[c]
            for label, gen in sources:
                pipes[c].attribution(m, stage, gen, label)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001  (one failure must not stop the grid; its traceback is kept)
        return _failed(err)
    return {"status": "ok", "pairs": len(cells) * len(sources)}


def _failed(err: BaseException) -> dict:
    """The outcome of a job that raised: its one-line error and, for the failures folder, its traceback."""
    return {
        "status": "failed",
        "error": f"{type(err).__name__}: {_first_line(err)}",
        "traceback": traceback.format_exc(),
    }


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


# --- executors ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resources:
    """What each cluster job asks for (submitit's parameters; the ones left None are the cluster's defaults)."""

    partition: str | None = None
    account: str | None = None
    gpus: int | None = None
    cpus: int | None = None
    mem_gb: int | None = None
    time_min: int = 240
    max_parallel: int | None = None


EXECUTORS = ("inline", "local", "slurm")


def make_executor(kind: str, jobs_dir: Path, res: Resources):
    """A submitit executor for ``local`` (subprocesses on this machine) or ``slurm``; ``inline`` is None (cells run in
    this process, one after the other)."""
    if kind == "inline":
        return None
    if kind not in EXECUTORS:
        raise HarnessError(f"unknown executor '{kind}'. Valid executors: {', '.join(EXECUTORS)}")
    try:
        import submitit
    except ImportError:
        raise HarnessError(
            f"executor '{kind}' needs the Python package 'submitit': pip install 'watermark-harness[cluster]'"
        ) from None
    params: dict[str, Any] = {"timeout_min": res.time_min}
    if res.gpus is not None:
        params["gpus_per_node"] = res.gpus
    if res.cpus is not None:
        params["cpus_per_task"] = res.cpus
    if res.mem_gb is not None:
        params["mem_gb"] = res.mem_gb
    if kind == "slurm":
        import shutil

        if shutil.which("sbatch") is None:
            raise HarnessError("executor 'slurm' needs Slurm's 'sbatch' on this machine's PATH and found none")
        params.update(
            {
                k: v
                for k, v in {
                    "slurm_partition": res.partition,
                    "slurm_account": res.account,
                    "slurm_array_parallelism": res.max_parallel,
                }.items()
                if v is not None
            }
        )
    elif res.partition or res.account:
        raise HarnessError("--partition and --account are Slurm options: use them with --executor slurm")
    jobs_dir.mkdir(parents=True, exist_ok=True)
    executor = submitit.AutoExecutor(folder=str(jobs_dir / "%j"), cluster=kind)
    executor.update_parameters(**params)
    return executor


def _map(
    executor, fn, items: list[Cell], results: Path, device: str | None, what: str, with_seed: bool = False
) -> list[dict]:
    """``fn(item, results, device)`` for every item: inline in order, or as one submitit job array (waited for)."""
    if not items:
        return []
    if executor is None:
        out = []
        for k, item in enumerate(items, 1):
            log.info("%s %d/%d: %s", what, k, len(items), item.name(with_seed))
            out.append(fn(item, str(results), device))
            log.info("%s %d/%d: %s", what, k, len(items), out[-1]["status"])
        return out
    import submitit

    jobs = executor.map_array(fn, items, [str(results)] * len(items), [device] * len(items))
    log.info("%s: submitted %d jobs (%s); waiting", what, len(jobs), ", ".join(j.job_id for j in jobs[:5]))
    out = []
    for job in jobs:
        try:
            out.append(job.result())
        except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as err:
            out.append({"status": "failed", "error": f"job {job.job_id}: {_first_line(err)}", "traceback": str(err)})
    return out


def run(
    grid: Grid,
    results: Path,
    device: str | None = None,
    executor_kind: str = "inline",
    shard_of: tuple[int, int] | None = None,
    jobs_dir: Path | None = None,
    resources: Resources | None = None,
) -> dict:
    """Run the grid's cells (or one shard of them) and its attribution; return the summary counts and failures."""
    from harness.store.stages import Store

    cells = list(grid.cells) if shard_of is None else shard(grid.cells, *shard_of)
    executor = make_executor(executor_kind, jobs_dir or results / "jobs", resources or Resources())
    check_cells(cells)  # before any cell runs: a missing model or dataset fails the grid in seconds
    Store(results).check_writable()
    Store(results).sweep()
    trainings = list({c.training: c for c in cells}.values())
    failures: list[tuple[str, dict]] = []
    if executor is not None and len(trainings) > 1:  # one job per model first: cells then never wait on a training
        for cell, res in zip(
            trainings,
            _map(executor, train_cell, trainings, results, device, "training", grid.several_seeds),
            strict=True,
        ):
            if res["status"] == "failed":
                log.warning("training for %s failed: %s", cell.name(), res["error"])
    outcomes = _map(executor, run_cell, cells, results, device, "cell", grid.several_seeds)
    summary = {"cells": len(cells), "reused": 0, "computed": 0, "failed": 0}
    for cell, res in zip(cells, outcomes, strict=True):
        summary[res["status"]] += 1
        if res["status"] == "failed":
            failures.append((cell.name(grid.several_seeds), res))
    if grid.attribution and shard_of is None:
        log.info("attribution: %d detectors on the texts of %d models and the base", len(grid.attribution),
                 len(grid.attribution))  # fmt: skip
        if executor is None:
            res = attribute(grid.attribution, str(results), device)
        else:  # one job, where the detectors' models (GPU) are
            import submitit

            job = executor.submit(attribute, grid.attribution, str(results), device)
            try:
                res = job.result()
            except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as err:
                res = {"status": "failed", "error": f"job {job.job_id}: {_first_line(err)}", "traceback": str(err)}
        if res["status"] == "failed":
            failures.append(("attribution", res))
        summary["attribution"] = res["status"]
    summary["failures"] = [(name, res["error"], _keep_trace(results, name, res["traceback"])) for name, res in failures]
    return summary


def _keep_trace(results: Path, name: str, trace: str) -> Path:
    """Write a failure's traceback under ``<results>/failures/`` and return the file."""
    import hashlib
    import time

    folder = results / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{time.strftime('%Y%m%dT%H%M%S')}-{hashlib.sha256(name.encode()).hexdigest()[:10]}.txt"
    file.write_text(f"{name}\n\n{trace}")
    return file
