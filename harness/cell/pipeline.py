"""The flow of one robustness cell: train (methods/) -> attack (attacks/) -> generate -> detect -> metrics.

Every step is a stage in the run store, keyed by a hash of all its inputs including the upstream stage's hash, so a
watermarked model is trained once and reused by every attack, and a repeated command recomputes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice
from pathlib import Path

from harness.assets import data, models, textsim, weights
from harness.cell import detection, metrics, rewrites, scoring
from harness.cell.scoring import attack_row
from harness.cell.utility import utility
from harness.compute import distributed, imports, memory
from harness.compute.generation import SAMPLER, sample, sample_plainly
from harness.config.errors import HarnessError
from harness.config.registry import attacks
from harness.config.settings import EvalSettings, Preset
from harness.contract.attack import MODEL, AttackContext, Output, TextAttack
from harness.contract.method import TrainContext, refusal
from harness.store import files, kinds
from harness.store.stages import EditedStage, Stage, Store

# The repetition penalty acts before a decoding-time watermark's processor, as transformers orders its built-in
# penalty before user processors (lm-watermarking's and MarkLLM's KGW among them); temperature and truncation after.
PENALTY_FIRST = "repetition penalty, watermark, temperature, truncation"


@dataclass
class ScoredRun:
    """One evaluated model under one method's detector: a row of the printed table (a grid's cell makes several)."""

    row: str
    run: Stage
    reused: bool
    metrics: dict = field(default_factory=dict)


class Pipeline:  # implements the contract's MethodStages (method.py) and CellStages (attack.py)
    """The stages of one preset on one store. With ``plan=True`` nothing is built: every stage keeps its spec and hash
    and says only whether it is stored, so a grid can tell which of its runs are done already."""

    def __init__(self, preset: Preset, store: Store, device: str | None = None, plan: bool = False):
        memory.tune_allocator()  # logits-sized tensors reused, not page-faulted anew (harness/compute/memory.py)
        imports.defer_hqq_import()  # a job that has not imported transformers yet starts faster (compute/imports.py)
        self.preset = preset
        self.store = store
        self.device = device or models.default_device()
        self.plan = plan
        self._samplers: dict[str, tuple] = {}  # model id -> the decoding-time watermark it is sampled with

    def build_stage(self, stage: Stage, what: str, fn, collective: bool = False) -> bool:
        """Build ``stage`` or reuse it (returns whether it was reused); when planning, only say whether it is stored.
        ``collective``: with several processes, all of them compute it (harness/compute/distributed.py). Callers of
        the graph build their own stages with it too (``attribution``)."""
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
    def train_stage(self, method) -> tuple[Stage, dict[str, str]]:
        """The train stage of ``method`` (built or not) and the method's other models resolved to folders."""
        spec = {
            **training_settings(self.preset, method),
            "base_model": {k: self.base[k] for k in ("ref", "fingerprint")},
            "train_data": source_spec(self.preset.train_data),
        }
        extra = self.refs(method, spec)
        return self.store.stage(kinds.TRAIN, spec), extra

    def train(self, method) -> Stage:
        stage, extra = self.train_stage(method)

        def build(out: Path) -> dict:
            texts = data.iter_texts(self.preset.train_data)
            ctx = TrainContext(
                self.base["path"], texts, self.preset.train, self.device, extra, self, self.preset.train_data
            )
            return method.train(ctx, out)

        self.build_stage(stage, f"training of {method.name}", build, collective=True)
        return stage

    def aux_stage(self, kind: str, spec: dict, build, what: str, collective: bool = False) -> Path:
        """A stage a method builds for itself (teacher texts, reference statistics), shared by every run whose
        inputs match: keyed by ``spec`` plus the base model and the training data, which such stages read.
        ``collective``: computed by every process of a launch (harness/compute/distributed.py)."""
        kinds.check_own(kind)
        if files.plain_name(kind) != kind:  # it names a folder of the store
            raise HarnessError(f"a method's stage kind must be a plain name, not '{kind}'")
        full = {
            "stage": kind,
            **spec,
            "base_model": {k: self.base[k] for k in ("ref", "fingerprint")},
            "train_data": source_spec(self.preset.train_data),
        }
        stage = self.store.stage(kind, full)
        if not self.plan:  # (a dry run plans an attack's own stages, as every other, without building them)
            self._build_or_reuse(stage, what, build, collective)
        return stage.path

    def train_other(self, name: str, settings: dict) -> Path:
        """The train stage of method ``name`` with ``settings`` (the preset's for it, overridden), trained or reused."""
        from harness.config.registry import methods

        return self.train(methods.build(name, settings, self.preset)).path

    @staticmethod
    def refs(plugin, spec: dict) -> dict[str, str]:
        """Add the plugin's other models and datasets, with content fingerprints, to ``spec`` (what they hold is part
        of what the stage means: PRO's E, a paraphraser, calibration data), local ones named by content, not by path
        (``Plugin.hashed_params``); return the models resolved to folders."""
        refs = plugin.model_refs()
        resolved = {name: models.resolve(ref) for name, ref in refs.items()}
        if resolved:
            found = {n: models.fingerprint(p) for n, p in resolved.items()}
            spec["models"] = {n: {"ref": models.hashed_ref(refs[n], fp), "fingerprint": fp} for n, fp in found.items()}
        sources = plugin.data_refs()
        if sources:
            spec["data"] = {name: source_spec(src, by_content=True) for name, src in sources.items()}
        return resolved

    @staticmethod
    def check_other_models(attack, watermarked: Path) -> None:
        """Refuse a model the attack reads besides its input (a merge's donor) that is the watermarked model itself, by
        any spelling of its folder or as a copy: possible only once it is stored (a donor exists already), and checked
        before any stage is built. mergekit refuses a duplicate input only as a traceback, and merges a copy with
        itself."""
        if not watermarked.is_dir():
            return
        for name, ref in attack.model_refs().items():
            folder = models.on_disk(ref)
            if folder is not None and models.same_model(folder, watermarked):
                raise HarnessError(
                    f"attack {attack.name}: its {name} '{ref}' is the watermarked model itself ({watermarked}): name "
                    "another model"
                )

    def attack(self, attack, trained: Stage | Output) -> list[Output]:
        """The attacked model(s): one per entry of ``attack.outputs()``, all from one attack stage. Its input is the
        watermarked model (``trained``: its train stage) or another attack's output (a chain's next link), keyed by
        that model's id, so that a link is the same stage as the attack run alone on the same model."""
        model, model_id = (trained.path, trained.model_id) if isinstance(trained, Output) else model_of(trained)
        if attack.identity:
            return [Output(attack_row(attack), attack.config_label(), model, model_id, None)]
        spec = {
            "stage": kinds.ATTACK,
            "attack": attack.name,
            "attack_version": attack.version,
            "params": attack.hashed_params(),
            "input": model_id,
            "base_model": self.base["fingerprint"],
        }
        extra = self.refs(attack, spec)
        stage = self.store.stage(kinds.ATTACK, spec)
        for _, sub in attack.outputs():  # an output folder inside the stage's, whatever the plugin says
            if not files.stays_inside(sub):
                raise HarnessError(f"attack {attack.name} names an output folder '{sub}' outside its stage")

        def build(out: Path) -> dict:
            ctx = AttackContext(self.base["path"], self.device, extra)
            report = attack.apply(model, out, ctx)
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

        self.build_stage(stage, f"attack {attack.name}", build, collective=attack.collective)
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

    def attack_texts(self, attack: TextAttack, unaltered: tuple[Output, Stage],
                     reads: dict[str, Path] | None = None) -> tuple[Output, Stage]:  # fmt: skip
        """The unaltered model's generations (``unaltered``: its output and generate stage) with their completions
        rewritten by ``attack`` (re-tokenized with the base tokenizer); the human negatives stay as they are. Each row
        records how much was rewritten (unigram overlap with the original) and how much meaning was kept (cosine
        similarity of sentence embeddings). ``reads``: the stages the rewriting reads besides the texts (name ->
        folder), keyed into the stage by their keys and given to the attack as ``ctx.reads``."""
        unaltered_out, generated = unaltered
        spec = {
            "stage": kinds.TEXT_ATTACK,
            "attack": attack.name,
            "attack_version": attack.version,
            "params": attack.hashed_params(),
            "input": generated.key,
            "similarity_model": {
                "ref": textsim.SIMILARITY_MODEL,
                "fingerprint": models.fingerprint(self.similarity_model),
            },
        }
        if reads:  # (only where given: every other rewrite keeps its hash)
            spec["reads"] = {name: Path(folder).name for name, folder in reads.items()}
        extra = self.refs(attack, spec)
        stage = self.store.stage(kinds.TEXT_ATTACK, spec)

        def build(out: Path) -> dict:
            gens = files.read_jsonl(generated.path / "generations.jsonl")
            ctx = AttackContext(self.base["path"], self.device, extra, prompts=[g["prompt"] for g in gens],
                                reads=reads)  # fmt: skip
            rows, report = rewrites.rewrite(attack, gens, ctx, self.tokenizer, self.similarity_model)
            files.write_jsonl(out / "generations.jsonl", rows)
            return report

        self.build_stage(stage, f"text attack {attack.name}", build)
        return Output(attack_row(attack), attack.config_label(), unaltered_out.path, "", None), stage

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

    @property
    def evaluation(self) -> EvalSettings:
        """``CellStages.evaluation``: the settings the cell's texts are drawn and scored under."""
        return self.preset.eval

    @cached_property
    def prompts(self) -> list[dict]:
        """Evaluation prompts and human continuations; ``run`` reads them before training, so bad evaluation data
        fails in seconds rather than after hours of training."""
        e, source = self.preset.eval, self.preset.eval_source()
        limit = max(4 * e.num_prompts, 1000)
        if e.prompts == "chat":
            rows = list(islice(data.iter_rows(source, (source.prompt_field, source.text_field)), limit))
            context = models.context_length(self.preset.base_model)
            return data.chat_prompts(self.tokenizer, self.preset.base_model, rows, source, e.num_prompts,
                                     e.new_tokens, e.system_prompt, context)  # fmt: skip
        texts = data.load_texts(source, limit=limit)
        return data.eval_prompts(self.tokenizer, texts, e.num_prompts, e.prompt_tokens, e.new_tokens)

    @staticmethod
    def sampler(method, trained: Stage) -> tuple | None:
        """How the unaltered model of ``method`` (trained as ``trained``) is sampled: a decoding-time watermark's
        ``(spec, tokenizer -> its key's logits processors)``, which every draw of that model samples with
        (``generate``'s ``watermark``); None for a watermark in the weights."""
        if not method.decoding_time:
            return None
        return ({"method": method.name, "key_from": trained.key},
                lambda tokenizer: method.logits_processors(trained.path, tokenizer))  # fmt: skip

    def generate(
        self,
        model_path: str | Path,
        model_id: str,
        name: str,
        watermark: tuple | None = None,
        decoding_with: tuple | None = None,
        seed: int | None = None,
    ) -> Stage:
        """The model's continuations of the evaluation prompts. ``watermark``: a decoding-time watermark's ``(spec,
        tokenizer -> logits processors)``, applied by the sampler, and from then on to every draw of that model;
        ``decoding_with``: an attack's ``(spec, tokenizer -> logits processors)`` after the watermark's (``decode``);
        each recorded in the spec only where given. ``seed``: another draw than the evaluation's (``eval.seed``)."""
        e = self.evaluation if seed is None else self.evaluation.model_copy(update={"seed": seed})
        watermark = watermark or self._samplers.get(model_id)
        spec = {**self._texts_spec(model_id, e), "sampler": SAMPLER}
        if watermark is not None:
            spec["watermark"] = watermark[0]
        if decoding_with is not None:
            spec["decoding_with"] = decoding_with[0]
        if e.repetition_penalty is not None and (watermark or decoding_with):  # (the order matters only then)
            spec["order"] = PENALTY_FIRST
        stage = self.store.stage(kinds.GENERATE, spec)
        if watermark is not None:
            self._samplers[model_id] = watermark  # (what ``decode``, ``query`` and other draws sample the model with)

        def build(out: Path) -> dict:
            prompts = self.prompts
            tokenizer = models.load_tokenizer(str(model_path))
            model = models.load_causal_lm(str(model_path), self.device)
            prompt_ids = [p["prompt_ids"] for p in prompts]
            used: dict = {}
            processors = (*(watermark[1](tokenizer) if watermark is not None else ()),
                          *(decoding_with[1](tokenizer) if decoding_with is not None else ()))  # fmt: skip
            completions = distributed.map_shards(
                lambda part, first: sample(
                    model, part, e, tokenizer.eos_token_id, f"generate ({name})", first, used, processors
                ),
                prompt_ids,
            )
            texts = _write_texts(out, tokenizer, prompts, completions)
            return {"device": self.device, "texts": texts, "batch_size": used.get("batch_size")}

        self.build_stage(stage, f"generation from {name}", build, collective=True)
        return stage

    def _texts_spec(self, model_id: str, e: EvalSettings) -> dict:
        """What keys the continuations of the evaluation prompts by ``model_id`` drawn under ``e``."""
        return {
            "stage": kinds.GENERATE,
            "model": model_id,
            "eval_data": source_spec(self.preset.eval_source()),  # (the code or chat data where eval.prompts says)
            "eval": e.model_dump(exclude={"ppl_batch_size", "score_on"}),  # neither changes the texts
            "tokenizer": self.base["fingerprint"],
        }

    def texts(self, attack, unaltered: tuple[Output, Stage], reads: dict, make) -> tuple[Output, Stage]:
        """``CellStages.texts``: the attack's row of the unaltered model, with continuations the attack makes itself
        from the stages ``reads`` names."""
        out, _ = unaltered
        spec = self._texts_spec(out.model_id, self.evaluation)
        spec["made_by"] = {"attack": attack.name, "attack_version": attack.version, "params": attack.hashed_params(),
                           "reads": reads}  # fmt: skip
        self.refs(attack, spec["made_by"])
        stage = self.store.stage(kinds.GENERATE, spec)
        row = Output(attack_row(attack), attack.config_label(), out.path, out.model_id, None)

        def build(folder: Path) -> dict:
            prompts = self.prompts
            completions = make(prompts)
            if len(completions) != len(prompts) or not all(
                isinstance(c, list) and all(isinstance(i, int) for i in c) for c in completions
            ):
                raise RuntimeError(
                    f"attack {attack.name} made {len(completions)} continuations for {len(prompts)} prompts: one list "
                    "of token ids per prompt, in the prompts' order"
                )
            return {"texts": _write_texts(folder, self.tokenizer, prompts, completions)}

        self.build_stage(stage, f"texts of {attack.name}", build)
        return row, stage

    def decode(self, attack, unaltered: tuple[Output, Stage], processors, from_base: bool = False,
               reads: dict | None = None):  # fmt: skip
        """``CellStages.decode``: the attack's row of the unaltered model (or of the base), and its continuations with
        the attack's processors after its watermark's."""
        out, _ = unaltered
        spec = {"attack": attack.name, "attack_version": attack.version, "params": attack.hashed_params(),
                "base_model": self.base["fingerprint"]}  # fmt: skip
        if reads:
            spec["reads"] = reads
        ctx = AttackContext(self.base["path"], self.device, self.refs(attack, spec))
        if from_base:
            out = Output("", "", Path(self.base["path"]), f"base:{self.base['fingerprint']}", None)
        row = Output(attack_row(attack), attack.config_label(), out.path, out.model_id, None)
        return row, self.generate(out.path, out.model_id, row.row, None,
                                  (spec, lambda tokenizer: processors(tokenizer, ctx)))  # fmt: skip

    def query(self, unaltered: tuple[Output, Stage], prompts, new_tokens: int, seed: int, desc: str,
              from_base: bool = False):  # fmt: skip
        """``CellStages.query``: the unaltered model (or the base) sampled on an attacker's prompts, its watermark's
        processors included."""
        out, _ = unaltered
        path = self.base["path"] if from_base else str(out.path)
        tokenizer = models.load_tokenizer(path)
        model = models.load_causal_lm(path, self.device)
        watermark = None if from_base else self._samplers.get(out.model_id)
        processors = tuple(watermark[1](tokenizer)) if watermark is not None else ()
        return sample_plainly(model, prompts, new_tokens, seed, tokenizer.eos_token_id, desc, processors)

    def score(
        self, method, trained: Stage, generated: Stage, spec: dict, artefacts: dict, attack_spec: dict | None = None
    ) -> ScoredRun:
        """The run ``spec`` (``scoring.run_spec``): the method's detector on generated (positives) and human
        (negatives) texts, plus perplexity."""
        row = spec["row"]
        run = self.store.stage(kinds.RUN, spec)

        def build(out: Path) -> dict:
            gens = files.read_jsonl(generated.path / "generations.jsonl")
            pos, neg = detection.detect(self, method, trained, gens)
            ppl, again = detection.perplexities(self, gens, f"perplexity ({row})")
            scored = [{**s, "ppl": q} for s, q in zip(pos, ppl, strict=True)]
            if again is not None:  # the sampled ids' PPL, and the decoded text's as a text attack's row measures it
                scored = [{**s, "ppl_retokenized": q} for s, q in zip(scored, again, strict=True)]
            new_tokens = self.preset.eval.new_tokens
            ppl_on = metrics.ppl_footing(self.oracle_tokenizer["shares"], metrics.rewritten(gens))
            scoring.publish_scores(out, generated.path / "generations.jsonl", gens, scored, neg, new_tokens, ppl_on)
            # Where the model and key are: paths stay out of the hash, so a moved store still matches.
            (out / "artefacts.json").write_text(json.dumps(artefacts, indent=2))
            report = {"device": self.device, "ppl_batch_size": self.preset.eval.ppl_batch_size, "ppl_on": ppl_on}
            # Texts too short for the detector to score any position (scored neutrally: no evidence).
            report["unscored_texts"] = {"generated": sum(s.get("scored") == 0 for s in pos),
                                        "human": sum(s.get("scored") == 0 for s in neg)}  # fmt: skip
            attack_stage = None if attack_spec is None else self.store.stage(kinds.ATTACK, attack_spec)
            if attack_stage is not None:  # what the evaluated folder holds (e.g. a dequantized copy), from its stage
                report["evaluated"] = attack_stage.manifest()["report"].get("evaluated", "the attack's output")
            report["upstream_peak_memory"] = upstream_peaks(train=trained, attack=attack_stage, generate=generated)
            return report

        reused = self.build_stage(run, f"scoring of '{row}'", build, collective=True)
        if self.plan:
            return ScoredRun(row, run, reused)
        if reused and distributed.is_main():
            scoring.rescore(run)  # a run scored by older metric code is brought up to date from its scores
        distributed.barrier()
        return ScoredRun(row, run, reused, json.loads((run.path / "metrics.json").read_text()))

    # --- the command ------------------------------------------------------------------------------------------
    def run(self, method, attack) -> list[ScoredRun]:
        """Evaluate the unwatermarked base, the unaltered watermarked model and the attacked model (one table)."""
        none = attacks.build("none", {})
        refused = refusal(method, attack)
        if refused:
            raise HarnessError(refused)
        if not self.plan:
            if distributed.is_main():
                self.store.sweep()
            self.prompts  # noqa: B018  (reads and checks the evaluation data before any training)
        self.check_other_models(attack, model_of(self.train_stage(method)[0])[0])  # (before even a reuse is logged)
        trained = self.train(method)
        oracle = {k: self.oracle[k] for k in ("ref", "fingerprint")}

        def run_spec(attack_, config_label, generated: Stage, attack_spec: dict | None, control=False) -> dict:
            upstream = {"train": trained.spec, "attack": attack_spec, "generate": generated.spec}
            return scoring.run_spec(self.preset, method, attack_, config_label, trained_key=trained.key,
                                    generate_key=generated.key, oracle=oracle, upstream=upstream,
                                    control=control)  # fmt: skip

        base_gen = self.generate(self.base["path"], f"base:{self.base['fingerprint']}", "base model")
        base_spec = run_spec(None, None, base_gen, None)
        cells = [self.score(method, trained, base_gen, base_spec, {"model": self.base["path"]})]
        (unaltered_out,) = self.attack(none, trained)
        unaltered = self.generate(unaltered_out.path, unaltered_out.model_id, unaltered_out.row,
                                  self.sampler(method, trained))  # fmt: skip
        rows = [(none, unaltered_out, unaltered)]  # (attack, output, generations)
        # The attack says what it adds (harness/contract/attack.py): models of its own or rewrites of the unaltered
        # texts.
        rows += [(attack, out, gen) for out, gen in attack.evaluated(self, trained, (unaltered_out, unaltered))]
        utility(self, self.base["path"], f"base:{self.base['fingerprint']}", "base model")
        for a, out, gen in rows:
            if out.model_id:  # a model (a text attack's row reads the unaltered model's texts)
                utility(self, out.path, out.model_id, out.row)
            artefacts = {"model": str(out.path), "key": str(trained.path / "key.json")}
            spec = run_spec(a, out.config_label, gen, out.spec)
            cells.append(self.score(method, trained, gen, spec, artefacts, out.spec))
        if attack.controlled and attack.edits_weights():  # the same modification of the unwatermarked base
            base_out = Output(scoring.BASE_ROW, "", self.base["path"], f"base:{self.base['fingerprint']}", None)
            for out in self.attack(attack, base_out):
                row = scoring.attack_row(attack, out.config_label, control=True)
                gen = self.generate(out.path, out.model_id, row)
                utility(self, out.path, out.model_id, row)
                spec = run_spec(attack, out.config_label, gen, out.spec, control=True)
                cells.append(self.score(method, trained, gen, spec, {"model": str(out.path)}, out.spec))
        return cells


