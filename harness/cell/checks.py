"""What is checked of a cell before any model loads (``harness run``, ``harness grid`` and its dry run, ``harness
detect``): the cache, the training batch's split, the models and datasets, the plugins' own checks and every sequence
against the base model's length. Nothing here builds a stage."""

from __future__ import annotations

from harness.assets import chat, data, models
from harness.compute import training
from harness.config.errors import HarnessError
from harness.config.settings import Preset
from harness.contract.attack import Attack
from harness.contract.method import WatermarkMethod, refusal
from harness.store import files


def check_inputs(preset: Preset, plugins, build: bool = True) -> None:
    """Everything cheap, before any model loads: the training batch splits across the processes of a launch, the models
    (base, oracle, the plugins' own) resolve, every dataset reads, then the plugins' deeper checks pass and every
    sequence fits the base model (these two read the base model's config: a built-in one this machine lacks is judged
    by its recipe's where it has one, else built first, hence last). ``build=False`` (a dry run) builds no built-in
    model: the checks that would need one built are left to the run."""
    files.check_cache()  # (where built models and file hashes are kept: a file there fails every build, late)
    asked = preset.eval_source()  # (the code or chat data where eval.prompts says; one line where the preset has none)
    for method in (p for p in plugins if isinstance(p, WatermarkMethod)):
        for attack in (p for p in plugins if isinstance(p, Attack)):
            refused = refusal(method, attack)  # (a decoding-time watermark under a model attack)
            if refused:
                raise HarnessError(refused)
        refused = method.refuses_decoding(preset.eval.decoding())  # (settings that could not act on its texts)
        if refused:
            raise HarnessError(refused)
    decoding = preset.eval.decoding_label()
    rewriting = next((p for p in plugins if isinstance(p, Attack) and p.rewrites_texts()), None)
    if decoding and rewriting is not None:
        raise HarnessError(
            f"decoding ({decoding}) applies to a model's own sampling, and {rewriting.name} scores rewrites of the "
            "unaltered model's texts: evaluate it at the preset's decoding"
        )
    training.check_split(preset.train.batch_size, f"train.batch_size ({preset.train.batch_size})")
    refs = [ref for p in plugins for ref in p.model_refs().values()]
    for ref in dict.fromkeys((preset.base_model, preset.oracle_model, *refs)):
        models.check(ref)
    for role, ref in (("base_model", preset.base_model), ("oracle_model", preset.oracle_model)):
        if models.built(ref):  # (the base generates and the judge scores next tokens: causal LMs that read text)
            try:
                models.check_causal_lm_once(ref)
            except HarnessError as err:
                raise HarnessError(f"{role}: {err}") from None
    for source in dict.fromkeys((preset.train_data, preset.eval_data, asked,
                                 *(s for p in plugins for s in p.data_refs().values()))):  # fmt: skip
        data.check(source)
    check_held_out(preset, plugins)
    if preset.eval.prompts == "chat" and (build or models.built(preset.base_model)):
        chat.check(preset.base_model, preset.eval.system_prompt, preset.eval.new_tokens)
    # What follows is judged against the base model: a built-in one this machine lacks is judged by the config its
    # recipe gives (models.planned), or else built here by a first run (last, for that).
    base_ready = build or models.built(preset.base_model) or models.planned(preset.base_model)
    for plugin in plugins:
        plugin.validate(preset.base_model if base_ready else None)
    if base_ready:
        lengths = {"train.seq_len": preset.train.seq_len, **eval_lengths(preset)}
        lengths |= {f"{p.name} {k}": v for p in plugins for k, v in p.token_lengths().items()}
        models.check_lengths(preset.base_model, lengths)
        top_k = preset.eval.top_k
        vocab = models.vocab_length(preset.base_model) if top_k else 0
        if top_k and top_k >= vocab:  # (a row labelled top-k that samples as without it)
            raise HarnessError(
                f"eval.top_k={top_k} keeps every token of the base model's {vocab:,}-token vocabulary: it samples as "
                "without top-k (0, the default)"
            )


def check_held_out(preset: Preset, plugins) -> None:
    """Refuse a plugin dataset (fine-tuning, scrubbing, calibration) that holds the evaluation's own documents: the
    prompts and the human texts scored as negatives come from ``eval_data``, and a model tuned on them would be
    measured on what it was trained on. Another split of the same corpus is held out from them (the built-in corpora
    split by the rule in harness/assets/data.py)."""
    for plugin in plugins:
        for what, source in plugin.data_refs().items():
            if any(data.same_documents(source, held) for held in dict.fromkeys((preset.eval_data,
                                                                                preset.eval_source()))):  # fmt: skip
                where = source.path + (f" ({source.name})" if source.name else "") + f", split {source.split}"
                raise HarnessError(
                    f"{plugin.name}: its {what} data ({where}) is the evaluation's own texts (eval_data: the prompts "
                    "and the human negatives); use documents held out from them, e.g. another split"
                )


def eval_lengths(preset: Preset) -> dict[str, int]:
    """The sequences evaluation feeds a model: a prompt and its continuation (+1: a BOS token); for chat prompts the
    continuation alone (an instruction is whole: ``data.chat_prompts`` skips those that leave no room)."""
    if preset.eval.prompts == "chat":
        return {"eval.new_tokens": preset.eval.new_tokens + 1}
    return {"eval.prompt_tokens + eval.new_tokens": preset.eval.prompt_tokens + preset.eval.new_tokens + 1}
