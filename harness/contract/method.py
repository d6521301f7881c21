"""The method interface: a watermark method trains a student from a base model and owns its detector."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from harness.config.errors import HarnessError
from harness.config.settings import DataSource, TrainSettings
from harness.contract.plugin import Ablation, Column, Plugin


class MethodStages(Protocol):
    """The stages a method's training may build besides its own (``TrainContext.stages``)."""

    def aux_stage(
        self, kind: str, spec: dict, build: Callable[[Path], dict], what: str, collective: bool = False
    ) -> Path:
        """Build (or reuse) a stage of the run store that other runs can share, e.g. Gu-KTH's teacher texts, keyed by
        ``spec`` plus the base model's and the training data's fingerprints, and return its folder. ``collective``:
        under a launch, every process computes it (a stage that trains the whole model); otherwise the main process
        builds it alone."""
        ...

    def train_other(self, name: str, settings: dict) -> Path:
        """Another method's train stage with ``settings`` (the preset's for it, overridden), trained or reused, e.g.
        the Gu-KGW student Gloaguen-KGW starts from."""
        ...


@dataclass(frozen=True)
class TrainContext:
    """What a method gets to train with, as values: the resolved base model, the training texts and where they come
    from, the optimisation settings, the device and the method's other models; and ``stages``, what it may build
    besides its own stage (``MethodStages``; None where a caller trains with no store).
    Models load through ``harness.assets.models`` (``load_tokenizer``, ``load_causal_lm`` for the teacher,
    ``load_trainable`` for the student)."""

    base_model: str  # local folder or hub id
    train_texts: Iterable[str]  # streamed: read only as far as training needs (see TrainSettings.tokens)
    settings: TrainSettings
    device: str  # "cpu", "cuda", ...
    models: dict[str, str] | None = None  # the method's other models (``model_refs``), resolved to folders or ids
    stages: MethodStages | None = None
    train_data: DataSource | None = None  # where ``train_texts`` come from, for a method that reads them twice

    def need_stages(self, method: str) -> MethodStages:
        """``stages``, or a one-line error naming ``method``, which builds stages of its own."""
        if self.stages is None:
            raise HarnessError(f"{method} builds stages of its own: train it through the pipeline (harness run)")
        return self.stages


KEY_FILE = "key.json"


def save_trained(out: Path, student, tokenizer, key: dict) -> None:
    """What ``WatermarkMethod.train`` leaves in its stage folder: the released model (``out/model``: weights and
    tokenizer) and, beside it, the detection key (``out/key.json``, which may name other files in ``out``)."""
    from harness.compute.training import save_model

    save_model(student, out / "model", tokenizer)
    save_key(out, key)


def save_key(out: Path, key: dict) -> None:
    """Write the detection key ``key`` as ``out/key.json``, as ``save_trained`` leaves it beside the model: a detector
    needs the key alone (tests score texts with real detectors from keys written so, with no trained model)."""
    (out / KEY_FILE).write_text(json.dumps(key, indent=2))


KEY_LIMIT = 1 << 24  # bytes of a key.json (the keys written here are under 1 KB)


def read_key(folder: Path | str) -> dict:
    """The detection key that ``save_trained`` wrote into a train stage's folder (or a folder a user gave ``harness
    detect``): a missing, endless, malformed or non-object file is one line naming it."""
    from harness.store.files import parse_json, read_bounded

    path = Path(folder) / KEY_FILE
    key = parse_json(read_bounded(path, "detection key", KEY_LIMIT), str(path))
    if not isinstance(key, dict):
        raise HarnessError(f"{path}: a detection key is a JSON object, not {type(key).__name__}")
    return key


@dataclass(frozen=True)
class DetectContext:
    """What a detector may use besides its key: a stage of its own (e.g. Gu-KTH's reference statistics, computed once
    per key and data), human texts that are not the evaluation's negatives (from the training data) and the length
    of the evaluated completions."""

    stage: Callable[[str, dict, Callable[[Path], dict], str], Path]
    reference_texts: Callable[[int], list[str]]  # the first N documents of the training data
    prompt_tokens: int
    new_tokens: int
    device: str
    base_model: str | None = None  # the unwatermarked base (a folder), for detectors that compare with it


