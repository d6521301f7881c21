"""Detection by text length in stored runs: runs keep every text's prefix scores, whose last entry is the text's
score; ``harness rescore --prefix-scores`` adds them to runs scored before (the same scores, or the run is left as
it is); ``harness tables`` writes the tokens-to-detect table and the TPR-by-length figure."""

from __future__ import annotations

import json

import pytest

from harness.cell import metrics
from harness.config.presets import TINY


@pytest.fixture
def stored(tmp_path, random_llamas):
    """A store with Gu-KGW trained for one step on a random Llama and its base and unaltered runs."""
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import attacks, methods
    from harness.store.stages import Store

    base = str(random_llamas[1])
    preset = TINY.model_copy(
        update={
            "base_model": base,
            "oracle_model": base,
            "train": TINY.train.model_copy(update={"steps": 1, "batch_size": 2, "seq_len": 32}),
            "eval": TINY.eval.model_copy(update={"num_prompts": 8, "prompt_tokens": 8, "new_tokens": 20}),
        }
    )
    store = Store(tmp_path / "runs")
    Pipeline(preset, store, "cpu").run(methods.build("gu-kgw", {}, preset), attacks.build("none", {}))
    return store


def _scores(run):
    return [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]


def test_runs_keep_prefix_scores_and_length_metrics(stored):
    for run in stored.runs():
        scores = _scores(run)
        for s in scores:
            assert (
                len(s["prefix_scores"]) >= 2 and s["prefix_scores"][0] == 0.0
            )  # k = 1: the first token has no context
            assert s["prefix_scores"][-1] == pytest.approx(s["score"], abs=1e-4)
        m = json.loads((run / "metrics.json").read_text())
        assert m["by_length"]["lengths"] == [5, 10, 15, 20] and m["metrics_version"] == metrics.METRICS_VERSION
        assert len(m["by_length"]["tpr@0.01"]) == 4 and 0 <= m["detected_by_end@0.01"] <= 1


def test_rescore_adds_prefix_scores_to_older_runs(stored, cli, tmp_path):
    from harness.cell import metrics
    from harness.store.stages import Stage

    runs = stored.runs()
    before = {run.name: _scores(run) for run in runs}
    for run in runs:  # as runs were stored before detectors kept prefix scores
        stage = Stage("run", {}, run.name, run, stored.root)
        old = [{k: v for k, v in s.items() if k != "prefix_scores"} for s in before[run.name]]
        stage.update({"scores.jsonl": "".join(json.dumps(s) + "\n" for s in old)})
        stage.update({"metrics.json": json.dumps({**metrics.run_metrics(run), "metrics_version": "1"})})
    tampered = runs[0]
    scores = _scores(tampered)
    scores[0]["score"] += 1.0
    Stage("run", {}, tampered.name, tampered, stored.root).update(
        {"scores.jsonl": "".join(json.dumps(s) + "\n" for s in scores)}
    )
    out = cli("rescore", "--results", str(stored.root), "--prefix-scores")
    assert out.returncode == 2 and "runs could not be rescored and were left as they are" in out.stderr, out
    assert f"prefix scores added to {len(runs) - 1} of the {len(runs)} stored runs" in out.stdout
    for run in runs[1:]:
        assert _scores(run) == before[run.name]
        assert json.loads((run / "metrics.json").read_text())["by_length"]["lengths"] == [5, 10, 15, 20]
        assert Stage("run", {}, run.name, run, stored.root).problem() is None
    assert "prefix_scores" not in _scores(tampered)[0]
    out = cli("tables", "--results", str(stored.root), "--out", str(tmp_path / "tables"))
    assert out.returncode == 0, out.stderr
    setup = next(p for p in (tmp_path / "tables").iterdir() if p.is_dir())
    table = (setup / "tokens_to_detect.csv").read_text()
    assert "TPR@1% 5 tokens" in table and "TPR@1% 20 tokens" in table
    assert (setup / "figures" / "tpr_by_length.png").is_file()
