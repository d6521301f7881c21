"""A frozen sentence encoder E: the n-gram embeddings PRO's policy reads, and the meaning a paraphrase kept
(``harness.assets.textsim``). Any encoder loads by reference (a folder, ``package:``, a hub id); pooling and
normalisation are read from its sentence-transformers config, plain encoders use the CLS token.

torch and transformers are imported inside functions and classes so that importing this module stays cheap.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import weakref
from pathlib import Path

# Families that are decoder-only language models: their hidden states are not sentence embeddings.
DECODER_ONLY_TYPES = frozenset(
    {
        "llama", "mistral", "mixtral", "gpt2", "gptj", "gpt_neo", "gpt_neox", "gpt_bigcode", "opt", "phi", "phi3",
        "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2", "gemma3_text", "falcon", "bloom", "mpt", "starcoder2",
        "codegen", "olmo", "olmo2", "stablelm", "persimmon", "cohere", "dbrx", "jamba", "mamba", "rwkv", "xglm",
    }
)  # fmt: skip
GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


def is_sentence_encoder(folder: str) -> str | None:
    """None if ``folder`` (or a hub id) looks like a sentence encoder E can be, else the reason it cannot: its config
    must load, it must not be a decoder / causal LM, and it must have a tokenizer."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as err:
        from harness.config.errors import first_line

        return f"its config does not load ({first_line(err)})"
    generative = [a for a in (config.architectures or []) if a.endswith(GENERATIVE_SUFFIXES)]
    if generative:
        return f"it is a generative model ({generative[0]}), not a sentence encoder"
    if config.model_type in DECODER_ONLY_TYPES:
        return f"its model type '{config.model_type}' is a decoder-only language model, not a sentence encoder"
    if getattr(config, "is_decoder", False):
        return "its config says it is a decoder (is_decoder=true), not a sentence encoder"
    path = Path(folder)
    if path.is_dir():
        if not any((path / f).exists() for f in TOKENIZER_FILES):
            return "it has no tokenizer (no tokenizer.json, tokenizer_config.json or vocab.txt)"
    else:
        from transformers import AutoTokenizer

        try:
            AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError) as err:
            return f"its tokenizer does not load ({type(err).__name__})"
    return None


def pooling_of(folder: str) -> tuple[str, bool]:
    """(pooling, normalize) of an encoder folder: sentence-transformers' ``modules.json`` / ``*_Pooling/config.json``
    when present (mean or cls; ``Normalize`` module -> L2-normalised), else CLS without normalisation (plain
    encoders such as the paper's compositional-bert-large, a SimCSE-style BERT, use the CLS token)."""
    from harness.assets.models import read_json
    from harness.config.errors import HarnessError

    path = Path(folder)
    modules_file = path / "modules.json"
    if not modules_file.exists():
        return "cls", False
    modules = read_json(modules_file, finite=False)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise HarnessError(f"embedding model {folder}: modules.json is not a list of modules")
    pooling, normalize = "cls", False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith(".Pooling"):
            cfg = read_json(path / str(module.get("path", "")) / "config.json")
            if not isinstance(cfg, dict):
                raise HarnessError(f"embedding model {folder}: its pooling config is not a JSON object")
            if cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            else:
                modes = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v]
                raise HarnessError(f"embedding model {folder}: unsupported pooling {modes} (PRO supports mean, cls)")
        elif kind.endswith(".Normalize"):
            normalize = True
    return pooling, normalize


