"""Sampling continuations for evaluation, and their perplexity under the oracle model."""

from __future__ import annotations

from tqdm.auto import tqdm

from harness.config import EvalSettings


def sample(model, prompts: list[list[int]], settings: EvalSettings, eos_id: int | None, desc: str) -> list[list[int]]:
    """Exactly ``new_tokens`` sampled tokens per prompt: multinomial at ``temperature``, no top-k/top-p (Gu et al.).

    Prompts all have the same length, so batches need no padding. Batch ``b`` draws from a generator seeded with
    ``seed + b``: the texts depend on the seed and the batch size, both recorded in the run's spec.
    """
    import torch

    out: list[list[int]] = []
    batches = range(0, len(prompts), settings.batch_size)
    for b, start in enumerate(tqdm(batches, desc=desc, disable=None)):
        ids = torch.tensor(prompts[start : start + settings.batch_size], device=model.device)
        torch.manual_seed(settings.seed + b)
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=settings.temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=settings.new_tokens,
                min_new_tokens=settings.new_tokens,
                pad_token_id=eos_id,
            )
        out.extend(gen[:, ids.shape[1] :].tolist())
    return out


def completion_perplexity(
    model, prompts: list[list[int]], completions: list[list[int]], batch_size: int, desc: str = "perplexity"
) -> list[float]:
    """Perplexity of each completion given its prompt (prompt tokens masked out of the loss)."""
    import torch
    import torch.nn.functional as F

    ppl: list[float] = []
    for start in tqdm(range(0, len(prompts), batch_size), desc=desc, disable=None):
        p = prompts[start : start + batch_size]
        c = completions[start : start + batch_size]
        full = torch.tensor([a + b for a, b in zip(p, c, strict=True)], device=model.device)
        with torch.no_grad():
            logits = model(input_ids=full).logits.float()
        plen = len(p[0])
        pred = logits[:, plen - 1 : -1]  # position j predicts token j + 1
        nll = F.cross_entropy(pred.transpose(1, 2), full[:, plen:], reduction="none").mean(-1)
        ppl.extend(torch.exp(nll).tolist())
    return ppl
