"""What a method or an attack declares besides its settings (``harness.config.params.Params``): its name, its
requirements, the models and data it reads, and the tables and figures its rows go in (``harness/report`` reads these
and names no plugin)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import ValidationError

from harness.config.errors import HarnessError
from harness.config.params import Params


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

    def hashed_params(self) -> dict:
        """The settings as stage specs hold them (and hash them): ``params`` with each local model or data the plugin
        reads (``model_refs``, ``data_refs``) named by what it holds (``local:<fingerprint>``) rather than by its path,
        so that the plugin on the same files keys the same stages from any folder or store. Built-ins, packages' models
        and hub ids stay as written (every stage stored before this keeps its hash)."""
        from harness.assets import data, models

        local = {ref: models.hashed_ref(ref) for ref in self.model_refs().values()}
        local |= {src.path: data.hashed_path(src) for src in self.data_refs().values()}
        local = {k: v for k, v in local.items() if k != v}
        return _named_by_content(self.params.model_dump(), local) if local else self.params.model_dump()

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
    "curve": "a table of its own per swept attack (<attack>_curve: distillation's N teacher texts): per setting, each "
    "method's AUC with its interval, TPR at 1% FPR, tokens to detect and median PPL, the unaltered model first",
    "flagged": "a table of its own per attack (<attack>_flagged: spoofing's): per setting, the share of its texts each "
    "method's detector flags at 1% and 5% FPR (thresholds set on human texts), beside the unwatermarked base's",
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
class Column:
    """A column a method adds to ``runs.csv`` (``WatermarkMethod.columns``), named ``<method>.<field>``: for each of
    its runs, the mean over the generated texts of a number its detector writes into every text's scores
    (``Detector.score``'s dicts, kept in the run's ``scores.jsonl``, so exported runs give it too)."""

    field: str
    description: str = ""  # what the number is, for the reader of runs.csv (``harness tables`` logs it)

    def __post_init__(self) -> None:
        if not self.field.isidentifier():
            raise TypeError(f"a Column's field is a name of the detector's output, not {self.field!r}")


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


FIRST_ROWS = {  # what a ``SettingTable``'s first row may be
    "unaltered": "the unaltered watermarked model's texts",
    "base": "the unwatermarked base's own texts",
    None: "no first row",
}


# The runs.csv columns a SettingTable may show (harness/report/collect.py writes them; a unit test checks that each is
# one), beside a method's own ``<method>.<field>``: a name that is neither is refused when the class is defined.
RUN_METRICS = ("AUC", "AUC_lo", "AUC_hi", "TPR@0.1%", "TPR@1%", "TPR@5%", "TPR@10%", "PPL", "PPL_retokenized",
               "PPL_ratio", "PPL_ratio_lo", "PPL_ratio_hi", "rep3", "distinct1", "distinct2", "overlap", "cosine",
               "edit_rate", "tokens_to_detect", "detected_by_end", "AUC_vs_base", "TPR@1%_vs_base", "AUC_vs_control",
               "n_pos", "n_neg")  # fmt: skip


@dataclass(frozen=True)
class SettingTable:
    """A table an attack declares (``Attack.setting_tables``), written as ``<attack>_<name>`` in each setup that holds
    the attack's runs: a row per setting of the attack (its config label) after the row ``first`` (``FIRST_ROWS``),
    and for each method's main configuration each of ``values``, columns of ``runs.csv`` (a metric such as ``AUC``,
    ``TPR@1%``, ``PPL_ratio``, or a method's own ``<method>.<field>``), means over seeds where several."""

    name: str
    caption: str
    values: tuple[str, ...]
    first: str | None = "unaltered"

    def __post_init__(self) -> None:
        owner = f"setting table {self.name!r}"
        if not isinstance(self.name, str) or not self.name.replace("-", "_").isidentifier():
            raise HarnessError(f"{owner}: its name is a plain name of letters, digits, '-' and '_' (its file's)")
        if self.name in ATTACK_TABLES:  # (<attack>_curve and <attack>_flagged are the built-in tables' files)
            raise HarnessError(f"{owner}: its name is a built-in table's ({', '.join(ATTACK_TABLES)}): name it another")
        if isinstance(self.values, str) or not self.values or not all(isinstance(v, str) for v in self.values):
            raise HarnessError(f"{owner}: its values are a non-empty tuple of runs.csv column names, e.g. ('AUC',)")
        unknown = [v for v in self.values if v not in RUN_METRICS and "." not in v]
        if unknown:
            raise HarnessError(
                f"{owner}: {unknown[0]!r} is no column of runs.csv it can show ({', '.join(RUN_METRICS)}, or a "
                "method's <method>.<field>)"
            )
        if self.first not in FIRST_ROWS:
            raise HarnessError(
                f"{owner}: its first row is one of {', '.join(map(repr, FIRST_ROWS))}, not {self.first!r}"
            )


def _named_by_content(value, local: dict[str, str]):
    """``value`` (a settings dump) with every string that is a key of ``local``, alone or as an item of a
    comma-separated list, replaced by its value."""
    if isinstance(value, dict):
        return {k: _named_by_content(v, local) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_named_by_content(v, local) for v in value]
    if isinstance(value, str):
        return ",".join(local.get(part, part) for part in value.split(","))
    return value
