"""The settings a run is made of (data, training, evaluation, the preset that holds them) and ``--set
section.key=value`` overrides, validated before any model loads. Everything here that changes a result goes into the
run-store hashes; where it lives does not. The presets themselves (tiny, smol, ...) are ``harness.config.presets``."""

from __future__ import annotations

import hashlib
import json
import typing
from typing import Any, ClassVar, Literal

from pydantic import Field, PositiveInt, TypeAdapter, ValidationError, field_validator, model_validator

from harness.config.errors import HarnessError
from harness.config.gate import QualityGate
from harness.config.params import Params


class DataSource(Params):
    """A text collection: ``builtin:tiny-corpus``, a local file/folder (json/jsonl/txt/parquet), or a HF dataset id."""

    path: str
    name: str | None = None  # dataset configuration, e.g. "realnewslike" for allenai/c4
    split: str = "train"
    text_field: str = "text"
    # Instruction sets: the field holding each record's instruction (``text_field`` then holds its answer); None for
    # plain documents. Chat prompts (``eval.prompts=chat``) read such a set.
    prompt_field: str | None = None

    added_later: ClassVar[tuple[str, ...]] = ("prompt_field",)


# Tokens in one training batch at most (the paper's 64 x 512 is 32,768): 16.8M tokens' float32 logits at a
# 32,000-token vocabulary are 2 TB.
MAX_BATCH_TOKENS = 2**24


class TrainSettings(Params):
    """Optimisation shared by every method (paper appendix "Training Configurations")."""

    steps: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    seq_len: int = Field(gt=1)
    lr: float = Field(gt=0)
    warmup_frac: float = Field(0.1, ge=0, lt=1)
    betas: tuple[float, float] = (0.9, 0.999)  # --set train.betas=0.9,0.95 (or [0.9, 0.95]); each in [0, 1)
    weight_decay: float = Field(0.0, ge=0)
    # None: no clipping. Positive: torch scales the gradients by max_grad_norm / norm, so a negative one would flip
    # every gradient (training climbs the loss) and zero would erase them, with no error from torch.
    max_grad_norm: float | None = Field(1.0, gt=0)
    # Learning-rate schedule after the linear warmup: cosine decay to 0 at ``steps`` (the paper's), or constant.
    schedule: Literal["cosine", "constant"] = "cosine"
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    # The frozen teacher's weights (distillation methods): bfloat16 halves its memory (an 8B teacher in 16 GB).
    teacher_dtype: Literal["float32", "bfloat16"] = "float32"
    # Recompute activations in the backward pass (less memory, ~1/3 more compute); the same numbers, so it stays out
    # of every hash.
    gradient_checkpointing: bool = False
    seed: int = Field(0, ge=-(2**63), le=2**63 - 1)  # (torch takes a 64-bit seed; a larger one failed at training)

    def unhashed(self) -> set[str]:
        """Fields that stay out of hashes and stored configs: gradient checkpointing (the same numbers), and the
        teacher's dtype while it is float32, what every training used before the setting existed."""
        return {"gradient_checkpointing"} | ({"teacher_dtype"} if self.teacher_dtype == "float32" else set())

    @field_validator("betas", mode="before")
    @classmethod
    def _pair(cls, value):
        return [part.strip() for part in value.split(",")] if isinstance(value, str) else value

    @field_validator("betas")
    @classmethod
    def _decay_rates(cls, value: tuple[float, float]) -> tuple[float, float]:
        """AdamW's moment decay rates, each in [0, 1), which torch checks only when the optimiser is made (after the
        models have loaded, as a traceback)."""
        if not all(0 <= beta < 1 for beta in value):
            raise ValueError(f"each of AdamW's betas must be in [0, 1), not {value[0]:g}, {value[1]:g}")
        return value

    @model_validator(mode="after")
    def _batch_bounded(self) -> TrainSettings:
        """A batch's tokens at most MAX_BATCH_TOKENS: past it no device holds one step's logits, and the error came
        only after the training data had been read."""
        if self.batch_size * self.seq_len > MAX_BATCH_TOKENS:
            raise ValueError(
                f"train.batch_size x train.seq_len ({self.batch_size:,} x {self.seq_len:,}) exceeds "
                f"{MAX_BATCH_TOKENS:,} tokens a step (the paper's: 64 x 512)"
            )
        return self

    @model_validator(mode="after")
    def _decay_below_one(self) -> TrainSettings:
        """AdamW multiplies every weight by 1 - lr * weight_decay at each step: at 1 or more that zeroes or flips
        them, which torch does not check."""
        if self.lr * self.weight_decay >= 1:
            raise ValueError(
                f"lr * weight_decay ({self.lr:g} * {self.weight_decay:g}) must stay below 1: AdamW multiplies every "
                "weight by 1 - lr * weight_decay at each step"
            )
        return self

    @property
    def tokens(self) -> int:
        """Training tokens one pass of ``steps`` batches consumes."""
        return self.steps * self.batch_size * self.seq_len


