"""Name -> plugin registries for watermark methods and attacks.

Built-ins are listed as ``"module:Class"`` strings so that ``harness list`` and argument validation never import
torch; outside plugins come in through the entry-point groups ``harness.methods`` and ``harness.attacks``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from harness.config.errors import HarnessError, first_line
from harness.config.refs import load_target

# One line per plugin. The order is the tables' order:
# methods are columns in this order (the paper's), and attacks' categories are row groups in the order they first
# appear here; plugins from entry points follow.
METHODS: dict[str, str] = {
    "gu-kth": "methods.gu_kth:GuKTH",
    "gu-aar": "methods.gu_aar:GuAAR",
    "gu-kgw": "methods.gu_kgw:GuKGW",
    "gloaguen-kgw": "methods.gloaguen_kgw:GloaguenKGW",
    "pro": "methods.pro:PRO",
    "gaussmark": "methods.gaussmark:GaussMark",
    "gaussian-bias": "methods.gaussian_bias:GaussianBias",
    "kgw-decoding": "methods.decoding_time:KGWDecoding",
    "kth-decoding": "methods.decoding_time:KTHDecoding",
    "aar-decoding": "methods.decoding_time:AARDecoding",
}

ATTACKS: dict[str, str] = {
    "none": "attacks.identity:NoAttack",
    "gptq": "attacks.quant:GPTQ",
    "int8": "attacks.quant:Int8",
    "hqq": "attacks.quant:HQQ",
    "bnb-4bit": "attacks.quant:BnB4",
    "awq": "attacks.awq:AWQ",
    "gguf": "attacks.gguf:GGUF",
    "wanda": "attacks.prune:Wanda",
    "sparsegpt": "attacks.prune:SparseGPT",
    "slerp": "attacks.merge:Slerp",
    "merge": "attacks.donor_merge:DonorMerge",
    "finetune": "attacks.finetune:FineTune",
    "lora": "attacks.lora:LoRA",
    "distill": "attacks.distillation:Distill",
    "weight-noise": "attacks.noise:WeightNoise",
    "dipper": "attacks.paraphrase:Dipper",
    "token-edit": "attacks.edits:TokenEdit",
    "token-insert": "attacks.edits:TokenInsert",
    "word-delete": "attacks.edits:WordDelete",
    "synonym": "attacks.edits:Synonym",
    "typo": "attacks.edits:Typo",
    "lowercase": "attacks.edits:Lowercase",
    "chain": "attacks.chain:Chain",
    "wash": "attacks.ensemble:Wash",
    "logit-merge": "attacks.ensemble:LogitMerge",
    "steal-scrub": "attacks.stealing:Scrub",
    "steal-spoof": "attacks.stealing:Spoof",
    "steal-finetune": "attacks.stealing:FineTuneScrub",
    "steal-paraphrase": "attacks.stealing:ParaphraseScrub",
}


class PluginLoadError(HarnessError):
    """A registered plugin that cannot be loaded here (its import fails, or it names no plugin class)."""


@dataclass(frozen=True)
class Registry:
    """A registry of one kind of plugin ("method" or "attack")."""

    kind: str
    builtins: dict[str, str]
    group: str
    contract: str  # "module:Class" of the contract's class every plugin of this kind subclasses

    def entries(self) -> dict[str, str]:
        """All names, built-in and from installed plugins, mapped to their import target."""
        found = dict(self.builtins)
        for name, target in _installed(self.group):
            found.setdefault(name, target)
        return found

    def names(self) -> list[str]:
        return sorted(self.entries())

    def ordered(self) -> list[str]:
        """The names in the registry's order (built-ins as listed, then outside plugins by name)."""
        return list(self.builtins) + sorted(set(self.names()) - set(self.builtins))

    def check(self, name: str) -> str:
        """Return the import target of ``name`` or raise a one-line error that lists the valid names."""
        entries = self.entries()
        if name not in entries:
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise HarnessError(f"unknown {self.kind} '{name}'.{hint} Valid {self.kind}s: {', '.join(self.names())}")
        return entries[name]

    def load(self, name: str) -> Any:
        """Import and return the class registered under ``name``; ``PluginLoadError`` (one line) where its module
        cannot be imported (it raises, or exits: an outside plugin's ``sys.exit`` must not end the harness), lacks
        the attribute, or names no plugin class. A plugin class that declares what cannot be (an unknown table) is
        the ``HarnessError`` its definition raises."""
        target = self.check(name)
        try:
            found = load_target(target)
        except HarnessError:
            raise
        except (Exception, SystemExit) as err:  # noqa: BLE001  (whatever an outside module does on import)
            what = f"{type(err).__name__}: {first_line(err)}" if str(err).strip() else type(err).__name__
            raise PluginLoadError(f"{self.kind} '{name}' ({target}) cannot be loaded: {what}") from None
        base = self.base()
        if not (isinstance(found, type) and issubclass(found, base)):  # (an attack registered as a method too)
            raise PluginLoadError(
                f"{self.kind} '{name}' ({target}) is not {'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind} class "
                f"(a subclass of {base.__name__}): "
                f"{found!r}"[:300]
            )
        return found

    def base(self) -> type:
        """The contract's class every plugin of this registry subclasses (named, as the built-ins are: the contract
        lies a floor above the settings)."""
        return load_target(self.contract)

    def clashes(self) -> dict[str, str]:
        """Installed plugins that carry a built-in's name (``name -> their target``): never loaded, since the built-in
        keeps its name (``harness list`` says so)."""
        return {name: target for name, target in _installed(self.group)
                if name in self.builtins and target != self.builtins[name]}  # fmt: skip

    def build(self, name: str, settings: dict[str, Any], preset=None) -> Any:
        """An instance of ``name`` with validated settings, after checking its requirements (packages, CUDA).
        With a ``preset``, ``settings`` override the preset's own settings for this plugin (``Preset.methods`` or
        ``Preset.attacks``): how every run, grid cell and table builds a plugin."""
        cls = self.load(name)
        if preset is not None:
            settings = cls.with_preset({**getattr(preset, f"{self.kind}s").get(name, {}), **settings}, preset)
        params = cls.parse_params(self.kind, settings)
        cls.check_requirements(self.kind)
        plugin = cls(params)
        try:  # (what every row's label is made of: an outside plugin's that raises would end a run in a traceback)
            plugin.config_label(), getattr(plugin, "table_label", str)()
        except Exception as err:  # noqa: BLE001
            raise PluginLoadError(f"{self.kind} '{name}': its label cannot be made: {type(err).__name__}: "
                                  f"{first_line(err)}") from None  # fmt: skip
        return plugin


@cache
def _installed(group: str) -> tuple[tuple[str, str], ...]:
    """The installed plugins of an entry-point group, read once per process: reading them scans every installed
    package's metadata, and a grid check looks names up hundreds of times."""
    return tuple((ep.name, ep.value) for ep in entry_points(group=group))


methods = Registry("method", METHODS, "harness.methods", "harness.contract.method:WatermarkMethod")
attacks = Registry("attack", ATTACKS, "harness.attacks", "harness.contract.attack:Attack")