def upstream_peaks(**stages: Stage | None) -> dict:
    """Each stage a run was made from, with the peak memory its manifest recorded (``{"train": {"stage": "train/<hash>",
    "rss_bytes": ...}, ...}``), so that a run's own manifest says what making it took at most, training included, and
    an exported run (which carries no stage folders) keeps it. Stages built before peaks were recorded are left out."""
    out = {}
    for name, stage in stages.items():
        peak = stage.manifest().get("peak_memory") if stage is not None and stage.done else None
        if peak:
            out[name] = {"stage": f"{stage.kind}/{stage.key}", **peak}
    return out


def model_of(trained: Stage) -> tuple[Path, str]:
    """The watermarked model a train stage holds, and the id downstream stages key it by."""
    return trained.path / MODEL, trained.key


def training_settings(preset: Preset, method) -> dict:
    """What a train stage's spec holds that needs no fingerprint (of the base model, which may have to be built for
    one, or of the data): the method, its settings and the training's."""
    return {
        "stage": kinds.TRAIN,
        "method": method.name,
        "method_version": method.version,
        "params": method.train_params(),
        "train": preset.train.model_dump(exclude=preset.train.unhashed()),
    }


def source_spec(src, by_content: bool = False) -> dict:
    """The data ``src`` as a stage's spec holds it, with its fingerprint; ``by_content``: a local file or folder named
    by that fingerprint, not its path (a plugin's data, ``Plugin.hashed_params``)."""
    found = data.fingerprint(src)
    return {**src.model_dump(), "fingerprint": found} | ({"path": data.hashed_path(src, found)} if by_content else {})


def _write_texts(folder: Path, tokenizer, prompts: list[dict], completions: list[list[int]]) -> int:
    """Write the continuations ``completions`` of the evaluation ``prompts`` (token ids, with their human
    continuations) and their decoded texts as a stage's ``generations.jsonl``; return how many."""
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
    files.write_jsonl(folder / "generations.jsonl", rows)
    return len(rows)