_POSITIVE_INT = TypeAdapter(PositiveInt)


# The settings of EvalSettings that choose how tokens are drawn (``harness run --decode KEY=VALUE``; a grid group's
# ``decodings``): runs that differ only in them share a setup, and the decoding table sets them side by side.
DECODING = ("greedy", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")
# The sampler divides float32 logits by the temperature: any logit below 2^64 in size stays finite at this one.
MIN_TEMPERATURE = 2.0**-64
MAX_PROMPTS = 1_000_000  # evaluation prompts (the paper's grid: 5,000); past islice's limit, a count was a traceback
# The settings of EvalSettings that choose what the models are asked (``harness run --prompts``, ``--system-prompt``;
# a grid group's ``prompts``): runs that differ only in them, or in their decoding, share a setup, and the prompts
# table sets them side by side.
PROMPTS = ("prompts", "system_prompt")
PromptKind = Literal["documents", "code", "chat"]  # (``--prompts``' choices: ``PROMPT_KINDS``)
PROMPT_KINDS: tuple[str, ...] = typing.get_args(PromptKind)


class EvalSettings(Params):
    """Generation and detection protocol (paper Section 4.1; Gu et al.: top_p 1, top_k 0, exactly N new tokens)."""

    num_prompts: int = Field(gt=1, le=MAX_PROMPTS)
    prompt_tokens: int = Field(gt=0)
    new_tokens: int = Field(gt=2)
    # Decoding, as a user's stack applies it to the logits (the watermark's bias and any decoding-time watermark are
    # in them already): repetition penalty, then temperature, then top-k, top-p and min-p, then a draw; or greedy,
    # the argmax after the penalty (harness/compute/generation.py). Each at its neutral value is off, and the sampler
    # then does exactly what it did before they existed (the same texts and hashes: ``added_later``).
    temperature: float = Field(1.0, gt=0)  # (at least MIN_TEMPERATURE)
    greedy: bool = False
    top_k: int = Field(0, ge=0)  # the k likeliest tokens; 0: off
    top_p: float = Field(1.0, gt=0, le=1)  # the smallest set of likeliest tokens holding p of the mass; 1: off
    min_p: float = Field(0.0, ge=0, lt=1)  # tokens at least min_p times the likeliest's probability; 0: off
    # CTRL's penalty on every token already in the prompt or the text: its logit divided by it where positive,
    # multiplied where negative (transformers' RepetitionPenaltyLogitsProcessor); 1: off
    repetition_penalty: float = Field(1.0, gt=0)
    seed: int = Field(42, ge=-(2**63), le=2**63 - 1)  # (the sampler hashes it as a 64-bit integer)
    # What the models are asked: ``documents`` continue the first ``prompt_tokens`` tokens of the preset's
    # ``eval_data`` (the paper's protocol), ``code`` those of its ``code_data`` (a low-entropy domain), ``chat``
    # answer the instructions of its ``chat_data`` rendered through the model's chat template (harness/assets/chat.py;
    # ``prompt_tokens`` unused: an instruction is whole), after ``system_prompt`` where one is given. The human texts
    # scored as negatives are the documents' continuations or the instructions' human answers, ``new_tokens`` long.
    prompts: PromptKind = "documents"
    system_prompt: str | None = None
    # Prompts per generate call, or "auto": the largest that fits the GPU (halved from 1,024 until it fits; 256 on a
    # CPU), recorded in the generation's manifest. Draws are per prompt, so the batch does not choose the texts; it
    # stays part of the hash as kernels may compute the last bits of logits differently at another batch size.
    batch_size: int | Literal["auto"] = 64
    ppl_batch_size: int = Field(32, gt=0)
    # What detectors read: the decoded text tokenized again (as a user submits text; Gu et al. and the paper), or the
    # sampled token ids. Part of the run hash, not of the generation's.
    score_on: Literal["text", "ids"] = "text"

    added_later: ClassVar[tuple[str, ...]] = (
        "greedy", "top_k", "top_p", "min_p", "repetition_penalty", "prompts", "system_prompt"
    )  # fmt: skip

    @model_validator(mode="after")
    def _system_prompt_for_chat(self) -> EvalSettings:
        if self.system_prompt is not None:
            if self.prompts != "chat":
                raise ValueError(f"a system prompt is a turn of a chat: it needs prompts=chat, not {self.prompts}")
            if not self.system_prompt.strip():
                raise ValueError("the system prompt is empty: give its text, or leave it out")
        return self

    @model_validator(mode="after")
    def _greedy_alone(self) -> EvalSettings:
        if self.greedy:
            set_ = [f"{k}={v}" for k, v in self.decoding().items() if k not in ("greedy", "repetition_penalty")]
            if set_:
                raise ValueError(
                    f"greedy decoding takes the likeliest token: {', '.join(set_)} would not change it (drop it, or "
                    "drop greedy)"
                )
        return self

    def decoding(self) -> dict:
        """The decoding settings that differ from plain sampling at temperature 1 (``DECODING``), as set."""
        return decoding_of(self.model_dump())

    def plain(self) -> EvalSettings:
        """These settings with plain sampling at temperature 1 of the preset's documents: what runs that differ only
        in how their models were used share."""
        return EvalSettings(**documents_prompts(plain_sampling(self.model_dump())))

    def decoding_label(self) -> str:
        """What tables call this decoding: ``greedy``, ``temperature=0.7, top_p=0.9``; "" for plain sampling at
        temperature 1 (the paper's and every earlier run's)."""
        return decoding_label(self.model_dump())

    def prompts_label(self) -> str:
        """What tables call these prompts: ``code``, ``chat``, ``chat (system: "You are...")``; "" for documents."""
        return prompts_label(self.model_dump())

    @field_validator("temperature")
    @classmethod
    def _divisor(cls, value: float) -> float:
        if value < MIN_TEMPERATURE:
            raise ValueError(
                f"{value:g} is below 2^-64: the sampler divides float32 logits by it, so the largest would be infinite "
                "and tie (a draw of the first of them, not the likeliest)"
            )
        return value

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value):
        if value == "auto":
            return value
        try:
            return _POSITIVE_INT.validate_python(value)
        except ValidationError:
            raise ValueError(f"must be a positive integer or 'auto', not {value!r}") from None


