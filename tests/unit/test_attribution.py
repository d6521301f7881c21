"""Attribution (``harness.audit.attribution``): each detector on the stored unaltered texts of every model of a group
and of the base, generating nothing the runs stored already."""

from __future__ import annotations

import json

from harness.audit.attribution import attribute
from harness.cell.pipeline import Pipeline
from harness.config.registry import attacks, methods
from harness.store import kinds
from harness.store.stages import Store

PRESET = {"eval.num_prompts": "6", "eval.prompt_tokens": "4", "eval.new_tokens": "16", "eval.batch_size": "6"}


def test_a_decoding_time_watermarks_texts_are_its_runs_own(random_llamas, tmp_path, small_preset):
    """A decoding-time watermark's model is the base sampled with its key: attribution reads the run's own unaltered
    texts (the same generate stage, none made anew), so its detector flags its own texts as the run's TPR says, not
    the base's texts under another name."""
    store = Store(tmp_path / "runs")
    pipe = Pipeline(small_preset(tmp_path, random_llamas[1], **PRESET), store, "cpu")
    method = methods.build("kgw-decoding", {"delta": "8"})
    cells = {c.row: c for c in pipe.run(method, attacks.build("none", {}))}
    run = json.loads((cells["Unaltered"].run.path / "spec.json").read_text())
    generated = {p.name for p in (store.root / "stages" / kinds.GENERATE).iterdir()}
    later = Pipeline(pipe.preset, store, "cpu")  # (as a grid's attribution step: another process, nothing sampled)
    assert attribute([(later, method)]) == 2  # (its texts and the base's)
    assert {p.name for p in (store.root / "stages" / kinds.GENERATE).iterdir()} == generated
    found = {}
    for stage in (store.root / "stages" / kinds.ATTRIBUTION).iterdir():
        spec = json.loads((stage / "spec.json").read_text())
        found[spec["labels"]["source"]["label"]] = (spec["generate"], json.loads((stage / "metrics.json").read_text()))
    own = next(v for k, v in found.items() if k.startswith("KGW"))
    assert own[0] == run["generate"] != found["Unwatermarked base"][0]
    assert own[1]["auc"] == cells["Unaltered"].metrics["auc"], (own, cells["Unaltered"].metrics)
