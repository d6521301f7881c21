"""The one training loop every method uses: AdamW, linear warmup then cosine decay, gradient clipping,
through ``accelerate`` so that the same loop runs on a CPU, one GPU or several."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator

from harness.compute import distributed
from harness.compute.progress import Progress
from harness.config.errors import HarnessError
from harness.config.settings import TrainSettings

log = logging.getLogger(__name__)

# A loss whose mean over the last WINDOW steps exceeds its first WINDOW steps' mean by CLIMB nats and CLIMB_RATIO
# times is said to climb (``climbing``): SmolLM2's PRO at a learning rate 30x the paper's went from 0.00 to 6-11 nats
# a token in 80 steps and wrote token noise, while every training that learned went down or stayed within 0.1 nat.
WINDOW, CLIMB, CLIMB_RATIO = 10, 1.0, 3.0


def loss_step(loss_fn: Callable) -> Callable:
    """A training step for a plain loss: ``backward(loss_fn(model, batch))``, the usual case."""

    def step(model, batch, backward) -> float:
        loss = loss_fn(model, batch)
        backward(loss)
        return loss.item()

    return step


def train(
    model,
    step: Callable,
    batches: Iterator,
    settings: TrainSettings,
    desc: str = "train",
    device: str | None = None,
    lr: float | None = None,
    on_step: Callable[[int, object], None] | None = None,
    masks: dict | None = None,
) -> dict:
    """Optimise ``model`` for ``settings.steps`` steps; return a short training log.

    ``step(model, batch, backward)`` leaves the gradients of the model's trainable parameters in ``.grad`` (usually
    through ``backward(loss)``, accelerate's backward) and returns the loss to log; ``loss_step`` adapts a plain loss.
    The loop then clips, steps AdamW and the schedule. Only parameters with ``requires_grad`` are optimised;
    ``batches`` yields CPU tensors, moved here. ``device="cpu"`` keeps training on the CPU; otherwise accelerate
    places it (one or several GPUs when launched with ``accelerate launch``). ``lr`` overrides ``settings.lr``.
    ``on_step(step_number, unwrapped_model)`` runs after each optimiser step (e.g. to save checkpoints). ``masks``
    (parameter name -> 0/1 tensor of its shape) zeroes every gradient where its mask is 0, before clipping: only the
    masked-in entries train (Gloaguen-KGW's stable parameters).

    Launched with several processes (harness/compute/distributed.py), every process calls this with the same batches:
    each trains on its slice of every batch and accelerate averages the gradients, so a step sees the whole batch as one
    process would. Inside a stage that the main process builds alone, it trains alone on whole batches.
    """
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    torch.manual_seed(settings.seed)
    accelerator = Accelerator(mixed_precision=settings.mixed_precision, cpu=device == "cpu")
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise HarnessError(
            "training under FSDP needs FSDP2, whose sharded student save_model can gather: launch with "
            "accelerate launch --use_fsdp --fsdp_version 2 (or DDP: accelerate launch --multi_gpu)"
        )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=lr or settings.lr, betas=settings.betas, weight_decay=settings.weight_decay
    )
    warmup = int(settings.warmup_frac * settings.steps)
    if settings.schedule == "cosine":
        scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, settings.steps)
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, warmup)
    model.train()
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    together = distributed.active()
    if together or distributed.world_size() == 1:
        # The schedule stays outside accelerate: its wrapper would step it once per process at every step.
        model, optimizer = accelerator.prepare(model, optimizer)
        # FSDP2 replaces the parameters by sharded ones (and accelerate points the optimizer at them): clip those.
        params = [p for p in model.parameters() if p.requires_grad]
    else:  # the main process alone, the others waiting: no wrapper that would talk to them
        model.to(accelerator.device)
    if masks is not None:
        masks = placed_like(accelerator.unwrap_model(model), masks)
    losses: list[float] = []
    warned = False
    start = time.perf_counter()
    with Progress(settings.steps, desc, unit="step") as bar:
        for _ in range(settings.steps):
            batch = next(batches)
            if together:
                batch = my_rows(batch)
            batch = batch.to(accelerator.device)
            with accelerator.autocast():
                loss = step(model, batch, accelerator.backward)
            if not math.isfinite(float(loss)):  # every later step would be as meaningless: stop, store nothing
                raise HarnessError(
                    f"{desc}: the loss is {float(loss)} at step {len(losses) + 1} of {settings.steps}, so the "
                    "training diverged (a learning rate too large?); nothing of it was stored"
                )
            if masks is not None:
                mask_gradients(accelerator.unwrap_model(model), masks)
            if settings.max_grad_norm is not None:
                accelerator.clip_grad_norm_(params, settings.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss))
            if len(losses) >= 2 * WINDOW and not warned and (climb := climbing(losses)):
                warned = True  # (once: the training goes on, as configured; its texts' quality columns will tell)
                if distributed.is_main():
                    log.warning("%s: %s: the training may be diverging (a learning rate too large?)", desc, climb)
            # A step that times work of its own (PRO's anti-watermarked pool) shows it beside the loss.
            shown = step.progress() if hasattr(step, "progress") else {}
            bar.update(1, loss=f"{losses[-1]:.3f}", **shown)
            if on_step is not None:
                on_step(len(losses), accelerator.unwrap_model(model))
    trained = accelerator.unwrap_model(model).eval()
    diverged = non_finite(trained)
    if diverged is not None:
        raise HarnessError(
            f"{desc}: weight {diverged} is not finite after step {settings.steps}, so the training diverged (a "
            "learning rate too large?); nothing of it was stored"
        )
    if settings.gradient_checkpointing:
        trained.gradient_checkpointing_disable()
    seconds = time.perf_counter() - start
    return {
        "steps": settings.steps,
        "seconds": round(seconds, 2),
        "tokens_per_second": round(settings.tokens / seconds, 1),
        "loss_first": losses[0],
        "loss_last_10": sum(losses[-10:]) / len(losses[-10:]),
        "losses": losses,
    }


def climbing(losses: list[float]) -> str | None:
    """Why the loss is climbing (the last ``WINDOW`` steps' mean against the first's), or None where it is not."""
    first, last = (sum(part) / len(part) for part in (losses[:WINDOW], losses[-WINDOW:]))
    if last > first + CLIMB and last > CLIMB_RATIO * first:
        return f"the loss climbed from {first:.3g} (mean of the first {WINDOW} steps) to {last:.3g} (the last {WINDOW})"
    return None


def non_finite(model) -> str | None:
    """The name of the first parameter of ``model`` holding a NaN or an infinity (this process's shard of it under
    FSDP), or None."""
    import torch

    for name, param in model.named_parameters():
        values = param.to_local() if hasattr(param, "to_local") else param
        if not bool(torch.isfinite(values.detach()).all()):
            return name
    return None


def placed_like(model, masks: dict) -> dict:
    """``masks`` (name -> full 0/1 or bool tensor, a mapping that may compute each when asked) as bool tensors on each
    parameter's device; for a parameter that FSDP2 sharded, this process's shard of the mask, cut as the parameter
    is. One full mask at a time is in memory."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    placed = {}
    for name, param in model.named_parameters():
        if name not in masks:
            continue
        mask = masks[name].to(param.device).bool()
        placed[name] = (
            distribute_tensor(mask, param.device_mesh, param.placements) if isinstance(param, DTensor) else mask
        )
    return placed


def mask_gradients(model, masks: dict) -> None:
    """Multiply each parameter's gradient by its mask (from ``placed_like``)."""
    for name, param in model.named_parameters():
        if param.grad is not None and name in masks:
            param.grad.mul_(masks[name])


def save_model(model, folder, tokenizer=None) -> None:
    """Write a trained model (safetensors), and ``tokenizer`` beside it, as a transformers folder. Only the main
    process writes: another process of a launch builds a collective stage into a scratch folder that is dropped, so
    its copy (a whole model each) would be written for nothing. A model that FSDP2 trained holds a shard of each
    weight per process: every process of the launch must call this (the weights are gathered, a collective, onto the
    main process's CPU), and the main process writes the whole model, as one process would have."""
    from torch.distributed.fsdp import FSDPModule

    state = None  # save_pretrained's own: the model's state dict
    if isinstance(model, FSDPModule):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if distributed.is_main():
        model.save_pretrained(folder, state_dict=state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)


def check_split(rows: int, what: str) -> None:
    """Refuse a training batch of ``rows`` that the processes of this launch cannot split evenly (each trains on its
    slice, and the averaged gradients must be those of the whole batch); ``what`` names it in the error."""
    if rows % distributed.world_size():
        raise HarnessError(
            f"{what} cannot be split evenly across {distributed.world_size()} processes: "
            "use a batch size that is a multiple of the number of processes"
        )


def my_rows(batch):
    """This process's rows of a batch (a tensor or a mapping of tensors sharing their first dimension)."""
    rows = len(batch) if not hasattr(batch, "keys") else len(next(iter(batch.values())))
    check_split(rows, f"a training batch of {rows} rows")
    start, stop = distributed.shard_bounds(rows)
    if hasattr(batch, "keys"):
        return batch.__class__({k: v[start:stop] for k, v in batch.items()})
    return batch[start:stop]