# Evaluation settings as a dump or a run's spec holds them (a setting they lack is at its default: ``added_later``).
def decoding_of(eval_settings: dict) -> dict:
    """The decoding settings of ``eval_settings`` that differ from plain sampling at temperature 1, as set."""
    fields = EvalSettings.model_fields
    return {k: eval_settings[k] for k in DECODING if k in eval_settings and eval_settings[k] != fields[k].default}


def decoding_label(eval_settings: dict) -> str:
    """``EvalSettings.decoding_label`` of ``eval_settings``."""
    return ", ".join("greedy" if k == "greedy" else f"{k}={v:g}" for k, v in decoding_of(eval_settings).items())


SYSTEM_LABEL_CHARS = 32  # of a system prompt, in a label


def prompts_label(eval_settings: dict) -> str:
    """``EvalSettings.prompts_label`` of ``eval_settings``: "" for documents (what every run asked before the setting
    existed); a long system prompt is named by its start and a short hash of the whole."""
    kind = eval_settings.get("prompts", "documents")
    if kind == "documents":
        return ""
    system = eval_settings.get("system_prompt")
    if system is None:
        return kind
    shown = " ".join(system.split())
    if len(shown) > SYSTEM_LABEL_CHARS:
        digest = hashlib.sha256(system.encode()).hexdigest()[:6]
        shown = f"{shown[:SYSTEM_LABEL_CHARS].rstrip()}... {digest}"
    return f'{kind} (system: "{shown}")'


