"""The settings base of the presets and of every method and attack (``Params``: typed, frozen, every number one the
machine holds), parsed from ``key=value`` strings. What a plugin declares besides its settings is the contract's
(``harness/contract/plugin.py``)."""

from __future__ import annotations

import types
import typing
from typing import Annotated, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from harness.config.errors import HarnessError


def _comma_separated(value):
    """A tuple of the non-empty, stripped parts of ``value`` where it is a string (as ``key=a,b`` gives it)."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


# A setting that names several things, comma-separated on the command line (a merge's donors, WASH's models).
CommaList = Annotated[tuple[str, ...], BeforeValidator(_comma_separated)]


class Params(BaseModel):
    """Base of every plugin's settings (and of the presets'): frozen, unknown keys rejected, and every number one the
    machine holds (``machine_number``): finite, within float32 for a float, within 64 bits for an integer, and never
    true/false (an infinite learning rate or strength would train every weight into NaN and store that as a result)."""

    # (validate_default: a default is checked as a given value is, so a plugin cannot declare one it would refuse)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, validate_default=True)
    # Settings added after results were stored with this plugin: ``model_dump`` leaves each out while it holds its
    # default, so that every stored stage keeps its hash and record, and a run that sets one is a new configuration.
    added_later: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_later_defaults(self, handler):
        data = handler(self)
        fields = type(self).model_fields
        for name in self.added_later:
            default = fields[name].default
            if name in data and (
                getattr(self, name) == default if isinstance(default, BaseModel) else data[name] == default
            ):  # (a section of settings: as the model, in any dump mode)
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


def parse_assignments(items: list[str], what: str) -> dict[str, str]:
    """Parse ``["t=0.5", "k=1"]`` into a dict; a malformed item is a one-line error."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if sep and key and not value:
            raise HarnessError(f"{what} '{item}' has no value: give one after '='")
        if not sep or not key:
            raise HarnessError(f"malformed {what} '{item}': expected key=value, e.g. t=0.5")
        if key in out:
            raise HarnessError(f"{what} '{key}' given twice")
        out[key] = value
    return out
