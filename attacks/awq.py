"""AWQ (activation-aware weight quantization) of the watermarked model through llm-compressor: its ``AWQModifier``
(which rescales each layer's input channels by how large their calibration activations are, folding the inverse
scales into the layer before) followed by its ``QuantizationModifier`` (round-to-nearest integer weights in groups),
both in one ``oneshot`` call, as llm-compressor's AWQ examples do. Most AWQ checkpoints on the hub are made this way
(or with AutoAWQ, which llm-compressor replaces).

The result is saved in compressed-tensors' ``pack-quantized`` format (``out_dir/quantized``: int4 codes packed into
int32, a scale and zero point per group), as llm-compressor writes it. That format has no CPU kernel: transformers
decompresses it to float whatever the device. The evaluated model (``out_dir/model``) is the float32 copy that
compressed-tensors' own decompression makes of it (transformers' ``CompressedTensorsConfig(dequantize=True)``): every
quantized weight is ``scale * (q - zero)`` and every tensor AWQ rescaled (the norms before the attention and MLP
projections) is as AWQ left it, so the copy computes what the quantized model computes.

llm-compressor 0.14's AWQ pins its cached activations in page-locked memory for faster copies to a GPU, which fails
on a machine without one (``Cannot access accelerator device``); there, pinning is skipped (nothing else changes: the
tensors are the same). As for pruning, the compression session is reset before and after ``oneshot``.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from attacks.quant import RowGroupSize, group_label
from harness.compute.progress import library_output
from harness.config.errors import HarnessError
from harness.contract.attack import (
    MODEL,
    QUANTIZED,
    AttackContext,
    CalibrationParams,
    ModelAttack,
    calibration_ids,
    library_versions,
)

IGNORE = ["lm_head"]  # as llm-compressor's AWQ examples: the output projection stays in float
QUANT_KEYS = ("weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape")  # compressed-tensors' own


class AWQParams(CalibrationParams):
    """AWQ settings. The defaults are llm-compressor's ``W4A16_ASYM`` scheme (4-bit integers, asymmetric, groups of
    128 input columns; -1 is one group per output row) and its ``AWQModifier`` defaults (``duo_scaling``: scales
    from activations and weights, a grid of ``n_grid`` points). Calibration as GPTQ's (``calib_*``; C4 by default)."""

    bits: Literal[4, 8] = 4
    group_size: RowGroupSize = 128
    sym: bool = False
    duo_scaling: bool | Literal["both"] = True
    n_grid: int = Field(20, gt=0)

    @field_validator("bits", mode="before")
    @classmethod
    def _number(cls, value):
        return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value

    @field_validator("duo_scaling", mode="before")
    @classmethod
    def _duo(cls, value):
        """One error for a bad value (not one per member of the union)."""
        if isinstance(value, str):
            word = value.strip().lower()
            known = {"both": "both", "true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
            if word not in known:
                raise ValueError(f"duo_scaling must be true, false or both, not {value!r}")
            return known[word]
        return value


class AWQ(ModelAttack):
    name = "awq"
    category = "Quantization"
    label = "AWQ"
    description = "AWQ quantization (llm-compressor)"
    version = "1"
    Params = AWQParams
    requires = {"llmcompressor": "quant"}

    def config_label(self) -> str:
        p = self.params
        return group_label(p.bits, p.group_size, 128) + (", sym" if p.sym else "")

    def data_refs(self) -> dict:
        return {"calibration": self.params.calibration_source()}

    def validate(self, base_model: str | None = None) -> None:
        """Before any work: llm-compressor knows which layers AWQ balances in the base model's architecture, and the
        group size divides the input width of every layer it quantizes (llm-compressor refuses others only once
        calibration starts: llmcompressor/modifiers/quantization/group_size_validation.py, whose rule this is)."""
        if base_model is None:
            return
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        from harness.assets import models

        # The class llm-compressor looks its mappings up by: the one AutoModelForCausalLM loads the model as.
        model_type = models.config(base_model).model_type
        architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, f"a {model_type} model")
        with library_output(os.devnull):  # (llm-compressor logs to stdout as it is imported)
            from llmcompressor.modifiers.transform.awq.dynamic_mappings import AWQ_DYNAMIC_MAPPING_REGISTRY
            from llmcompressor.modifiers.transform.awq.mappings import AWQ_MAPPING_REGISTRY

        known = set(AWQ_MAPPING_REGISTRY) | set(AWQ_DYNAMIC_MAPPING_REGISTRY)
        if architecture not in known:
            raise HarnessError(
                f"AWQ: llm-compressor has no AWQ layer mappings for {architecture} "
                f"(it knows {len(known)} architectures, e.g. LlamaForCausalLM, Qwen2ForCausalLM)"
            )
        group = self.params.group_size
        if group == -1:
            return
        from attacks.quant import linear_shapes

        for name, columns, _ in linear_shapes(base_model):
            if columns >= group and columns % group:
                raise HarnessError(f"AWQ group_size {group} does not divide the in_features ({columns}) of {name}")

    def recipe(self):
        """Fresh llm-compressor modifiers: AWQ's smoothing, then the quantization it smooths for."""
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
        from llmcompressor.modifiers.quantization import QuantizationModifier
        from llmcompressor.modifiers.transform.awq import AWQModifier

        p = self.params
        strategy = {"strategy": "channel"} if p.group_size == -1 else {"strategy": "group", "group_size": p.group_size}
        weights = QuantizationArgs(num_bits=p.bits, type="int", symmetric=p.sym, **strategy)
        scheme = QuantizationScheme(targets=["Linear"], weights=weights)
        return [
            AWQModifier(duo_scaling=p.duo_scaling, n_grid=p.n_grid),
            QuantizationModifier(config_groups={"group_0": scheme}, ignore=IGNORE),
        ]

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        from harness.assets import data
        from harness.assets.models import load_causal_lm, load_tokenizer
        from harness.compute.training import save_model

        p = self.params
        tokenizer = load_tokenizer(str(model_dir))
        ids = calibration_ids(tokenizer, p)
        # Loaded on the CPU: llm-compressor's sequential pipeline moves each layer to the GPU (where there is one)
        # while calibrating, and back.
        model = load_causal_lm(str(model_dir), "cpu", dtype="float32")
        quantized = out_dir / QUANTIZED
        with library_output(out_dir / "llmcompressor.log"):
            recipe = self._oneshot(model, tokenizer, ids)
            model.save_pretrained(quantized, save_compressed=True)  # llm-compressor's save: compressed-tensors
        tokenizer.save_pretrained(quantized)
        stored = json.loads((quantized / "config.json").read_text())["quantization_config"]
        if stored.get("format") != "pack-quantized":
            raise HarnessError(f"llm-compressor wrote format {stored.get('format')!r}, not pack-quantized")
        del model
        with library_output(out_dir / "llmcompressor.log"):
            copy, layers = _dequantized(quantized, load_causal_lm(str(model_dir), "cpu", dtype="float32"))
        save_model(copy, out_dir / MODEL, tokenizer)
        return {
            "bits": p.bits,
            "group_size": p.group_size,
            "sym": p.sym,
            "duo_scaling": p.duo_scaling,
            "n_grid": p.n_grid,
            "recipe": recipe,
            "ignore": IGNORE,
            "quantized_layers": layers,
            "calibration": {
                "source": p.calibration_source().model_dump(),
                "fingerprint": data.fingerprint(p.calibration_source()),
                "samples": p.calib_samples,
                "length": p.calib_len,
                "seed": p.seed,
                "shape": list(ids.shape),
            },
            "quantization_config": stored,
            "versions": library_versions("llmcompressor", "compressed-tensors"),
            "evaluated": (
                f"float32 copy of the AWQ {p.bits}-bit model (compressed-tensors pack-quantized, in {QUANTIZED}/), "
                "dequantized by compressed-tensors' decompression"
            ),
        }

    def _oneshot(self, model, tokenizer, ids) -> list[dict]:
        """AWQ and quantization of ``model`` in place, with fresh modifiers and a reset session; returns the
        modifiers' settings."""
        import torch
        from datasets import Dataset
        from llmcompressor import oneshot
        from llmcompressor.core import reset_session

        dataset = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * ids.shape[1]] * ids.shape[0]})
        recipe = self.recipe()
        reset_session()
        try:
            with _no_pinning_without_accelerator(torch):
                oneshot(
                    model=model,
                    tokenizer=tokenizer,
                    recipe=recipe,
                    dataset=dataset,
                    num_calibration_samples=ids.shape[0],
                    max_seq_length=ids.shape[1],
                    shuffle_calibration_samples=False,  # the windows are already drawn with the seed
                    batch_size=1,
                    pipeline="sequential",
                )
        finally:
            reset_session()
        awq, quantization = recipe
        return [
            {"modifier": type(awq).__name__, "duo_scaling": awq.duo_scaling, "n_grid": awq.n_grid},
            {
                "modifier": type(quantization).__name__,
                "config_groups": {k: v.model_dump(mode="json") for k, v in quantization.config_groups.items()},
                "ignore": list(quantization.ignore),
            },
        ]


@contextlib.contextmanager
def _no_pinning_without_accelerator(torch):
    """Skip llm-compressor's pinning of cached activations where no accelerator is visible: page-locked memory exists
    only for copies to one, and torch refuses to pin without one. Pinning changes no value."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        yield
        return
    pin = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = pin


def _dequantized(quantized: Path, plain):
    """``plain`` (the unquantized model, float32) with every tensor replaced by compressed-tensors' decompression of
    the checkpoint in ``quantized``; returns it and the names of the quantized layers."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    loaded = AutoModelForCausalLM.from_pretrained(
        str(quantized), quantization_config=CompressedTensorsConfig(dequantize=True), dtype="float32"
    )
    state = loaded.state_dict()
    layers = sorted(k.removesuffix(".weight_scale") for k in state if k.endswith(".weight_scale"))
    if not layers:
        raise HarnessError(f"the AWQ checkpoint in '{quantized}' holds no quantized layer")
    weights = {k: v for k, v in state.items() if k.rpartition(".")[2] not in QUANT_KEYS}
    plain.load_state_dict(weights, strict=True)  # every tensor of the model, none left over
    return plain, layers
