"""What ``harness detect`` does with what it was asked: find the key, check the suspect against it, audit the
suspect (``audit.audit``) and decide. Two steps, so that the command line can quiet the model libraries and settle
the device between them: ``Request`` checks what costs nothing (the options, the store, a texts file) before any
model library is imported, and ``Request.decide`` does the rest."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.audit import verdict as audit
from harness.config import presets
from harness.config.errors import HarnessError
from harness.config.params import parse_assignments
from harness.config.settings import DECODING, MAX_PROMPTS, PROMPTS, Preset, apply_overrides
from harness.contract.method import read_key
from harness.store import files
from harness.store.stages import Store

# The settings of how a suspect model is used (sampled, asked): given alone, they keep the key's own setup.
USE_SETTINGS = {f"eval.{name}" for name in (*DECODING, *PROMPTS)}


@dataclass
class Request:
    """A ``harness detect`` request: the trained watermark, named by its train stage (``key``) or by the ``method``
    and settings (``method_args``, ``KEY=VALUE`` strings) that trained it, in the store at ``results``; the suspect,
    a ``model`` reference or a file of texts (``texts_file``); the setup (``preset`` and ``overrides``, else the
    key's own), how many texts to generate (``num_texts``), and the false-positive rate of the decision (``alpha``).
    Made, it has checked every input that costs nothing to check, in that order."""

    results: Path
    alpha: float
    key: str | None = None
    method: str | None = None
    method_args: list[str] | None = None
    model: str | None = None
    texts_file: Path | None = None
    preset: str | None = None
    overrides: list[str] | None = None
    num_texts: int | None = None
    store: Store = field(init=False)
    chosen: Preset | None = field(init=False, default=None)  # the setup asked for (else the key's: audit.setup_of)
    # --decode, --prompts and --system-prompt alone: applied to the key's own setup, which they do not replace
    use: dict = field(init=False, default_factory=dict)
    texts: list[tuple[int, str]] | None = field(init=False, default=None)  # read from ``texts_file``

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise HarnessError(f"--alpha must lie between 0 and 1, not {self.alpha:g}")
        if self.num_texts is not None and self.num_texts < 2:
            raise HarnessError(f"--num-texts must be at least 2, not {self.num_texts}")
        if self.num_texts is not None and self.num_texts > MAX_PROMPTS:  # (eval.num_prompts' bound)
            raise HarnessError(f"--num-texts must be at most {MAX_PROMPTS:,}, not {self.num_texts}")
        if (self.key is None) == (self.method is None):
            raise HarnessError(
                "name the trained watermark by --key (its train stage) or by --method (and its settings)"
            )
        if self.key is not None and self.method_args:
            raise HarnessError("--method-arg goes with --method; with --key the settings are the key's own")
        self.store = Store(self.results)
        if not self.store.has_stages():
            raise HarnessError(f"no run store at '{self.store.root}': train a watermark with 'harness run' first")
        self.store.check_writable()  # (the audit stores its stages there: a read-only store is one line here)
        files.check_cache()
        overrides = parse_assignments(self.overrides or [], "setting")
        use = {k: v for k, v in overrides.items() if k in USE_SETTINGS}
        if self.preset or len(use) < len(overrides):
            self.chosen = apply_overrides(presets.get_preset(self.preset or "tiny"), overrides)
        elif use:  # how the suspect is sampled or asked, over the key's own setup (checked here, applied there)
            apply_overrides(presets.get_preset("tiny"), use)
            self.use = use
        if self.texts_file is not None:
            self.texts = audit.read_texts(self.texts_file)

    def decide(self, device: str | None) -> tuple[dict, list[dict]]:
        """Audit the suspect on ``device``: the report (the key, the source, the decision, where the scores are) and
        the per-text rows."""
        from harness.assets import data, models
        from harness.cell.checks import eval_lengths
        from harness.cell.pipeline import Pipeline
        from harness.config.registry import methods

        store, chosen, texts = self.store, self.chosen, self.texts
        if self.model is not None:
            models.check(self.model)  # (before the key is verified: that reads its weights)
        if self.key is not None:
            trained = audit.train_stage(store, self.key)
            params = {k: v for k, v in trained.spec["params"].items() if v is not None}
            method = methods.build(trained.spec["method"], params)
        else:
            setup = chosen or presets.get_preset("tiny")
            method = methods.build(self.method, parse_assignments(self.method_args or [], "method setting"), setup)
            audit.check_stored_training(store, method, setup)
            trained = Pipeline(setup, store, device, plan=True).train(method)
            if not trained.done:
                raise HarnessError(
                    f"no trained {self.method} with these settings in '{store.root}' (train stage {trained.key}): "
                    f"train it with 'harness run --preset {setup.name} --method {self.method} ...', or name a stored "
                    "one by --key"
                )
            trained = audit.train_stage(store, str(trained.path))
        method = audit.audit_method(method, set(parse_assignments(self.method_args or [], "method setting")))
        preset = audit.setup_of(trained, chosen)
        if self.use:
            preset = apply_overrides(preset, self.use)
        if self.num_texts is not None:
            preset = preset.model_copy(update={"eval": preset.eval.model_copy(update={"num_prompts": self.num_texts})})
        # What 'harness run' checks of the evaluation (the key's base model reads the human texts) and, for a model,
        # of the suspect that continues the prompts; a file's texts fit the base model too. All before the base model
        # loads or builds: the key's own folder holds its tokenizer.
        models.check_lengths(preset.base_model, eval_lengths(preset))
        context, tokenizer = models.context_length(preset.base_model), None
        if texts is not None:
            tokenizer = audit.key_tokenizer(trained)
            if tokenizer is not None:
                audit.check_text_lengths(self.texts_file, texts, tokenizer, context)
            resolved = None
        else:
            audit.check_planned_vocabulary(self.model, trained)
            resolved = audit.check_causal_lm(self.model)
            models.check_lengths(resolved, eval_lengths(preset), f"the suspect model '{self.model}'")
        pipe = Pipeline(preset, store, device)
        if pipe.base["fingerprint"] != trained.spec["base_model"]["fingerprint"]:
            raise HarnessError(
                f"the key's base model '{preset.base_model}' is not the model it was trained from here (fingerprint "
                f"{pipe.base['fingerprint']}, the key's {trained.spec['base_model']['fingerprint']})"
            )
        for source in (preset.eval_source() if texts is None else preset.eval_data, preset.train_data):
            data.check(source)
        if texts is None:
            suspect = audit.Suspect("model", self.model, audit.check_model(resolved, self.model, pipe.tokenizer))
        else:
            if tokenizer is None:
                audit.check_text_lengths(self.texts_file, texts, pipe.tokenizer, context)
            suspect = audit.Suspect("texts", str(self.texts_file), texts=tuple(t for _, t in texts))
        stage, result = audit.audit(pipe, method, trained, suspect)
        quality = suspect_quality(pipe, stage) if suspect.kind == "model" else None
        # (no verdict where the scheme has no null: audit.NO_NULL)
        flagged = None if result["p_value"] is None else result["p_value"] < self.alpha
        source = {"kind": suspect.kind, "ref": suspect.ref}
        if texts is None and preset.eval.decoding():  # how the suspect sampled, where not plainly
            source["decoding"] = preset.eval.decoding_label()
        if texts is None and preset.eval.prompts_label():  # what it was asked, where not the documents
            source["prompts"] = preset.eval.prompts_label()
        report = {
            "key": {"train_stage": trained.key, "method": method.name, "config": method.config_label(),
                    "base_model": preset.base_model, "published": method.published_key(read_key(trained.path))},
            "source": source,
            "decision": {"watermarked": flagged, "alpha": self.alpha, **result},
            "scores": str(stage.path / "scores.jsonl"),
        }  # fmt: skip
        if quality is not None:
            report["quality"] = quality
        return report, files.read_jsonl(stage.path / "scores.jsonl")


def suspect_quality(pipe, stage) -> dict:
    """The suspect model's texts beside the base model's continuations of the same prompts, under the setup's quality
    gate (``harness.config.gate``): a verdict on texts that no longer count as writing (a collapsed or broken model)
    says nothing of a model anyone would use. The judge is the key's base model, which the audit holds anyway (the
    setup's oracle may be a 13B model, or one this machine would have to build, for two passes); the tables judge by
    the oracle. The base's continuations are its generate stage (reused where a run stored it); the perplexities are
    measured here, not stored."""
    from harness.cell import detection
    from harness.cell.metrics import median
    from harness.cell.pipeline import Pipeline
    from harness.cell.quality import ppl_ratio, text_quality
    from harness.store import kinds

    judge = Pipeline(pipe.preset.model_copy(update={"oracle_model": pipe.preset.base_model}), pipe.store, pipe.device)

    suspect = files.read_jsonl(pipe.store.at(kinds.GENERATE, stage.spec["source"]["generate"]).path
                               / "generations.jsonl")  # fmt: skip
    base = files.read_jsonl(
        pipe.generate(pipe.base["path"], f"base:{pipe.base['fingerprint']}", "base model").path / "generations.jsonl"
    )
    ppl = [median(detection.perplexities(judge, gens, f"perplexity ({who})")[0]) for who, gens in
           (("suspect", suspect), ("base model", base))]  # fmt: skip
    rep3 = [text_quality([g["completion_ids"] for g in gens])["rep3"] for gens in (suspect, base)]
    gate, ratio = pipe.preset.quality_gate, ppl_ratio(*ppl)
    return {"median_ppl": ppl[0], "base_median_ppl": ppl[1], "ppl_ratio": ratio, "rep3": rep3[0],
            "base_rep3": rep3[1], "judge": f"{pipe.preset.base_model} (the key's base model)", "gate": gate.describe(),
            "verdict": gate.verdict(ratio, rep3[0], rep3[1])}  # fmt: skip
