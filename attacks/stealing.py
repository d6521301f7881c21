"""Watermark stealing (Jovanovic et al., ICML 2024, "Watermark Stealing in Large Language Models"), brought to
watermarks in the weights: an attacker who knows a watermark is there queries the watermarked model, learns from its
texts which next tokens it favours beyond a reference, and then scrubs (decodes the watermarked model with those
boosts taken off, fine-tunes it away from them, or paraphrases its texts with them taken off) or spoofs (decodes an
unwatermarked model with them added, so that the owner's detector flags text the owner's model never wrote). The key
is never read.

The estimate (a stage of its own, ``steal``, shared by every attack that reads it with the same settings): the
watermarked model continues ``texts`` prompts of the attacker's own (the first ``prompt_tokens`` tokens of documents
of ``dataset``'s train split, never the documents evaluations read), and a reference writes on the same prompts: the
unwatermarked base (``reference=base``: what anyone holding the open base can do), the documents themselves
(``reference=human``), or any unwatermarked model with the base's tokenizer (a model reference). For each context
(the ``context`` tokens before: the previous one by default, the context of the KGW schemes seeded by one token; two
for a scheme seeded by two, Gu-KGW's k = 2) and next token, with ``n_w`` and ``n_r`` the counts in the watermarked and
the reference texts,

    p_w(t | c) = n_w(c, t) / n_w(c),    p_r(t | c) = (n_r(c, t) + beta f_r(t)) / (n_r(c) + beta)

(the reference's bigram smoothed toward its unigram frequency ``f_r``, add-one over the vocabulary, with weight
``beta`` = 1: a context the reference never saw falls back to the unigram), and the estimated boost is
``s(c, t) = clip(log2(p_w / p_r), 0, 1)`` where ``n_w(c, t) >= min_count``, else 0: 1 where the watermarked model
writes ``t`` after ``c`` at least twice as often as the reference, as Jovanovic et al.'s ratio clipped at 2. Written
here because no maintained library steals a watermark from texts.

Decoding with it adds ``sign * strength * s(c, t)`` to the logits of token ``t`` after context ``c`` (scrubbing: -1 on
the watermarked model; spoofing: +1 on the base), after a decoding-time watermark's own processor and before the
draw's decoding transform.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from pydantic import Field, model_validator

from attacks.paraphrase import Dipper, DipperParams
from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.config.settings import MAX_PROMPTS
from harness.contract.attack import Attack, AttackContext, Evaluated
from harness.contract.plugin import Sweep

ESTIMATE = "estimate.npz"  # the stage's file: contexts, tokens and scores of every boosted pair
QUERIES = "queries.jsonl"  # the attacker's prompts and the watermarked model's texts the estimate was made from
BETA = 1.0  # the reference bigram's weight toward its unigram
KIND = "steal"  # the estimate's stage kind


class StealParams(Params):
    texts: int = Field(1000, ge=1, le=MAX_PROMPTS)  # N: the attacker's queries of the watermarked model
    dataset: str = "c4-realnewslike"  # plain text whose documents' first tokens are the attacker's prompts
    prompt_tokens: int = Field(32, gt=0)
    new_tokens: int = Field(64, gt=1)
    reference: str = "base"  # "base", "human", or a model reference (a folder, a hub id, a built-in) of the tokenizer
    min_count: int = Field(2, ge=1)  # n_w(c, t) below it: no boost estimated
    strength: float = Field(4.0, ge=0)  # what decoding adds or takes off, times the estimated boost (0 to 1)
    seed: int = 0
    # The context's width: the previous token (1), or the previous two or three (a scheme whose green list is seeded
    # by several tokens, Gu-KGW's k = 2). Each (context, token) pair is one 64-bit key: vocabulary^(width + 1) < 2^63.
    context: int = Field(1, ge=1, le=3)
    added_later: ClassVar[tuple[str, ...]] = ("context",)

    @model_validator(mode="after")
    def _a_count_the_texts_can_reach(self):  # (past it no pair is counted often enough: an empty estimate, no attack)
        if self.min_count > self.texts * self.new_tokens:
            raise ValueError(f"min_count={self.min_count} is more than the {self.texts} x {self.new_tokens} tokens the "
                             "attacker's texts hold: no boost could be estimated")  # fmt: skip
        return self

    def estimate_spec(self) -> dict:
        """What the estimate depends on: the stealing settings alone, not the strength (which only the scrub or the
        spoof reads) nor an attack's own settings (a fine-tuning budget, a paraphraser's), so that every attack with
        the same stealing settings shares one estimate."""
        return self.model_dump(include=set(StealParams.model_fields) - {"strength"})


def source(p: StealParams):
    """The attacker's documents: a plain-text dataset of the fine-tuning attack's, or a local file."""
    from attacks.finetune import DATASETS
    from harness.config.settings import DataSource

    return DATASETS[p.dataset].source if p.dataset in DATASETS else DataSource(path=p.dataset, text_field="text")


def keys_fit(vocab: int, width: int) -> bool:
    """Whether a context of ``width`` tokens and the token after it, of a ``vocab``-token vocabulary, key in 64 bits
    (signed, as numpy's int64): vocab^(width + 1) below 2^63."""
    return vocab ** (width + 1) < 2**63


def estimate_boosts(watermarked: list[list[int]], reference: list[list[int]], vocab: int, min_count: int,
                    width: int = 1) -> dict:  # fmt: skip
    """The boosts ``s(c, t)`` (module docstring) from token-id texts, each context ``c`` the ``width`` tokens before
    ``t``: ``{"contexts", "tokens", "scores"}`` arrays of every pair with a boost above 0, sorted by context then token,
    a context as one key (``context_keys``); with ``width`` and ``vocab`` where the width is above 1."""
    import numpy as np

    if not keys_fit(vocab, width):
        raise HarnessError(
            f"steal: a context of {width} tokens of a {vocab:,}-token vocabulary does not fit 64-bit keys"
        )

    def pairs(texts):
        """A key per position with ``width`` tokens before it, the context's key times the vocabulary plus the token,
        every id inside the vocabulary."""
        rows = [np.lib.stride_tricks.sliding_window_view(np.asarray(t, np.int64), width + 1)
                for t in texts if len(t) > width]  # fmt: skip
        windows = np.concatenate(rows) if rows else np.zeros((0, width + 1), np.int64)
        return context_keys(windows[(windows < vocab).all(1)], vocab)

    w_keys, w_counts = np.unique(pairs(watermarked), return_counts=True)
    r_keys, r_counts = np.unique(pairs(reference), return_counts=True)
    # Each context's count, summed over its pairs in key order (a context is a key, not an index: wider ones are many)
    w_contexts, w_of = np.unique(w_keys // vocab, return_inverse=True)
    r_contexts, r_of = np.unique(r_keys // vocab, return_inverse=True)
    w_context = np.bincount(w_of.reshape(-1), weights=w_counts, minlength=len(w_contexts))
    r_context = np.bincount(r_of.reshape(-1), weights=r_counts, minlength=len(r_contexts))
    unigram = np.bincount(r_keys % vocab, weights=r_counts, minlength=vocab) + 1.0
    unigram /= unigram.sum()
    seen = w_counts >= min_count
    keys, counts = w_keys[seen], w_counts[seen]
    ctx, tok = keys // vocab, keys % vocab
    n_r, n_r_context = np.zeros(len(keys)), np.zeros(len(keys))
    if len(r_keys):
        at = np.minimum(np.searchsorted(r_keys, keys), len(r_keys) - 1)
        n_r = np.where(r_keys[at] == keys, r_counts[at], 0)
        at = np.minimum(np.searchsorted(r_contexts, ctx), len(r_contexts) - 1)
        n_r_context = np.where(r_contexts[at] == ctx, r_context[at], 0.0)
    p_w = counts / w_context[w_of.reshape(-1)[seen]]
    p_r = (n_r + BETA * unigram[tok]) / (n_r_context + BETA)
    score = np.clip(np.log2(p_w / p_r), 0.0, 1.0)
    boosted = score > 0
    found = {"contexts": ctx[boosted], "tokens": tok[boosted], "scores": score[boosted].astype(np.float32)}
    return found | ({"width": np.int64(width), "vocab": np.int64(vocab)} if width > 1 else {})


def context_keys(windows, vocab: int):
    """One key per row of ``windows`` (numpy or torch, ``(..., width)`` ids): its ids as the digits of a number in
    base ``vocab``, the first the most significant (one id: itself)."""
    key = windows[..., 0]
    for j in range(1, windows.shape[-1]):
        key = key * vocab + windows[..., j]
    return key


class StolenBoosts:
    """A logits processor adding ``scale * s(c, t)`` to the scores of the tokens ``t`` estimated after the context
    ``c`` of each row, its last token or tokens (``along``: after every position of a sequence but its last, in one
    pass)."""

    def __init__(self, estimate: dict, scale: float):
        import numpy as np
        import torch

        self.width, self.vocab = int(estimate.get("width", 1)), int(estimate.get("vocab", 0))
        contexts = np.asarray(estimate["contexts"], np.int64)
        # Each context's pairs are the slice from its first to its last entry (the estimate is sorted by context).
        keys, first = np.unique(contexts, return_index=True)
        last = len(contexts) - 1 - np.unique(contexts[::-1], return_index=True)[1]
        self.slices = tuple(torch.as_tensor(a, dtype=torch.long) for a in (keys, first, last + 1))
        self.tokens = torch.as_tensor(np.asarray(estimate["tokens"]), dtype=torch.long)
        self.values = torch.as_tensor(np.asarray(estimate["scores"]), dtype=torch.float32) * scale
        self._on: dict = {}  # device -> the tables there

    def __call__(self, input_ids, scores):
        import torch

        if not len(self.tokens) or input_ids.shape[1] < self.width:
            return scores
        out = scores.clone(memory_format=torch.contiguous_format)
        self._add(out, torch.arange(len(out), device=out.device), self._keys(input_ids[:, -self.width :]))
        return out

    def _keys(self, windows):
        """The context key of each window of ``width`` ids (``context_keys``); -1, no context, where an id lies past
        the estimate's vocabulary (its key would be another context's)."""
        if self.width == 1:
            return windows[..., 0]
        import torch

        windows = windows.long()
        inside = (windows < self.vocab).all(-1)
        return torch.where(inside, context_keys(windows, self.vocab), torch.full_like(inside, -1, dtype=torch.long))

    def along(self, ids, scores):
        """``scores`` (batch, positions, vocabulary) with the boosts after each position's token ``ids[:, t]`` added
        to its scores, the last position's left as they are: a copy, the processor applied to every prefix at once."""
        import torch

        out = scores.clone(memory_format=torch.contiguous_format)
        batch, length = ids.shape
        width = self.width
        if not len(self.tokens) or length < width + 1:
            return out
        # Position t (width - 1 .. length - 2) reads the window of ids that ends at it.
        positions = torch.arange(width - 1, length - 1, device=out.device)
        rows = torch.arange(batch, device=out.device)[:, None] * length + positions
        windows = ids.unfold(1, width, 1)[:, : length - width]
        self._add(out, rows.reshape(-1), self._keys(windows).reshape(-1))
        return out

    def _add(self, out, rows, contexts) -> None:
        """Add to each row ``rows[i]`` of ``out`` (contiguous, rows of the vocabulary) the boosts after
        ``contexts[i]``: those of its tokens inside the vocabulary, a context never estimated none."""
        import torch

        if out.device not in self._on:
            self._on[out.device] = tuple(t.to(out.device) for t in (*self.slices, self.tokens, self.values))
        keys, first, end, tokens, values = self._on[out.device]
        contexts = contexts.to(out.device, torch.long).contiguous()
        at = torch.searchsorted(keys, contexts).clamp(max=len(keys) - 1)
        hit = keys[at] == contexts
        rows, at = rows[hit], at[hit]
        counts = end[at] - first[at]
        total = int(counts.sum())
        # One entry per (row, boosted token), rows in order: the k-th of a row's is its context's first entry + k.
        before = torch.cumsum(counts, 0) - counts  # the row's first place among all entries
        entries = torch.arange(total, device=out.device)
        entries += torch.repeat_interleave(first[at] - before, counts, output_size=total)
        rows, tokens = torch.repeat_interleave(rows, counts, output_size=total), tokens[entries]
        inside = tokens < out.shape[-1]
        flat = out.view(-1)  # (an estimate's pairs are distinct: one float32 addition per boosted score, as before)
        flat[rows[inside] * out.shape[-1] + tokens[inside]] += values[entries[inside]].to(out.dtype)


class Stealing(Attack):
    """An attack kind of its own: the estimate stage, then the watermarked model (scrubbing) or the base (spoofing)
    decoded with it (``CellStages.decode``). Rows in tab:robustness under "Adaptive"."""

    category = "Adaptive"
    tables: ClassVar[tuple[str, ...]] = ("robustness",)
    sign: ClassVar[int]
    from_base: ClassVar[bool]
    Params = StealParams

    def data_refs(self) -> dict:
        return {"prompts": source(self.params)}

    def token_lengths(self) -> dict[str, int]:
        return {"prompt_tokens + new_tokens": self.params.prompt_tokens + self.params.new_tokens + 1}

    def reference_model(self) -> str | None:
        """The attacker's own reference model (None: the base's texts or the documents are the reference)."""
        return None if self.params.reference in ("base", "human") else self.params.reference

    def model_refs(self) -> dict[str, str]:
        return {"reference": self.reference_model()} if self.reference_model() else {}

    def counted_in(self) -> str | None:
        """The model whose tokenizer the estimate is counted in (None: the base's)."""
        return None

    def validate(self, base_model: str | None = None) -> None:
        """A reference model reads the base's tokenizer: the estimate compares token ids. A context of several tokens
        keys each pair in 64 bits: vocabulary^(width + 1) below 2^63 (a 128,256-token vocabulary: two tokens)."""
        from harness.assets import models

        ref, width = self.reference_model(), self.params.context
        counter = self.counted_in() or base_model
        if width > 1 and counter is not None and (models.built(counter) or models.planned(counter)):
            vocab = models.config(counter).vocab_size
            if not keys_fit(vocab, width):
                widest = max(w for w in (1, 2, 3) if keys_fit(vocab, w))
                raise HarnessError(f"attack {self.name}: context={width} with a {vocab:,}-token vocabulary does not "
                                   f"fit 64-bit keys; at most context={widest}")  # fmt: skip
        if base_model is None or ref is None:
            return
        models.check(ref)
        from attacks.donor_merge import vocabulary_fits

        vocabulary_fits(base_model, ref, role="stealing reference")

    def config_label(self) -> str:
        p = self.params
        reference = {"base": "", "human": ", human reference"}.get(p.reference, f", reference {p.reference}")
        context = f", context={p.context}" if p.context > 1 else ""
        counted = "" if p.min_count == StealParams.model_fields["min_count"].default else f", min_count={p.min_count}"
        return f"N={p.texts}, strength={p.strength:g}{context}{counted}{reference}"

    def steal(self, pipeline, unaltered) -> dict:
        """The estimate (a stage: built once for the watermarked model, its sampler and these settings), counted in the
        base's tokens, or in those of the model ``counted_in()`` names (both sides' texts decoded and re-tokenized by
        its tokenizer, for a rewriter of another vocabulary)."""
        import numpy as np

        from harness.assets import data, models

        p = self.params
        out, generated = unaltered
        spec = {"version": self.version, "model": out.model_id, "settings": p.estimate_spec(),
                "prompts": {**source(p).model_dump(), "fingerprint": data.fingerprint(source(p))}}  # fmt: skip
        reference_model = self.reference_model()
        if reference_model:  # a reference model of the attacker's: its content keys the estimate
            spec["reference"] = {
                "ref": reference_model,
                "fingerprint": models.fingerprint(models.resolve(reference_model)),
            }
        if "watermark" in generated.spec:  # a decoding-time watermark's sampler is what the attacker queries
            spec["watermark"] = generated.spec["watermark"]
        counted_in = self.counted_in()
        if counted_in is not None:  # (only then: every estimate in the base's tokens keeps its hash)
            counter = models.resolve(counted_in)
            found = models.fingerprint(counter)
            spec["counted_in"] = {"ref": models.hashed_ref(counted_in, found), "fingerprint": found}

        def build(folder) -> dict:
            tokenizer = models.load_tokenizer(str(out.path))
            docs = data.load_texts(source(p), limit=2 * p.texts)
            records = data.prompt_records(tokenizer, docs, p.prompt_tokens, p.new_tokens, p.texts)
            if not records:
                raise HarnessError(f"steal: no document of '{p.dataset}' holds {p.prompt_tokens + p.new_tokens} tokens")
            records = [records[i % len(records)] for i in range(p.texts)]
            prompts = [r["prompt_ids"] for r in records]
            marked = pipeline.query(unaltered, prompts, p.new_tokens, p.seed, "steal: the watermarked model's texts")
            if p.reference == "human":
                reference = [r["human_ids"] for r in records]
            elif reference_model:
                from harness.compute.generation import sample_plainly

                model = models.load_causal_lm(models.resolve(reference_model), models.default_device())
                reference = sample_plainly(model, prompts, p.new_tokens, p.seed, tokenizer.eos_token_id,
                                           "steal: the reference's texts")  # fmt: skip
                del model
            else:
                reference = pipeline.query(unaltered, prompts, p.new_tokens, p.seed, "steal: the base's texts",
                                           from_base=True)  # fmt: skip
            counted, vocab = marked, len(tokenizer)  # (the queries are stored as the model wrote them)
            if counted_in is not None:
                other = models.load_tokenizer(counter)
                counted, reference = (retokenized(tokenizer, other, texts) for texts in (marked, reference))
                vocab = len(other)
            found = estimate_boosts(counted, reference, vocab, p.min_count, p.context)
            np.savez(folder / ESTIMATE, **found)
            from harness.store import files

            files.write_jsonl(folder / QUERIES, [{"prompt_ids": a, "completion_ids": b}
                                                 for a, b in zip(prompts, marked, strict=True)])  # fmt: skip
            tokens = {"watermarked_tokens": sum(map(len, counted)), "reference_tokens": sum(map(len, reference))}
            return {"pairs": len(found["scores"]), "contexts": len(set(found["contexts"].tolist())), **tokens}

        folder = pipeline.aux_stage(KIND, spec, build, f"stolen estimate (N={p.texts})")
        return {"folder": folder, "spec": spec}

    def evaluated(self, pipeline, trained, unaltered) -> Evaluated:
        found = self.steal(pipeline, unaltered)
        scale = self.sign * self.params.strength

        def processors(tokenizer, ctx: AttackContext) -> list:
            return [StolenBoosts(load_estimate(found["folder"]), scale)]

        # (the estimate's hash keys the texts: a spoof's model is the base whatever watermark it was stolen from)
        reads = {"estimate": found["folder"].name}
        return [pipeline.decode(self, unaltered, processors, from_base=self.from_base, reads=reads)]


class Scrub(Stealing):
    name = "steal-scrub"
    label = "Stolen scrub"
    description = "decoding the watermarked model with the boosts stolen from its texts taken off"
    sweep = Sweep("strength (logits taken off x the stolen boost)", "Scrubbing with a stolen estimate",
                  setting="strength")  # fmt: skip
    version = "1"
    sign, from_base = -1, False


class Spoof(Stealing):
    name = "steal-spoof"
    label = "Stolen spoof"
    description = "the unwatermarked base decoded with the boosts stolen from the watermarked model's texts"
    sweep = Sweep("strength (logits added x the stolen boost)", "Spoofing with a stolen estimate", setting="strength")
    tables: ClassVar[tuple[str, ...]] = ("robustness", "flagged")
    version = "1"
    sign, from_base = 1, True


class ParaphraseScrubParams(StealParams, DipperParams):
    """The estimate's settings (``strength``: what the paraphraser's decoding takes off, times the estimated boost)
    and DIPPER's (``seed`` draws both the attacker's queries and the paraphrases). The estimate is counted in the
    paraphraser's tokens, which its spec names (``counted_in``)."""


class ParaphraseScrub(Stealing, Dipper):
    """Scrubbing by paraphrase, Jovanovic et al.'s scrub: DIPPER rewrites the watermarked model's texts with the boosts
    stolen from its texts taken off its decoding, so that the rewrite keeps the meaning and leaves the tokens the
    model favours. The paraphraser writes in its own vocabulary, so the estimate is counted in its tokens (both
    sides' texts re-tokenized by its tokenizer: a stage of its own beside the base-token estimate) and its decoder's
    previous token is the context. Unlike the decoding scrub, the watermarked model writes nothing here: a
    decoding-time watermark's sampler cannot put back the green tokens taken off. Strength 0 is DIPPER with the same
    settings. A text attack whose rows go in tab:robustness under "Adaptive"; it reads an estimate, so no chain holds
    it."""

    name = "steal-paraphrase"
    label = "Stolen scrub (paraphrase)"
    description = "paraphrasing the watermarked model's texts with the boosts stolen from them taken off"
    sweep = Sweep("strength (logits taken off x the stolen boost)", "Scrubbing by paraphrase with a stolen estimate",
                  setting="strength")  # fmt: skip
    tables: ClassVar[tuple[str, ...]] = ("robustness",)
    chain_link: ClassVar[bool] = False
    version = "1"
    sign, from_base = -1, False
    Params = ParaphraseScrubParams

    def model_refs(self) -> dict[str, str]:
        return {**Dipper.model_refs(self), **Stealing.model_refs(self)}

    def config_label(self) -> str:
        return f"{Stealing.config_label(self)}, {Dipper.config_label(self)}"

    def counted_in(self) -> str:
        return self.params.tokenizer or self.params.model

    def evaluated(self, pipeline, trained, unaltered) -> Evaluated:
        found = self.steal(pipeline, unaltered)
        return [pipeline.attack_texts(self, unaltered, reads={"estimate": found["folder"]})]

    def processors(self, ctx: AttackContext) -> list:
        if not ctx.reads or "estimate" not in ctx.reads:
            raise HarnessError(f"attack {self.name} rewrites with a stolen estimate, and its context names none")
        return [StolenBoosts(load_estimate(ctx.reads["estimate"]), self.sign * self.params.strength)]


def retokenized(tokenizer, other, texts: list[list[int]]) -> list[list[int]]:
    """Token-id ``texts`` of ``tokenizer`` as ``other`` tokenizes their text."""
    decoded = tokenizer.batch_decode(texts, skip_special_tokens=True)
    return other(decoded, add_special_tokens=False)["input_ids"] if decoded else []


def load_estimate(folder) -> dict:
    import numpy as np

    with np.load(folder / ESTIMATE) as found:
        return {k: found[k] for k in found.files}


class FineTuneScrubParams(StealParams):
    steps: int = Field(50, ge=1, le=100_000)  # the attacker's budget of optimiser steps
    lr: float = Field(1e-4, gt=0)
    batch_size: int = Field(8, gt=0)


class FineTuneScrub(Stealing):
    """Scrubbing by fine-tuning: the watermarked model trained for ``steps`` steps, on the attacker's own queries
    (the texts the estimate was made from), toward its own next-token distribution with the stolen boosts taken off,
    ``softmax(l_frozen - strength * s(c, .))``: the KL divergence from that target to the model, over the queries'
    completion tokens (the fine-tuning attack's batches and training loop). The trained model is a stage of its own
    (``steal-finetune``); its row is its texts, as a model attack's."""

    name = "steal-finetune"
    label = "Stolen scrub (fine-tuning)"
    description = "fine-tuning the watermarked model away from the boosts stolen from its texts"
    sweep = Sweep("fine-tuning steps", "Scrubbing by fine-tuning with a stolen estimate", setting="steps")
    version = "1"
    sign, from_base = -1, False
    Params = FineTuneScrubParams

    def config_label(self) -> str:
        return f"{Stealing.config_label(self)}, steps={self.params.steps}"

    def edits_weights(self) -> bool:
        return True  # (a decoding-time watermark is not in the weights: its methods refuse this attack)

    def validate(self, base_model: str | None = None) -> None:
        from harness.compute.training import check_split

        super().validate(base_model)  # (its reference model and context, as the other stealing attacks')
        check_split(self.params.batch_size, f"the fine-tuning scrub's batch_size ({self.params.batch_size})")

    def evaluated(self, pipeline, trained, unaltered) -> Evaluated:
        from harness.contract.attack import Output

        out, _ = unaltered
        found = self.steal(pipeline, unaltered)
        p = self.params
        spec = {"version": self.version, "estimate": found["spec"], "model": out.model_id,
                "strength": p.strength, "steps": p.steps, "lr": p.lr, "batch_size": p.batch_size}  # fmt: skip

        def build(folder) -> dict:
            return scrub_by_finetuning(out.path, found["folder"], folder / "model", p)

        folder = pipeline.aux_stage("steal-finetune", spec, build, f"fine-tuning scrub ({self.config_label()})",
                                    collective=True)  # fmt: skip
        model_id = f"steal-finetune:{folder.name}"
        from harness.contract.attack import MODEL

        row = Output(f"{self.table_label()} {self.config_label()}", self.config_label(), folder / MODEL, model_id,
                     None)  # fmt: skip
        return [(row, pipeline.generate(row.path, row.model_id, row.row))]


def scrub_by_finetuning(model_dir, estimate_dir, out_dir, p: FineTuneScrubParams) -> dict:
    """``FineTuneScrub``'s training: returns its report."""

    import torch

    from attacks.finetune import example_batches, shuffled_passes
    from harness.assets import models
    from harness.compute.training import save_model, train
    from harness.config.settings import TrainSettings
    from harness.store import files

    device = models.default_device()
    tokenizer = models.load_tokenizer(str(model_dir))
    student = models.load_trainable(str(model_dir), device)
    teacher = models.load_causal_lm(str(model_dir), device).eval()
    estimate = load_estimate(estimate_dir)
    boosts = StolenBoosts(estimate, -p.strength)
    queries = files.read_jsonl(estimate_dir / QUERIES)
    examples = [(q["prompt_ids"] + q["completion_ids"], len(q["prompt_ids"])) for q in queries]
    seq_len = max(len(ids) for ids, _ in examples)

    def step(model, batch, backward) -> float:
        ids, labels, attention = batch.unbind(1)
        with torch.no_grad():
            logits = teacher.to(ids.device)(input_ids=ids, attention_mask=attention).logits.float()
            target = boosts.along(ids, logits)  # the boosts after each position's token, taken off the teacher's
            target = torch.log_softmax(target, dim=-1)
        log_p = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), dim=-1)
        trained = (labels[:, 1:] != -100).unsqueeze(-1)  # position t predicts token t + 1: the completion's
        kl = (target.exp() * (target - log_p))[:, :-1] * trained
        loss = kl.sum() / trained.sum().clamp(min=1)
        backward(loss)
        return loss.item()

    settings = TrainSettings(steps=p.steps, batch_size=p.batch_size, seq_len=seq_len, lr=p.lr, warmup_frac=0.0,
                             schedule="constant", seed=p.seed)  # fmt: skip
    batches = example_batches(shuffled_passes(examples, p.seed), p.batch_size, seq_len, tokenizer)
    report = train(student, step, batches, settings, "steal-finetune: scrubbing", device)
    save_model(student, out_dir, tokenizer)
    return {"queries": len(examples), **{k: v for k, v in report.items() if k != "losses"}}


def recovered(estimate: dict, green: Callable[[int, int], bool], top: int | None = None) -> float:
    """The share of the estimate's boosted pairs (its ``top`` highest-scored, or all) whose token is in the green list
    of its context (``green(c, t) -> bool``, a scheme's known lists): chance is the scheme's gamma."""
    import numpy as np

    order = np.argsort(-np.asarray(estimate["scores"]), kind="stable")[: top or len(estimate["scores"])]
    if not len(order):
        return math.nan
    hits = [green(int(estimate["contexts"][i]), int(estimate["tokens"][i])) for i in order]
    return float(np.mean(hits))
