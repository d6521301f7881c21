"""Random-weight models of real shapes for the speed benchmarks (SPEC section 7 times random weights): speed depends
on the shape, not on the weights, and no real checkpoint of these sizes can be loaded offline here."""

from __future__ import annotations

# The Llama-3.2-1B shape (untied, SPEC section 7's anchor) and SmolLM2-135M's (tied, the real LLM every machine has).
SHAPES = {
    "llama-1b": {"vocab_size": 128_256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "smollm2-135m": {"vocab_size": 49_152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True},
}  # fmt: skip


def random_llama(shape: str, device: str = "cpu", dtype=None):
    """A Llama of ``shape`` with seeded random weights, in eval mode on ``device`` (its parameters in ``dtype``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a 1.5B model's CPU init takes longer than its benchmark
        model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=2048, eos_token_id=2, **SHAPES[shape]))
    return model.to(dtype=dtype).eval() if dtype is not None else model.eval()
