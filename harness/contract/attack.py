"""The attack interface. A model attack reads a saved model folder and writes the modified model to another; a
text attack rewrites generated texts (paraphrasing). Both are pure functions of their inputs (no state kept
between calls). What an attack may ask of the pipeline that runs it is ``CellStages``, a typed protocol that
``harness.cell.pipeline.Pipeline`` implements: the pipeline calls ``Attack.evaluated(pipeline, ...)``, and the attack
calls back only what is written there, so a setting followed from the command line to the attack stays in sight."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import Field, model_validator

from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.config.settings import DataSource, EvalSettings
from harness.contract.plugin import ATTACK_TABLES, Plugin, SettingTable, Sweep, check_table_names
from harness.store.stages import Stage

MODEL = "model"  # the sub-folder of an attack stage that holds the (one) attacked model
# The sub-folder of a quantizing attack's stage with the library's own output (packed weights, a GGUF file, a
# compressed-tensors checkpoint), beside the float32 copy in MODEL that is evaluated.
QUANTIZED = "quantized"


@dataclass(frozen=True)
class Output:
    """One model an attack produced (or the unaltered one): its table row and config label, its folder, the id that
    downstream hashes use, and the spec of the attack stage that made it (None: unaltered)."""

    row: str
    config_label: str
    path: Path
    model_id: str
    spec: dict | None


# What an attack adds to a cell: each evaluated output with the stage of the texts scored for it.
Evaluated = list[tuple[Output, Stage]]


class CellStages(Protocol):
    """The stages an attack's ``evaluated`` makes its rows from."""

    def attack(self, attack: ModelAttack, trained: Stage | Output) -> list[Output]:
        """The model(s) ``attack`` writes from the watermarked model (its train stage) or from another attack's
        output (a chain's next link), one per ``attack.outputs()``, all from one attack stage."""
        ...

    def attack_texts(
        self, attack: TextAttack, unaltered: tuple[Output, Stage], reads: dict[str, Path] | None = None
    ) -> tuple[Output, Stage]:
        """The texts of ``unaltered`` (an output and its generate stage) rewritten by ``attack``. ``reads``: the stages
        the rewriting reads besides the texts (name -> folder, as ``aux_stage`` returns them: a stolen estimate), given
        to ``attack.apply_texts`` as ``ctx.reads``; their keys key the rewrites, so that two attacks reading different
        stages never share one stage's rewrites."""
        ...

    @property
    def evaluation(self) -> EvalSettings:
        """The settings the cell's texts are drawn and scored under (``eval``: its decoding, ``new_tokens``, ``seed``,
        the prompts' kind), read-only."""
        ...

    @property
    def prompts(self) -> list[dict]:
        """The evaluation prompts, in order: each a dict with ``prompt_ids`` (what the models continue) and
        ``human_ids`` (the human continuation, the negatives), token ids of the base tokenizer."""
        ...

    def generate(self, model_path: str | Path, model_id: str, name: str, *, seed: int | None = None) -> Stage:
        """The continuations of the evaluation prompts written by the model in ``model_path`` (``model_id`` keys the
        stage; ``name`` is the row it is for), as the model is sampled (a decoding-time watermark's processors
        included). ``seed``: another draw per prompt than the evaluation's (``evaluation.seed``): N seeds, N samples
        of each prompt, each a stage of its own."""
        ...

    def texts(
        self, attack: Attack, unaltered: tuple[Output, Stage], reads: dict, make: Callable[[list[dict]], list]
    ) -> tuple[Output, Stage]:
        """``attack``'s row (the unaltered model's output under the attack's row name and config label) with
        continuations the attack makes itself: ``make(prompts)`` (``prompts`` as above) returns one list of token ids
        per prompt, in order (the best of several draws, a selection, a mixture). Stored as generations are, and keyed
        by the model, the attack's settings and ``reads``, which must name every stage ``make`` reads (their keys), or
        two attacks reading different stages would share one stage's texts."""
        ...

    def decode(
        self,
        attack: Attack,
        unaltered: tuple[Output, Stage],
        processors: Processors,
        from_base: bool = False,
        reads: dict | None = None,
    ) -> tuple[Output, Stage]:
        """``attack``'s row (the unaltered model's output under the attack's row name and config label) and its
        texts: the continuations of the evaluation prompts written by the unaltered watermarked model (``unaltered``:
        its output and generate stage; a decoding-time watermark's processors first, where the method has one) with
        ``processors(tokenizer, ctx)`` (transformers ``LogitsProcessor``s; ``ctx`` an ``AttackContext`` holding
        ``attack.model_refs()`` resolved to folders) acting on its scores before the draw's decoding transform: an
        attack that changes how the model is decoded, not its weights (several models' distributions mixed).
        ``from_base``: the unwatermarked base writes instead, with no watermark of its own (a spoofer's model). The
        stage is keyed by the model, the attack's settings, its other models' fingerprints and ``reads``: what else
        the processors read (the stages they load: a stolen estimate's hash), which the spec must name, or two
        attacks that read different stages would share one stage's texts."""
        ...

    def query(
        self,
        unaltered: tuple[Output, Stage],
        prompts: list[list[int]],
        new_tokens: int,
        seed: int,
        desc: str,
        from_base: bool = False,
    ) -> list[list[int]]:
        """What an attacker gets by querying the unaltered watermarked model (as it is sampled: a decoding-time
        watermark's processors included) on prompts of their own: ``new_tokens`` tokens after each of ``prompts``
        (token ids), plain sampling at temperature 1 keyed by ``seed``; ``from_base``: the unwatermarked base's
        instead (what anyone holding the open base writes). Not stored: the caller keeps what it needs in a stage of
        its own (``aux_stage``)."""
        ...

    def aux_stage(
        self, kind: str, spec: dict, build: Callable[[Path], dict], what: str, collective: bool = False
    ) -> Path:
        """A stage of the attack's own (a stolen estimate, a model it trained), as ``MethodStages.aux_stage``: keyed by
        ``spec`` plus the base model's and the training data's fingerprints, built once and shared (planned, not
        built, in a dry run); returns its folder."""
        ...


