"""Sampling continuations for evaluation, and their perplexity under the oracle model."""

from __future__ import annotations

import logging

from harness.compute.progress import Progress
from harness.config.settings import EvalSettings

log = logging.getLogger(__name__)

# Version of the sampler: part of every generation's hash, so texts drawn by an older one are never reused as its own.
SAMPLER = "per-prompt-gumbel-1"
_M32 = 0xFFFFFFFF
# Batch "auto": a GPU starts at 1,024 prompts and halves until a batch fits. A CPU takes 256, where new tokens/s stop
# growing with the batch (benchmarks/generate.py, whose table is in benchmarks/README.md): below it the per-step work
# around the model (the generation loop, the noise, small matrices) is shared by fewer rows.
AUTO_BATCH = {"cuda": 1024, "cpu": 256}


def sample(
    model,
    prompts: list[list[int]],
    settings: EvalSettings,
    eos_id: int | None,
    desc: str,
    first_index: int = 0,
    used: dict | None = None,
    processors: tuple = (),
) -> list[list[int]]:
    """Exactly ``new_tokens`` sampled tokens per prompt: by default multinomial at ``temperature``, no top-k/top-p
    (Gu et al.); ``settings``' decoding (``EvalSettings.decoding``) transforms the logits first (``GumbelPerPrompt``).

    Prompts of different lengths (chat prompts) are padded on the left within a batch and masked (their positions
    count from each prompt's first token), so each gets what it gets alone; document prompts all have the same length
    and need no padding. A repetition penalty also sees the padding (EOS where the tokenizer has no pad token), as a
    user's batched stack does. The random draws belong to the prompt, not to the
    batch: token ``t`` of prompt ``i`` (``first_index`` + its place in ``prompts``) is the argmax of
    ``logits / temperature`` plus Gumbel noise hashed from (seed, i, t, token id), which is an exact draw from
    ``softmax(logits / temperature)``. A prompt thus gets the same text in any batch and in any process of a
    multi-process run, up to the last bits of its logits (which a kernel may compute differently at another batch
    size, so the batch size stays part of the hash).

    ``processors`` act on the logits before the draw and before any decoding transform (a decoding-time watermark's,
    where a learned watermark's bias is: in the logits).

    ``settings.batch_size`` ``"auto"``: batches of up to 1,024 prompts on a GPU, halved whenever one does not fit
    (the prompts already drawn are kept); 256 on a CPU (``AUTO_BATCH``). The batch size used last goes into
    ``used["batch_size"]``.
    """
    import torch

    auto = settings.batch_size == "auto"
    size = AUTO_BATCH["cuda" if model.device.type == "cuda" else "cpu"] if auto else settings.batch_size
    size = max(1, min(size, len(prompts)))
    pad = eos_id if eos_id is not None else 0
    out: list[list[int]] = []
    with Progress(len(prompts), desc, unit="text") as bar:
        while len(out) < len(prompts):
            start = len(out)
            batch = prompts[start : start + size]
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=model.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
            rows = torch.arange(len(ids), device=model.device) + first_index + start
            try:
                gen = draw(
                    model, ids, rows, settings.seed, settings.temperature, settings.new_tokens, eos_id, processors,
                    settings.decoding(), mask,
                )  # fmt: skip
            except torch.OutOfMemoryError:
                if not auto or size == 1:
                    raise
                del ids, rows, mask
                torch.cuda.empty_cache()
                size //= 2
                log.info("generation: a batch did not fit; %d prompts per batch from here", size)
                continue
            out.extend(gen[:, width:].tolist())
            bar.update(len(ids))
    if used is not None:
        used["batch_size"] = size
    return out


def sample_plainly(model, prompts: list[list[int]], new_tokens: int, seed: int, eos_id: int | None, desc: str,
                   processors: tuple = ()) -> list[list[int]]:  # fmt: skip
    """``sample`` of ``new_tokens`` tokens after prompts of the caller's own (teacher texts, an attacker's queries) at
    plain sampling, temperature 1 and a per-prompt draw keyed by ``seed``, in batches of "auto" (the sampler reads the
    prompts it is given: the settings' prompt count and length only have to be valid)."""
    settings = EvalSettings(num_prompts=max(2, len(prompts)), prompt_tokens=max(1, len(prompts[0])),
                            new_tokens=new_tokens, seed=seed, batch_size="auto")  # fmt: skip
    return sample(model, prompts, settings, eos_id, desc, processors=processors)


