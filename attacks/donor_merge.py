"""Merges with donor models through mergekit: linear, task arithmetic, TIES, DARE-TIES and DARE-linear.

Most community merges on the hub combine a fine-tune with other fine-tunes of the same base (*donors*), and most are
TIES or DARE-TIES. Here the watermarked model is one of the merged models (weight ``weight``) beside each donor
(weight ``donor_weight``), and the unwatermarked base is the merge's base: the task-vector methods (task arithmetic,
TIES, DARE) add the weighted differences of each model from the base, TIES and DARE keep a ``density`` share of each
difference (TIES by magnitude with a sign election, DARE at random and rescaled, seeded by ``seed``), and linear
averages the models' weights themselves (normalised, as mergekit's default; it has no base). Every setting not named
here is mergekit's default for the method; the stage keeps the mergekit configuration it ran (``mergekit.yaml``),
which ``mergekit-yaml mergekit.yaml OUT --random-seed SEED`` reproduces (tests/unit/test_donor_merge.py checks that).

Donors are model references; each preset names its own (``harness list``): for the tiny and smol presets, their base
fine-tuned here on other text (harness/assets/donors.py), for the real presets hub fine-tunes of their base. A donor
must have the base's architecture and vocabulary (mergekit merges tensors of matching names and shapes and would
merge mismatched vocabularies silently into nonsense): checked before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from harness.config.errors import HarnessError
from harness.config.params import CommaList, Params
from harness.contract.attack import MODEL, AttackContext, ModelAttack, library_versions

# name -> (its label, whether it keeps a density share of each difference, whether that share is drawn at random)
METHODS = {
    "linear": ("Linear", False, False),
    "task_arithmetic": ("Task arithmetic", False, False),
    "ties": ("TIES", True, False),
    "dare_ties": ("DARE-TIES", True, True),
    "dare_linear": ("DARE-linear", True, True),
}
DEFAULT_DENSITY = 0.5  # mergekit's examples' value for TIES and DARE (it has no default of its own)
MAX_DONORS = 8
# What must agree between a donor and the base for their tensors to be merged as the same model's.
ARCHITECTURE = ("model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")  # fmt: skip


class DonorMergeParams(Params):
    method: str = "ties"
    weight: float = Field(0.5, gt=0)  # the watermarked model's weight
    donors: CommaList = ()  # model references (comma-separated on the command line); presets name theirs
    donor_weight: float = Field(0.5, gt=0)  # each donor's weight
    density: float | None = Field(None, gt=0, le=1)  # TIES and DARE: the share of each difference kept
    seed: int = Field(0, ge=0, lt=2**32)  # DARE: the random drop's seed

    @field_validator("method")
    @classmethod
    def _known(cls, value: str) -> str:
        if value in METHODS:
            return value
        from mergekit.merge_methods import registry

        known = sorted(m.spec.name for m in registry.registered_methods())
        if value in known:
            raise ValueError(
                f"mergekit's '{value}' is not a merge with donors this attack runs (it runs {', '.join(METHODS)}; "
                "SLERP with the base is the slerp attack)"
            )
        raise ValueError(f"mergekit does not know the merge method '{value}' (it knows {', '.join(known)})")

    @model_validator(mode="after")
    def _consistent(self) -> DonorMergeParams:
        if not self.donors:
            raise ValueError("give at least one donor model: donors=<reference>[,<reference>...]")
        if len(self.donors) > MAX_DONORS:
            raise ValueError(f"at most {MAX_DONORS} donors, not {len(self.donors)}")
        if len(set(self.donors)) != len(self.donors):
            raise ValueError(f"a donor is named twice: {', '.join(self.donors)}")
        _, sparse, random = METHODS[self.method]
        if self.density is not None and not sparse:
            raise ValueError(f"density applies to ties, dare_ties and dare_linear, not to {self.method}")
        if self.seed and not random:
            raise ValueError(f"seed applies to dare_ties and dare_linear (their random drop), not to {self.method}")
        return self

    def kept(self) -> float | None:
        """The density the merge uses: the one set, else the default, for the methods that keep a share."""
        return (self.density or DEFAULT_DENSITY) if METHODS[self.method][1] else None


class DonorMerge(ModelAttack):
    name = "merge"
    category = "Merging"
    label = "Merge with donors"
    description = "merging with donor models"
    version = "1"
    Params = DonorMergeParams
    requires = {"mergekit": "merge"}

    def table_label(self) -> str:
        return METHODS[self.params.method][0]

    def config_label(self) -> str:
        p = self.params
        donors = len(p.donors)
        label = f"w={p.weight:g}, {donors} donor{'s' * (donors > 1)} x {p.donor_weight:g}"
        if p.kept() is not None:
            label += f", density={p.kept():g}"
        if METHODS[p.method][2]:
            label += f", seed={p.seed}"
        return label

    def model_refs(self) -> dict[str, str]:
        return {f"donor{i + 1}": ref for i, ref in enumerate(self.params.donors)}

    def validate(self, base_model: str | None = None) -> None:
        """Each donor is another model (one folder spelt two ways, or a copy of it, is one donor), with the base's
        architecture and vocabulary, judged from configs (and tokenizers where both are on this machine) before any
        work; a built-in donor is a fine-tune of a named base, which must be this one."""
        from harness.assets import donors, models

        found: dict[Path, str] = {}
        for ref in self.params.donors:
            folder = models.on_disk(ref)
            twin = next((r for f, r in found.items() if folder is not None and models.same_model(folder, f)), None)
            if twin is not None:
                raise HarnessError(
                    f"merge donors '{twin}' and '{ref}' are one model ({folder}): name each donor once (mergekit "
                    "would refuse the duplicate input, or weigh it twice)"
                )
            if folder is not None:
                found[folder] = ref
        if base_model is None:
            return
        for ref in self.params.donors:
            if ref in donors.DONORS:
                if donors.DONORS[ref].base != base_model:
                    raise HarnessError(
                        f"merge donor '{ref}' is a fine-tune of {donors.DONORS[ref].base}, not of the base model "
                        f"{base_model}: its tensors are another model's"
                    )
                continue  # the base fine-tuned: its architecture and vocabulary by construction
            self.check_donor(ref, models.config(base_model), models.config(ref))
            if models.built(base_model) and not models.planned(ref):
                same_vocabulary(base_model, ref)

    @staticmethod
    def check_donor(ref: str, base, donor) -> None:
        for key in ARCHITECTURE:
            ours, theirs = getattr(base, key, None), getattr(donor, key, None)
            if key == "architectures" and None in (ours, theirs):
                continue  # a config from a recipe or a GGUF header names no class (model_type is still compared)
            if ours != theirs:
                raise HarnessError(
                    f"merge donor '{ref}' differs from the base model in {key} ({theirs} against {ours}): mergekit "
                    "would merge its tensors as if they were the base's"
                )

    def mergekit_config(self, model_dir: str, base_model: str, donor_dirs: list[str]) -> dict:
        """The mergekit configuration of this merge (what ``mergekit-yaml`` reads)."""
        p = self.params
        shares = {} if p.kept() is None else {"density": p.kept()}
        models = [{"model": model_dir, "parameters": {"weight": p.weight, **shares}}]
        models += [{"model": d, "parameters": {"weight": p.donor_weight, **shares}} for d in donor_dirs]
        config = {"merge_method": p.method, "models": models, "dtype": "float32"}
        if p.method != "linear":  # (linear averages the models themselves: mergekit's linear has no base)
            config["base_model"] = base_model
        return config

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        import yaml
        from mergekit.config import MergeConfiguration
        from mergekit.merge import MergeOptions, run_merge

        donor_dirs = [ctx.models[f"donor{i + 1}"] for i in range(len(self.params.donors))]
        for ref, folder in zip(self.params.donors, donor_dirs, strict=True):  # the files themselves, now they are here
            same_vocabulary(ctx.base_model, folder, ref)
        config = self.mergekit_config(str(model_dir), ctx.base_model, donor_dirs)
        (out_dir / "mergekit.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        options = MergeOptions(
            cuda=ctx.device.startswith("cuda"),
            copy_tokenizer=True,
            write_model_card=False,
            quiet=True,
            random_seed=self.params.seed,
        )
        run_merge(MergeConfiguration.model_validate(config), str(out_dir / MODEL), options)
        return {
            "mergekit_config": json.loads(json.dumps(config)),
            "donors": list(self.params.donors),
            "random_seed": self.params.seed,
            "versions": library_versions("mergekit"),
            "evaluated": f"the {METHODS[self.params.method][0]} merge (float32)",
        }


def vocabulary_fits(base: str, ref: str, role: str) -> None:
    """``same_vocabulary`` before any build: the vocabulary sizes that a recipe or a GGUF header gives where either
    model is not built yet (its tokens are compared once it is), else the tokenizers."""
    from harness.assets import models

    if models.planned(base) or models.planned(ref):
        ours, theirs = models.config(base).vocab_size, models.config(ref).vocab_size
        if ours != theirs:
            raise HarnessError(
                f"{role} '{ref}' has another vocabulary than the base model ({theirs} tokens against {ours}): its ids "
                "are other tokens'"
            )
        return
    same_vocabulary(base, ref, role=role)


def same_vocabulary(base: str, donor: str, name: str | None = None, role: str = "merge donor") -> None:
    """Refuse a donor whose tokenizer maps tokens to other ids than the base's (its embedding rows would be merged
    with other tokens' rows; a ``role`` other than a merge donor's would mix other tokens' probabilities)."""
    from harness.assets import models

    # (references resolved first: a built-in's name is no hub id)
    ours = models.load_tokenizer(models.resolve(base)).get_vocab()
    theirs = models.load_tokenizer(models.resolve(donor)).get_vocab()
    if ours != theirs:
        differ = sum(1 for token, i in theirs.items() if ours.get(token) != i) + max(0, len(ours) - len(theirs))
        raise HarnessError(
            f"{role} '{name or donor}' has another vocabulary than the base model ({len(theirs)} tokens against "
            f"{len(ours)}, {differ} differ): its rows are other tokens'"
        )