# What ``CellStages.decode`` is given: (the base tokenizer, the attack's context) -> the logits processors to add.
Processors = Callable[[Any, "AttackContext"], list]


@dataclass(frozen=True)
class AttackContext:
    """What an attack may use besides the model: the unwatermarked base (for merging), the device, the attack's other
    models resolved to folders or ids (``model_refs``), and, for text attacks, the prompt each text continues and the
    stages its rewriting reads (``CellStages.attack_texts``' ``reads``)."""

    base_model: str  # local folder or hub id of the unwatermarked base
    device: str
    models: dict[str, str] | None = None
    prompts: list[str] | None = None
    reads: dict[str, Path] | None = None


class Attack(Plugin):
    """What every attack declares: its label and category, and the tables and figures its rows go in (the report
    reads these; it names no attack). Row groups and their order follow the registry's order of attacks."""

    category: ClassVar[str]  # row group in tab:robustness, e.g. "Merging"
    label: ClassVar[str]  # e.g. "SLERP"
    description: ClassVar[str] = ""  # what captions call it (default: the label), e.g. "DIPPER paraphrasing"
    # The tables its rows go in, by the names of ``harness.contract.plugin.ATTACK_TABLES`` (checked when the class is
    # defined: an unknown name is an error that lists the valid ones).
    tables: ClassVar[tuple[str, ...]] = ("robustness",)
    # Tables of its own besides those: each a row per setting of the attack and the runs.csv columns it names.
    setting_tables: ClassVar[tuple[SettingTable, ...]] = ()
    sweep: ClassVar[Sweep | None] = None  # a figure of AUC against its strength
    identity: ClassVar[bool] = False  # True only for ``none``: the pipeline then uses the input model as is
    # The uninformed attack others are read against (weight noise): the AUC-utility figure draws it as a curve.
    reference_curve: ClassVar[bool] = False
    # Whether a cell also applies it to the unwatermarked base, a control row of each output (distillation: a student
    # trained the same way on the base's own texts), and reads its rows against that control's texts
    # (``AUC_vs_control``): what survives the modification beyond what the modification itself does to the scores.
    controlled: ClassVar[bool] = False
    # Whether a chain may hold it (attacks/chain.py): a model attack as any link, a text attack as the last. An attack
    # of a kind of its own makes its rows through stages of its own (an estimate it reads, several draws), which a
    # chain's links do not pass on.
    chain_link: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        """Check the table names of every attack class as it is defined, built-in or an outside plugin's."""
        super().__init_subclass__(**kwargs)
        owner = f"attack class {cls.__module__}.{cls.__qualname__}"
        check_table_names(owner, "table", cls.tables, ATTACK_TABLES)
        declared = cls.setting_tables
        if not isinstance(declared, tuple) or not all(isinstance(t, SettingTable) for t in declared):
            raise HarnessError(f"{owner}: its setting_tables must be a tuple of SettingTable, not {declared!r:.80}")
        names = [t.name for t in declared]
        if len(set(names)) < len(names):
            raise HarnessError(f"{owner}: two of its setting_tables share a name ({', '.join(names)})")

    def refuses(self, method) -> str | None:
        """Why this attack cannot act on ``method`` (a ``WatermarkMethod``; None: it can), said before any training,
        as the method says why it refuses an attack (``WatermarkMethod.refuses``): an attack built on a scheme's keys
        or on sampling several texts may have nothing to act on for another."""
        return None

    def edits_weights(self) -> bool:
        """Whether the attack changes the model (a model attack but ``none``), rather than what it wrote."""
        return isinstance(self, ModelAttack) and not self.identity

    def rewrites_texts(self) -> bool:
        """Whether its rows score rewrites of texts (a text attack's, or a chain's that ends in one) rather than what a
        model sampled: the evaluation's decoding settings do not apply to them."""
        return isinstance(self, TextAttack)

    def token_lengths(self) -> dict[str, int]:
        lengths = getattr(self.params, "token_lengths", None)  # calibration settings say theirs
        return lengths() if lengths is not None else {}

    def table_label(self) -> str:
        """The Method column of tab:robustness (e.g. "SLERP"; fine-tuning names its dataset there)."""
        return self.label

    def evaluated(self, pipeline: CellStages, trained: Stage, unaltered: tuple[Output, Stage]) -> Evaluated:
        """The ``(output, generations)`` pairs this attack adds to a cell beside the unaltered model, made through
        ``pipeline`` (``CellStages``: ``attack``, ``attack_texts``, ``generate``, ``decode``, ``texts``, ...) from
        ``trained`` (the watermarked model's train stage) and ``unaltered`` (the unaltered model's output and
        generations). The pipeline asks the attack rather than branching on its kind: model and text attacks say
        theirs below; a new kind of attack implements this alone."""
        raise NotImplementedError(f"attack {self.name} says nothing of what it adds to a cell (evaluated)")


