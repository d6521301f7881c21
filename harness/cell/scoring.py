"""A run's record and its scores: the spec a run stores (what the tables read), publishing its per-text scores and
metrics, and rescoring stored runs when only the metric code changed (republishing them, as ``migrate`` does).

``run_spec`` is the one place a run's record is assembled: the pipeline stores it, and tests of what reads the store
build their runs with it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from harness.cell import metrics
from harness.config.errors import HarnessError
from harness.config.settings import Preset
from harness.store import files, kinds
from harness.store.stages import Stage, Store

log = logging.getLogger(__name__)

SCORING_VERSION = "2"  # bump when detection code changes a run's per-text scores (it is part of the run hash)
BASE_ROW = "Unwatermarked base"  # the control row: the base model's texts under the method's detector
BASE_CATEGORY = "Reference"  # its row group


def preset_settings(preset: Preset) -> dict:
    """The preset as runs store it: without the settings that cannot change a result (scoring's batch size,
    ``TrainSettings.unhashed``)."""
    data = preset.hashed()
    data["eval"].pop("ppl_batch_size")
    for name in preset.train.unhashed():
        data["train"].pop(name)
    return data


def detector_spec(method, trained_key: str, reads: str, prompted: bool = True) -> dict:
    """Which detector scored a run's (or an audit's) texts: ``method``'s, keyed by the train stage ``trained_key``,
    reading ``reads`` (``eval.score_on``) and, where its detector reads them and they were given (``prompted``), each
    text's prompt (recorded only then, so runs of the detectors that read none keep their hashes), and the detector's
    version where the method has one."""
    spec = {"method": method.name, "key_from": trained_key, "reads": reads}
    if method.detector_version is not None:  # (``WatermarkMethod.detector_version``)
        spec["version"] = method.detector_version
    if prompted and method.detector_reads_prompt():
        spec["context"] = "prompt"
    return spec


def method_info(method) -> dict:
    return {
        "name": method.name,
        "label": method.label,
        "params": method.hashed_params(),
        "config_label": method.config_label(),
    }


def attack_info(attack, config_label: str | None = None, control: bool = False) -> dict:
    """What tables need of the attack a run evaluates (None: the unwatermarked base); ``control``: the attack applied
    to the unwatermarked base (``Attack.controlled``), recorded only then so that every other run keeps its hash."""
    if attack is None:
        return {"name": None, "category": BASE_CATEGORY, "label": "No watermark", "config_label": "base model"}
    return {
        "name": attack.name,
        "category": attack.category,
        "label": attack.table_label(),
        "params": attack.hashed_params(),
        "config_label": attack.config_label() if config_label is None else config_label,
        **({"control": True} if control else {}),
    }


CONTROL = "of the base"  # how a control row is named after its attack's row (``Attack.controlled``)


def attack_row(attack, config_label: str | None = None, control: bool = False) -> str:
    """The row a run prints as: ``Unaltered``, or the attack's label and settings (e.g. ``SLERP t=0.5``), followed by
    ``of the base`` for a control row."""
    if attack.identity:
        return "Unaltered"
    row = f"{attack.table_label()} {attack.config_label() if config_label is None else config_label}".strip()
    return f"{row} {CONTROL}" if control else row


def run_spec(
    preset: Preset,
    method,
    attack,
    config_label: str | None,
    *,
    trained_key: str,
    generate_key: str,
    oracle: dict,
    upstream: dict,
    control: bool = False,
) -> dict:
    """The spec of one run (hashed into its key, stored as ``spec.json``): ``method``'s detector, keyed by the train
    stage ``trained_key``, on the generations ``generate_key`` of the model ``attack`` made (None: the unwatermarked
    base; ``config_label``: which of the attack's outputs), scored with ``oracle``'s perplexity. ``upstream`` is what
    the upstream hashes stand for (models' and data's fingerprints included), so that one file is readable alone."""
    return {
        "stage": kinds.RUN,
        "row": BASE_ROW if attack is None else attack_row(attack, config_label, control),
        "preset": preset.name,
        "scoring_version": SCORING_VERSION,
        "detector": detector_spec(method, trained_key, preset.eval.score_on),
        "generate": generate_key,
        "oracle": oracle,
        # The full resolved settings, for readers and for tables.
        "config": {
            "preset": preset_settings(preset),
            "method": method_info(method),
            "attack": attack_info(attack, config_label, control),
        },
        "upstream": upstream,
    }


def publish_scores(
    out: Path,
    generations: Path,
    gens: list[dict],
    pos: list[dict],
    neg: list[dict],
    new_tokens: int | None = None,
    ppl_on: str | None = None,
) -> None:
    """Write a scoring stage's per-text scores (label 1: generated, 0: human), link its generations (the file
    ``generations``) and write the metrics computed from them (``new_tokens``: the evaluation's completion length;
    ``ppl_on``: what the perplexity was measured on)."""
    scores = [{"i": g["i"], "label": 1, **s} for g, s in zip(gens, pos, strict=True)]
    scores += [{"i": g["i"], "label": 0, **s} for g, s in zip(gens, neg, strict=True)]
    files.write_jsonl(out / "scores.jsonl", scores)
    files.link(generations, out / "generations.jsonl")
    (out / "metrics.json").write_text(json.dumps(metrics.run_metrics(out, new_tokens, ppl_on), indent=2))


def up_to_date(stored, current: str) -> bool:
    """Whether metrics of version ``stored`` need no rescoring by code of version ``current``: the same, or newer (an
    older harness reading a store a newer one scored leaves its metrics as they are, rather than take columns away)."""
    if stored == current:
        return True
    try:
        return int(stored) > int(current)
    except (TypeError, ValueError):
        return False


def rescore(run: Stage) -> bool:
    """Recompute a finished run's ``metrics.json`` from its stored scores when metric code changed since it was made
    (``METRICS_VERSION``), and republish the run under its lock. Returns whether anything changed."""
    version = metrics.METRICS_VERSION
    metrics_file = run.path / "metrics.json"
    try:
        if up_to_date(json.loads(metrics_file.read_text()).get("metrics_version"), version):
            return False
    except (OSError, ValueError):
        pass  # unreadable: the check under the lock below names what is wrong
    from harness.store.export import exported_without

    dropped = exported_without(run.path)
    if dropped:  # a run's metrics may read its texts (a text attack's rewrite rates): not without them
        raise HarnessError(
            f"run {run.path} was exported without {', '.join(dropped)}: rescore it in the store it came from"
        )
    with files.locked(run.lock_file, f"rescoring of run {run.key}"):
        problem = run.problem()  # scores that no longer match what was published are never rescored
        if problem is not None:
            raise HarnessError(f"run {run.path} cannot be rescored: {problem}")
        old = json.loads(metrics_file.read_text())
        if up_to_date(old.get("metrics_version"), version):  # another process did it while we waited
            return False
        republish(run, {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "from": old.get("metrics_version", "0"), "to": version})  # fmt: skip
    log.info("rescored run %s (metrics version %s -> %s)", run.key, old.get("metrics_version", "0"), version)
    return True


def republish(run: Stage, entry: dict) -> None:
    """Recompute a finished run's ``metrics.json`` from its stored files and publish it anew, with ``entry`` (what
    was done, to which metrics version) appended to its manifest's ``rescored`` list. Call while holding the run's
    lock, after checking that it is intact (``Stage.problem``)."""
    manifest = run.manifest()
    manifest.setdefault("rescored", []).append(entry)
    new = metrics.run_metrics(run.path)
    run.update({"metrics.json": json.dumps(new, indent=2), "manifest.json": json.dumps(manifest, indent=2)})


def rescore_store(store: Store) -> tuple[int, int, list[str]]:
    """``rescore`` every finished run and attribution stage of ``store``; return (rescored, total, the ones left as
    they are because they are damaged or edited: each named in a warning, the others rescored all the same)."""
    stages = store.results()
    rescored, skipped = 0, []
    for stage in stages:
        try:
            rescored += rescore(stage)
        except HarnessError as err:
            log.warning("left as it is: %s", err)
            skipped.append(str(stage.path))
    return rescored, len(stages), skipped
