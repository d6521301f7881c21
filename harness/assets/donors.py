"""Donor models for the merge attacks: fine-tunes of a preset's base on other text, built here and cached.

Community merges (TIES, DARE) combine a model with *donors*: other fine-tunes of the same base. The real presets name
donors on the hub; the tiny and smol presets have none there, so each ships donors made here: its base fine-tuned on
one field of the bundled instruction set (tools/make_tiny_code_instruct.py), the code of its responses or the English
of its prompts, text its base did not train on. A donor shares its base's tokenizer and architecture by construction
(the merge attack refuses donors that do not). Built once per machine like the tiny model, under ``$HARNESS_CACHE`` in
a folder named by a hash of the recipe, the base's content and the data's: another base or recipe builds anew.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from harness.config.refs import TINY_CODE_INSTRUCT, TINY_LM
from harness.config.settings import DataSource, TrainSettings
from harness.store import files

DONOR_FILES = ("config.json", "model.safetensors")


@dataclass(frozen=True)
class Donor:
    """A built-in donor: ``base`` (a model reference) fine-tuned on ``data`` with ``train``'s settings, plain
    next-token loss on the packed token stream."""

    base: str
    data: DataSource
    train: dict
    version: int = 1


_TINY_TRAIN = {"steps": 150, "batch_size": 8, "seq_len": 128, "lr": 3e-4, "warmup_frac": 0.05, "seed": 0}
_SMOL_TRAIN = {"steps": 30, "batch_size": 8, "seq_len": 128, "lr": 1e-4, "warmup_frac": 0.1, "seed": 0}
_SMALL_TRAIN = {"steps": 200, "batch_size": 32, "seq_len": 256, "lr": 2e-4, "warmup_frac": 0.05,
                "mixed_precision": "bf16", "seed": 0}  # fmt: skip
CODE = DataSource(path=TINY_CODE_INSTRUCT, split="train", text_field="response")
PROSE = DataSource(path=TINY_CODE_INSTRUCT, split="train", text_field="prompt")
SMOLLM2, SMALL_LM = "builtin:smollm2-135m", "builtin:small-lm"
DONORS = {
    "builtin:tiny-donor-code": Donor(TINY_LM, CODE, _TINY_TRAIN),
    "builtin:tiny-donor-prose": Donor(TINY_LM, PROSE, _TINY_TRAIN),
    "builtin:smollm2-135m-donor-code": Donor(SMOLLM2, CODE, _SMOL_TRAIN),
    "builtin:smollm2-135m-donor-prose": Donor(SMOLLM2, PROSE, _SMOL_TRAIN),
    "builtin:small-donor-code": Donor(SMALL_LM, CODE, _SMALL_TRAIN),
    "builtin:small-donor-prose": Donor(SMALL_LM, PROSE, _SMALL_TRAIN),
}


def _folder(ref: str) -> Path | None:
    """The donor's cache folder, or None while its base is not built (its name hashes the base's content)."""
    from harness.assets import data, models

    donor = DONORS[ref]
    if not models.built(donor.base):
        return None
    base = models.fingerprint(models.resolve(donor.base))
    recipe = {"version": donor.version, "train": donor.train, "data": donor.data.model_dump(), "base": base,
              "data_fingerprint": data.fingerprint(donor.data)}  # fmt: skip
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return files.cache_root() / f"{ref.removeprefix('builtin:')}-{digest}"


def built(ref: str) -> bool:
    folder = _folder(ref)
    return folder is not None and files.is_built(folder, DONOR_FILES)


def build(ref: str) -> Path:
    """The donor's folder (weights and its base's tokenizer), building its base and then it where this machine has
    none: one process builds while others wait."""
    from harness.assets import models

    models.resolve(DONORS[ref].base)  # built first: the donor's folder is named by its content
    return files.build_once(_folder(ref), DONOR_FILES, f"donor {ref}", lambda out: _build(ref, out))


def _build(ref: str, out: Path) -> dict:
    from harness.assets import data, models
    from harness.compute.training import loss_step, save_model, train

    donor = DONORS[ref]
    base = models.resolve(donor.base)
    tokenizer = models.load_tokenizer(base)
    device = models.default_device()
    model = models.load_trainable(base, device)
    settings = TrainSettings(**donor.train)
    need = settings.steps * settings.batch_size * settings.seq_len
    stream = data.token_stream(tokenizer, data.iter_texts(donor.data), max_tokens=need)
    batches = data.training_batches(tokenizer, stream, settings)
    log_ = train(
        model, loss_step(lambda m, b: m(input_ids=b, labels=b).loss), batches, settings, f"donor {ref}", device
    )
    save_model(model, out, tokenizer)
    return {
        "base": {"ref": donor.base, "fingerprint": models.fingerprint(base)},
        "data": donor.data.model_dump(),
        "train": donor.train,
        "stream_tokens": len(stream),
        **{k: v for k, v in log_.items() if k != "losses"},
    }


# The ``module:function`` hooks that harness/config/refs.py names for each donor (a built-in's hooks take no
# argument).
build_tiny_code = partial(build, "builtin:tiny-donor-code")
built_tiny_code = partial(built, "builtin:tiny-donor-code")
build_tiny_prose = partial(build, "builtin:tiny-donor-prose")
built_tiny_prose = partial(built, "builtin:tiny-donor-prose")
build_smol_code = partial(build, "builtin:smollm2-135m-donor-code")
built_smol_code = partial(built, "builtin:smollm2-135m-donor-code")
build_smol_prose = partial(build, "builtin:smollm2-135m-donor-prose")
built_smol_prose = partial(built, "builtin:smollm2-135m-donor-prose")
build_small_code = partial(build, "builtin:small-donor-code")
built_small_code = partial(built, "builtin:small-donor-code")
build_small_prose = partial(build, "builtin:small-donor-prose")
built_small_prose = partial(built, "builtin:small-donor-prose")
