"""Several processes on one command: ``accelerate launch -m harness run ...`` or ``torchrun --nproc_per_node N -m
harness run ...`` (the launcher sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; torch.distributed does the talking,
through accelerate, which picks NCCL on GPUs and gloo on CPUs).

Every process runs the same pipeline in step. A *collective* stage (training, the fine-tuning attack, generation,
scoring) is computed by all of them: training splits each batch across processes (accelerate wraps the model for DDP,
or shards it with FSDP2), and generation and scoring split the prompts (``map_shards``). Every other stage is built by
the main process alone while the others wait (``solo``). Only the main process writes to the store; what the others
compute is gathered to it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

_solo = 0  # > 0 while the main process builds a stage alone: nothing in it may wait for the other processes


def check_setting() -> None:
    """One line where a launcher's variable is not a whole number (``WORLD_SIZE`` at least 1, ``RANK`` and
    ``LOCAL_RANK`` at least 0), before anything reads it."""
    from harness.config.errors import HarnessError

    for name, least in (("WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)):
        value = os.environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) >= least):
            raise HarnessError(f"{name}={value!r} is not a launcher's setting: a whole number, at least {least}")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's index in the launch; 0 outside one (a stray ``RANK`` without ``WORLD_SIZE`` > 1 means nothing)."""
    return int(os.environ.get("RANK", "0")) if world_size() > 1 else 0


def local_rank() -> int:
    """This process's index on its machine (its GPU)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def active() -> bool:
    """Whether this code runs together with other processes (launched with several, and not inside a solo build)."""
    return world_size() > 1 and _solo == 0


def state():
    """accelerate's process state, which sets up torch.distributed on first use (gloo on a CPU-only machine)."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


@contextlib.contextmanager
def solo() -> Iterator[None]:
    """Within: this process works alone (collectives are off), as the main process does while the others wait."""
    global _solo
    _solo += 1
    try:
        yield
    finally:
        _solo -= 1


def broadcast(value):
    """``value`` as the main process has it (every process must call this at the same point)."""
    if not active():
        return value
    from accelerate.utils import broadcast_object_list

    state()
    return broadcast_object_list([value], from_process=0)[0]


def barrier() -> None:
    if active():
        state().wait_for_everyone()


def shard_bounds(n: int) -> tuple[int, int]:
    """The contiguous slice [start, stop) of ``n`` items that this process handles (sizes differ by at most one)."""
    if not active():
        return 0, n
    size, r = world_size(), rank()
    return r * n // size, (r + 1) * n // size


def map_shards(fn: Callable[[list, int], list], items: list) -> list:
    """``fn(items, 0)``, computed by splitting ``items`` across processes: each calls ``fn(its_slice, start)`` (start:
    the slice's index in ``items``), and every process gets the results of all, in order."""
    start, stop = shard_bounds(len(items))
    mine = fn(items[start:stop], start)
    if not active():
        return mine
    from accelerate.utils import gather_object

    state()
    return gather_object(mine)  # every process's list, concatenated in rank order


def average_gradients(params) -> None:
    """Average the ``.grad`` of ``params`` over the processes: for a model trained beside the one accelerate wraps
    (PRO's policy), so that every process takes the same step, the step one process would take on the whole batch."""
    if not active():
        return
    import torch.distributed as dist

    state()
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world_size()


def total(count: int) -> int:
    """``count`` summed over the processes (itself when alone): e.g. the tokens a loss averages over in the whole batch,
    so that each process can weight its share as one process would weight the whole."""
    if not active():
        return count
    import torch
    import torch.distributed as dist

    value = torch.tensor(count, dtype=torch.long, device=state().device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return int(value.item())


def all_rows(batch):
    """The rows of every process's ``batch`` (a tensor of the same shape in each), stacked in rank order."""
    if not active():
        return batch
    import torch
    import torch.distributed as dist

    state()
    parts = [torch.empty_like(batch) for _ in range(world_size())]
    dist.all_gather(parts, batch.contiguous())
    return torch.cat(parts)