def documents_prompts(eval_settings: dict) -> dict:
    """``eval_settings`` at the preset's documents (no ``PROMPTS`` setting): what runs that differ only in what the
    models were asked share."""
    return {k: v for k, v in eval_settings.items() if k not in PROMPTS}


def plain_sampling(eval_settings: dict) -> dict:
    """``eval_settings`` at plain sampling (temperature 1 where the temperature is recorded, no other decoding
    setting): what runs that differ only in how their models sampled share, the prompts and human texts included."""
    plain = {"temperature": 1.0} if "temperature" in eval_settings else {}
    return {k: v for k, v in eval_settings.items() if k not in DECODING} | plain


class Preset(Params):
    # A name that becomes a folder of tables: letters, digits, '.', '_' and '-' only.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    base_model: str
    oracle_model: str
    train_data: DataSource
    eval_data: DataSource
    train: TrainSettings
    eval: EvalSettings
    methods: dict[str, dict[str, Any]] = {}  # per-method default settings
    attacks: dict[str, dict[str, Any]] = {}  # per-attack default settings (--attack-arg overrides them)
    notes: str = ""
    # What ``eval.prompts=code`` and ``eval.prompts=chat`` read (None: the preset has none; --set code_data.path=...):
    # code documents continued as ``eval_data``'s are, and an instruction set (its ``prompt_field`` set).
    code_data: DataSource | None = None
    chat_data: DataSource | None = None
    # When a row's texts still count as writing (``harness.config.gate``): read by the tables, never by a stage but the
    # run's, whose spec records it where it is not the default.
    quality_gate: QualityGate = QualityGate()

    added_later: ClassVar[tuple[str, ...]] = ("code_data", "chat_data", "quality_gate")

    @model_validator(mode="after")
    def _chat_data_pairs(self) -> Preset:
        if self.chat_data is not None and self.chat_data.prompt_field is None:
            raise ValueError(
                "chat_data is an instruction set: set chat_data.prompt_field (the instruction) and text_field (the "
                "human answer)"
            )
        return self

    def eval_source(self) -> DataSource:
        """The data the evaluation's prompts and human texts come from, by ``eval.prompts``; one line where the
        preset has none."""
        kind = self.eval.prompts
        source = {"documents": self.eval_data, "code": self.code_data, "chat": self.chat_data}[kind]
        if source is None:
            fields = " chat_data.prompt_field=... chat_data.text_field=..." if kind == "chat" else ""
            raise HarnessError(
                f"preset {self.name} has no {kind}_data for --prompts {kind}: give one with --set {kind}_data.path=..."
                + fields
            )
        return source

    def hashed(self) -> dict:
        """The preset as every run's spec holds it (and hashes it): its plugins' default settings only for the plugins
        runs have recorded them for since the first stored results. A plugin added later has its preset settings in
        each run's own params (which is what they change), so giving it preset defaults moves no stored run's hash.
        The code and chat data are left out: a run that reads one records it in its generation's spec (as
        ``eval_data``), and no other run depends on them."""
        data = self.model_dump(exclude={"code_data", "chat_data"})
        for section, names in (("methods", HASHED_METHOD_DEFAULTS), ("attacks", HASHED_ATTACK_DEFAULTS)):
            data[section] = {name: v for name, v in data[section].items() if name in names}
        return data


# The plugins whose preset settings runs record in their preset (``Preset.hashed``): those of the first results.
HASHED_METHOD_DEFAULTS = ("gu-kgw", "gu-kth", "gloaguen-kgw", "pro")
HASHED_ATTACK_DEFAULTS = ("gptq", "wanda", "sparsegpt", "finetune", "dipper")


TEXT_SETTINGS = ("eval.system_prompt",)  # free text, taken as given (a system prompt may start with "[" or say "none")


def _value(dotted: str, value: str):
    """An override's value as given on the command line: None, a JSON list or object, or the string itself (pydantic
    converts it to the setting's type); the string itself always for a setting of free text (``TEXT_SETTINGS``)."""
    if dotted in TEXT_SETTINGS:
        return value
    if value.strip().lower() in ("none", "null"):
        return None
    if value.lstrip().startswith(("[", "{")):
        try:
            return json.loads(value)
        except ValueError as err:
            raise HarnessError(f"bad setting {dotted}: not valid JSON ({err})") from None
        except RecursionError:  # (Python's JSON parser recurses: a value nested thousands deep)
            raise HarnessError(f"bad setting {dotted}: JSON nested too deeply to read") from None
    return value


