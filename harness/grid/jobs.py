"""What one job of a grid does, wherever it runs (this process, a local subprocess, a Slurm node): train a cell's
model, run a cell, or the attribution matrix. A job never raises for its own failure (the grid goes on): it returns
its outcome, with the traceback of a failure."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.grid.spec import Cell


def check_cells(cells: list[Cell], build: bool = True, results: Path | None = None) -> None:
    """The inputs of every cell (models, data, plugins' own checks), once per distinct preset and plugin;
    ``build=False``: building no built-in model (``checks.check_inputs``). With the ``results`` store: no attack reads
    a cell's watermarked model, stored there, as a model of its own (``Pipeline.check_other_models``)."""
    from harness.cell.checks import check_inputs
    from harness.config.errors import HarnessError

    seen: set = set()
    for cell in cells:
        m, a = cell.build()
        key = (cell.preset.model_dump_json(), m.name, str(m.params), a.name, str(a.params))
        if key not in seen:
            seen.add(key)
            try:
                check_inputs(cell.preset, (m, a), build)
                if results is not None:
                    check_own_models(cell.preset, m, a, results)
            except HarnessError as err:  # say which cell of the spec, so the user knows what to fix
                where = f"{cell.where} ({cell.name()})" if cell.where else cell.name()
                raise HarnessError(f"{where}: {err}") from None


def check_own_models(preset, method, attack, results: Path) -> None:
    """Refuse an attack whose other models (a merge's donors) include the watermarked model of ``method``, as the
    run would once it reached the attack: a stored one can be named as a donor, an untrained one not (no folder
    exists), and where the base is not built, nothing is trained from it yet."""
    from harness.assets import models
    from harness.cell.pipeline import Pipeline, model_of
    from harness.store.stages import Store

    if attack.model_refs() and models.built(preset.base_model):
        stage, _ = Pipeline(preset, Store(results), plan=True).train_stage(method)
        Pipeline.check_other_models(attack, model_of(stage)[0])


def unbuilt(cell: Cell) -> list[str]:
    """The built-in models a cell needs that this machine has not built yet (a dry run plans no such cell)."""
    return unbuilt_models(cell.preset, cell.build())


def unbuilt_models(preset, plugins) -> list[str]:
    """The built-in models that ``preset`` with ``plugins`` (a method and an attack) needs and this machine has not
    built yet."""
    from harness.assets import models

    refs = (preset.base_model, preset.oracle_model, *(ref for p in plugins for ref in p.model_refs().values()))
    return [ref for ref in dict.fromkeys(refs) if not models.built(ref)]


def plan(cell: Cell, results: Path, device: str | None) -> list[tuple[str, bool]]:
    """``(row, stored)`` of each run the cell makes, building nothing."""
    return plan_runs(cell.preset, cell.build(), results, device)


def plan_runs(preset, plugins, results: Path, device: str | None) -> list[tuple[str, bool]]:
    """``(row, stored)`` of each run that ``preset`` with ``(method, attack)`` makes, building nothing."""
    from harness.cell.pipeline import Pipeline
    from harness.store.stages import Store

    pipe = Pipeline(preset, Store(results), device, plan=True)
    return [(c.row, c.reused) for c in pipe.run(*plugins)]  # (planned: "reused" is "stored and verified")


@dataclass(frozen=True)
class Planned:
    """What a grid's dry run says of one cell: its ``state`` (as shown), whether every run it makes is stored, and the
    built-in models this machine lacks that it would build first."""

    cell: Cell
    state: str
    stored: bool = False
    builds: tuple[str, ...] = ()


def dry_run(cells: list[Cell], results: Path, device: str | None) -> Iterator[Planned]:
    """``harness grid --dry-run``: each cell in turn, building nothing: its runs stored, some of them, or to compute
    (first building the built-in models it reads that this machine lacks: none of its runs can be stored before);
    where a setup cannot be planned here, why, said at its first cell."""
    from harness.config.errors import HarnessError

    unknown: set[str] = set()  # setups whose cells cannot be planned here (asked once per setup)
    for cell in cells:
        missing = unbuilt(cell)
        if missing:
            yield Planned(cell, f"to compute (first builds {', '.join(missing)})", builds=tuple(missing))
            continue
        if cell.setup in unknown:
            yield Planned(cell, "cannot tell (as above)")
            continue
        try:
            rows = plan(cell, results, device)
        except HarnessError as err:
            unknown.add(cell.setup)
            yield Planned(cell, f"cannot tell ({err})")
            continue
        done = sum(s for _, s in rows)
        yield Planned(cell, "stored" if done == len(rows) else f"{done}/{len(rows)} runs stored", done == len(rows))


def run_cell(cell: Cell, results: str, device: str | None) -> dict:
    """Run one cell (the unit a job runs); never raises for the cell's own failure: the grid goes on."""
    from harness.cell.pipeline import Pipeline
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
    from harness.cell.pipeline import Pipeline
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
    """The attribution matrix of ``cells`` (``attribution.attribute``): every detector on the stored texts of every
    cell's model and of the base, generating nothing new once the cells have run."""
    from harness.audit.attribution import attribute
    from harness.cell.pipeline import Pipeline
    from harness.store.stages import Store

    try:
        store = Store(Path(results))
        pairs = attribute([(Pipeline(c.preset, store, device), c.build()[0]) for c in cells])
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001  (one failure must not stop the grid; its traceback is kept)
        return _failed(err)
    return {"status": "ok", "pairs": pairs}


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
