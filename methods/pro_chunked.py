"""PRO's vocabulary-sized work in chunks of tokens: the teacher's and the student's logits, M's values, the teacher
targets and every KL of a step, computed ``CHUNK_ELEMENTS`` at a time from the models' final hidden states and
recomputed chunk by chunk in the backward pass (``torch.utils.checkpoint``), so that a step's peak holds no
tokens x vocabulary tensor: at 16 x 512 tokens and V = 262,144 one float32 logits tensor alone is 8 GiB, and the
unchunked step keeps about ten of them alive.

The hidden states come from the models' own forward with their output layer's forward set to the identity for the
call (``head_skipped``): the model runs as it always does (masks, positions, caches, autocast) and only the last
matrix product moves here, where it is done per chunk with the same weights. Used above ``CHUNK_ELEMENTS`` per
tensor (``PROStep``), on one process and for models whose logits are that product alone (``plain_head``); below it,
or elsewhere, the step is the unchunked one, so trainings of that size are bit-identical to before. The two agree to
float tolerance (``tests/unit/test_pro.py``).

The price is arithmetic: each chunk's head products and M's forward run again in the backward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

from harness.compute import distributed
from methods.distill import CHUNK_ELEMENTS, _kl_sum

# Model types whose causal-LM forward ends in ``logits = lm_head(hidden_states)`` with no scaling or soft-capping of
# the logits after it (read in transformers 5's modeling files); any other keeps the unchunked step.
PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma3_text"})


def plain_head(model) -> bool:
    """Whether ``model``'s logits are its output layer applied to its final hidden states and nothing more."""
    config = getattr(model, "config", None)
    return (
        getattr(config, "model_type", None) in PLAIN_HEADS
        and not getattr(config, "final_logit_softcapping", None)
        and getattr(config, "logit_scale", None) in (None, 1, 1.0)
    )


def use_chunks(model, rows: int, vocab: int) -> bool:
    """The chunked step: one process, a plain head, and a rows x vocabulary tensor over ``CHUNK_ELEMENTS``."""
    return rows * vocab > CHUNK_ELEMENTS and not distributed.active() and plain_head(model)


def rows_per_chunk(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // vocab)


@contextmanager
def head_skipped(model):
    """Within it ``model(...).logits`` are the final hidden states (the output layer's forward is the identity);
    yields the output layer, whose weights ``head_logits`` applies per chunk."""
    head = model.get_output_embeddings()
    head.forward = _identity
    try:
        yield head
    finally:
        del head.forward


def _identity(hidden):
    return hidden


def head_logits(head, hidden):
    """The output layer's logits for ``hidden`` (rows, H), in float32."""
    import torch.nn.functional as F

    return F.linear(hidden, head.weight, head.bias).float()


def chunked_kl(student_head, student_hidden, target: Callable[[int, int], object]):
    """Mean over rows of KL(softmax(target) || softmax(student logits)), the student's logits ``student_head`` applied
    to ``student_hidden`` (rows, H) and ``target(i, j)`` the target logits of rows ``i:j`` (no gradient), each chunk
    recomputed in the backward pass: the value of ``methods.distill.kl_per_token`` on the full tensors."""
    from torch.utils.checkpoint import checkpoint

    rows = student_hidden.shape[0]
    step = rows_per_chunk(student_head.weight.shape[0])

    def part(hidden, start: int):
        return _kl_sum(head_logits(student_head, hidden), target(start, start + hidden.shape[0]))

    total = sum(checkpoint(part, student_hidden[i : i + step], i, use_reentrant=False) for i in range(0, rows, step))
    return total / rows


def policy_loss(policy, emb, student_head, student_hidden, teacher_logits, delta: float, eps: float,
                lambda_1: float, reduction: str):  # fmt: skip
    """L_M's two parts in chunks: ``(l_sim_m, (l_norm, unbiased, balanced, hinge))`` as ``kl_per_token(student,
    teacher + delta * M(emb))`` and ``methods.pro_policy.norm_loss(M(emb), ...)`` give them, with the student's logits
    detached (``student_hidden`` is read without gradient) and ``teacher_logits(i, j)`` the teacher's rows ``i:j``.
    M's values are never held for more than one chunk: each chunk returns its sums and M's column sums (V floats),
    and its forward runs again in the backward pass."""
    import torch
    from torch.utils.checkpoint import checkpoint

    rows, vocab = emb.shape[0], policy.sizes["vocab"]
    step = rows_per_chunk(vocab)
    hidden = student_hidden.detach()

    def part(e, start: int):
        m = policy(e)
        with torch.no_grad():
            student = head_logits(student_head, hidden[start : start + e.shape[0]])
        kl = _kl_sum(student, teacher_logits(start, start + e.shape[0]) + delta * m)
        m = m.float()
        return torch.stack([kl, m.mean(dim=1).abs().sum(), (eps - m.abs()).clamp(min=0).sum()]), m.sum(dim=0)

    sums, column_sum = 0, 0
    for i in range(0, rows, step):
        got, columns = checkpoint(part, emb[i : i + step], i, use_reentrant=False)
        sums, column_sum = sums + got, column_sum + columns
    kl, unbiased, hinge = sums[0] / rows, sums[1], sums[2]
    balanced = (column_sum / rows).abs()
    if reduction == "mean":
        unbiased, balanced, hinge = unbiased / rows, balanced.mean(), hinge / (rows * vocab)
    else:
        balanced = balanced.sum()
    return kl, (unbiased + balanced + lambda_1 * hinge, unbiased, balanced, hinge)
