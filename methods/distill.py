"""Logit distillation into a student: per-token KL(teacher || student) with a frozen teacher, as Gu et al.
(the KL is summed over the vocabulary and averaged over every position of every sequence)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.assets import models
from harness.compute.training import loss_step, train
from harness.config.settings import TrainSettings

# Positions x vocabulary above which the KL is computed chunk by chunk, each chunk recomputed in the backward pass:
# no float32 copy of the whole B x T x V tensor is kept (64 x 512 x 128,256 in float32 is 16.8 GB).
CHUNK_ELEMENTS = 1 << 26


def kl_per_token(student_logits, teacher_logits):
    """Mean over positions of KL(softmax(teacher) || softmax(student)), computed in float32 (chunked over positions
    when the logits are large, with the same value)."""
    import torch.nn.functional as F

    s, t = student_logits.flatten(0, -2), teacher_logits.flatten(0, -2)
    rows, vocab = s.shape
    if rows * vocab <= CHUNK_ELEMENTS:
        return F.kl_div(F.log_softmax(s.float(), -1), F.log_softmax(t.float(), -1), log_target=True,
                        reduction="batchmean")  # fmt: skip
    from torch.utils.checkpoint import checkpoint

    step = max(1, CHUNK_ELEMENTS // vocab)
    total = sum(
        checkpoint(_kl_sum, s[i : i + step], t[i : i + step], use_reentrant=False) for i in range(0, rows, step)
    )
    return total / rows


def _kl_sum(student_logits, teacher_logits):
    import torch.nn.functional as F

    return F.kl_div(F.log_softmax(student_logits.float(), -1), F.log_softmax(teacher_logits.float(), -1),
                    log_target=True, reduction="sum")  # fmt: skip


def logit_distill(
    student,
    teacher,
    watermark: Callable,
    batches,
    settings: TrainSettings,
    desc: str,
    device: str | None = None,
    masks: dict | None = None,
    on_step: Callable | None = None,
) -> dict:
    """Train ``student`` towards ``watermark(input_ids, teacher_logits)``; the teacher stays frozen. ``masks``: train
    only these entries of the student's parameters; ``on_step``: called after each step (both as
    ``harness.compute.training.train`` takes them)."""
    import torch

    teacher.eval().requires_grad_(False)

    def loss_fn(model, input_ids):
        if next(teacher.parameters()).device != input_ids.device:
            teacher.to(input_ids.device)
        with torch.no_grad():
            # In the teacher's own precision: kl_per_token takes each chunk to float32.
            target = watermark(input_ids, teacher(input_ids=input_ids).logits)
        return kl_per_token(model(input_ids=input_ids).logits, target)

    return train(student, loss_step(loss_fn), batches, settings, desc=desc, device=device, masks=masks, on_step=on_step)


def teacher_prompts(ctx, tokenizer, prompt_tokens: int, count: int) -> list[list[int]]:
    """Sampling distillation's prompts (Gu et al.): the first ``prompt_tokens`` tokens of the training documents that
    have as many, ``count`` of them, the corpus cycled through where it holds fewer."""
    from harness.assets import data
    from harness.config.errors import HarnessError

    prompts = []
    for ids in (tokenizer(t, add_special_tokens=True)["input_ids"] for t in data.iter_texts(ctx.train_data)):
        if len(ids) >= prompt_tokens:
            prompts.append(ids[:prompt_tokens])
            if len(prompts) == count:
                break
    if not prompts:
        raise HarnessError(f"no training document has {prompt_tokens} tokens for a teacher prompt")
    return [prompts[i % len(prompts)] for i in range(count)]


def sampling_distillation(method, ctx, out: Path, stage_kind: str, stage_label: str, make_texts: Callable) -> dict:
    """Gu et al.'s sampling distillation, the training of Gu-KTH and Gu-AAR: the frozen base decodes one teacher text
    per training sequence with ``method``'s key (``make_texts(ctx, key, count, prompt_tokens, new_tokens, batch,
    folder)``, a stage of kind ``stage_kind``), a copy of the base is fine-tuned on them (``train_on_teacher_texts``)
    and saved with the method's detection key. The method's ``batch_size`` and ``seq_len``, where set, replace the
    training's. Returns the training report."""
    from harness.contract.method import save_trained

    stages = ctx.need_stages(method.label)
    p = method.params
    s = ctx.settings.model_copy(
        update={"batch_size": p.batch_size or ctx.settings.batch_size, "seq_len": p.seq_len or ctx.settings.seq_len}
    )
    tokenizer = models.load_tokenizer(ctx.base_model)
    key = method.key(tokenizer)
    count = -(-s.tokens // s.seq_len)  # one teacher text per training sequence
    spec = {"key": key.to_dict(), "texts": count, "prompt_tokens": p.prompt_tokens, "new_tokens": s.seq_len,
            "generate_batch": p.generate_batch}  # fmt: skip
    teacher = stages.aux_stage(
        stage_kind,
        spec,
        lambda folder: make_texts(ctx, key, count, p.prompt_tokens, s.seq_len, p.generate_batch, folder),
        stage_label,
    )
    student, report = train_on_teacher_texts(
        ctx, tokenizer, teacher, s, f"train {method.label} (sampling distillation)"
    )
    save_trained(out, student, tokenizer, method.detection_key(tokenizer))
    report["teacher_texts"] = teacher.name
    return report


def train_on_teacher_texts(ctx, tokenizer, teacher: Path, settings: TrainSettings, desc: str):
    """Sampling distillation's training (Gu et al.): a copy of the base fine-tuned with cross-entropy on the teacher
    texts of the stage ``teacher`` (``texts.jsonl``), tokenized again and packed into ``settings.seq_len`` blocks.
    Returns the student and the training report."""
    import json

    from harness.assets import data

    texts = (json.loads(line)["text"] for line in (teacher / "texts.jsonl").read_text().splitlines())
    stream = data.token_stream(tokenizer, texts, max_tokens=settings.tokens)
    batches = data.training_batches(tokenizer, stream, settings)
    student = models.load_trainable(ctx.base_model, ctx.device)
    step = loss_step(lambda m, b: m(input_ids=b, labels=b).loss)
    return student, train(student, step, batches, settings, desc=desc, device=ctx.device)
