"""Every number a setting takes is checked where it is parsed (so ``--dry-run`` refuses what the run refuses): generated
from the plugins' and presets' ``Params`` classes, so that a setting added without a range fails here."""

import types
import typing

import pytest

from harness.config.errors import HarnessError
from harness.config.params import takes_numbers
from harness.config.presets import TINY
from harness.config.registry import attacks, methods
from harness.config.settings import EvalSettings, TrainSettings

# Settings that take a negative number on purpose; any other must refuse -1 (give it ``ge``/``gt`` or a validator).
SIGNED = {
    "seed",  # torch, numpy and random take any 64-bit seed (torch maps a negative one to 2**64 + seed)
    "layers",  # GaussMark's decoder layers: negative counts from the last
    "group_size",  # GPTQ's and AWQ's -1: one group per output row
}


def _settings():
    """``(owner, Params class, field, parse)``: each numeric setting of every plugin (over the tiny preset's settings
    for it) and of the presets' training and evaluation, with the function that parses settings as the CLI does."""
    for registry in (methods, attacks):
        for name in registry.names():
            cls = registry.load(name)
            own = cls.with_preset(dict(getattr(TINY, f"{registry.kind}s").get(name, {})), TINY)
            parse = lambda kw, cls=cls, own=own, kind=registry.kind: cls.parse_params(kind, {**own, **kw})  # noqa: E731
            yield from ((f"{registry.kind} {name}", cls.Params, field, parse) for field in cls.Params.model_fields)
    for section, cls, values in (("train", TrainSettings, TINY.train), ("eval", EvalSettings, TINY.eval)):
        parse = lambda kw, cls=cls, values=values: cls(**{**values.model_dump(), **kw})  # noqa: E731
        yield from ((section, cls, field, parse) for field in cls.model_fields)


NUMERIC = [(o, c, f, p) for o, c, f, p in _settings() if takes_numbers(c.model_fields[f].annotation)]


def _shaped(annotation, value):
    """``value`` as the setting takes it: alone, or as each member of a tuple or list."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return _shaped(next(a for a in args if takes_numbers(a)), value)
    if origin is tuple:
        return [value] if args[-1] is Ellipsis else [value] * len(args)
    return [value] if origin is list else value


def _refused(parse, field: str, value) -> bool:
    try:
        parse({field: value})
    except HarnessError as err:
        assert field in str(err) and "\n" not in str(err), str(err)
        return True
    except ValueError as err:  # (pydantic's, from a preset section: apply_overrides makes it one line)
        assert field in str(err), str(err)
        return True
    return False


def test_every_kind_of_setting_is_covered():
    assert len(NUMERIC) > 80 and {o for o, *_ in NUMERIC} >= {"train", "eval", "method gu-kth", "attack merge"}


@pytest.mark.parametrize("owner, cls, field, parse", NUMERIC, ids=[f"{o}.{f}" for o, _, f, _ in NUMERIC])
def test_every_number_is_one_the_machine_holds_and_of_its_sign(owner, cls, field, parse):
    """Refused: infinities and NaN, floats past float32's range or below its smallest normal number (the tensors
    they become or scale are float32), integers past 64 bits (torch's and numpy's), true/false (Python's 1 and 0),
    and a negative number where the setting is not one of ``SIGNED``."""
    annotation = cls.model_fields[field].annotation
    bad = [float("inf"), float("-inf"), float("nan"), 1e39, -1e39, True, False]
    bad += [2**64, -(2**64)] if int in _members(annotation) else []
    bad += [1e-39, 3.5e38] if float in _members(annotation) else []
    for value in bad:
        assert _refused(parse, field, _shaped(annotation, value)), f"{owner}: {field}={value!r} was accepted"
    if field not in SIGNED:
        assert _refused(parse, field, _shaped(annotation, -1)), f"{owner}: {field}=-1 was accepted: give it a range"


def _members(annotation) -> set:
    """The plain types a field's annotation is made of."""
    args = typing.get_args(annotation)
    return {annotation} if not args else set().union(*(_members(a) for a in args if a is not Ellipsis))


@pytest.mark.parametrize(
    "field", [("sigma", float, float("nan"), {"ge": 0}), ("steps", int, -5, {"ge": 0}), ("rate", float, 2.0, {"lt": 1})]
)
def test_a_plugins_own_defaults_are_checked_as_given_values_are(field, tmp_path, monkeypatch, cli):
    """An outside plugin that declares a default its own bounds refuse (NaN for a sigma >= 0, -5 steps) cannot be
    built with it: one line, exit 2, nothing run or stored (a NaN in spec.json would not even be JSON)."""
    name, kind, default, bounds = field
    module = tmp_path / f"bad_default_{name}.py"
    module.write_text(
        "from pydantic import Field\nfrom attacks.noise import WeightNoise\n\n"
        f"class Params(WeightNoise.Params):\n    {name}: {kind.__name__} = Field({default!r}, **{bounds!r})\n\n"
        "class Plugin(WeightNoise):\n    name = 'bad-default'\n    Params = Params\n".replace("nan", "float('nan')")
    )
    from harness.config.registry import attacks

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(attacks.builtins, "bad-default", f"bad_default_{name}:Plugin")
    out = cli("run", "--method", "gu-kgw", "--attack", "bad-default", "--dry-run", "--results", str(tmp_path / "runs"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and name in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()