class ModelAttack(Attack, ABC):
    """Base of every model -> model attack (quantization, pruning, merging, fine-tuning)."""

    # Under a launch of several processes: True if every process computes the attack with the others (it trains the
    # whole model, which one GPU may not hold), False if the main process builds it alone
    # (harness/compute/distributed.py).
    collective: ClassVar[bool] = False
    chain_link: ClassVar[bool] = True

    @abstractmethod
    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        """Write the attacked model(s) into the stage folder ``out_dir``: one model (weights + tokenizer, loadable by
        ``harness.assets.models.load_causal_lm``) per entry of ``outputs()``, in its sub-folder. Return every setting
        used, library versions included, and under ``"evaluated"`` what the evaluated folder holds (e.g. a dequantized
        copy of what the library produced)."""

    def outputs(self) -> list[tuple[str, str]]:
        """``(row config label, sub-folder)`` of each model the attack writes. One by default; fine-tuning writes a
        checkpoint per requested step, each its own table row, from one training run."""
        return [(self.config_label(), MODEL)]

    def evaluated(self, pipeline: CellStages, trained: Stage, unaltered: tuple[Output, Stage]) -> Evaluated:
        """Each model the attack stage writes from the trained one, with its generations."""
        return [(out, pipeline.generate(out.path, out.model_id, out.row)) for out in pipeline.attack(self, trained)]


