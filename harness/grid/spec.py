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
        decodings: [{}, {top_p: 0.9}]  # optional: how the models sample, a cell each (as harness run --decode)
    attribution: robustness       # optional: a group whose models' detectors are applied to each other's texts
    calibration:                  # optional: each method's strength chosen on the unaltered model before any attack
      ppl_ratio_max: 1.25         #   (harness.grid.calibration); a group's entry ``calibrated`` runs the choice
      over_budget: refuse         #   or closest: a method that cannot meet the budget runs, marked, never ranked
      sweep: {gu-kgw: {delta: [1, 2, 4]}}

The whole spec is validated (keys, names, settings, models and data) before any cell runs, and an error names the
line. Cells that several groups share run once. Every cell is a ``Pipeline.run`` (``harness.grid.jobs``), run here or
as submitit jobs (``harness.grid.executors``): stored stages are reused, so a grid started again after a crash
recomputes only what was not finished.
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from harness.config import presets
from harness.config.errors import HarnessError
from harness.config.settings import Preset, apply_overrides, decode_overrides, prompts_overrides
from harness.store import files

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


CALIBRATED = "calibrated"  # a method entry of a group: the configuration the spec's calibration chose


class Group(_Strict):
    overrides: dict[str, Any] = {}  # over the spec's, for this group only (e.g. another base model)
    # A list of settings over the preset's ({} = the preset's own), or "calibrated": the calibration's choice.
    methods: dict[str, list[dict[str, Any] | Literal["calibrated"]]] = Field(min_length=1)
    attacks: dict[str, list[dict[str, Any]]] = {"none": [{}]}
    # How every model of the group samples: each entry a cell of every method x attack (``harness run --decode``);
    # {} = the preset's own decoding.
    decodings: list[dict[str, Any]] = Field(default_factory=lambda: [{}], min_length=1)
    # What every model of the group is asked: each entry a cell of every method x attack x decoding (``harness run
    # --prompts``): documents, code or chat, or {prompts: chat, system_prompt: "..."}.
    prompts: list[str | dict[str, Any]] = Field(default_factory=lambda: ["documents"], min_length=1)


class Calibration(_Strict):
    """Each method's strength chosen on the unaltered model, by a rule written before any attack runs: every value of
    one setting per method is trained and evaluated unaltered (the ``sweep``), and the chosen configuration is the
    one that maximises ``pick`` among those whose unaltered texts pass the preset's quality gate with a median PPL
    at most ``ppl_ratio_max`` times the unwatermarked base's (``harness.grid.calibration``)."""

    ppl_ratio_max: float = Field(ge=1, allow_inf_nan=False)
    pick: Literal["AUC", "AUC_vs_base", "TPR@1%"] = "AUC_vs_base"
    # A method none of whose swept values meets the budget: "refuse" stops the grid in one line naming the closest
    # value; "closest" runs that value (the smallest PPL ratio among those inside the quality gate) and marks the
    # method outside the budget: the tables at matched quality show its rows and never order it against another.
    over_budget: Literal["refuse", "closest"] = "refuse"
    sweep: dict[str, dict[str, list[Any]]] = Field(min_length=1)  # method -> {setting: [values]}: one setting each

    @field_validator("ppl_ratio_max", mode="before")
    @classmethod
    def _a_number(cls, value):  # (YAML's true would be the budget 1.0, as a plugin's settings refuse it)
        if isinstance(value, bool):
            raise ValueError("a number, not true or false")
        return value


class GridSpec(_Strict):
    preset: str
    overrides: dict[str, Any] = {}
    seeds: list[StrictInt] | None = Field(None, min_length=1)  # (strict: true is no seed; the range is train.seed's)
    calibration: Calibration | None = None
    groups: dict[str, Group] = Field(min_length=1)
    attribution: str | None = None


