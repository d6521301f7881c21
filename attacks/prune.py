"""Unstructured pruning of the watermarked model with Wanda or SparseGPT, through llm-compressor's ``oneshot``.

Every ``torch.nn.Linear`` of every decoder layer (the attention and MLP projections) is pruned to ``sparsity``;
``lm_head``, the embeddings and the norms stay bit-identical (checked). The modifier targets the decoder layers, not
``Linear``: with ``targets=["Linear"]`` llm-compressor 0.14 names each module ``<name>.`` (trailing dot), so an
``ignore`` of ``lm_head`` matches nothing and lm_head is pruned as well. Calibration uses ``calib_samples``
windows of ``calib_len`` tokens (``harness.contract.attack.calibration_ids``), fed to ``oneshot`` already
tokenized, in a fixed order. The evaluated model is the pruned one saved densely: plain safetensors with the pruned
weights stored as zeros (no compressed-tensors sparse format), loadable by plain ``transformers``.

The sparsity of every pruned layer is measured on the result and reported. A layer left less sparse than the
setting asks for (e.g. a target pattern that matched nothing) is an error, never a silent unpruned "attack".
Wanda prunes exactly ``int(in_features * sparsity)`` weights of each row; SparseGPT (as the reference code) prunes
the weights at or below the threshold of each block of ``block_size`` columns, i.e. ``int(block numel * sparsity)
+ 1`` per block (barring ties), so its measured sparsity is a hair above the setting.

llm-compressor keeps a global compression session (llm-compressor issue #1358: stale state across calls in one
process). Each call resets that session before and after ``oneshot`` and builds fresh modifiers, so calls are pure
functions of their inputs.
"""

from __future__ import annotations

import shutil
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from harness.compute.progress import library_output
from harness.contract.attack import (
    MODEL,
    AttackContext,
    CalibrationParams,
    ModelAttack,
    calibration_ids,
    library_versions,
)

TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "added_tokens.json",
    "chat_template*",
)
MASK_STRUCTURE = "0:0"  # unstructured
IGNORE = ["re:.*lm_head"]  # a second guard: lm_head is in no decoder layer


class PruneParams(CalibrationParams):
    sparsity: float = Field(0.5, ge=0, lt=1)


