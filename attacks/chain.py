"""Attacks in a chain: what a release usually is (fine-tune, then merge, then quantize to GGUF), one link after another.

Each link is an attack of the registry with its settings (the preset's for it, overridden). Every model link is its
own stored stage keyed by the model it read (``Pipeline.attack``), so a chain reuses whatever its prefix shares with
another chain or with the attack run alone, and a re-run reuses every link. A link that writes several models
(fine-tuning's checkpoints) hands each to the next link: the chain has a row per path. A text attack may end a chain
(it rewrites what the last model wrote); it may not come before a model attack. Rows are named by the whole chain
(``Fine-tuning → SLERP → GGUF`` with ``s=9 → t=0.5 → Q4_K_M``) in the "Chains" group of tab:robustness.

On the command line: ``--attack finetune --attack-arg steps=9 --then slerp --then-arg t=0.5 --then gguf``; in a grid
file, ``chain: [{links: [{attack: finetune, settings: {steps: 9}}, {attack: slerp, settings: {t: 0.5}}]}]``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Any

from pydantic import field_validator

from harness.config.params import Params
from harness.contract.attack import Attack, CellStages, Evaluated, Output, TextAttack
from harness.store.stages import Stage

MAX_LINKS = 4  # a release rarely takes more; each link is a stage (a model on disk) and a chain's row names them all
ARROW = " → "


class Link(Params):
    attack: str
    settings: dict[str, Any] = {}


class ChainParams(Params):
    links: tuple[Link, ...]

    @field_validator("links", mode="before")
    @classmethod
    def _mappings(cls, links):
        """Each link a mapping whose settings are a mapping: said by link number (pydantic would name a type)."""
        if not isinstance(links, list | tuple):
            raise ValueError(f"links must be a list of {{attack: A, settings: {{...}}}}, not {links!r:.60}")
        for number, link in enumerate(links, 1):
            if isinstance(link, Link):
                continue
            if not isinstance(link, dict):
                raise ValueError(f"link {number} must be a mapping {{attack: A, settings: {{...}}}}, not {link!r:.60}")
            settings = link.get("settings")
            if settings is not None and not isinstance(settings, dict):
                raise ValueError(f"link {number}: its settings must be a mapping like {{t: 0.5}}, not {settings!r:.60}")
        return links

    @field_validator("links")
    @classmethod
    def _links_follow(cls, links: tuple[Link, ...]) -> tuple[Link, ...]:
        if not 2 <= len(links) <= MAX_LINKS:
            raise ValueError(f"a chain has 2 to {MAX_LINKS} links, not {len(links)}")
        built = [build_link(link, i + 1) for i, link in enumerate(links)]
        for i, attack in enumerate(built):
            if not attack.chain_link:
                raise ValueError(
                    f"link {i + 1} ({links[i].attack}) is not an attack a chain can hold: it makes its rows through "
                    "stages of its own; a chain holds model attacks, and a text attack as its last link"
                )
        for i, attack in enumerate(built[:-1]):
            if isinstance(attack, TextAttack):
                raise ValueError(
                    f"link {i + 1} ({links[i].attack}) rewrites texts, so no link can follow it: a text attack may "
                    "only end a chain"
                )
        # Each link's complete settings, as its attack holds them: one chain, one record, whatever was left default.
        return tuple(
            Link(attack=link.attack, settings=a.params.model_dump(mode="json"))
            for link, a in zip(links, built, strict=True)
        )


def build_link(link: Link, number: int):
    """The attack of link ``number``, from its resolved settings; a chain, ``none`` or an unknown name is refused."""
    from harness.config.errors import HarnessError
    from harness.config.registry import attacks

    if link.attack in ("chain", "none"):
        raise ValueError(f"link {number} cannot be '{link.attack}'")
    try:
        return attacks.build(link.attack, link.settings)
    except HarnessError as err:
        raise ValueError(f"link {number}: {err}") from None


class Chain(Attack):
    name = "chain"
    category = "Chains"
    label = "Chain"
    description = "attacks in a chain"
    version = "1"
    Params = ChainParams

    @classmethod
    def parse_params(cls, kind: str, values: dict) -> ChainParams:
        """A bad chain is one line that says which link is wrong and why (not pydantic's nesting)."""
        from pydantic import ValidationError

        from harness.config.errors import HarnessError

        try:
            return cls.Params(**values)
        except ValidationError as err:
            problems = "; ".join(
                e["msg"].removeprefix("Value error, ")
                if e["type"] == "value_error"  # (our own messages name the link)
                else f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}"
                for e in err.errors()
            )
            raise HarnessError(
                f"bad chain of attacks: {problems} (on the command line: --attack A --then B [--then-arg K=V]; in a "
                "grid file: chain: [{links: [{attack: A, settings: {...}}, ...]}])"
            ) from None

    @classmethod
    def with_preset(cls, settings: dict, preset) -> dict:
        """Each link's settings over the preset's for its attack, as that attack alone would take them."""
        links = settings.get("links")
        if preset is None or not isinstance(links, list | tuple):
            return settings
        resolved = []
        for link in links:
            own = link.get("settings") if isinstance(link, dict) else None
            if isinstance(link, dict) and isinstance(link.get("attack"), str) and isinstance(own, dict | None):
                link = {**link, "settings": {**preset.attacks.get(link["attack"], {}), **(own or {})}}
            resolved.append(link)
        return {**settings, "links": resolved}

    @cached_property
    def links(self) -> list[Attack]:
        return [build_link(link, i + 1) for i, link in enumerate(self.params.links)]

    def table_label(self) -> str:
        return ARROW.join(link.table_label() for link in self.links)

    def config_label(self) -> str:
        return ARROW.join(link.config_label() for link in self.links)

    def model_refs(self) -> dict[str, str]:
        return {f"link{i + 1}.{k}": ref for i, link in enumerate(self.links) for k, ref in link.model_refs().items()}

    def data_refs(self) -> dict:
        return {f"link{i + 1}.{k}": src for i, link in enumerate(self.links) for k, src in link.data_refs().items()}

    def token_lengths(self) -> dict[str, int]:
        return {f"link{i + 1}.{k}": n for i, link in enumerate(self.links) for k, n in link.token_lengths().items()}

    def edits_weights(self) -> bool:
        return any(link.edits_weights() for link in self.links)

    def rewrites_texts(self) -> bool:
        return any(link.rewrites_texts() for link in self.links)

    def refuses(self, method) -> str | None:
        return next((why for link in self.links if (why := link.refuses(method))), None)

    def validate(self, base_model: str | None = None) -> None:
        for link in self.links:
            link.validate(base_model)

    def evaluated(self, pipeline: CellStages, trained: Stage, unaltered: tuple[Output, Stage]) -> Evaluated:
        """The last link's models (each with its generations), every link a stage keyed by the one before; a text
        attack at the end rewrites what those models wrote."""
        *models, last = self.links
        text = last if isinstance(last, TextAttack) else None
        if text is None:
            models.append(last)
        paths = [(trained, ())]  # (the model a link reads: the train stage or an output, the labels so far)
        for link in models:
            paths = [
                (out, (*labels, out.config_label)) for source, labels in paths for out in pipeline.attack(link, source)
            ]
        rows = []
        for out, labels in paths:
            labels = (*labels, text.config_label()) if text else labels
            named = replace(out, row=self.row(labels), config_label=ARROW.join(labels), spec=out.spec)
            generated = pipeline.generate(out.path, out.model_id, named.row)
            if text:
                rewritten, stage = pipeline.attack_texts(text, (named, generated))
                rows.append((replace(rewritten, row=named.row, config_label=named.config_label), stage))
            else:
                rows.append((named, generated))
        return rows

    def row(self, labels: tuple[str, ...]) -> str:
        return f"{self.table_label()} {ARROW.join(labels)}"
