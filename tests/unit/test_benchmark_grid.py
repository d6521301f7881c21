"""benchmarks/grid.py's breakdown of a store's time: stages grouped by kind (trainings by method, attacks by the
category of their rows), a stage built inside another not counted twice, and the rows adding up to the wall time."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("bench_grid", Path(__file__).parents[2] / "benchmarks" / "grid.py")
grid = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(grid)


def stage(root: Path, kind: str, name: str, spec: dict, started: str, seconds: float) -> None:
    folder = root / name if kind == "run" else root / "stages" / kind / name
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps(spec))
    (folder / "manifest.json").write_text(json.dumps({"kind": kind, "started": started, "seconds": seconds}))
    (folder / "DONE").write_text("")


def test_stages_are_grouped_and_nested_ones_counted_once(tmp_path):
    root = tmp_path / "runs"
    stage(root, "train", "a", {"method": "gu-kth"}, "2026-01-01T00:00:00Z", 100.0)
    stage(root, "gu-kth-teacher", "b", {}, "2026-01-01T00:00:10Z", 30.0)  # built inside the training
    stage(root, "attack", "c", {"attack": "gptq"}, "2026-01-01T00:02:00Z", 5.0)
    stage(root, "attack", "d", {"attack": "int8"}, "2026-01-01T00:02:10Z", 3.0)
    stage(root, "attack", "e", {"attack": "slerp"}, "2026-01-01T00:02:20Z", 2.0)
    stage(root, "generate", "f", {}, "2026-01-01T00:02:30Z", 4.0)
    stage(root, "run", "g", {}, "2026-01-01T00:02:40Z", 1.5)
    stage(root, "generate", "partial", {}, "2026-01-01T00:03:00Z", 9.0)
    (root / "stages" / "generate" / "partial" / "DONE").unlink()  # unfinished: not counted

    cache = tmp_path / "cache" / "tiny-lm-abc"
    cache.mkdir(parents=True)
    (cache / "build.json").write_text(json.dumps({"seconds": 60.0}))
    os.utime(cache / "build.json", (0, 0))  # long before the stages: nested in none

    rows = {name: (count, seconds) for name, count, seconds in grid.breakdown(root, cache.parent, 300.0, 10.0)}
    assert rows["training: gu-kth"] == (1, pytest.approx(70.0))
    assert rows["method's own stage: gu-kth-teacher"] == (1, pytest.approx(30.0))
    assert rows["model attack: Quantization"] == (2, pytest.approx(8.0))
    assert rows["model attack: Merging"] == (1, pytest.approx(2.0))
    assert rows["generation"] == (1, pytest.approx(4.0))
    assert rows["scoring (detector and perplexity)"] == (1, pytest.approx(1.5))
    assert rows["built-in model: tiny-lm"] == (1, pytest.approx(60.0))
    assert rows["harness tables"] == (1, pytest.approx(10.0))
    assert sum(seconds for _, seconds in rows.values()) == pytest.approx(310.0)  # wall time of grid and tables
    assert "the rest" in grid.render(grid.breakdown(root, None, 300.0, 10.0), 310.0)