def draw(
    model, ids, rows, seed: int, temperature: float, new_tokens: int, pad_id, processors=(), decoding=None, mask=None
):
    """``model.generate`` of exactly ``new_tokens`` tokens after the prompts ``ids`` (left-padded where ``mask``,
    their attention mask, says so; else all real tokens), each row drawing with its own noise (``rows``: the rows'
    prompt indices). The logits go through the stack users run with transformers: its repetition penalty
    (``decoding``'s, ``EvalSettings.decoding``) first, then ``processors`` (a decoding-time watermark's, as
    lm-watermarking's and MarkLLM's are passed to ``generate``), then temperature, top-k, top-p, min-p or greedy."""
    import torch

    decoding = dict(decoding or {})
    penalty = decoding.pop("repetition_penalty", None)
    first = [PenaltyFirst(penalty)] if penalty is not None else []
    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=mask if mask is not None else torch.ones_like(ids),
            do_sample=False,  # the draw is the argmax of the noised logits
            logits_processor=[*first, *processors, GumbelPerPrompt(seed, rows, ids.shape[1], temperature, decoding)],
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad_id,
            **{k: None for k in ("temperature", "top_k", "top_p")},  # not the model's generation defaults
        )


def _mul32(x, c: int):
    """(x * c) mod 2**32 for int64 tensors of 32-bit values, without overflowing 64 bits."""
    return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & _M32


def hash32(x):
    """A 32-bit integer hash with full avalanche (Wellons' "lowbias32"), on int64 tensors; written here because
    torch has no counter-based random numbers that a draw can be keyed by."""
    x = x & _M32
    x = _mul32(x ^ (x >> 16), 0x7FEB352D)
    x = _mul32(x ^ (x >> 15), 0x846CA68B)
    return x ^ (x >> 16)


def _shift(x, k: int):
    """Logical right shift of int32 tensors read as 32-bit unsigned values."""
    return (x >> k) & ((1 << (32 - k)) - 1)


def hash32_int32(x):
    """``hash32`` on int32 tensors holding the 32 bits (two's complement): the same bits, about 7x faster on a CPU
    (int32 lanes are twice as many, and int32 products wrap mod 2**32 where int64 ones need ``_mul32``'s four
    multiplications). The sampler's (batch x vocabulary) noise goes through it; ``hash32`` stays the definition."""
    x = (x ^ _shift(x, 16)) * 0x7FEB352D
    x = (x ^ _shift(x, 15)) * (0x846CA68B - (1 << 32))
    return x ^ _shift(x, 16)


class PenaltyFirst:
    """transformers' repetition penalty on the float32 scores, the first transform of the stack (``draw``): before a
    watermark's processor, as transformers applies its built-in penalty before the processors a user passes."""

    def __init__(self, penalty: float):
        from transformers import RepetitionPenaltyLogitsProcessor

        self.penalty = RepetitionPenaltyLogitsProcessor(penalty)

    def __call__(self, input_ids, scores):
        return self.penalty(input_ids, scores.float())