class Detector(ABC):
    """Scores texts given as token ids of the base tokenizer (completions only; the pipeline decides whether those
    are the generated ids or the decoded text tokenized again). Higher ``score`` means more likely watermarked."""

    @abstractmethod
    def score(self, sequences: list[list[int]], prompts: list[list[int]] | None = None) -> list[dict]:
        """One dict per sequence with at least ``score``; ``p_value`` where the scheme has one. ``prompts``: the ids
        each sequence continues (BOS first where the tokenizer adds one), given only to a detector whose method reads
        them (``WatermarkMethod.detector_reads_prompt``) and only where they are known (``harness detect --texts``
        has none: None)."""

    def pool(self, sequences: list[list[int]], scores: list[dict]) -> dict | None:
        """One test of all ``sequences`` together (``scores``: theirs from ``score``), for a decision about the source
        that wrote them: ``{"p_value", "statistic", "test", "tokens"}``, the p-value valid for the number of texts
        under the scheme's own null hypothesis, and ``per_text_p_values`` (one per text) where the test gives each text
        its own p-value and ``score`` gives none that holds (KTH). None where the scheme has none (the caller then
        compares the per-text scores with the base model's, ``harness/audit/verdict.py``)."""
        return None


@dataclass(frozen=True)
class PublishedDefault:
    """Where a drawn key holds the value that makes it (``path`` into ``key.json``; a key that lacks it has the
    default, as keys written before the setting did), the published default of that value, and who published it:
    ``WatermarkMethod.published_key`` says that a key holding the default is a published one."""

    path: tuple[str, ...]
    default: object
    source: str  # e.g. "lm-watermarking's default hash key"

    @classmethod
    def seed_setting(cls, method: WatermarkMethod) -> PublishedDefault:
        """A key drawn from the method's ``seed`` setting, whose default ships with the harness's code."""
        return cls(("seed",), type(method).Params.model_fields["seed"].default, "the harness's default key seed")

    def of(self, key: dict) -> str | None:
        value = key
        for part in self.path:
            value = value.get(part, self.default) if isinstance(value, dict) else None
        return f"{self.source} {self.default}" if value == self.default else None


def score_texts(method, detector: Detector, sequences: list[list[int]], prompts: list[list[int]] | None) -> list[dict]:
    """``detector.score`` on ``sequences``, given their ``prompts`` where ``method``'s detector reads them (and they
    are known); every caller scores through this, so a detector that reads no prompt keeps the one-argument form."""
    if prompts is not None and method.detector_reads_prompt():
        return detector.score(sequences, prompts=prompts)
    return detector.score(sequences)


def score_long_enough(
    sequences: list[list[int]], minimum: int, score: Callable, neutral: dict, prompts: list | None = None
) -> list[dict]:
    """``score`` (a batch function) on the sequences of at least ``minimum`` tokens (with ``prompts``: on those
    sequences and their prompts, ``score(seqs, prompts)``); the shorter ones, which hold no position to score (e.g. a
    paraphrase that came out nearly empty), get ``neutral``, the result of no evidence for a watermark, with
    ``scored: 0``, so that one short text never stops a run."""
    keep = [i for i, seq in enumerate(sequences) if len(seq) >= minimum]
    out = [{**neutral, "scored": 0} for _ in sequences]
    if keep:
        seqs = [sequences[i] for i in keep]
        results = score(seqs) if prompts is None else score(seqs, [prompts[i] for i in keep])
        for i, result in zip(keep, results, strict=True):
            out[i] = result
    return out


class KeyFromTokenizer:
    """For a method whose detection key is ``detection_key(tokenizer)`` of the base model's tokenizer (KGW, KTH,
    AAR: drawn from its settings alone): ``WatermarkMethod.draw_key`` without training."""

    def draw_key(self, out: Path, base_model: str) -> None:
        from harness.assets.models import load_tokenizer

        save_key(out, self.detection_key(load_tokenizer(base_model)))


