"""Gloaguen-KGW, as the paper describes it (appendix "Baseline Setting" and "Training Configurations"): KGW distilled
into the parameters that fine-tuning leaves alone.

1. Distil KGW as Gu-KGW does (the stored Gu-KGW train stage of the same settings is reused).
2. Fine-tune that student on plain text of the training corpus (paper: 2,500 steps, batch 64 x 512, lr 1e-5, 500
   warmup steps, cosine) and take the change of every parameter, ``|theta_ft - theta_1|`` (the task vector of
   fine-tuning, contrasted with the watermarked student it started from). A stage of its own, reused by every
   stable fraction.
3. Distil KGW again from the stage-1 student, updating only its most stable parameters: in each weight tensor the
   ``stable_fraction`` of entries that fine-tuning moved least. The others keep stage 1's values bit for bit (their
   gradient is zeroed, and AdamW without weight decay leaves a parameter with zero gradient where it is).

The detector is KGW's with stage 1's key. The paper does not give the fraction; ``stable_fraction`` defaults to 0.5,
the half of each tensor that fine-tuning moved least: the stage-1 student already carries the watermark in all of its
weights, and stage 3 has to re-learn it in the masked ones with the same number of distillation steps, so a mask that
keeps too few entries cannot hold it, while one that keeps them all is Gu-KGW again. Ranking within each tensor
rather than across the model keeps layers whose weights have different scales from being masked wholesale.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from harness.assets import data, models
from harness.assets.weights import weight_reader
from harness.config.settings import TrainSettings
from harness.contract.method import TrainContext, read_key, save_trained
from methods.gu_kgw import GuKGW, GuKGWParams, distill

FINETUNED = "finetuned"


class GloaguenKGWParams(GuKGWParams):
    stable_fraction: float = Field(0.5, gt=0, le=1)  # share of each tensor's entries that stage 3 may update
    ft_steps: int = Field(2500, gt=0)  # stage 2 (paper: 2,500)
    ft_lr: float = Field(1e-5, gt=0)  # stage 2 (paper: 1e-5)
    ft_warmup: int = Field(500, ge=0)  # stage 2 warmup steps (paper: 500)


class GloaguenKGW(GuKGW):
    name = "gloaguen-kgw"
    label = "Gloaguen-KGW"
    version = "1"
    Params = GloaguenKGWParams

    def kgw_settings(self) -> dict:
        """Stage 1's settings: the Gu-KGW ones of this method."""
        return self.params.model_dump(include=set(GuKGWParams.model_fields))

    def config_label(self) -> str:
        label = super().config_label()
        return label if self.params.stable_fraction == 0.5 else f"{label}, stable={self.params.stable_fraction:g}"

    def train(self, ctx: TrainContext, out: Path) -> dict:
        from methods.kgw import KGWKey

        stages = ctx.need_stages(self.label)
        p, s = self.params, ctx.settings
        stage1 = stages.train_other("gu-kgw", self.kgw_settings())
        finetuned = stages.aux_stage(
            "gloaguen-finetune",
            {"stage1": stage1.name, "steps": p.ft_steps, "lr": p.ft_lr, "warmup": p.ft_warmup, "train": s.model_dump()},
            lambda folder: self.finetune(stage1 / "model", folder, ctx),
            "Gloaguen-KGW stage 2 (fine-tuning for stable parameters)",
            collective=True,  # it trains the whole student: across GPUs (FSDP) at the paper's scale
        )
        tokenizer = models.load_tokenizer(str(stage1 / "model"))
        key = read_key(stage1)
        teacher = models.load_causal_lm(ctx.base_model, ctx.device, dtype=ctx.settings.teacher_dtype)
        student = models.load_trainable(str(stage1 / "model"), ctx.device)
        # Read from the two saved models a tensor at a time, as training places them: no process holds the
        # fine-tuned model or a full set of masks (at 8B, 32 GB and 8 GB of host memory per process).
        masks = StableMasks(stage1 / "model", finetuned / FINETUNED, p.stable_fraction)
        teacher_key = KGWKey.from_dict(key["teacher"])
        what = "distill Gloaguen-KGW (stable parameters)"
        report = distill(student, teacher, teacher_key, tokenizer, ctx, what, masks)
        save_trained(out, student, tokenizer, {**key, "method": self.name})
        total = sum(param.numel() for param in student.parameters())
        kept = sum(kept_count(param.numel(), p.stable_fraction) for param in student.parameters())
        report.update(
            {
                "stage1": stage1.name,
                "stage2": finetuned.name,
                "stable_fraction": p.stable_fraction,
                "updated_parameters": kept,
                "parameters": total,
            }
        )
        return report

    def finetune(self, model_dir: Path, folder: Path, ctx: TrainContext) -> dict:
        """Stage 2: fine-tune the stage-1 student on plain training text (a differently shuffled pass of the same
        corpus, as the paper fine-tunes on OpenWebText again) and save it."""
        from harness.compute.training import loss_step, save_model, train

        p, s = self.params, ctx.settings
        tokenizer = models.load_tokenizer(str(model_dir))
        model = models.load_trainable(str(model_dir), ctx.device)
        settings = TrainSettings(
            **{
                **s.model_dump(),
                "steps": p.ft_steps,
                "lr": p.ft_lr,
                "warmup_frac": min(p.ft_warmup / p.ft_steps, 0.99),
                "schedule": "cosine",
                "seed": s.seed + 1,
            }
        )
        texts = data.iter_texts(ctx.train_data)
        stream = data.token_stream(tokenizer, texts, max_tokens=settings.tokens)
        batches = data.training_batches(tokenizer, stream, settings)
        report = train(
            model,
            loss_step(lambda m, b: m(input_ids=b, labels=b).loss),
            batches,
            settings,
            "Gloaguen stage 2",
            ctx.device,
        )
        save_model(model, folder / FINETUNED, tokenizer)
        return report


def kept_count(size: int, fraction: float) -> int:
    """How many of a tensor's ``size`` entries its mask keeps: ``fraction`` of them, at least one."""
    return max(1, round(fraction * size))


def stable_mask(change, fraction: float):
    """Bool mask of ``change``'s shape (``|after - before|`` of one tensor): the ``fraction`` of entries that moved
    least (at least one), ties broken by position, as a stable sort of ``change`` would pick them. Selected by the
    k-th smallest change rather than a sort: a sort's int64 order of an 8B model's embedding alone is 4 GB."""
    import torch

    flat = change.flatten()
    keep = kept_count(flat.numel(), fraction)
    if keep == flat.numel():
        return torch.ones(change.shape, dtype=torch.bool)
    threshold = torch.kthvalue(flat, keep).values
    mask = flat < threshold
    ties = (flat == threshold).nonzero().flatten()
    mask[ties[: keep - int(mask.sum())]] = True  # the first of the entries at the threshold, by position
    return mask.view(change.shape)


class StableMasks(weight_reader):
    """Gloaguen-KGW's masks, ``{parameter name: bool mask}``, each computed when asked for (``stable_mask``) from the
    tensor of that name in the stage-1 model folder ``before`` and in the fine-tuned one ``after``."""

    def __init__(self, before: Path, after: Path, fraction: float):
        super().__init__(before)
        self.after, self.fraction = weight_reader(after), fraction

    def __getitem__(self, name: str):
        change = self.after[name].float().sub_(super().__getitem__(name).float()).abs_()  # in place: one copy
        return stable_mask(change, self.fraction)
