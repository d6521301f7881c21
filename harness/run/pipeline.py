"""The flow of one robustness cell: train (methods/) -> attack (attacks/) -> generate -> detect -> metrics.

Every step is a stage in the run store, keyed by a hash of all its inputs including the upstream stage's hash, so a
watermarked model is trained once and reused by every attack, and a repeated command recomputes nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from attacks.base import MODEL, AttackContext, TextAttack
from harness.assets import data, models, weights
from harness.compute import distributed, imports, memory, training
from harness.compute.generation import SAMPLER, completion_perplexity, sample
from harness.config.errors import HarnessError
from harness.config.presets import Preset
from harness.config.registry import attacks
from harness.run import metrics, scoring, textsim
from harness.run.scoring import attack_row
from harness.store import files
from harness.store.stages import EditedStage, Stage, Store
from methods.base import DetectContext, TrainContext, score_texts

log = logging.getLogger(__name__)


@dataclass
class ScoredRun:
    """One evaluated model under one method's detector: a row of the printed table (a grid's cell makes several)."""

    row: str
    run: Stage
    reused: bool
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Output:
    """One model an attack produced (or the unaltered one): its table row and config label, its folder, the id that
    downstream hashes use, and the spec of the attack stage that made it (None: unaltered)."""

    row: str
    config_label: str
    path: Path
    model_id: str
    spec: dict | None


def check_inputs(preset: Preset, plugins, build: bool = True) -> None:
    """Everything cheap, before any model loads: the training batch splits across the processes of a launch, the models
    (base, oracle, the plugins' own) resolve, every dataset reads, then the plugins' deeper checks pass and every
    sequence fits the base model (these two read the base model's config: a built-in one this machine lacks is judged
    by its recipe's where it has one, else built first, hence last). ``build=False`` (a dry run) builds no built-in
    model: the checks that would need one built are left to the run."""
    files.check_cache()  # (where built models and file hashes are kept: a file there fails every build, late)
    training.check_split(preset.train.batch_size, f"train.batch_size ({preset.train.batch_size})")
    refs = [ref for p in plugins for ref in p.model_refs().values()]
    for ref in dict.fromkeys((preset.base_model, preset.oracle_model, *refs)):
        models.check(ref)
    for source in (preset.train_data, preset.eval_data, *(s for p in plugins for s in p.data_refs().values())):
        data.check(source)
    # What follows is judged against the base model: a built-in one this machine lacks is judged by the config its
    # recipe gives (models.planned), or else built here by a first run (last, for that).
    base_ready = build or models.built(preset.base_model) or models.planned(preset.base_model)
    for plugin in plugins:
        plugin.validate(preset.base_model if base_ready else None)
    if base_ready:
        lengths = {"train.seq_len": preset.train.seq_len, **eval_lengths(preset)}
        lengths |= {f"{p.name} {k}": v for p in plugins for k, v in p.token_lengths().items()}
        models.check_lengths(preset.base_model, lengths)


def eval_lengths(preset: Preset) -> dict[str, int]:
    """The sequences evaluation feeds a model: a prompt and its continuation (+1: a BOS token)."""
    return {"eval.prompt_tokens + eval.new_tokens": preset.eval.prompt_tokens + preset.eval.new_tokens + 1}


class Pipeline:
    """The stages of one preset on one store. With ``plan=True`` nothing is built: every stage keeps its spec and hash
    and says only whether it is stored, so a grid can tell which of its runs are done already."""

    def __init__(self, preset: Preset, store: Store, device: str | None = None, plan: bool = False):
        memory.tune_allocator()  # logits-sized tensors reused, not page-faulted anew (harness/compute/memory.py)
        imports.defer_hqq_import()  # a job that has not imported transformers yet starts faster (compute/imports.py)
        self.preset = preset
        self.store = store
        self.device = device or models.default_device()
        self.plan = plan

    def _build(self, stage: Stage, what: str, fn, collective: bool = False) -> bool:
        """Build ``stage`` or reuse it (returns whether it was reused); when planning, only say whether it is stored.
        ``collective``: with several processes, all of them compute it (harness/compute/distributed.py)."""
        if self.plan:  # stored means reusable: verified as a real run would verify it
            try:
                return stage.done and stage.problem() is None
            except EditedStage:
                return False
        return self._build_or_reuse(stage, what, fn, collective)

    def _build_or_reuse(self, stage: Stage, what: str, fn, collective: bool) -> bool:
        try:
            return self.store.build_or_reuse(stage, what, fn, collective)
        finally:
            memory.release()  # the stage's tensors are gone: their memory goes back (harness/compute/memory.py)

    # --- inputs shared by every stage -------------------------------------------------------------------------
    @cached_property
    def base(self) -> dict:
        path = models.resolve(self.preset.base_model)
        return {"ref": self.preset.base_model, "path": path, "fingerprint": models.fingerprint(path)}

    @cached_property
    def oracle(self) -> dict:
        path = models.resolve(self.preset.oracle_model)
        return {"ref": self.preset.oracle_model, "path": path, "fingerprint": models.fingerprint(path)}

    @cached_property
    def oracle_tokenizer(self) -> dict:
        """The oracle's tokenizer, and whether it is the base model's (False: texts are re-tokenized for the oracle).
        Apart from ``oracle``: planning a run needs the oracle's fingerprint, not its tokenizer."""
        tokenizer = models.load_tokenizer(self.oracle["path"])
        shares = tokenizer.get_vocab() == models.load_tokenizer(self.base["path"]).get_vocab()
        return {"tokenizer": tokenizer, "shares": shares}

    # --- stages ---------------------------------------------------------------------------------------------
    def train(self, method) -> Stage:
        spec = {
            "stage": "train",
            "method": method.name,
            "method_version": method.version,
            "params": method.train_params(),
            "base_model": {k: self.base[k] for k in ("ref", "fingerprint")},
            "train_data": source_spec(self.preset.train_data),
            "train": self.preset.train.model_dump(exclude=self.preset.train.unhashed()),
        }
        extra = self.refs(method, spec)
        stage = self.store.stage("train", spec)

        def build(out: Path) -> dict:
            texts = data.iter_texts(self.preset.train_data)
            ctx = TrainContext(
                self.base["path"],
                texts,
                self.preset.train,
                self.device,
                extra,
                self.aux_stage,
                self.train_other,
                self.preset.train_data,
            )
            return method.train(ctx, out)

        self._build(stage, f"training of {method.name}", build, collective=True)
        return stage

    def aux_stage(self, kind: str, spec: dict, build, what: str, collective: bool = False) -> Path:
        """A stage a method builds for itself (teacher texts, reference statistics), shared by every run whose
        inputs match: keyed by ``spec`` plus the base model and the training data, which such stages read.
        ``collective``: computed by every process of a launch (harness/compute/distributed.py)."""
        if kind in ("train", "attack", "generate", "text-attack", "run"):
            raise ValueError(f"'{kind}' is a pipeline stage, not a method's own")
        if files.plain_name(kind) != kind:  # it names a folder of the store
            raise HarnessError(f"a method's stage kind must be a plain name, not '{kind}'")
        full = {
            "stage": kind,
            **spec,
            "base_model": {k: self.base[k] for k in ("ref", "fingerprint")},
            "train_data": source_spec(self.preset.train_data),
        }
        stage = self.store.stage(kind, full)
        self._build_or_reuse(stage, what, build, collective)
        return stage.path

    def train_other(self, name: str, settings: dict) -> Path:
        """The train stage of method ``name`` with ``settings`` (the preset's for it, overridden), trained or reused."""
        from harness.config.registry import methods

        return self.train(methods.build(name, settings, self.preset)).path

    @staticmethod
    def refs(plugin, spec: dict) -> dict[str, str]:
        """Add the plugin's other models and datasets, with content fingerprints, to ``spec`` (what they hold is part
        of what the stage means: PRO's E, a paraphraser, calibration data); return the models resolved to folders."""
        refs = plugin.model_refs()
        resolved = {name: models.resolve(ref) for name, ref in refs.items()}
        if resolved:
            spec["models"] = {n: {"ref": refs[n], "fingerprint": models.fingerprint(p)} for n, p in resolved.items()}
        sources = plugin.data_refs()
        if sources:
            spec["data"] = {name: source_spec(src) for name, src in sources.items()}
        return resolved

    def attack(self, attack, trained: Stage) -> list[Output]:
        """The attacked model(s): one per entry of ``attack.outputs()``, all from one attack stage."""
        if attack.identity:
            return [Output(attack_row(attack), attack.config_label(), trained.path / "model", trained.key, None)]
        spec = {
            "stage": "attack",
            "attack": attack.name,
            "attack_version": attack.version,
            "params": attack.params.model_dump(),
            "input": trained.key,
            "base_model": self.base["fingerprint"],
        }
        extra = self.refs(attack, spec)
        stage = self.store.stage("attack", spec)
        for _, sub in attack.outputs():  # an output folder inside the stage's, whatever the plugin says
            if not files.stays_inside(sub):
                raise HarnessError(f"attack {attack.name} names an output folder '{sub}' outside its stage")

        def build(out: Path) -> dict:
            ctx = AttackContext(self.base["path"], self.device, extra)
            report = attack.apply(trained.path / "model", out, ctx)
            if distributed.is_main():  # (the others of a collective attack may write nothing)
                missing = [sub for _, sub in attack.outputs() if not (out / sub / "config.json").is_file()]
                if missing:
                    raise RuntimeError(f"attack {attack.name} wrote no model into {', '.join(missing)}")
                for _, sub in attack.outputs():
                    bad = weights.non_finite_weight(out / sub)
                    if bad is not None:
                        raise HarnessError(
                            f"attack {attack.name} ({attack.config_label()}) produced a model whose {bad} is not "
                            "finite (NaN or infinite weights); nothing of it was stored"
                        )
            return report

        self._build(stage, f"attack {attack.name}", build, collective=attack.collective)
        return [
            # A single model keeps the stage's hash as its id; several are told apart by their sub-folder.
            Output(
                attack_row(attack, label),
                label,
                stage.path / sub,
                stage.key if sub == MODEL else f"{stage.key}/{sub}",
                stage.spec,
            )
            for label, sub in attack.outputs()
        ]

    def attack_texts(self, attack: TextAttack, generated: Stage) -> Stage:
        """Generations whose completions ``attack`` rewrote (re-tokenized with the base tokenizer); the human
        negatives stay as they are. Each row records how much was rewritten (unigram overlap with the original) and
        how much meaning was kept (cosine similarity of sentence embeddings)."""
        spec = {
            "stage": "text-attack",
            "attack": attack.name,
            "attack_version": attack.version,
            "params": attack.params.model_dump(),
            "input": generated.key,
            "similarity_model": {
                "ref": textsim.SIMILARITY_MODEL,
                "fingerprint": models.fingerprint(self.similarity_model),
            },
        }
        extra = self.refs(attack, spec)
        stage = self.store.stage("text-attack", spec)

        def build(out: Path) -> dict:
            gens = files.read_jsonl(generated.path / "generations.jsonl")
            ctx = AttackContext(self.base["path"], self.device, extra, prompts=[g["prompt"] for g in gens])
            texts, applied = attack.apply_texts_measured([g["completion"] for g in gens], ctx)
            if len(texts) != len(gens):
                raise RuntimeError(f"attack {attack.name} returned {len(texts)} texts for {len(gens)}")
            ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            originals = [g["completion"] for g in gens]
            overlap = [textsim.unigram_overlap(a, b) for a, b in zip(originals, texts, strict=True)]
            cosine = textsim.embedding_cosine(originals, texts, self.similarity_model, self.device)
            rows = [
                {**g, "completion": t, "completion_ids": i, "original_completion": g["completion"],
                 "unigram_overlap": o, "embedding_cosine": c}
                for g, t, i, o, c in zip(gens, texts, ids, overlap, cosine, strict=True)
            ]  # fmt: skip
            for row, done in zip(rows, applied or [], strict=False):  # an edit's rate as applied, text by text
                row["edit"] = done
            files.write_jsonl(out / "generations.jsonl", rows)
            return {"texts": len(rows), **textsim.summary(overlap, cosine, applied)}

        self._build(stage, f"text attack {attack.name}", build)
        return stage

    @cached_property
    def oracle_model(self):
        """The perplexity oracle, loaded once per pipeline (a command scores several runs with it)."""
        return models.load_causal_lm(self.oracle["path"], self.device)

    @cached_property
    def similarity_model(self) -> str:
        return models.resolve(textsim.SIMILARITY_MODEL)

    @cached_property
    def tokenizer(self):
        """The base model's tokenizer: prompts, decoding, and the detectors' re-tokenization of text."""
        return models.load_tokenizer(self.base["path"])

    @cached_property
    def prompts(self) -> list[dict]:
        """Evaluation prompts and human continuations; ``run`` reads them before training, so bad evaluation data
        fails in seconds rather than after hours of training."""
        e = self.preset.eval
        texts = data.load_texts(self.preset.eval_data, limit=max(4 * e.num_prompts, 1000))
        return data.eval_prompts(self.tokenizer, texts, e.num_prompts, e.prompt_tokens, e.new_tokens)

    def generate(self, model_path: str | Path, model_id: str, name: str) -> Stage:
        e = self.preset.eval
        spec = {
            "stage": "generate",
            "model": model_id,
            "eval_data": source_spec(self.preset.eval_data),
            "eval": e.model_dump(exclude={"ppl_batch_size", "score_on"}),  # neither changes the texts
            "tokenizer": self.base["fingerprint"],
            "sampler": SAMPLER,
        }
        stage = self.store.stage("generate", spec)

        def build(out: Path) -> dict:
            prompts = self.prompts
            tokenizer = models.load_tokenizer(str(model_path))
            model = models.load_causal_lm(str(model_path), self.device)
            prompt_ids = [p["prompt_ids"] for p in prompts]
            used: dict = {}
            completions = distributed.map_shards(
                lambda part, first: sample(model, part, e, tokenizer.eos_token_id, f"generate ({name})", first, used),
                prompt_ids,
            )
            rows = [
                {
                    "i": i,
                    "prompt_ids": p["prompt_ids"],
                    "completion_ids": c,
                    "human_ids": p["human_ids"],
                    "prompt": tokenizer.decode(p["prompt_ids"], skip_special_tokens=True),
                    "completion": tokenizer.decode(c, skip_special_tokens=True),
                    "human": tokenizer.decode(p["human_ids"], skip_special_tokens=True),
                }
                for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
            ]
            files.write_jsonl(out / "generations.jsonl", rows)
            return {"device": self.device, "texts": len(rows), "batch_size": used.get("batch_size")}

        self._build(stage, f"generation from {name}", build, collective=True)
        return stage

    def score(
        self, method, trained: Stage, generated: Stage, spec: dict, artefacts: dict, attack_spec: dict | None = None
    ) -> ScoredRun:
        """The run ``spec`` (``scoring.run_spec``): the method's detector on generated (positives) and human
        (negatives) texts, plus perplexity."""
        row = spec["row"]
        run = self.store.stage("run", spec)

        def build(out: Path) -> dict:
            gens = files.read_jsonl(generated.path / "generations.jsonl")
            pos, neg = self.detect(method, trained, gens)
            ppl = self.perplexities(gens, f"perplexity ({row})")
            scored = [{**s, "ppl": q} for s, q in zip(pos, ppl, strict=True)]
            new_tokens = self.preset.eval.new_tokens
            ppl_on = metrics.ppl_footing(self.oracle_tokenizer["shares"], metrics.rewritten(gens))
            scoring.publish_scores(out, generated.path / "generations.jsonl", gens, scored, neg, new_tokens, ppl_on)
            # Where the model and key are: paths stay out of the hash, so a moved store still matches.
            (out / "artefacts.json").write_text(json.dumps(artefacts, indent=2))
            report = {"device": self.device, "ppl_batch_size": self.preset.eval.ppl_batch_size, "ppl_on": ppl_on}
            # Texts too short for the detector to score any position (scored neutrally: no evidence).
            report["unscored_texts"] = {"generated": sum(s.get("scored") == 0 for s in pos),
                                        "human": sum(s.get("scored") == 0 for s in neg)}  # fmt: skip
            if attack_spec is not None:  # what the evaluated folder holds (e.g. a dequantized copy), from its stage
                attack_stage = self.store.stage("attack", attack_spec)
                report["evaluated"] = attack_stage.manifest()["report"].get("evaluated", "the attack's output")
            return report

        reused = self._build(run, f"scoring of '{row}'", build, collective=True)
        if self.plan:
            return ScoredRun(row, run, reused)
        if reused and distributed.is_main():
            scoring.rescore(run)  # a run scored by older metric code is brought up to date from its scores
        distributed.barrier()
        return ScoredRun(row, run, reused, json.loads((run.path / "metrics.json").read_text()))

    def attribution(self, method, trained: Stage, generated: Stage, source: dict) -> Stage:
        """Attribution (the paper's appendix): ``method``'s detector, keyed by ``trained``, on another model's stored
        generations (and the human texts beside them), generating nothing. ``metrics.json``'s ``tpr@f`` is then the
        share of that model's texts flagged at the threshold that gives FPR ``f`` on human texts."""
        spec = {
            "stage": "attribution",
            "preset": self.preset.name,
            "scoring_version": scoring.SCORING_VERSION,
            "detector": scoring.detector_spec(method, trained.key, self.preset.eval.score_on),
            "generate": generated.key,
            # For the table: who detects (method, config) and whose texts (a label and, for a watermarked model, the
            # train stage that made it).
            "labels": {"detector": {"method": method.label, "config": method.config_label()}, "source": source},
            "preset_settings": scoring.preset_settings(self.preset),
            "base_model": self.base["fingerprint"],
        }
        stage = self.store.stage("attribution", spec)

        def build(out: Path) -> dict:
            gens = files.read_jsonl(generated.path / "generations.jsonl")
            pos, neg = self.detect(method, trained, gens)
            scoring.publish_scores(
                out, generated.path / "generations.jsonl", gens, pos, neg, self.preset.eval.new_tokens
            )
            return {"device": self.device}

        self._build(stage, f"attribution of {source['label']} texts by {method.label}", build)
        return stage

    def detect(self, method, trained: Stage, gens: list[dict]) -> tuple[list[dict], list[dict]]:
        """``method``'s detector, keyed by ``trained``, on the generated and on the human texts of ``gens``."""
        detector = method.detector(trained.path, self.tokenizer, self.detect_context())

        def both(part: list[dict], _first: int) -> list[tuple[dict, dict]]:
            prompts = [g["prompt_ids"] for g in part]  # what both the generated and the human texts continue
            pos = score_texts(method, detector, self.detector_input(part, "completion"), prompts)
            neg = score_texts(method, detector, self.detector_input(part, "human"), prompts)
            return list(zip(pos, neg, strict=True))

        pairs = distributed.map_shards(both, gens)
        return [p for p, _ in pairs], [n for _, n in pairs]

    def detect_context(self) -> DetectContext:
        return DetectContext(
            stage=self.aux_stage,
            reference_texts=lambda n: data.load_texts(self.preset.train_data, limit=n),
            prompt_tokens=self.preset.eval.prompt_tokens,
            new_tokens=self.preset.eval.new_tokens,
            device=self.device,
            base_model=self.base["path"],
        )

    def detector_input(self, gens: list[dict], field: str) -> list[list[int]]:
        """What a detector reads: by default the decoded text tokenized again with the base tokenizer, as a user
        submits text (Gu et al. and the paper do this); ``eval.score_on=ids`` scores the sampled ids instead."""
        if self.preset.eval.score_on == "ids":
            return [g[f"{field}_ids"] for g in gens]
        return self.tokenizer([g[field] for g in gens], add_special_tokens=False)["input_ids"]

    def perplexities(self, gens: list[dict], desc: str) -> list[float]:
        """Completion perplexity under the oracle; texts are re-tokenized when its tokenizer differs (e.g. LLaMA-2
        scoring LLaMA-3 text, as in the paper)."""
        oracle_tok = self.oracle_tokenizer["tokenizer"]
        if self.oracle_tokenizer["shares"]:
            prompts = [g["prompt_ids"] for g in gens]
            completions = [g["completion_ids"] for g in gens]
        else:
            prompts = oracle_tok([g["prompt"] for g in gens])["input_ids"]
            completions = oracle_tok([g["completion"] for g in gens], add_special_tokens=False)["input_ids"]
        pad = oracle_tok.pad_token_id if oracle_tok.pad_token_id is not None else oracle_tok.eos_token_id
        return distributed.map_shards(
            lambda part, first: completion_perplexity(
                self.oracle_model, part, completions[first : first + len(part)], self.preset.eval.ppl_batch_size,
                pad or 0, desc,
            ),
            prompts,
        )  # fmt: skip

    # --- the command ------------------------------------------------------------------------------------------
    def run(self, method, attack) -> list[ScoredRun]:
        """Evaluate the unwatermarked base, the unaltered watermarked model and the attacked model (one table)."""
        none = attacks.build("none", {})
        if not self.plan:
            if distributed.is_main():
                self.store.sweep()
            self.prompts  # noqa: B018  (reads and checks the evaluation data before any training)
        trained = self.train(method)
        oracle = {k: self.oracle[k] for k in ("ref", "fingerprint")}

        def run_spec(attack_, config_label, generated: Stage, attack_spec: dict | None) -> dict:
            upstream = {"train": trained.spec, "attack": attack_spec, "generate": generated.spec}
            return scoring.run_spec(self.preset, method, attack_, config_label, trained_key=trained.key,
                                    generate_key=generated.key, oracle=oracle, upstream=upstream)  # fmt: skip

        base_gen = self.generate(self.base["path"], f"base:{self.base['fingerprint']}", "base model")
        base_spec = run_spec(None, None, base_gen, None)
        cells = [self.score(method, trained, base_gen, base_spec, {"model": self.base["path"]})]
        (unaltered_out,) = self.attack(none, trained)
        unaltered = self.generate(unaltered_out.path, unaltered_out.model_id, unaltered_out.row)
        rows = [(none, unaltered_out, unaltered)]  # (attack, output, generations)
        if isinstance(attack, TextAttack):  # rewrites what the unaltered model wrote
            text_out = Output(attack_row(attack), attack.config_label(), unaltered_out.path, "", None)
            rows.append((attack, text_out, self.attack_texts(attack, unaltered)))
        elif not attack.identity:
            for out in self.attack(attack, trained):
                rows.append((attack, out, self.generate(out.path, out.model_id, out.row)))
        for a, out, gen in rows:
            artefacts = {"model": str(out.path), "key": str(trained.path / "key.json")}
            spec = run_spec(a, out.config_label, gen, out.spec)
            cells.append(self.score(method, trained, gen, spec, artefacts, out.spec))
        return cells


def source_spec(src) -> dict:
    return {**src.model_dump(), "fingerprint": data.fingerprint(src)}


def attribute(entries: list[tuple[Pipeline, object]]) -> int:
    """Attribution (the paper's appendix): the detector of each ``(pipeline, method)`` on the unaltered texts of every
    entry's model and of the base model (the first entry's), generating nothing that the entries' runs stored
    already. Returns how many (detector, texts) pairs were scored."""
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
        sources.append((label, pipe.generate(out.path, out.model_id, out.row)))
        trained.append((pipe, method, stage))
    for pipe, method, stage in trained:
        for label, generated in sources:
            pipe.attribution(method, stage, generated, label)
    return len(trained) * len(sources)


def fill_prefix_scores(store: Store, device: str | None = None) -> tuple[int, int, list[str]]:
    """Add the per-text prefix scores (tokens to detect, TPR by length) to the finished runs that were scored before
    detectors kept them: each run's detector, keyed by its train stage in ``store``, scores the run's stored texts
    again (no generation); the new scores must equal the stored ones, else the run is left as it is. Returns
    (filled, runs lacking them, the ones left as they are: each named in a warning)."""
    from harness.config.registry import methods

    filled, lacking, skipped = 0, 0, []
    for path in store.runs():
        run = Stage("run", {}, path.name, path, store.root)
        try:
            with files.locked(run.lock_file, f"prefix scores of run {run.key}"):
                scores = files.read_jsonl(path / "scores.jsonl")
                if all("prefix_scores" in s for s in scores):
                    continue
                lacking += 1
                problem = run.problem()
                spec = json.loads((path / "spec.json").read_text())
                key = spec["detector"]["key_from"]
                trained = Stage("train", {}, key, store.root / "stages" / "train" / key, store.root)
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
                first, _ = pipe.detect(method, trained, gens[:1])
                if "prefix_scores" not in first[0]:
                    lacking -= 1  # a detector that keeps none (a statistic that is not a running one)
                    continue
                pos, neg = pipe.detect(method, trained, gens)
                fresh = {(1, g["i"]): s for g, s in zip(gens, pos, strict=True)}
                fresh |= {(0, g["i"]): s for g, s in zip(gens, neg, strict=True)}
                for s in scores:
                    new = fresh[(s["label"], s["i"])]
                    if abs(new["score"] - s["score"]) > 1e-9:
                        raise HarnessError(f"its detector now scores text {s['i']} {new['score']}, not {s['score']}")
                    s["prefix_scores"] = new["prefix_scores"]
                run.update({"scores.jsonl": "".join(json.dumps(s) + "\n" for s in scores)})
                manifest = run.manifest()
                manifest.setdefault("rescored", []).append({"prefix_scores": "added", "to": metrics.METRICS_VERSION})
                new_metrics = json.dumps(metrics.run_metrics(path), indent=2)
                run.update({"metrics.json": new_metrics, "manifest.json": json.dumps(manifest, indent=2)})
                filled += 1
        except HarnessError as err:
            log.warning("run %s left as it is: %s", path, err)
            skipped.append(str(path))
    return filled, lacking, skipped