class WatermarkMethod(Plugin, ABC):
    """Base of every method: ``train`` writes ``out/model`` (weights + tokenizer, what is released) and the detection
    key beside it (``out/key.json`` and any files it names), never inside ``out/model``."""

    label: ClassVar[str]  # name in tables, e.g. "Gu-KGW"; columns follow the registry's order of methods
    # The settings the paper varies to trade detection for quality (tab:watermark-config, the AUC-PPL figure): tables
    # take a configuration that differs from the preset's only in these as one point of that trade-off.
    tradeoff_settings: ClassVar[tuple[str, ...]] = ()
    # tab:ft_steps compares the featured method with the best other one at every fine-tuning step.
    featured: ClassVar[bool] = False
    ablations: ClassVar[tuple[Ablation, ...]] = ()  # tables of its configurations that differ in one setting alone
    # Columns of its own in runs.csv: the mean over each run's generated texts of a field its detector writes.
    columns: ClassVar[tuple[Column, ...]] = ()
    # Whether its detector's ``pool`` is a test with a null distribution of its own (KGW, KTH); False: ``harness
    # detect`` calibrates the scores against the unwatermarked base model's own continuations instead.
    detector_has_null: ClassVar[bool] = False
    # Bumped when the detector's per-text output changes for the same key and texts: recorded in a run's (and an
    # audit's) detector spec only where set (``scoring.detector_spec``), so the other methods' runs keep their hashes.
    # KGW and KTH "2": per-text p-values that hold their level (KGW's over a text's distinct units; KTH's rank against
    # human texts no longer called a p-value).
    detector_version: ClassVar[str | None] = None
    # Settings ``harness detect`` scores with, where the command line does not set them (PRO: its centred score).
    audit_settings: ClassVar[dict] = {}
    # A setting that chooses between detection scores, and what each value reads (the report says which rows use
    # which): None where the method has one score.
    score_setting: ClassVar[tuple[str, dict[str, str]] | None] = None

    # A decoding-time watermark (the closed-source upper bound a learned one is measured against): its "trained" model
    # is the base as it is, and the watermark is in the sampler (``logits_processors``), so no model attack applies.
    decoding_time: ClassVar[bool] = False

    def logits_processors(self, key_dir: Path, tokenizer) -> list:
        """What the sampler applies to the logits when this method's model writes (decoding-time methods): none for
        a watermark in the weights."""
        return []

    def refuses(self, attack) -> str | None:
        """Why this method cannot be evaluated under ``attack`` (None: it can). A decoding-time watermark is not in the
        weights, so an attack that changes them has nothing to act on."""
        if self.decoding_time and attack.edits_weights():
            return (
                f"{self.name} watermarks at decoding time, not in the weights: model attacks ({attack.name}) do not "
                "apply to it (text attacks do)"
            )
        return None

    def refuses_decoding(self, decoding: dict) -> str | None:
        """Why this method cannot be evaluated at the decoding settings ``decoding`` (``EvalSettings.decoding``: those
        that differ from plain sampling), where they would change nothing its rows are labelled with (None: it can)."""
        return None

    def published_default(self) -> PublishedDefault | None:
        """The published default of the value a drawn key is made from (a paper's seed or hash key); None where keys
        are learned in training (PRO's policy)."""
        return None

    def published_key(self, key: dict) -> str | None:
        """Why ``key`` (a train stage's ``key.json``, as ``read_key`` gives it) is a published one, in a few words
        (e.g. a paper's default seed): anyone can write text it flags, so a verdict under it is no evidence against
        anyone who could know it. None: a key of the owner's own (drawn from a seed they keep, or trained)."""
        default = self.published_default()
        return None if default is None else default.of(key)

    def detector_reads_prompt(self) -> bool:
        """Whether this configuration's detector reads the prompt each text continues (``Detector.score``'s
        ``prompts``): its runs then record it (``scoring.detector_spec``), as the same texts score differently."""
        return False

    @abstractmethod
    def train(self, ctx: TrainContext, out: Path) -> dict:
        """Train the watermarked student into ``out``; return a training report for the manifest."""

    def train_params(self) -> dict:
        """The settings that decide the trained student, hashed into its train stage: two configurations that train
        the same student share one stage (the runs keep every setting). All of them unless a method says otherwise."""
        return self.hashed_params()

    def draw_key(self, out: Path, base_model: str) -> None:
        """Write into ``out`` the detection key ``train`` would write on ``base_model`` (``key.json`` and the files it
        names), without training: a scheme whose key does not depend on the trained student draws it from its
        settings (a seed) and the base, so its null can be tested over keys drawn afresh (``benchmarks/audit_null.py``,
        ``tests/unit/test_audit_null.py``). A key learned in training cannot be drawn so."""
        raise HarnessError(f"{self.label}'s key is learned in training: it cannot be drawn without training a student")

    @abstractmethod
    def detector(self, key_dir: Path, tokenizer, ctx: DetectContext | None = None) -> Detector:
        """The detector for the key that ``train`` wrote into ``key_dir`` (detection needs no watermarked model;
        ``tokenizer`` is the base model's, for schemes that read text; ``ctx`` for schemes that need more, such as a
        reference distribution)."""


def refusal(method: WatermarkMethod, attack) -> str | None:
    """Why ``method`` cannot be evaluated under ``attack``, said by either of them (None: it can)."""
    return method.refuses(attack) or attack.refuses(method)
