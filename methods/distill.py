"""Logit distillation into a student: per-token KL(teacher || student) with a frozen teacher, as Gu et al.
(the KL is summed over the vocabulary and averaged over every position of every sequence)."""

from __future__ import annotations

from collections.abc import Callable

from harness.config import TrainSettings
from harness.training import loss_step, train


def kl_per_token(student_logits, teacher_logits):
    """Mean over positions of KL(softmax(teacher) || softmax(student)), computed in float32."""
    import torch.nn.functional as F

    s = F.log_softmax(student_logits.float(), dim=-1)
    t = F.log_softmax(teacher_logits.float(), dim=-1)
    return F.kl_div(s.flatten(0, -2), t.flatten(0, -2), log_target=True, reduction="batchmean")


def logit_distill(
    student, teacher, watermark: Callable, batches, settings: TrainSettings, desc: str, device: str | None = None
) -> dict:
    """Train ``student`` towards ``watermark(input_ids, teacher_logits)``; the teacher stays frozen."""
    import torch

    teacher.eval().requires_grad_(False)

    def loss_fn(model, input_ids):
        if next(teacher.parameters()).device != input_ids.device:
            teacher.to(input_ids.device)
        with torch.no_grad():
            target = watermark(input_ids, teacher(input_ids=input_ids).logits.float())
        return kl_per_token(model(input_ids=input_ids).logits, target)

    return train(student, loss_step(loss_fn), batches, settings, desc=desc, device=device)
