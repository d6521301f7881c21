"""Retained utility: an attacked model as a language model, its perplexity on held-out human text of the preset's
domain (the evaluation prompts' human continuations, which no stage trains on), beside how much watermark it keeps.

This is not the PPL column of the tables (the oracle's perplexity of what a model generated): a model that writes
fluent text of its own can still have forgotten how to model text, and the reverse. An attack that removes a
watermark only by making the model a worse language model has done what weight noise does (the figure's reference
curve). One stage per model, keyed by the model's id, so every run of that model shares it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness.assets import models
from harness.compute import distributed
from harness.compute.generation import completion_perplexity
from harness.store import kinds
from harness.store.stages import Stage

VERSION = "1"


def utility(pipe, model_path: str | Path, model_id: str, name: str) -> Stage:
    """The held-out perplexity of the model ``model_path`` (id ``model_id``): built once, reused by every run."""
    e = pipe.preset.eval
    spec = {
        "stage": kinds.UTILITY,
        "version": VERSION,
        "model": model_id,
        "eval_data": {**pipe.preset.eval_data.model_dump(), "prompts": e.num_prompts},
        "lengths": {"prompt_tokens": e.prompt_tokens, "new_tokens": e.new_tokens},
        "tokenizer": pipe.base["fingerprint"],
    }
    stage = pipe.store.stage(kinds.UTILITY, spec)

    def build(out: Path) -> dict:
        prompts = pipe.prompts
        model = models.load_causal_lm(str(model_path), pipe.device)
        pad = pipe.tokenizer.pad_token_id if pipe.tokenizer.pad_token_id is not None else pipe.tokenizer.eos_token_id
        human = [p["human_ids"] for p in prompts]
        ppl = distributed.map_shards(
            lambda part, first: completion_perplexity(
                model, part, human[first : first + len(part)], e.ppl_batch_size, pad or 0, f"held-out PPL ({name})"
            ),
            [p["prompt_ids"] for p in prompts],
        )
        # Every continuation has new_tokens tokens, so the corpus perplexity is the geometric mean of the texts'.
        result = {
            "heldout_ppl": math.exp(sum(math.log(q) for q in ppl) / len(ppl)),
            "texts": len(ppl),
            "tokens_per_text": e.new_tokens,
        }
        (out / kinds.UTILITY_FILE).write_text(json.dumps(result, indent=1))
        return {"device": pipe.device}

    pipe.build_stage(stage, f"held-out perplexity of {name}", build)
    return stage
