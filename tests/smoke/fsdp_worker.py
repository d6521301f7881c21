"""Run by tests/smoke/test_fsdp.py under torchrun (or alone): three AdamW steps of a causal LM, the first with
gradient masks (Gloaguen-KGW's), the last through PRO's FPL gradient, then ``training.save_model``. With several
processes the model is sharded by FSDP2 (``fully_shard``, as accelerate does on GPUs) and each process takes its rows
of every batch.

Usage: python fsdp_worker.py MODEL_FOLDER OUT_FOLDER"""

import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from harness.compute import distributed
from harness.compute.training import mask_gradients, my_rows, placed_like, save_model
from methods.pro_policy import fpl_gradients


def main(model_folder: str, out: str) -> None:
    if distributed.world_size() > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32)
    vocab = model.config.vocab_size
    batches = [torch.randint(3, vocab, (4, 12)) for _ in range(4)]
    masks = {name: torch.rand(p.shape) < 0.5 for name, p in model.named_parameters()}
    if distributed.world_size() > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    # No weight decay: a weight moves only where a gradient reached it (the test's "did not train" check).
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    lm_loss = lambda m, ids: m(input_ids=ids, labels=ids).loss  # noqa: E731

    placed = placed_like(model, masks)
    lm_loss(model, my_rows(batches[0])).backward()
    mask_gradients(model, placed)
    optimizer.step()
    optimizer.zero_grad()
    lm_loss(model, my_rows(batches[1])).backward()
    optimizer.step()
    optimizer.zero_grad()
    sim, anti = my_rows(batches[2]), my_rows(batches[3])
    # As PRO's step calls it: the L_sim forward has run before (under FSDP2 the root module's parameters are then the
    # gathered ones, freed by the backward).
    sim_loss = lm_loss(model, sim)
    fpl_gradients(model, lambda m: sim_loss, lambda m: lm_loss(m, anti), alpha=0.1, beta=0.5)
    optimizer.step()
    save_model(model, out)
    if distributed.world_size() > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
