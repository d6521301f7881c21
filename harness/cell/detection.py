"""A method's detector and the perplexity oracle on stored generations, for the pipeline ``pipe`` (its preset, base
tokenizer, oracle and device): what a run's scoring stage computes, and what attribution, ``harness detect`` and the
prefix-score migration compute again from stored texts."""

from __future__ import annotations

from harness.assets import data
from harness.cell import metrics
from harness.compute import distributed
from harness.compute.generation import completion_perplexity
from harness.config.errors import HarnessError, first_line
from harness.contract.method import DetectContext, score_texts
from harness.store.stages import Stage


def keyed_detector(pipe, method, trained: Stage):
    """``method``'s detector, keyed by ``trained``: a key.json whose values make no key of the method (a store from
    elsewhere, edited with its contents.json: a gamma of NaN, a negative vocabulary) is one line naming it."""
    try:
        return method.detector(trained.path, pipe.tokenizer, detect_context(pipe))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        raise HarnessError(
            f"the key of {trained.path} makes no {method.label} detector: {type(err).__name__}: {first_line(err)}"
        ) from None


def detect(pipe, method, trained: Stage, gens: list[dict]) -> tuple[list[dict], list[dict]]:
    """``method``'s detector, keyed by ``trained``, on the generated and on the human texts of ``gens``."""
    detector = keyed_detector(pipe, method, trained)

    def both(part: list[dict], _first: int) -> list[tuple[dict, dict]]:
        prompts = [g["prompt_ids"] for g in part]  # what both the generated and the human texts continue
        pos = score_texts(method, detector, detector_input(pipe, part, "completion"), prompts)
        neg = score_texts(method, detector, detector_input(pipe, part, "human"), prompts)
        return list(zip(pos, neg, strict=True))

    pairs = distributed.map_shards(both, gens)
    return [p for p, _ in pairs], [n for _, n in pairs]


def detect_context(pipe) -> DetectContext:
    """What a detector may use besides its key: stages of its own in ``pipe``'s store (``Pipeline.aux_stage``), the
    training data's texts, the evaluation's lengths, the device and the base model."""
    return DetectContext(
        stage=pipe.aux_stage,
        reference_texts=lambda n: data.load_texts(pipe.preset.train_data, limit=n),
        prompt_tokens=pipe.preset.eval.prompt_tokens,
        new_tokens=pipe.preset.eval.new_tokens,
        device=pipe.device,
        base_model=pipe.base["path"],
    )


def detector_input(pipe, gens: list[dict], field: str) -> list[list[int]]:
    """What a detector reads: by default the decoded text tokenized again with the base tokenizer, as a user
    submits text (Gu et al. and the paper do this); ``eval.score_on=ids`` scores the sampled ids instead."""
    if pipe.preset.eval.score_on == "ids":
        return [g[f"{field}_ids"] for g in gens]
    return pipe.tokenizer([g[field] for g in gens], add_special_tokens=False)["input_ids"]


def perplexities(pipe, gens: list[dict], desc: str) -> tuple[list[float], list[float] | None]:
    """Completion perplexity under the oracle, on the footing ``metrics.ppl_footing`` names; and, where that is the
    ids the model sampled, of its decoded text tokenized again as well (else None): the footing a text attack's row
    has, so that an edited row and its unaltered one can be compared on it. Texts are re-tokenized for an oracle of
    another tokenizer (e.g. LLaMA-2 scoring LLaMA-3 text, as in the paper)."""
    oracle_tok = pipe.oracle_tokenizer["tokenizer"]
    pad = oracle_tok.pad_token_id if oracle_tok.pad_token_id is not None else oracle_tok.eos_token_id

    def measure(prompts: list[list[int]], completions: list[list[int]], what: str) -> list[float]:
        return distributed.map_shards(
            lambda part, first: completion_perplexity(
                pipe.oracle_model, part, completions[first : first + len(part)], pipe.preset.eval.ppl_batch_size,
                pad or 0, what,
            ),
            prompts,
        )  # fmt: skip

    if not pipe.oracle_tokenizer["shares"]:
        prompts = oracle_tok([g["prompt"] for g in gens])["input_ids"]
        completions = oracle_tok([g["completion"] for g in gens], add_special_tokens=False)["input_ids"]
        return measure(prompts, completions, desc), None
    prompts = [g["prompt_ids"] for g in gens]
    ppl = measure(prompts, [g["completion_ids"] for g in gens], desc)
    if metrics.rewritten(gens):  # a text attack's ids are its text tokenized again already (run/rewrites.py)
        return ppl, None
    # Tokenized as run/rewrites.py tokenizes a rewrite: a text an edit leaves as it was gets the same ids there.
    again = pipe.tokenizer([g["completion"] for g in gens], add_special_tokens=False)["input_ids"]
    return ppl, measure(prompts, again, f"{desc}, re-tokenized")
