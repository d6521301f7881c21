"""Sampling continuations for evaluation, and their perplexity under the oracle model."""

from __future__ import annotations

from harness.config import EvalSettings
from harness.progress import Progress


def sample(model, prompts: list[list[int]], settings: EvalSettings, eos_id: int | None, desc: str) -> list[list[int]]:
    """Exactly ``new_tokens`` sampled tokens per prompt: multinomial at ``temperature``, no top-k/top-p (Gu et al.).

    Prompts all have the same length, so batches need no padding. Batch ``b`` draws from a generator seeded with
    ``seed + b``: the texts depend on the seed and the batch size, both recorded in the run's spec.
    """
    import torch

    out: list[list[int]] = []
    with Progress(len(prompts), desc, unit="text") as bar:
        for b, start in enumerate(range(0, len(prompts), settings.batch_size)):
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
            bar.update(len(ids))
    return out


def completion_perplexity(
    model, prompts: list[list[int]], completions: list[list[int]], batch_size: int, pad_id: int = 0, desc: str = "ppl"
) -> list[float]:
    """Perplexity of each completion given its prompt: prompt tokens condition but are not scored. Sequences of
    different lengths are right-padded and masked."""
    import torch
    import torch.nn.functional as F

    ppl: list[float] = []
    with Progress(len(prompts), desc, unit="text") as bar:
        for start in range(0, len(prompts), batch_size):
            pairs = list(zip(prompts[start : start + batch_size], completions[start : start + batch_size], strict=True))
            width = max(len(p) + len(c) for p, c in pairs)
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
            ppl.extend(torch.exp((nll * mask).sum(-1) / mask.sum(-1)).tolist())
            bar.update(len(pairs))
    return ppl
