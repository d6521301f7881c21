"""Attribution (the paper's appendix): each watermark's detector on the stored texts of every model of a grid and of
the base model, generating nothing that the grid's runs stored already. A caller of the stage graph
(``harness.cell.pipeline``), as ``harness detect`` (``harness.audit.verdict``) is: it adds one ``attribution`` stage per
(detector, texts) pair, which the tables read beside the runs."""

from __future__ import annotations

from pathlib import Path

from harness.cell import detection, scoring
from harness.cell.pipeline import Pipeline
from harness.config.registry import attacks
from harness.store import files, kinds
from harness.store.stages import Stage


def attribution(pipe: Pipeline, method, trained: Stage, generated: Stage, source: dict) -> Stage:
    """``method``'s detector, keyed by ``trained``, on another model's stored generations (and the human texts beside
    them), generating nothing. ``metrics.json``'s ``tpr@f`` is then the share of that model's texts flagged at the
    threshold that gives FPR ``f`` on human texts."""
    spec = {
        "stage": kinds.ATTRIBUTION,
        "preset": pipe.preset.name,
        "scoring_version": scoring.SCORING_VERSION,
        "detector": scoring.detector_spec(method, trained.key, pipe.preset.eval.score_on),
        "generate": generated.key,
        # For the table: who detects (method, config) and whose texts (a label and, for a watermarked model, the
        # train stage that made it).
        "labels": {"detector": {"method": method.label, "config": method.config_label()}, "source": source},
        "preset_settings": scoring.preset_settings(pipe.preset),
        "base_model": pipe.base["fingerprint"],
    }
    stage = pipe.store.stage(kinds.ATTRIBUTION, spec)

    def build(out: Path) -> dict:
        gens = files.read_jsonl(generated.path / "generations.jsonl")
        pos, neg = detection.detect(pipe, method, trained, gens)
        scoring.publish_scores(out, generated.path / "generations.jsonl", gens, pos, neg, pipe.preset.eval.new_tokens)
        return {"device": pipe.device}

    pipe.build_stage(stage, f"attribution of {source['label']} texts by {method.label}", build)
    return stage


def attribute(entries: list[tuple[Pipeline, object]]) -> int:
    """The detector of each ``(pipeline, method)`` on the unaltered texts of every entry's model and of the base model
    (the first entry's), generating nothing that the entries' runs stored already. Returns how many (detector, texts)
    pairs were scored."""
    none = attacks.build("none", {})
    first = entries[0][0]
    base = first.generate(first.base["path"], f"base:{first.base['fingerprint']}", "base model")
    sources = [({"label": scoring.BASE_ROW, "method": None, "config": None}, base)]
    trained = []
    for pipe, method in entries:
        stage = pipe.train(method)
        (out,) = pipe.attack(none, stage)
        label = {"label": f"{method.label} ({method.config_label()})", "method": method.label,
                 "config": method.config_label(), "train": stage.key}  # fmt: skip
        # (a decoding-time watermark's model is the base sampled with its key: the run's own unaltered texts)
        sources.append((label, pipe.generate(out.path, out.model_id, out.row, pipe.sampler(method, stage))))
        trained.append((pipe, method, stage))
    for pipe, method, stage in trained:
        for label, generated in sources:
            attribution(pipe, method, stage, generated, label)
    return len(trained) * len(sources)
