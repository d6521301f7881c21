"""Migrations of a store's finished runs that need their detector again, not only newer metric code (that is
``scoring.rescore``): a caller of the stage graph (``harness.cell.pipeline``) that scores stored texts and republishes
the runs as ``rescore`` does."""

from __future__ import annotations

import json
import logging

from harness.cell import detection, metrics, scoring
from harness.cell.pipeline import Pipeline
from harness.config.errors import HarnessError
from harness.config.settings import Preset
from harness.store import files, kinds
from harness.store.stages import Store

log = logging.getLogger(__name__)


def fill_prefix_scores(store: Store, device: str | None = None) -> tuple[int, int, list[str]]:
    """Add the per-text prefix scores (tokens to detect, TPR by length) to the finished runs that were scored before
    detectors kept them: each run's detector, keyed by its train stage in ``store``, scores the run's stored texts
    again (no generation); the new scores must equal the stored ones, else the run is left as it is. Returns
    (filled, runs lacking them, the ones left as they are: each named in a warning)."""
    from harness.config.registry import methods

    filled, lacking, skipped = 0, 0, []
    for path in store.runs():
        run = store.at(kinds.RUN, path.name)
        try:
            with files.locked(run.lock_file, f"prefix scores of run {run.key}"):
                scores = files.read_jsonl(path / "scores.jsonl")
                if all("prefix_scores" in s for s in scores):
                    continue
                lacking += 1
                problem = run.problem()
                spec = json.loads((path / "spec.json").read_text())
                key = spec["detector"]["key_from"]
                trained = store.at(kinds.TRAIN, key)
                if problem is None and not trained.done:
                    problem = f"its train stage {key} is not in this store"
                if problem is None:
                    problem = trained.problem()
                if problem is not None:
                    raise HarnessError(problem)
                preset = Preset.model_validate(spec["config"]["preset"])
                method = spec["config"]["method"]
                method = methods.build(method["name"], {k: v for k, v in method["params"].items() if v is not None})
                pipe = Pipeline(preset, store, device)
                gens = files.read_jsonl(path / "generations.jsonl")
                first, _ = detection.detect(pipe, method, trained, gens[:1])
                if "prefix_scores" not in first[0]:
                    lacking -= 1  # a detector that keeps none (a statistic that is not a running one)
                    continue
                pos, neg = detection.detect(pipe, method, trained, gens)
                fresh = {(1, g["i"]): s for g, s in zip(gens, pos, strict=True)}
                fresh |= {(0, g["i"]): s for g, s in zip(gens, neg, strict=True)}
                for s in scores:
                    new = fresh[(s["label"], s["i"])]
                    if abs(new["score"] - s["score"]) > 1e-9:
                        raise HarnessError(f"its detector now scores text {s['i']} {new['score']}, not {s['score']}")
                    s["prefix_scores"] = new["prefix_scores"]
                run.update({"scores.jsonl": "".join(json.dumps(s) + "\n" for s in scores)})
                scoring.republish(run, {"prefix_scores": "added", "to": metrics.METRICS_VERSION})
                filled += 1
        except HarnessError as err:
            log.warning("run %s left as it is: %s", path, err)
            skipped.append(str(path))
    return filled, lacking, skipped
