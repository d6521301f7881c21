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


def random_llama_config(vocab: int, hidden: int = 576, layers: int = 4, device: str = "cpu"):
    """A Llama of SmolLM2-135M's width (its heads and MLP ratio; tied embeddings, as SmolLM2 and Gemma 3) with
    ``layers`` layers and a vocabulary of ``vocab`` tokens, seeded random weights, in eval mode: for figures that grow
    with the vocabulary (``pro_memory.py``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden // 64)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 3),
                         tie_word_embeddings=True, max_position_embeddings=2048, eos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config).eval()