class TextAttack(Attack, ABC):
    """Base of every texts -> texts attack: it rewrites the unaltered watermarked model's completions. Its rows go
    in a table of its own (as DIPPER's tab:dipper), with how much the texts were rewritten and kept."""

    tables: ClassVar[tuple[str, ...]] = ("own",)
    chain_link: ClassVar[bool] = True  # (as a chain's last link)

    @abstractmethod
    def apply_texts(self, texts: list[str], ctx: AttackContext) -> list[str]:
        """Return one rewritten text per input text, in order (``ctx.prompts`` holds the prompt of each)."""

    def apply_texts_measured(self, texts: list[str], ctx: AttackContext) -> tuple[list[str], list[dict] | None]:
        """``apply_texts`` and, where the attack can say it, what it applied to each text (an edit's
        ``{"unit", "units", "edited"}``), stored with each rewritten text; None where it cannot."""
        return self.apply_texts(texts, ctx), None

    def evaluated(self, pipeline: CellStages, trained: Stage, unaltered: tuple[Output, Stage]) -> Evaluated:
        """The rewrites of what the unaltered model wrote."""
        return [pipeline.attack_texts(self, unaltered)]


# Calibration tokens at most: the stream is read into memory with a 4x pool to pick windows from (a Python list, about
# 36 bytes a token: 2.4 GB here), and GPTQ keeps every sample's activations. The paper calibrates on 65,536 tokens
# (128 x 512); a setting past this bound is a typo that would fail only after the model was trained and the data read.
MAX_CALIB_TOKENS = 2**24


class CalibrationParams(Params):
    """Calibration data of the attacks that need some (GPTQ, Wanda, SparseGPT): ``calib_samples`` windows of
    ``calib_len`` tokens drawn with ``seed`` from the first documents of a dataset (a built-in, a local file or a
    hub id, as everywhere in the harness). Defaults are the paper's setting; presets override them."""

    calib_data: str = "allenai/c4"
    calib_name: str | None = "en"
    calib_split: str = "train"
    calib_field: str = "text"
    calib_samples: int = Field(128, gt=0)
    calib_len: int = Field(512, gt=1)
    seed: int = 0

    @model_validator(mode="after")
    def _bounded(self) -> CalibrationParams:
        if self.calib_samples * self.calib_len > MAX_CALIB_TOKENS:
            raise ValueError(
                f"calib_samples x calib_len ({self.calib_samples:,} x {self.calib_len:,}) exceeds "
                f"{MAX_CALIB_TOKENS:,} calibration tokens (the paper's: 128 x 512)"
            )
        return self

    def token_lengths(self) -> dict[str, int]:
        return {"calib_len": self.calib_len}

    def calibration_source(self) -> DataSource:
        return DataSource(
            path=self.calib_data, name=self.calib_name, split=self.calib_split, text_field=self.calib_field
        )


def calibration_ids(tokenizer, params: CalibrationParams):
    """``(calib_samples, calib_len)`` token ids: the documents' token stream (each ending in EOS) cut into windows of
    ``calib_len``, of which ``calib_samples`` are picked by a generator seeded with ``seed`` (Wanda and SparseGPT draw
    random windows of C4 documents the same way). Reads only as many documents as it needs, with a 4x pool to
    pick from."""
    import torch

    from harness.assets import data

    n, length = params.calib_samples, params.calib_len
    stream = data.token_stream(tokenizer, data.iter_texts(params.calibration_source()), max_tokens=4 * n * length)
    windows = len(stream) // length
    if windows < n:
        raise HarnessError(
            f"calibration data '{params.calib_data}' holds {len(stream)} tokens: {windows} windows of {length}, "
            f"fewer than calib_samples={n}"
        )
    ids = torch.tensor(stream[: windows * length], dtype=torch.long).view(windows, length)
    pick = torch.randperm(windows, generator=torch.Generator().manual_seed(params.seed))[:n]
    return ids[pick.sort().values]


def library_versions(*distributions: str) -> dict[str, str | None]:
    """Installed versions of the libraries an attack used, for its report."""
    from harness.store.versions import package_versions

    return package_versions(("torch", "transformers", *distributions))
