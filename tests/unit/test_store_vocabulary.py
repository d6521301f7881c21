"""The store owns the stage kinds and the folder layout: a method's own stage may not take one of the harness's kinds,
and nothing outside harness/store/ spells where a stage's folder lies (it asks the Store)."""

import ast
from pathlib import Path

import pytest

from harness.cell.pipeline import Pipeline
from harness.config.errors import HarnessError
from harness.config.presets import TINY
from harness.store import kinds
from harness.store.stages import Store, stage_at

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", kinds.RESERVED)
def test_a_methods_own_stage_may_not_take_a_store_kind(kind, tmp_path):
    """attribution and detect included: tables read attribution stages as results, whoever built them."""
    pipe = Pipeline(TINY, Store(tmp_path), "cpu", plan=True)
    with pytest.raises(HarnessError) as err:
        pipe.aux_stage(kind, {}, lambda out: {}, "a method's own stage")
    message = str(err.value)
    assert "\n" not in message and f"'{kind}'" in message
    assert all(k in message for k in kinds.RESERVED)
    assert not (tmp_path / "stages").exists()  # refused before anything was written


def test_attribution_and_detect_are_reserved():
    assert {"attribution", "detect"} <= set(kinds.RESERVED)


def test_the_store_answers_where_stages_lie(tmp_path):
    store = Store(tmp_path)
    assert not store.has_stages()
    trained = store.stage(kinds.TRAIN, {"x": 1})
    trained.build(lambda out: {})
    run = store.stage(kinds.RUN, {"x": 1})
    run.build(lambda out: {})
    assert store.has_stages()
    assert store.at(kinds.TRAIN, trained.key).path == trained.path and store.at(kinds.RUN, run.key).path == run.path
    assert stage_at(trained.path).kind == kinds.TRAIN and stage_at(trained.path).root == tmp_path
    assert stage_at(run.path).kind == kinds.RUN and stage_at(run.path).path == run.path
    # the train stage first, then the run: both have the same hash (the same spec)
    assert [(s.kind, s.path) for s in store.matching(trained.key[:4])] == [
        (kinds.TRAIN, trained.path),
        (kinds.RUN, run.path),
    ]
    assert [s.kind for s in store.finished()] == [kinds.TRAIN, kinds.RUN]


def _python_files() -> list[Path]:
    found = []
    for folder in ("harness", "methods", "attacks", "benchmarks"):
        found += sorted((ROOT / folder).rglob("*.py"))
    return [f for f in found if (ROOT / "harness" / "store") not in f.parents]


def test_only_the_store_spells_its_folder_layout():
    """A stage's folder, the train stages of a hash prefix, whether a folder is a stage and of which kind: all are the
    Store's answers (harness/store/stages.py), so the layout can change in one place."""
    spelled = []
    for file in _python_files():
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value == "stages" or "stages/" in node.value:
                    spelled.append(f"{file.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    assert not spelled, spelled
    assert len(_python_files()) > 50  # the walk saw the tree


def test_stage_kinds_are_named_only_through_the_stores_vocabulary():
    """Where a stage is made or looked up (``Stage(kind, ...)``, ``store.stage(kind, ...)``, ``store.at(kind, ...)``)
    outside harness/store/, its kind is one of ``kinds``' names, never a string literal that could drift from them."""
    from harness.store import kinds

    literal = []
    for file in _python_files():
        for node in ast.walk(ast.parse(file.read_text())):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            if isinstance(node.func, ast.Attribute):  # store.stage(...), store.at(...), store.folder(...)
                name, names = node.func.attr, ("Stage", "stage", "at", "folder")
            else:
                name, names = getattr(node.func, "id", ""), ("Stage",)
            if name in names and node.args[0].value in kinds.RESERVED:
                literal.append(f"{file.relative_to(ROOT)}:{node.lineno}: {name}({node.args[0].value!r}, ...)")
    assert not literal, literal