@dataclass(frozen=True)
class Cell:
    """One method configuration x one attack configuration on one resolved preset: one ``harness run``."""

    preset: Preset = field(compare=False)
    seed: int
    method: str
    method_settings: tuple  # ((key, value), ...) over the preset's defaults, as the spec gave them
    attack: str
    attack_settings: tuple
    setup: str = ""  # the resolved preset as JSON: cells of different presets differ (set by ``make``)
    where: str = field(default="", compare=False)  # ``spec:line`` of the method entry the cell comes from

    @classmethod
    def make(cls, preset: Preset, seed: int, method: str, ms: tuple, attack: str, ats: tuple) -> Cell:
        return cls(preset, seed, method, ms, attack, ats, preset.model_dump_json())

    def build(self):
        """The method and attack plugins of this cell (validated)."""
        from harness.config.registry import attacks, methods

        m = methods.build(self.method, _thawed(self.method_settings), self.preset)
        a = attacks.build(self.attack, _thawed(self.attack_settings), self.preset)
        return m, a

    @property
    def training(self) -> tuple:
        """What identifies the trained model this cell uses (cells that share it share one training): its setup but
        for how its models sample and what they are asked, which no training reads."""
        plain = self.preset.model_copy(update={"eval": self.preset.eval.plain()})
        return (plain.model_dump_json(), self.method, self.method_settings)

    def name(self, with_seed: bool = False) -> str:
        m, a = self.build()
        seed = f" seed={self.seed}" if with_seed else ""
        # An attack whose table label depends on its settings (a merge's TIES or DARE-TIES, a fine-tuning's dataset)
        # names it: two merges of the same weights are otherwise the same words.
        kind = a.table_label()
        attack = "none" if a.identity else f"{a.name}({f'{kind}: ' if kind != a.label else ''}{a.config_label()})"
        decoding, prompts = self.preset.eval.decoding_label(), self.preset.eval.prompts_label()
        decoding = f" decoding({decoding})" if decoding else ""
        prompts = f" prompts({prompts})" if prompts else ""
        return f"{m.name}({m.config_label()}) x {attack}{prompts}{decoding}{seed}"


@dataclass(frozen=True)
class Grid:
    spec: GridSpec
    source: str
    cells: tuple[Cell, ...]
    attribution: tuple[Cell, ...]  # one unaltered cell per detector of the attribution group
    sweep: tuple[Cell, ...] = ()  # the calibration's cells: each swept configuration, unaltered
    # ``group: method`` entries that name the calibrated configuration, left out of ``cells`` until it is chosen
    waiting: tuple[str, ...] = ()
    # Those entries' cells at the first swept value: what the choice's cells will be but for the swept setting, so
    # that their inputs (an attack the method cannot take, a missing package) are checked before the sweep runs
    provisional: tuple[Cell, ...] = ()
    lines: dict = field(default_factory=dict, compare=False)  # the spec's line of each key (for errors)

    @property
    def several_seeds(self) -> bool:
        return len({c.seed for c in (*self.cells, *self.sweep)}) > 1


MAX_CELLS = 10_000  # cells of one grid: each a run of minutes at least (weeks of a GPU), the paper's grid about 600
MAX_SPEC_BYTES = 1 << 20  # a grid spec is a page of YAML; more is not one (e.g. /dev/zero)
MAX_SPEC_NODES = 100_000  # entries of the spec with its aliases expanded: the paper's grid has ~600