class GumbelPerPrompt:
    """Logits processor: ``scores / temperature + Gumbel(hash(seed, prompt index, step, token))`` (see ``sample``),
    the scores first transformed as a user's decoding stack does, in transformers' order (``decoding``, the settings
    that are set: ``EvalSettings.decoding``): the repetition penalty, then the temperature, then top-k, top-p and
    min-p, which leave the tokens they drop at -inf (so the noisy argmax is an exact draw from the truncated
    distribution). Greedy returns the penalised scores without noise: the argmax is the likeliest token. The transforms
    are transformers' own processors; with none set, the scores are exactly those of the sampler before they
    existed."""

    def __init__(self, seed: int, rows, prompt_len: int, temperature: float, decoding: dict | None = None):
        from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TopKLogitsWarper, TopPLogitsWarper

        self.rows = hash32(rows.long() ^ hash32(rows.new_tensor(seed) ^ 0x5BD1E995))  # one key per prompt
        self.prompt_len, self.temperature = prompt_len, temperature
        self.vocab = None
        decoding = decoding or {}
        self.greedy = bool(decoding.get("greedy"))
        penalty = decoding.get("repetition_penalty")
        self.penalty = RepetitionPenaltyLogitsProcessor(penalty) if penalty is not None else None
        self.warpers = [
            cls(decoding[name])
            for name, cls in (("top_k", TopKLogitsWarper), ("top_p", TopPLogitsWarper), ("min_p", MinPLogitsWarper))
            if name in decoding
        ]

    def __call__(self, input_ids, scores):
        import torch

        if self.penalty is not None:
            scores = self.penalty(input_ids, scores.float())
        if self.greedy:
            return scores.float()
        if self.vocab is None or self.vocab.shape[0] != scores.shape[-1]:
            vocab = hash32(torch.arange(scores.shape[-1], device=scores.device) ^ 0x27D4EB2F)
            self.vocab = vocab.to(torch.int32)  # (the same 32 bits: int64 -> int32 wraps)
        step = input_ids.shape[1] - self.prompt_len
        keys = hash32(self.rows ^ hash32(self.rows.new_tensor(step) + 0x165667B1)).to(torch.int32)
        # hash32(keys ^ vocab) >> 8, computed on int32: 24 bits, exact in float32, never 0 or 1
        bits = _shift(hash32_int32(keys[:, None] ^ self.vocab[None, :]), 8)
        uniform = (bits.float() + 0.5) / 2**24
        scores = scores.float() / self.temperature
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        return scores - torch.log(-torch.log(uniform))


# The float32 logits scoring holds at once (``completion_perplexity``): a batch's are texts x tokens x vocabulary, and
# computing the loss from them holds about three times that again. At the presets' 96 tokens a text this keeps a
# 49,152-token vocabulary (SmolLM2) at its 32 texts a pass and a 262,144-token one (Gemma 3) at 10, where 32 held
# 12-15 GiB for perplexity alone.
LOGITS_BYTES = 2**30


def completion_perplexity(
    model, prompts: list[list[int]], completions: list[list[int]], batch_size: int, pad_id: int = 0, desc: str = "ppl"
) -> list[float]:
    """Perplexity of each completion given its prompt: prompt tokens condition but are not scored. Sequences of
    different lengths are right-padded and masked. A batch whose logits would exceed ``LOGITS_BYTES`` passes through
    the model in parts (the same values: each text's are its own, padded to the batch's width as before)."""
    vocab = getattr(model.get_output_embeddings(), "out_features", None) or model.config.get_text_config().vocab_size
    ppl: list[float] = []
    with Progress(len(prompts), desc, unit="text") as bar:
        for start in range(0, len(prompts), batch_size):
            pairs = list(zip(prompts[start : start + batch_size], completions[start : start + batch_size], strict=True))
            width = max(len(p) + len(c) for p, c in pairs)
            rows = max(1, min(len(pairs), LOGITS_BYTES // (width * vocab * 4)))
            for part in range(0, len(pairs), rows):
                ppl.extend(_perplexity(model, pairs[part : part + rows], width, pad_id))
            bar.update(len(pairs))
    return ppl


def _perplexity(model, pairs: list[tuple[list[int], list[int]]], width: int, pad_id: int) -> list[float]:
    """``completion_perplexity`` of one pass: the pairs right-padded to ``width``."""
    import torch
    import torch.nn.functional as F

    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    scored = torch.zeros_like(ids, dtype=torch.bool)  # positions whose token is a completion token
    for row, (p, c) in enumerate(pairs):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c)
        attention[row, : len(p) + len(c)] = 1
        scored[row, len(p) : len(p) + len(c)] = True
    ids, attention, scored = ids.to(model.device), attention.to(model.device), scored.to(model.device)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # predicts token j+1
    mask = scored[:, 1:]
    return torch.exp((nll * mask).sum(-1) / mask.sum(-1)).tolist()