def _section_fields(parents: list[str]) -> set[str]:
    """Every setting of the preset's section at ``parents`` (``["eval"]``), by its class: a dump leaves out the
    ``added_later`` ones at their defaults, and an override may still set them."""
    section: Any = Preset
    for part in parents:
        field = section.model_fields.get(part) if isinstance(section, type) and issubclass(section, Params) else None
        section = field.annotation if field is not None else None
        options = [a for a in typing.get_args(section) if a is not type(None)]
        if len(options) == 1:  # an optional section (``DataSource | None``)
            section = options[0]
    return set(section.model_fields) if isinstance(section, type) and issubclass(section, Params) else set()


def decode_overrides(items: dict[str, str]) -> dict[str, str]:
    """``{"top_p": "0.9"}`` (``--decode top_p=0.9``, a grid's ``decodings``) as the overrides they are
    (``eval.top_p``); a key that is no decoding setting is one line naming those there are."""
    unknown = [k for k in items if k not in DECODING]
    if unknown:
        raise HarnessError(f"unknown decoding setting '{unknown[0]}': decoding settings are {', '.join(DECODING)}")
    return {f"eval.{k}": v for k, v in items.items()}


def prompts_overrides(entry: str | dict) -> dict[str, str]:
    """A grid's ``prompts`` entry (``chat``, or ``{prompts: chat, system_prompt: "..."}``) as the overrides it is
    (``eval.prompts``); a key that is no prompts setting is one line naming those there are."""
    items = {"prompts": entry} if isinstance(entry, str) else dict(entry)
    unknown = [k for k in items if k not in PROMPTS]
    if unknown:
        raise HarnessError(f"unknown prompts setting '{unknown[0]}': prompts settings are {', '.join(PROMPTS)}")
    if not all(isinstance(v, str) for v in items.values()):
        raise HarnessError(f"prompts settings are text: {', '.join(f'{k}={v!r}' for k, v in items.items())}")
    return {f"eval.{k}": v for k, v in items.items()}


def apply_overrides(preset: Preset, overrides: dict[str, str]) -> Preset:
    """Return ``preset`` with ``section.key=value`` overrides (e.g. ``train.steps=50``), validated as a whole.
    ``methods.<method>.<key>`` and ``attacks.<attack>.<key>`` set any setting that plugin declares (the preset's
    own settings for it are the defaults every run of it starts from). A value ``none``/``null`` is None; one that
    starts with ``[`` or ``{`` is JSON (``train.betas=[0.9, 0.95]``)."""
    from harness.config.registry import attacks, methods

    data = preset.model_dump()
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        if len(parents) == 2 and parents[0] in ("methods", "attacks"):
            registry = methods if parents[0] == "methods" else attacks
            registry.check(parents[1])  # an unknown name is one line suggesting the closest
            fields = registry.load(parents[1]).Params.model_fields
            if leaf not in fields:
                raise HarnessError(
                    f"unknown setting '{dotted}': {registry.kind} '{parents[1]}' has {', '.join(fields) or 'none'}"
                )
            node = data[parents[0]].setdefault(parents[1], {})
        else:
            for depth, part in enumerate(parents):
                if node.get(part) is None and part in _section_fields(parents[:depth]):
                    node[part] = {}  # a section the preset leaves unset (code_data): set from its first setting
                if not isinstance(node.get(part), dict):
                    raise HarnessError(f"unknown setting '{dotted}'")
                node = node[part]
            if leaf not in node and leaf not in _section_fields(parents):
                raise HarnessError(f"unknown setting '{dotted}'")
        node[leaf] = _value(dotted, value)
    try:
        return Preset(**data)
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        form = ""
        if e["type"] in ("tuple_type", "list_type") and isinstance(e.get("input"), str):  # (--set x=0.5,1.5)
            form = f" (write a list in JSON: --set {where}='[{e['input']}]')"
        raise HarnessError(f"bad setting {where}: {e['msg']}{form}") from None