def _document(text: str, source: str):
    """The YAML document of a spec as one node graph (aliases are shared nodes, not copies), refused in one line
    where it could not be a grid spec: a key given twice (YAML keeps the last one silently), a key that is not text,
    an alias that refers to itself, or aliases that expand to more than ``MAX_SPEC_NODES`` entries (a "billion
    laughs"). Checked on the graph, in time linear in the text."""
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        return None
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise HarnessError(f"{source}:{node.start_mark.line + 1}: an alias that refers to itself")
        open_.add(id(node))
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                line = key.start_mark.line + 1
                if key.tag == "tag:yaml.org,2002:merge":  # "<<: *defaults"
                    total += size(value)
                    continue
                if not isinstance(key, yaml.ScalarNode) or key.tag != "tag:yaml.org,2002:str":
                    what = key.value if isinstance(key, yaml.ScalarNode) else "a collection"
                    raise HarnessError(f"{source}:{line}: the key {what!r} is not text")
                if key.value in seen:
                    raise HarnessError(
                        f"{source}:{line}: '{key.value}' is given twice (first on line {seen[key.value]}); "
                        "YAML would keep only the last"
                    )
                seen[key.value] = line
                total += size(value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        open_.discard(id(node))
        sizes[id(node)] = total
        if total > MAX_SPEC_NODES:
            raise HarnessError(
                f"{source}:{node.start_mark.line + 1}: its aliases expand to more than {MAX_SPEC_NODES:,} entries"
            )
        return total

    size(root)
    return root


def _deepest_line(text: str) -> int:
    """The first line (1-based) where a YAML text is nested deepest, counting flow brackets and block indentation
    (approximately: quotes and comments are not parsed), to name where a spec too deep to read goes too deep;
    a scan of the text, since the parser that would say so is what ran out of stack."""
    depth, best, best_line = 0, -1, 1
    indents: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip(" -")
        if stripped and not stripped.startswith("#") and depth == 0:  # block nesting: a stack of indentations
            indent = len(line) - len(stripped)
            while indents and indents[-1] >= indent:
                indents.pop()
            indents.append(indent)
        peak = depth
        for char in line:
            depth += (char in "[{") - (char in "]}")
            peak = max(peak, depth)
        if peak + len(indents) > best:
            best, best_line = peak + len(indents), number
    return best_line


def _lines(root) -> dict[tuple, int]:
    """Line number (1-based) of every key and item of a YAML document (``_document``), by path:
    ``("groups", "x", "methods")``; an aliased node is walked where it is first reached."""
    import yaml

    found: dict[tuple, int] = {}
    walked: set[int] = set()

    def walk(node, path: tuple) -> None:
        found.setdefault(path, node.start_mark.line + 1)
        if id(node) in walked:
            return
        walked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                found[(*path, str(key.value))] = key.start_mark.line + 1
                walk(value, (*path, str(key.value)))
        elif isinstance(node, yaml.SequenceNode):
            for i, value in enumerate(node.value):
                walk(value, (*path, i))

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
    text = files.read_bounded(path, "grid spec", MAX_SPEC_BYTES)
    try:
        root = _document(text, source)
        raw = yaml.SafeLoader(text).construct_document(root) if root is not None else None
        lines = _lines(root)
        files.check_surrogates(raw, source)
    except RecursionError:  # (PyYAML's composer and these walks recurse)
        raise HarnessError(f"{source}:{_deepest_line(text)}: nested too deeply to read") from None
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
    return expand(spec, source, lines)


def only_groups(g: Grid, names: list[str]) -> Grid:
    """The grid of the named groups alone (``harness grid --group``), so that a short lease runs what matters first:
    a grid otherwise runs training by training, every group of one model before the next model. The attribution
    stays only where its group is among them."""
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise HarnessError(f"{g.source}: --group {twice} is given twice")
    unknown = [n for n in names if n not in g.spec.groups]
    if unknown:
        raise HarnessError(f"{g.source}: no group '{unknown[0]}' (groups: {', '.join(g.spec.groups)})")
    keep = {n: g.spec.groups[n] for n in g.spec.groups if n in names}
    attribution = g.spec.attribution if g.spec.attribution in keep else None
    calibration = g.spec.calibration
    if calibration is not None:  # (each method's choice is its own stage: the kept groups' methods keep theirs)
        used = _calibrated_methods(keep)
        sweep = {m: s for m, s in calibration.sweep.items() if m in used}
        calibration = calibration.model_copy(update={"sweep": sweep}) if sweep else None
    update = {"groups": keep, "attribution": attribution, "calibration": calibration}
    return expand(g.spec.model_copy(update=update), g.source, g.lines)


def expand(spec: GridSpec, source: str = "<grid>", lines: dict | None = None, chosen: dict | None = None) -> Grid:
    """The cells of a validated spec, in the order that trains each model once (grouped by training, in the order
    the spec names them); every plugin and setting is checked here. ``chosen``: the calibration's choice (method ->
    its settings), which the entries ``calibrated`` take; without it they wait (``Grid.waiting``)."""
    lines = lines or {}
    at = lambda *path: _where(source, lines, path)  # noqa: E731
    try:
        base = presets.get_preset(spec.preset)
    except HarnessError as err:
        raise HarnessError(f"{at('preset')}: {err}") from None
    try:
        base = apply_overrides(base, _strings(spec.overrides))
    except HarnessError as err:
        raise HarnessError(f"{at('overrides')}: {err}") from None
    seeds = spec.seeds or [base.train.seed]
    if len(set(seeds)) != len(seeds):
        raise HarnessError(f"{at('seeds')}: a seed is listed twice")
    for seed in seeds:  # each checked as train.seed, as --set train.seed=... would be
        try:
            apply_overrides(base, {"train.seed": str(seed)})
        except HarnessError as err:
            raise HarnessError(f"{at('seeds')}: {err}") from None
    planned = sum(len(g.prompts) * len(g.decodings) * len(seeds) * sum(map(len, g.methods.values()))
                  * sum(map(len, g.attacks.values())) for g in spec.groups.values())  # fmt: skip
    if planned > MAX_CELLS:
        raise HarnessError(
            f"{at('groups')}: the groups make {planned:,} cells (prompts x decodings x seeds x methods x attacks), "
            f"more than a grid runs ({MAX_CELLS:,}): split the spec"
        )
    sweep = _sweep(spec, base, seeds, at)
    cells: dict[Cell, None] = {}
    provisional: dict[Cell, None] = {}
    by_group: dict[str, list[Cell]] = {}
    waiting: list[str] = []
    for group_name, group in spec.groups.items():
        try:
            preset = apply_overrides(base, _strings(group.overrides))
        except HarnessError as err:
            raise HarnessError(f"{at('groups', group_name, 'overrides')}: {err}") from None
        if not group.attacks:
            raise HarnessError(f"{at('groups', group_name, 'attacks')}: no attacks (use {{none: [{{}}]}})")
        asked = []
        for k, prompts in enumerate(group.prompts):
            try:
                asked.append(apply_overrides(preset, prompts_overrides(prompts)))
            except HarnessError as err:
                raise HarnessError(f"{at('groups', group_name, 'prompts', k)}: {err}") from None
        decoded = []
        for k, decoding in enumerate(group.decodings):
            try:
                overrides = decode_overrides(_strings(decoding))
                decoded += [apply_overrides(preset, overrides) for preset in asked]
            except HarnessError as err:
                raise HarnessError(f"{at('groups', group_name, 'decodings', k)}: {err}") from None
        for preset, seed in itertools.product(decoded, seeds):
            seeded = preset.model_copy(update={"train": preset.train.model_copy(update={"seed": seed})})
            for method, method_list in group.methods.items():
                if not method_list:
                    raise HarnessError(f"{at('groups', group_name, 'methods', method)}: no settings (use [{{}}])")
                for i, ms in enumerate(method_list):
                    waits = False
                    if ms == CALIBRATED:
                        swept = spec.calibration.sweep if spec.calibration is not None else {}
                        if method not in swept:
                            raise HarnessError(
                                f"{at('groups', group_name, 'methods', method, i)}: '{CALIBRATED}' needs a "
                                f"calibration section that sweeps {method}"
                            )
                        waits = chosen is None or method not in chosen
                        if waits:
                            waiting.append(f"{group_name}: {method}")
                            ((name, values),) = swept[method].items()
                            ms = {name: values[0]}
                        else:
                            ms = chosen[method]
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
                            cell = replace(cell, where=at("groups", group_name, "methods", method, i))
                            if waits:
                                provisional.setdefault(cell)
                                continue
                            cells.setdefault(cell)
                            by_group.setdefault(group_name, []).append(cell)
    _check_sweep_used(spec, at)
    _check_rows_apart(list(cells))
    ordered = sorted(cells, key=_training_order(list(cells)))
    attribution: list[Cell] = []
    if spec.attribution is not None:
        if spec.attribution not in spec.groups:
            raise HarnessError(f"{at('attribution')}: no group '{spec.attribution}' (groups: {', '.join(spec.groups)})")
        for cell in by_group[spec.attribution]:
            unaltered = Cell.make(cell.preset, cell.seed, cell.method, cell.method_settings, "none", ())
            if unaltered not in attribution:
                attribution.append(unaltered)
    return Grid(spec, source, tuple(ordered), tuple(attribution), sweep, tuple(dict.fromkeys(waiting)),
                provisional=tuple(provisional), lines=lines)  # fmt: skip


def with_choice(g: Grid, chosen: dict[str, dict]) -> Grid:
    """``g`` with its ``calibrated`` entries as the calibration chose (method -> settings)."""
    return expand(g.spec, g.source, g.lines, chosen)


def _sweep(spec: GridSpec, base: Preset, seeds: list[int], at) -> tuple[Cell, ...]:
    """The calibration's cells (``Calibration``): each swept value of each method, unaltered, for every seed; one
    setting per method and at least two values, each a valid setting of the method."""
    if spec.calibration is None:
        return ()
    out: list[Cell] = []
    for method, settings in spec.calibration.sweep.items():
        where = at("calibration", "sweep", method)
        if len(settings) != 1:
            raise HarnessError(f"{where}: sweep one setting of {method}, not {len(settings)} ({', '.join(settings)})")
        ((name, values),) = settings.items()
        if len(values) < 2:
            raise HarnessError(f"{where}: a sweep of {method}'s {name} needs at least two values, not {values!r}")
        for seed in seeds:
            seeded = base.model_copy(update={"train": base.train.model_copy(update={"seed": seed})})
            none = _plugin("attack", seeded, "none", {}, where)
            resolved: dict[tuple, object] = {}
            for k, value in enumerate(values):
                at_value = at("calibration", "sweep", method, name, k)
                m = _plugin("method", seeded, method, {name: value}, at_value)
                params = _frozen(m.params.model_dump())
                if params in resolved:  # (2 and 2.0 are one configuration)
                    raise HarnessError(f"{at_value}: {name}={value!r} is swept twice (as {resolved[params]!r})")
                resolved[params] = value
                cell = Cell.make(seeded, seed, method, params, "none", _frozen(none.params.model_dump()))
                out.append(replace(cell, where=at_value))
    _check_rows_apart(out)  # (the sweep's rows are the AUC-PPL figure's points)
    return tuple(dict.fromkeys(out))


def _check_rows_apart(cells: list[Cell]) -> None:
    """Two cells of one setup whose rows would carry the same words (a plugin's label that does not show the setting
    they differ in) are refused: every table would show them as one row, and pair them as one."""
    named: dict[tuple, Cell] = {}
    for cell in cells:
        key = (cell.setup, cell.name(with_seed=True))
        other = named.setdefault(key, cell)
        if other is not cell:
            differ = sorted({k for k, _ in set(other.method_settings) ^ set(cell.method_settings)}
                            | {k for k, _ in set(other.attack_settings) ^ set(cell.attack_settings)})  # fmt: skip
            raise HarnessError(
                f"{cell.where}: two cells would be one row, '{key[1]}': they differ in {', '.join(differ)}, which "
                "the row's label does not show"
            )


def _calibrated_methods(groups: dict[str, Group]) -> set[str]:
    """The methods some of ``groups`` runs as ``calibrated``."""
    return {m for g in groups.values() for m, entries in g.methods.items() if CALIBRATED in entries}


def _check_sweep_used(spec: GridSpec, at) -> None:
    """A swept method that no group runs as ``calibrated`` is refused: its trainings would choose for nothing."""
    if spec.calibration is None:
        return
    calibrated = _calibrated_methods(spec.groups)
    for method in spec.calibration.sweep:
        if method not in calibrated:
            raise HarnessError(
                f"{at('calibration', 'sweep', method)}: the calibration sweeps {method}, but no group runs {method}: "
                f"[{CALIBRATED}] (add it to a group, or take it out of the sweep)"
            )


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


class _Mapping(tuple):
    """A setting's mapping, frozen (sorted (key, value) pairs) so that a cell hashes, and told apart from a list."""


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return _Mapping(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _thawed(settings: tuple) -> dict:
    """``_frozen``'s settings as the plugin takes them again (nested mappings and lists included: a chain's links)."""

    def thaw(value: Any) -> Any:
        if isinstance(value, _Mapping):
            return {k: thaw(v) for k, v in value}
        return [thaw(v) for v in value] if isinstance(value, tuple) else value

    return {k: thaw(v) for k, v in settings}


def _plugin(kind: str, preset: Preset, name: str, settings: Any, where: str):
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
    """Sort key: cells of one training together, trainings in the order the spec first names them (linear in cells:
    each cell's place is looked up, not searched for)."""
    first: dict[tuple, int] = {}
    place: dict[Cell, int] = {}
    for k, c in enumerate(cells):
        first.setdefault(c.training, len(first))
        place.setdefault(c, k)
    return lambda c: (first[c.training], place[c])


MAX_SHARDS = 10_000  # more shares than any grid has trainings (paper.yaml: under 200); the split is O(trainings x n)


def parse_shard(text: str) -> tuple[int, int]:
    """``i/n`` (1 <= i <= n <= ``MAX_SHARDS``, ASCII digits) -> (i, n)."""
    found = re.fullmatch(r"\s*([0-9]{1,6})\s*/\s*([0-9]{1,6})\s*", text)
    i_, n_ = (int(found[1]), int(found[2])) if found else (0, 0)
    if not 1 <= i_ <= n_ <= MAX_SHARDS:
        raise HarnessError(f"bad shard '{text[:40]}': expected i/n with 1 <= i <= n <= {MAX_SHARDS:,}, e.g. 1/4")
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
