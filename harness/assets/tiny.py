"""The tiny base model: a byte-level BPE tokenizer and a 3-layer Llama trained briefly on the bundled corpus.

Built once per machine (seeded, deterministic on one machine) and cached under ``$HARNESS_CACHE`` (default
``~/.cache/harness``), in a folder named by a hash of its recipe and corpus, so a changed recipe builds anew.
It is a real if small language model: its continuations of held-out text are English-like, not noise.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from harness.assets import data
from harness.config.errors import HarnessError
from harness.config.settings import DataSource, TrainSettings
from harness.store import files

log = logging.getLogger(__name__)

RECIPE = {
    "version": 1,
    "vocab_size": 4096,
    "model": {
        "hidden_size": 192,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
    "train": {"steps": 600, "batch_size": 8, "seq_len": 128, "lr": 1e-3, "seed": 0},
}
EOS = "<|endoftext|>"


def recipe_hash() -> str:
    corpus = data.fingerprint(DataSource(path=data.TINY_CORPUS))
    blob = json.dumps({"recipe": RECIPE, "corpus": corpus}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


TINY_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def tiny_lm_built() -> bool:
    return files.is_built(files.cache_root() / f"tiny-lm-{recipe_hash()}", TINY_FILES)


def tiny_lm() -> Path:
    """Folder of the tiny model and tokenizer, building it first if this machine has none. One process builds it
    while others wait for it (a lock per recipe); an interrupted build leaves nothing behind."""
    folder = files.cache_root() / f"tiny-lm-{recipe_hash()}"
    return files.build_once(folder, TINY_FILES, "the tiny base model", build)


def planned_config(recipe: dict = RECIPE, **special_ids):
    """The config of a model of ``recipe``, known before it is built: its layers, context length and vocabulary size.
    ``build_lm`` makes its model from this, with its tokenizer's ``special_ids`` (bos/eos/pad_token_id)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=recipe["vocab_size"], **special_ids, **recipe["model"])


def build_tokenizer(texts: list[str], vocab_size: int = RECIPE["vocab_size"]):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS, pad_token=EOS)


def build(out: Path) -> dict:
    """Train the tokenizer and the model into ``out``; return what was measured."""
    return build_lm(out, RECIPE, data.load_texts(DataSource(path=data.TINY_CORPUS, split="train")), "tiny base model")


def build_lm(out: Path, recipe: dict, texts: list[str], desc: str, device: str | None = None) -> dict:
    """A byte-level BPE of ``recipe["vocab_size"]`` and a Llama of ``recipe["model"]`` trained on ``texts`` with
    ``recipe["train"]`` (TrainSettings), saved into ``out``; returns what was measured. Shared by the tiny and the
    small presets' models (harness/assets/small.py)."""
    import torch
    from transformers import LlamaForCausalLM

    from harness.compute.training import loss_step, train

    tokenizer = build_tokenizer(texts, recipe["vocab_size"])
    if len(tokenizer) != recipe["vocab_size"]:  # what planned_config promised the checks before the build
        raise HarnessError(
            f"{desc}: the corpus gave a BPE of {len(tokenizer)} tokens, not the recipe's {recipe['vocab_size']}"
        )
    tokenizer.save_pretrained(out)
    stream = data.token_stream(tokenizer, texts)

    torch.manual_seed(recipe["train"]["seed"])
    eos = tokenizer.eos_token_id
    config = planned_config(recipe, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model = LlamaForCausalLM(config)
    settings = TrainSettings(**recipe["train"])
    batches = data.training_batches(tokenizer, stream, settings)
    log_ = train(model, loss_step(lambda m, b: m(input_ids=b, labels=b).loss), batches, settings, desc, device)
    model.save_pretrained(out, safe_serialization=True)
    return {
        "recipe": recipe,
        "corpus_tokens": len(stream),
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        **{k: v for k, v in log_.items() if k != "losses"},
    }