class Embedder:
    """The frozen encoder E with a least-recently-used cache of n-gram embeddings.

    Written by hand rather than through sentence-transformers: one code path serves plain encoders (CLS pooling,
    like the paper's compositional-bert-large) and sentence-transformers folders (pooling and normalisation read from
    their config files), and batching and the n-gram cache are under our control. The cache (on E's device,
    ``harness.assets.ngram_cache``) is keyed by the rows of base-model token ids and the tokenizer that decodes them,
    so each distinct n-gram is decoded and embedded once, across training batches, the anti-watermarked pool (whose
    n-grams generation already embedded) and detection.
    """

    def __init__(
        self, folder: str, device: str = "cpu", cache_size: int = 200_000, batch_size: int = 256, max_length: int = 128
    ):
        import torch
        from transformers import AutoModel, AutoTokenizer

        from harness.assets.models import pickle_allowed

        self.folder = str(folder)
        self.device = torch.device(device)
        self.pooling, self.normalize = pooling_of(self.folder)
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        # safetensors only unless the user passed --allow-pickle (as harness.assets.models.load_causal_lm)
        safetensors_only = None if pickle_allowed() else True
        self.model = AutoModel.from_pretrained(self.folder, use_safetensors=safetensors_only).to(self.device).eval()
        self.model.requires_grad_(False)
        self.dim = int(self.model.config.hidden_size)
        self.cache_size, self.batch_size, self.max_length = cache_size, batch_size, max_length
        self.caches: dict[tuple[str, int], object] = {}  # (tokenizer's hash, n) -> its NgramCache
        self._tokenizers: dict[int, tuple[weakref.ref, str]] = {}  # id(tokenizer) -> (the tokenizer, its hash)
        self.hits = 0
        self.misses = 0

    def embed_texts(self, texts: list[str]):
        """(N, dim) float32 embeddings of ``texts``, in sub-batches of ``batch_size`` padded to their longest."""
        import numpy as np
        import torch

        out = []
        # Longest first, so that each sub-batch pads to about its own length; put back in order at the end.
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        order = np.argsort(-lengths, kind="stable").tolist()
        texts = [texts[i] for i in order]
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**enc).last_hidden_state.float()
                if self.pooling == "mean":
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                else:
                    emb = hidden[:, 0]
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb, dim=-1)
                out.append(emb)
        if not out:
            return torch.zeros(0, self.dim, device=self.device)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        return torch.cat(out)[inverse.to(self.device)].clone()  # clone: a normal tensor, usable by autograd

    def embed_ngrams(self, ngrams, tokenizer):
        """(N, dim) embeddings of n-grams of base-model ids (an (N, n) tensor of ids, or a list of N equal-length
        tuples), each decoded to text with the base ``tokenizer`` (special tokens kept, so distinct n-grams stay
        distinct texts), on E's device. Each distinct n-gram not in the cache is embedded once, in order of first
        appearance; ``hits`` / ``misses`` count distinct n-grams found / not found in the cache. The cache keeps the
        n-grams of each tokenizer (and length) apart: one process may detect PRO on models of several tokenizers
        (a grid, ``harness rescore``), where the same ids are other texts. No Python runs per n-gram
        (``harness.assets.ngram_cache``)."""
        import numpy as np
        import torch

        from harness.assets.ngram_cache import NgramCache, decode_rows, distinct

        rows = torch.as_tensor(ngrams, dtype=torch.long).to(self.device)
        if rows.numel() == 0:
            return torch.zeros(len(rows), self.dim, device=self.device)
        which = (self._fingerprint(tokenizer), rows.shape[1])
        cache = self.caches.get(which)
        if cache is None:
            cache = self.caches[which] = NgramCache(rows.shape[1], self.dim, self.cache_size, self.device)
        keys, firsts, inverse = distinct(rows)
        rows = rows[firsts]  # the distinct n-grams, in order of first appearance
        order = torch.arange(len(rows), device=self.device)
        slots, found, taken = cache.find(keys, rows)
        vectors = torch.empty(len(rows), self.dim, device=self.device)
        vectors[found] = cache.vectors[slots[found]]
        cache.touch(slots[found], order[found])  # hits count as used first, in order, then the misses are added
        todo = (~found).nonzero()[:, 0]
        self.hits += int(found.sum())
        self.misses += len(todo)
        if len(todo):
            texts = decode_rows(tokenizer, rows[todo])
            by_length = np.argsort(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), kind="stable")
            new = self.embed_texts([texts[i] for i in by_length])  # like lengths together: less padding
            vectors[todo[torch.from_numpy(by_length).to(self.device)]] = new
            keep = ~taken[todo]  # (a key another n-gram holds in the cache: embedded, not stored)
            cache.add(keys[todo][keep], rows[todo][keep], vectors[todo][keep], len(rows) + order[todo][keep])
        cache.clock += 2 * len(rows)
        return vectors[inverse]

    @property
    def cached(self) -> int:
        """How many n-gram embeddings the caches hold."""
        return sum(len(cache) for cache in self.caches.values())

    def _fingerprint(self, tokenizer) -> str:
        """What turns ids into text: a hash of ``tokenizer``'s definition (its fast tokenizer's JSON, else its
        vocabulary), worked out once per tokenizer object."""
        known = self._tokenizers.get(id(tokenizer))
        if known is not None and known[0]() is tokenizer:
            return known[1]
        backend = getattr(tokenizer, "backend_tokenizer", None)
        definition = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
        digest = hashlib.sha256(f"{type(tokenizer).__name__}\n{definition}".encode()).hexdigest()[:16]
        self._tokenizers[id(tokenizer)] = (weakref.ref(tokenizer), digest)
        return digest


_SHARED: dict[tuple, Embedder] = {}


def shared_embedder(folder: str, device: str = "cpu", **kwargs) -> Embedder:
    """One Embedder (and so one cache) per encoder folder, device and settings in this process: a caller that asks
    for another batch or cache size gets an embedder that has them (the batch moves an embedding's last bits)."""
    bound = inspect.signature(Embedder).bind(str(folder), str(device), **kwargs)
    bound.apply_defaults()  # the same settings share one embedder, whether given or left to their defaults
    key = tuple(bound.arguments.items())
    if key not in _SHARED:
        _SHARED[key] = Embedder(folder, device, **kwargs)
    return _SHARED[key]
