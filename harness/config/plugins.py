"""What every method and attack plugin shares: typed parameters parsed from ``key=value`` strings, and requirements
checked before any model loads."""

from __future__ import annotations

import importlib.util
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_serializer, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from harness.config.errors import HarnessError


class Params(BaseModel):
    """Base of every plugin's settings (and of the presets'): frozen, unknown keys rejected, and every number one the
    machine holds (``machine_number``): finite, within float32 for a float, within 64 bits for an integer, and never
    true/false (an infinite learning rate or strength would train every weight into NaN and store that as a result)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # Settings added after results were stored with this plugin: ``model_dump`` leaves each out while it holds its
    # default, so that every stored stage keeps its hash and record, and a run that sets one is a new configuration.
    added_later: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_later_defaults(self, handler):
        data = handler(self)
        fields = type(self).model_fields
        for name in self.added_later:
            if name in data and data[name] == fields[name].default:
                del data[name]
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, values):
        """Refuse true/false for a number before any field's own conversion sees it: Python counts a bool as the int
        1 or 0, so ``seed: true`` in a grid would be seed 1, and ``steps: [true]`` one step."""
        if isinstance(values, dict):
            for name, value in values.items():
                field_ = cls.model_fields.get(name) if isinstance(name, str) else None
                if field_ is None or not takes_numbers(field_.annotation):
                    continue
                items = value if isinstance(value, list | tuple) else (value,)
                if any(isinstance(item, bool) for item in items):
                    error = PydanticCustomError("number_not_bool", "a number, not true or false")
                    raise ValidationError.from_exception_data(
                        cls.__name__, [InitErrorDetails(type=error, loc=(name,), input=value)]
                    )
        return values

    @field_validator("*")
    @classmethod
    def _machine_numbers(cls, value, info):
        if isinstance(value, int | float) and not isinstance(value, bool):
            machine_number(value)
        elif isinstance(value, tuple) and takes_numbers(cls.model_fields[info.field_name].annotation):
            for item in value:
                if isinstance(item, int | float) and not isinstance(item, bool):
                    machine_number(item)
        return value


FLOAT32_MAX, FLOAT32_TINY = 3.4028234663852886e38, 1.1754943508222875e-38  # numpy.finfo(float32).max and .tiny
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what torch and numpy take as an integer (a seed, a size, a count)


def takes_numbers(annotation) -> bool:
    """Whether a field of this type holds numbers (int or float, alone, optional, in a tuple or list, or as a
    ``Literal`` of them), and not true/false."""
    if annotation in (int, float):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return any(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
    if origin is typing.Annotated:
        return takes_numbers(args[0])
    if origin in (typing.Union, types.UnionType, tuple, list):
        return any(takes_numbers(a) for a in args if a is not Ellipsis)
    return False


def machine_number(value: int | float) -> int | float:
    """``value`` where the tensors and generators it goes into hold it: an integer within 64 bits (torch's and
    numpy's seeds and sizes), a float zero or within float32's normal range, as the weights, logits and optimiser
    states it becomes or scales are float32 (past it, one is infinite or NaN, and below it zero: a result that means
    nothing, or a traceback deep in a library). Every ``Params`` field is checked so; a field's own bounds come on
    top."""
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"{value} does not fit in 64 bits (-2**63 to 2**63 - 1), what torch and numpy take")
    elif abs(value) > FLOAT32_MAX:
        raise ValueError(f"{value:g} is past float32's range (at most {FLOAT32_MAX:.4g}): it would be infinite there")
    elif 0 < abs(value) < FLOAT32_TINY:
        raise ValueError(
            f"{value:g} is below float32's smallest normal number ({FLOAT32_TINY:.4g}): it would be zero there"
        )
    return value


def float32_scale(value: float) -> float:
    """A standard deviation of noise drawn in float32 (a key's, an attack's), for a field validator: refused where the
    noise would overflow float32 weights or logits (at 16 standard deviations, past any draw), which the check of
    every number (``machine_number``: within float32's range, not below its smallest normal number) leaves open."""
    if value * 16 > FLOAT32_MAX:
        raise ValueError(f"{value:g} is too large: the noise would overflow float32")
    return value


class Plugin:
    """What a method or attack declares (class attributes) and holds (its validated settings)."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    Params: ClassVar[type[Params]] = Params
    requires: ClassVar[dict[str, str]] = {}  # importable module -> pip extra that provides it
    needs_cuda: ClassVar[bool] = False

    def __init__(self, params: Params):
        self.params = params

    @classmethod
    def with_preset(cls, settings: dict[str, Any], preset) -> dict[str, Any]:
        """``settings`` completed from ``preset`` where they hold other plugins' settings (a chain's links take their
        attacks' preset settings); the registry has put the preset's own settings for this plugin under them."""
        return settings

    def model_refs(self) -> dict[str, str]:
        """Models this plugin loads besides the base (e.g. PRO's embedding model, a paraphraser): name -> reference.
        The pipeline checks them before any work and puts their content fingerprints into the stage hashes."""
        return {}

    def data_refs(self) -> dict:
        """Datasets this plugin reads besides the preset's (e.g. an attack's calibration or fine-tuning data): name ->
        ``harness.config.DataSource``. The pipeline checks them before any work and puts their content fingerprints
        into the stage hashes."""
        return {}

    def validate(self, base_model: str | None = None) -> None:
        """Deeper checks of the settings against the machine and the base model (e.g. that a model is the right kind,
        that a key covers the base model's vocabulary), run before any work; raise ``HarnessError`` with one line.
        The references of ``model_refs`` are checked already."""

    def token_lengths(self) -> dict[str, int]:
        """Sequences this plugin feeds the model, in tokens (``{setting: length}``): checked against the base
        model's context before any work, as a longer one fails only when it reaches the model."""
        return {}

    def config_label(self) -> str:
        """Short settings label for tables, e.g. ``t=0.5``."""
        return ", ".join(f"{k}={v}" for k, v in self.params.model_dump().items())

    @classmethod
    def check_requirements(cls, kind: str) -> None:
        """Raise a one-line error naming what is missing (a package or CUDA) before any work starts."""
        for module, extra in cls.requires.items():
            if importlib.util.find_spec(module) is None:
                raise HarnessError(
                    f"{kind} '{cls.name}' needs the Python package '{module}': pip install 'watermark-harness[{extra}]'"
                )
        if cls.needs_cuda:
            import torch

            if not torch.cuda.is_available():
                raise HarnessError(f"{kind} '{cls.name}' needs a CUDA GPU and none is visible")

    @classmethod
    def parse_params(cls, kind: str, values: dict[str, Any]) -> Params:
        """Validate settings for this plugin, turning pydantic's report into one line."""
        try:
            return cls.Params(**values)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in err.errors())
            valid = ", ".join(cls.Params.model_fields) or "none"
            raise HarnessError(f"bad settings for {kind} '{cls.name}': {problems} (settings: {valid})") from None


# --- what a plugin declares for the tables and figures (harness/report reads these; it names no plugin) ----------
# The names a plugin joins a table by. harness/report/tables.py declares one table for each (a unit test checks that
# the two agree); a plugin class that names another is an error when it is defined, so a typo never drops its rows.
ATTACK_TABLES = {  # what an attack's ``tables`` may hold
    "robustness": "tab:robustness, in the row group of the attack's category",
    "ft_steps": "tab:ft_steps: the featured method against the best other at each of the attack's outputs",
    "own": "a table of its own named after the attack (as tab:dipper): AUC per setting, with how much the texts were "
    "rewritten and kept",
}
ABLATION_LAYOUTS = {  # what an ``Ablation``'s ``layout`` may be
    "horizontal": "as tab:ablation-horizontal: a block per setting; AUC and PPL unaltered, and the AUC under an attack",
    "vertical": "as tab:embedding: a row per value; AUC, TPR@1% and TPR@10% unaltered",
}


def check_table_names(owner: str, what: str, names: tuple[str, ...], valid: dict[str, str]) -> None:
    """Raise a one-line error that names the valid ones when ``names`` (``owner``'s ``what``s: its tables, its
    layout) is not a tuple of names of ``valid``."""
    if isinstance(names, str):  # ("own") is the string "own", not a tuple of one name
        raise HarnessError(f"{owner}: its {what}s must be a tuple of names, e.g. ({names!r},), not {names!r}")
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise HarnessError(
            f"{owner}: unknown {what} {', '.join(map(repr, unknown))}; valid {what}s: {', '.join(valid)}"
        )


@dataclass(frozen=True)
class Sweep:
    """How the figures plot AUC against an attack's strength (``auc_vs_<attack>``): the unaltered model at x = 0,
    one line per method, one panel per table label (e.g. per fine-tuning dataset) when ``panels``."""

    xlabel: str
    title: str  # ``{label}`` is replaced by the panel's table label
    setting: str | None = None  # x = this setting; None: the last number of the row's config label (``s=9``)
    error_bars: bool = False  # the AUC's bootstrap interval
    panels: bool = False


@dataclass(frozen=True)
class Ablation:
    """A table of one method's configurations that differ from its main one (the preset's) in one of ``settings``
    alone, laid out as one of ``ABLATION_LAYOUTS`` (a horizontal one has the AUC ``under`` an attack with given
    settings as the column ``under_column``)."""

    file: str  # the table's file name in each setup's folder
    settings: tuple[str, ...]
    caption: str
    layout: str  # a name of ``ABLATION_LAYOUTS``
    under: tuple[str, dict] | None = None  # (attack name, the settings its run must have)
    under_column: str = ""
    index_name: str = ""  # the vertical table's first column
    settings_tex: dict[str, str] = field(default_factory=dict)  # a setting's name in LaTeX, e.g. alpha -> $\alpha$

    def __post_init__(self) -> None:
        check_table_names(f"ablation '{self.file}'", "layout", (self.layout,), ABLATION_LAYOUTS)


def parse_assignments(items: list[str], what: str) -> dict[str, str]:
    """Parse ``["t=0.5", "k=1"]`` into a dict; a malformed item is a one-line error."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise HarnessError(f"malformed {what} '{item}': expected key=value, e.g. t=0.5")
        if key in out:
            raise HarnessError(f"{what} '{key}' given twice")
        out[key] = value
    return out