class _Prune(ModelAttack):
    """What Wanda and SparseGPT share: the calibration data, the ``oneshot`` call, saving and measuring."""

    category = "Pruning"
    version = "1"
    Params = PruneParams
    requires = {"llmcompressor": "prune"}
    modifier_name: ClassVar[str]  # llm-compressor's modifier class

    def config_label(self) -> str:
        return f"rho={self.params.sparsity:g}"

    def data_refs(self) -> dict:
        return {"calibration": self.params.calibration_source()}

    def make_modifier(self, layer_classes: list[str]):
        """A fresh llm-compressor modifier. Its ``targets`` are the decoder layers, within which it prunes every
        Linear: targeting ``Linear`` itself makes it name each module ``<name>.``, which no ``ignore`` name matches,
        so lm_head gets pruned too."""
        import llmcompressor.modifiers.pruning as pruning

        return getattr(pruning, self.modifier_name)(
            sparsity=self.params.sparsity, mask_structure=MASK_STRUCTURE, targets=layer_classes, ignore=IGNORE
        )

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        import torch
        from llmcompressor.utils.pytorch.module import infer_sequential_targets

        from harness.assets import data
        from harness.assets.models import load_causal_lm, load_tokenizer
        from harness.config.errors import HarnessError

        p = self.params
        out = out_dir / MODEL
        tokenizer = load_tokenizer(str(model_dir))
        ids = calibration_ids(tokenizer, p)
        # Loaded on the CPU: llm-compressor's sequential pipeline moves each layer to its main device
        # (the GPU when torch sees one) while calibrating, and back.
        model = load_causal_lm(str(model_dir), "cpu")
        layer_classes = list(infer_sequential_targets(model))  # the decoder layer class(es), e.g. LlamaDecoderLayer
        targets = {
            f"{layer_name}.{name}": module
            for layer_name, layer in model.named_modules()
            if type(layer).__name__ in layer_classes
            for name, module in layer.named_modules()
            if isinstance(module, torch.nn.Linear)
        }
        if not targets:
            raise HarnessError(f"attack '{self.name}': the model has no Linear layer in a {layer_classes} to prune")
        kept = {n: t.detach().clone() for n, t in model.named_parameters() if n.rpartition(".")[0] not in targets}
        start = time.perf_counter()
        settings: dict = {"sparsity": p.sparsity, "note": "sparsity 0: the model is saved unchanged"}
        if p.sparsity > 0:
            settings = self._oneshot(model, tokenizer, ids, layer_classes, out_dir / "llmcompressor.log")
        seconds = time.perf_counter() - start
        params = dict(model.named_parameters())
        changed = [n for n, t in kept.items() if not torch.equal(params[n], t)]
        if changed:
            raise HarnessError(
                f"attack '{self.name}' changed {len(changed)} parameters it must leave, e.g. {changed[0]}"
            )
        layers = {name: _sparsity(module.weight) for name, module in targets.items()}
        short = [
            name
            for name, module in targets.items()
            if layers[name]["zeros"] < module.weight.shape[0] * int(module.weight.shape[1] * p.sparsity)
        ]
        if short:
            raise HarnessError(
                f"attack '{self.name}' left {len(short)} of {len(targets)} Linear layers below sparsity {p.sparsity} "
                f"(e.g. {short[0]}: {layers[short[0]]['sparsity']:.4f}); nothing was written"
            )
        type(model).save_pretrained(model, out, safe_serialization=True)  # the class's, not oneshot's compressing one
        for file in sorted(Path(model_dir).iterdir()):
            if file.is_file() and any(fnmatch(file.name, pattern) for pattern in TOKENIZER_FILES):
                shutil.copy2(file, out / file.name)
        zeros, total = sum(v["zeros"] for v in layers.values()), sum(v["numel"] for v in layers.values())
        return {
            "method": self.label,
            "library": "llmcompressor.oneshot",
            "modifier": self.modifier_name,
            "settings": settings,
            "calibration": {
                **{k: v for k, v in p.model_dump().items() if k != "sparsity"},
                "shape": list(ids.shape),
                "fingerprint": data.fingerprint(p.calibration_source()),
            },
            "pruned_layers": layers,
            "sparsity_overall": zeros / total,
            "untouched": sorted(kept),  # checked bit-identical: embeddings, norms, lm_head
            "seconds": round(seconds, 2),
            "versions": library_versions("llmcompressor", "compressed-tensors"),
            "evaluated": "the pruned model (dense weights with zeros)",
        }

    def _oneshot(self, model, tokenizer, ids, layer_classes: list[str], log_file: Path) -> dict:
        """Prune ``model`` in place with a fresh modifier and a reset session; return the settings used."""
        from compressed_tensors.offload import remove_dispatch
        from datasets import Dataset
        from llmcompressor import oneshot
        from llmcompressor.core import reset_session
        from llmcompressor.utils.dev import get_main_device

        dataset = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * ids.shape[1]] * ids.shape[0]})
        modifier = self.make_modifier(layer_classes)
        call = {
            "num_calibration_samples": ids.shape[0],
            "max_seq_length": ids.shape[1],
            "shuffle_calibration_samples": False,  # the windows are already drawn with the seed
            "batch_size": 1,
            "pipeline": "sequential",
        }
        # llm-compressor's progress bars and logs (its session resets' too) go to a file in the stage.
        with library_output(log_file):
            reset_session()
            try:
                oneshot(model=model, tokenizer=tokenizer, recipe=modifier, dataset=dataset, **call)
                device = str(get_main_device())  # it warns when it finds no accelerator
            finally:
                reset_session()
                remove_dispatch(model)
        return {
            **modifier.model_dump(
                include={
                    "sparsity",
                    "mask_structure",
                    "targets",
                    "ignore",
                    "block_size",
                    "dampening_frac",
                    "sparsity_profile",
                    "owl_m",
                    "owl_lmbda",
                }
            ),
            "oneshot": call,
            "device": device,
        }


def _sparsity(weight) -> dict:
    zeros, numel = int((weight == 0).sum()), weight.numel()
    return {"zeros": zeros, "numel": numel, "sparsity": zeros / numel}


class Wanda(_Prune):
    name = "wanda"
    label = "Wanda"
    modifier_name = "WandaPruningModifier"


class SparseGPT(_Prune):
    name = "sparsegpt"
    label = "SparseGPT"
    modifier_name = "SparseGPTModifier"
