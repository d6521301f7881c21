"""Quantization of the watermarked model: GPTQ (gptqmodel), LLM.int8 and 4-bit (bitsandbytes) and HQQ (hqq).

GPTQ goes through gptqmodel, auto-gptq's maintained successor: auto-gptq 0.7.1 (the design card's library) does not
import with transformers 5 and refuses to quantize without CUDA. HQQ goes through the ``hqq`` package directly
(transformers' ``HqqConfig`` path is not implemented in 5.17). LLM.int8 goes through bitsandbytes'
``BitsAndBytesConfig(load_in_8bit=True)``, which runs on CPU too.

What is evaluated (``out_dir/model``, also named in the report under ``"evaluated"``):

* GPTQ and HQQ are weight-only schemes whose packed formats need kernels that do not all run on CPU. The library's
  native output is kept in ``out_dir/quantized`` (safetensors) and the evaluated model is a float32 copy made by the
  library's own dequantization (gptqmodel's ``dequantize_model``; hqq's ``HQQLinear.dequantize``): every quantized
  weight is exactly ``scale * (q - zero)``, so the copy computes what the quantized model computes.
* LLM.int8 also decomposes activations at run time (outlier columns above ``threshold`` stay in 16 bit), which a
  dequantized copy would not reproduce, so the evaluated model is the bitsandbytes 8-bit model itself (int8 weights
  and their scales in safetensors), which transformers reloads as ``Linear8bitLt`` layers on CPU or GPU.
* bitsandbytes' 4-bit (NF4, FP4) runs on the CPU too (bitsandbytes 0.46 and later), so as LLM.int8 the evaluated
  model is the 4-bit model itself, reloaded as ``Linear4bit`` layers: what its users run. On a CPU with AVX512-BF16
  bitsandbytes computes those layers in bfloat16 whatever ``compute_dtype`` says (the report says which it was).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from harness.compute.progress import library_output
from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.contract.attack import (
    MODEL,
    QUANTIZED,
    AttackContext,
    CalibrationParams,
    ModelAttack,
    calibration_ids,
    library_versions,
)

log = logging.getLogger(__name__)


def _positive_or_row(value: int) -> int:
    if value == 0:
        raise ValueError("group_size must be positive, or -1 for one group per output row")
    return value


# GPTQ's and AWQ's groups: consecutive input columns of each output row sharing a scale, or -1 for one per row.
RowGroupSize = Annotated[int, Field(ge=-1), AfterValidator(_positive_or_row)]


def group_label(bits: int, group_size: int, default_group: int) -> str:
    label = f"{bits} bits"
    if group_size != default_group:
        label += ", no groups" if group_size == -1 else f", group {group_size}"
    return label


def _config_dtype(model_dir: Path):
    """The dtype a model folder's config.json declares (float32 when it declares none)."""
    import torch

    config = json.loads((Path(model_dir) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise HarnessError(f"model '{model_dir}' declares dtype '{name}', which is not a float dtype")
    return dtype


def linear_shapes(model: str) -> list[tuple[str, int, int]]:
    """``(name, in_features, out_features)`` of every Linear layer of ``model`` but ``lm_head`` (the layers the
    quantizers take), from its config alone: the model is built on the meta device, so no weight loads. Once per
    config in a process: a grid's check asks for the same base model's shapes cell after cell."""
    import torch
    from transformers import AutoModelForCausalLM

    from harness.assets import models

    config = models.config(model)
    key = config.to_json_string()
    if key not in _LINEAR_SHAPES:
        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(config)
        _LINEAR_SHAPES[key] = [
            (name, module.in_features, module.out_features)
            for name, module in built.named_modules()
            if isinstance(module, torch.nn.Linear) and name.split(".")[-1] != "lm_head"
        ]
    return list(_LINEAR_SHAPES[key])


_LINEAR_SHAPES: dict[str, list[tuple[str, int, int]]] = {}  # config JSON -> its shapes


# --- GPTQ ----------------------------------------------------------------------------------------------------------

# What gptqmodel's CPU kernel (TorchLinear) packs, as the pinned gptqmodel 7.6.0 declares it. Importing gptqmodel
# loads its whole model zoo, which would be most of a grid's dry run (and of every settings check) for a lookup in a
# table; another installed version is asked directly, and tests/unit/test_quant.py checks this copy
# against the library.
GPTQ_KERNEL_LIMITS = {
    "7.6.0": {
        "bits": (2, 3, 4, 5, 6, 7, 8),
        "group_size": (-1, 16, 32, 64, 128, 256, 512, 1024),
        "in_features": (1,),
        "out_features": (1,),
        "whole_words_bits": (3, 5, 6, 7),
    }
}
GPTQ_WORD = 32  # codes per packed block of the bit widths that do not divide a 32-bit word


def gptq_kernel_limits(ask_library: bool = False) -> dict[str, tuple[int, ...]]:
    """The bits and group sizes gptqmodel's TorchLinear packs, the numbers a layer's in/out features must be a
    multiple of (one of), and the bits (``whole_words_bits``) whose packing needs both a multiple of ``GPTQ_WORD``:
    5, 6 and 7 bits pack planar blocks of 32 codes (the library says which), and 3 bits, packed 32 codes to three
    words, fails on a layer of another width only as it packs (gptqmodel's ``pack_original``: not declared in its
    limits, so named here)."""
    from importlib.metadata import version

    known = GPTQ_KERNEL_LIMITS.get(version("gptqmodel"))
    if known is not None and not ask_library:
        return known
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.planar_packing import PLANAR_BITS

    return {"bits": tuple(TorchLinear.SUPPORTS_BITS),
            "group_size": tuple(TorchLinear.SUPPORTS_GROUP_SIZE),
            "in_features": tuple(TorchLinear.SUPPORTS_IN_FEATURES_DIVISIBLE_BY),
            "out_features": tuple(TorchLinear.SUPPORTS_OUT_FEATURES_DIVISIBLE_BY),
            "whole_words_bits": tuple(sorted({3, *PLANAR_BITS}))}  # fmt: skip


class GPTQParams(CalibrationParams):
    """GPTQ settings. Calibration defaults to wikitext-2 (Gloaguen et al. calibrate GPTQ on it). The algorithm's
    settings default to auto-gptq's, the library the paper names (gptqmodel is its maintained successor, whose own
    defaults differ): ``sym`` on, ``desc_act`` off, damping 0.01 (gptqmodel: 0.05), and no group-aware reordering
    (``act_group_aware``, a gptqmodel step that auto-gptq lacks)."""

    calib_data: str = "Salesforce/wikitext"
    calib_name: str | None = "wikitext-2-raw-v1"
    bits: int = 4
    group_size: RowGroupSize = 128
    sym: bool = True
    desc_act: bool = False
    damp: float = Field(0.01, gt=0, lt=1)
    act_group_aware: bool = False

    @field_validator("bits")
    @classmethod
    def _packed_bits(cls, value: int) -> int:
        """The bits gptqmodel's CPU kernel packs (the paper's are 4 and 8); gptqmodel itself refuses others only when
        it packs the model, after training and calibration."""
        packed = gptq_kernel_limits()["bits"]
        if value not in packed:
            raise ValueError(f"GPTQ bits must be one gptqmodel packs ({', '.join(map(str, packed))}), not {value}")
        return value


class GPTQ(ModelAttack):
    name = "gptq"
    category = "Quantization"
    label = "GPTQ"
    version = "1"
    Params = GPTQParams
    requires = {"gptqmodel": "quant"}

    def config_label(self) -> str:
        return group_label(self.params.bits, self.params.group_size, 128)

    def data_refs(self) -> dict:
        return {"calibration": self.params.calibration_source()}

    def validate(self, base_model: str | None = None) -> None:
        """The group size and bits that gptqmodel's kernel takes, checked before any work (it refuses others only
        when it packs the model, after training and calibration)."""
        p = self.params
        limits = gptq_kernel_limits()
        if p.group_size not in limits["group_size"]:
            sizes = ", ".join(map(str, limits["group_size"]))
            raise HarnessError(f"GPTQ group_size {p.group_size} is not one gptqmodel packs: use one of {sizes}")
        if base_model is None:
            return
        divisors = {"in_features": limits["in_features"], "out_features": limits["out_features"]}
        if p.bits in limits["whole_words_bits"]:
            divisors = {what: (GPTQ_WORD,) for what in divisors}
        if divisors == {"in_features": (1,), "out_features": (1,)}:
            return  # every shape packs: no need to build the model's skeleton to look
        for name, columns, rows in linear_shapes(base_model):
            for what, size in (("in_features", columns), ("out_features", rows)):
                if not any(size % d == 0 for d in divisors[what]):
                    multiple = " or ".join(map(str, divisors[what]))
                    raise HarnessError(
                        f"GPTQ {p.bits}-bit cannot pack {name}: its {what} ({size}) is not a multiple of {multiple}"
                    )

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        from harness.assets import data

        p = self.params
        # The model's own dtype: gptqmodel would otherwise down-cast a float32 model to bfloat16 (on CPU, always), which
        # would change the layers GPTQ leaves alone (embeddings, norms, lm_head) too.
        dtype = _config_dtype(model_dir)
        # gptqmodel prints a banner, progress bars and per-layer tables: they go to gptqmodel.log in the stage.
        # ... and per-layer logs under ./logs/ of the working directory: run it from the stage folder.
        model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir).resolve()
        with library_output(out_dir / "gptqmodel.log"), contextlib.chdir(out_dir):
            _gptq_quantize(self, model_dir, out_dir, ctx, dtype)
        log.info("GPTQ %d-bit done (gptqmodel's own output is in %s)", p.bits, out_dir / "gptqmodel.log")
        quantized = out_dir / QUANTIZED
        stored = json.loads((quantized / "quantize_config.json").read_text())
        stored.get("meta", {}).pop("offload_to_disk_path", None)  # a scratch path, not a setting
        return {
            "bits": p.bits,
            "group_size": p.group_size,
            "sym": p.sym,
            "desc_act": p.desc_act,
            "damp_percent": p.damp,
            "act_group_aware": p.act_group_aware,
            "compute_dtype": str(dtype).removeprefix("torch."),
            "calibration": {
                "source": p.calibration_source().model_dump(),
                "fingerprint": data.fingerprint(p.calibration_source()),
                "samples": p.calib_samples,
                "length": p.calib_len,
                "seed": p.seed,
            },
            "quantize_config": stored,
            "versions": library_versions("gptqmodel"),
            "evaluated": (
                f"float32 copy of the GPTQ {p.bits}-bit model in {QUANTIZED}/, dequantized by gptqmodel's "
                "dequantize_model"
            ),
        }


# --- LLM.int8 ------------------------------------------------------------------------------------------------------


def _gptq_quantize(attack: GPTQ, model_dir: Path, out_dir: Path, ctx: AttackContext, dtype) -> None:
    """Quantize into ``out_dir/quantized`` with gptqmodel, then dequantize into ``out_dir/model``."""
    # gptqmodel's default CPU worker count is (cores + 1) // 2, i.e. 1 on a 2-core machine; 2 is the setting
    # tested there. An explicit GPTQMODEL_CPU_WORKERS wins.
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, min(12, ((os.cpu_count() or 1) + 1) // 2))))
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.utils.model_dequant import dequantize_model

    from harness.assets.models import load_tokenizer

    p = attack.params
    tokenizer = load_tokenizer(str(model_dir))
    ids = calibration_ids(tokenizer, p)
    calibration = [{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in ids]
    offload = out_dir / "offload"  # gptqmodel's layer offload; removed once the model is saved
    config = QuantizeConfig(
        bits=p.bits,
        group_size=p.group_size,
        sym=p.sym,
        desc_act=p.desc_act,
        damp_percent=p.damp,
        act_group_aware=p.act_group_aware,
        offload_to_disk_path=str(offload),
    )
    quantized = out_dir / QUANTIZED
    try:
        model = GPTQModel.load(str(model_dir), config, device=ctx.device, dtype=dtype)
        model.quantize(calibration, batch_size=1, calibration_sort=None)
        _restore_rope(model.model.config, model_dir)
        model.save(str(quantized))
        del model
    finally:
        shutil.rmtree(offload, ignore_errors=True)
    # gptqmodel's own dequantization of the saved checkpoint (scale * (q - zero) per group) into plain float32.
    dequantize_model(quantized, out_dir / MODEL, target_dtype=torch.float32)
    for leftover in ("quantize_config.json", "quant_log.csv"):  # copied over as "aux" files; not the model's
        (out_dir / MODEL / leftover).unlink(missing_ok=True)


def _restore_rope(config, model_dir: Path) -> None:
    """Put back the model's own RoPE settings where gptqmodel's load added flat keys to a per-layer-type RoPE dict
    (Gemma 3's ``{"sliding_attention": ..., "full_attention": ...}`` gets ``rope_type`` and ``rope_theta`` beside
    them), which transformers then refuses to save ("'str' object has no attribute 'get'"). The weights are not
    touched; a model with one RoPE dict is left as it is."""
    own = json.loads((Path(model_dir) / "config.json").read_text()).get("rope_parameters")
    layer_types = set(getattr(config, "layer_types", None) or ())
    if isinstance(own, dict) and own and set(own) <= layer_types:
        config.rope_parameters = own


class Int8Params(Params):
    """``threshold`` is bitsandbytes' ``llm_int8_threshold``: 0.6 as Gloaguen et al. (the library default is 6.0)."""

    threshold: float = Field(0.6, ge=0)


class Int8(ModelAttack):
    name = "int8"
    category = "Quantization"
    label = "INT8"
    version = "1"
    Params = Int8Params
    requires = {"bitsandbytes": "quant"}

    def config_label(self) -> str:
        label = "8 bits"
        return label if self.params.threshold == 0.6 else f"{label}, threshold {self.params.threshold:g}"

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        from harness.assets.models import load_tokenizer

        config = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=self.params.threshold)
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), quantization_config=config, device_map=ctx.device, dtype="auto", use_safetensors=True
        )
        int8_layers = sum(1 for m in model.modules() if type(m).__name__ == "Linear8bitLt")
        if int8_layers == 0:
            raise HarnessError(f"bitsandbytes quantized no layer of '{model_dir}' to int8")
        model.save_pretrained(out_dir / MODEL, safe_serialization=True)
        load_tokenizer(str(model_dir)).save_pretrained(out_dir / MODEL)
        stored = json.loads((out_dir / MODEL / "config.json").read_text())["quantization_config"]
        return {
            "threshold": self.params.threshold,
            "int8_layers": int8_layers,
            "quantization_config": stored,
            "versions": library_versions("bitsandbytes"),
            "evaluated": (
                f"the bitsandbytes LLM.int8 model itself ({int8_layers} Linear8bitLt layers, int8 weights in "
                f"safetensors, outlier threshold {self.params.threshold:g}), run by bitsandbytes at evaluation"
            ),
        }


# --- bitsandbytes 4-bit --------------------------------------------------------------------------------------------

# bitsandbytes' CPU kernel for 4-bit layers (used on a CPU with AVX512-BF16, when a layer runs without gradients)
# repacks each weight into whole tiles on its first forward: out_features in tiles of 32 rows, in_features in whole
# quantization blocks (transformers' BitsAndBytesConfig quantizes in blocks of 64). Another shape fails there, after
# training and quantization, so it is checked before (bitsandbytes/functional.py, _convert_weight_packed_for_cpu).
BNB_BLOCKSIZE = 64
BNB_CPU_TILE_ROWS = 32


class BnB4Params(Params):
    """bitsandbytes' 4-bit settings, as transformers' ``BitsAndBytesConfig(load_in_4bit=True, ...)`` takes them:
    ``quant_type`` nf4 (QLoRA's NormalFloat, what most 4-bit loads use) or fp4 (bitsandbytes' default), double
    quantization of the blocks' scales (``double_quant``), and the dtype the 4-bit layers compute in (``auto``: the
    model's own dtype, e.g. float32 for the tiny model, bfloat16 for LLaMA-3-8B). The durability study's
    ``bitsandbytes/4bit_qlora`` is nf4 without double quantization, this attack's default: a quantization, no LoRA."""

    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = False
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


class BnB4(ModelAttack):
    name = "bnb-4bit"
    category = "Quantization"
    label = "bnb 4-bit"
    description = "bitsandbytes 4-bit quantization"
    version = "1"
    Params = BnB4Params
    requires = {"bitsandbytes": "quant"}

    def config_label(self) -> str:
        p = self.params
        label = p.quant_type.upper() + (", double quant" if p.double_quant else "")
        return label if p.compute_dtype == "auto" else f"{label}, {p.compute_dtype}"

    def validate(self, base_model: str | None = None) -> None:
        """Where no GPU is visible, the 4-bit layers run on the CPU: bitsandbytes must quantize there (asked of the
        library on a small tensor), and on a CPU with AVX512-BF16 every quantized layer must fit its CPU kernel's
        tiles. Both are checked before any work: bitsandbytes fails on either only when the model first runs."""
        import torch

        if torch.cuda.is_available():
            return
        import bitsandbytes.functional as bnb_functional

        from harness.store.versions import package_versions

        try:
            bnb_functional.quantize_4bit(torch.ones(BNB_BLOCKSIZE, BNB_BLOCKSIZE), quant_type=self.params.quant_type)
        except Exception as err:  # what a bitsandbytes without a CPU backend raises varies by version
            version = package_versions(("bitsandbytes",))["bitsandbytes"]
            first = (str(err).splitlines() or [""])[0]
            raise HarnessError(
                f"bnb-4bit needs a CUDA GPU or a bitsandbytes that quantizes to 4 bits on the CPU (0.46 or later); "
                f"bitsandbytes {version} cannot here: {type(err).__name__}: {first}"
            ) from None
        if base_model is None or not bnb_functional.has_avx512bf16():
            return
        for name, columns, rows in linear_shapes(base_model):
            if columns % BNB_BLOCKSIZE or rows % BNB_CPU_TILE_ROWS:
                raise HarnessError(
                    f"bnb-4bit on this CPU (AVX512-BF16) needs every layer's in_features a multiple of "
                    f"{BNB_BLOCKSIZE} and out_features of {BNB_CPU_TILE_ROWS}: {name} is {columns} -> {rows} "
                    "(use a GPU)"
                )

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        from harness.assets.models import load_tokenizer

        p = self.params
        compute = _config_dtype(model_dir) if p.compute_dtype == "auto" else getattr(torch, p.compute_dtype)
        config = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=p.quant_type,
            bnb_4bit_use_double_quant=p.double_quant,
            bnb_4bit_compute_dtype=compute,
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), quantization_config=config, device_map=ctx.device, dtype="auto", use_safetensors=True
        )
        layers = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
        if not layers:
            raise HarnessError(f"bitsandbytes quantized no layer of '{model_dir}' to 4 bits")
        state = layers[0].weight.quant_state
        if (state.quant_type, state.nested) != (p.quant_type, p.double_quant):
            raise HarnessError(
                f"bitsandbytes quantized to {state.quant_type} (double quantization {state.nested}), not what was asked"
            )
        model.save_pretrained(out_dir / MODEL, safe_serialization=True)
        load_tokenizer(str(model_dir)).save_pretrained(out_dir / MODEL)
        stored = json.loads((out_dir / MODEL / "config.json").read_text())["quantization_config"]
        runs_as = f"in {str(compute).removeprefix('torch.')}"
        if str(ctx.device).startswith("cpu"):
            from bitsandbytes.functional import has_avx512bf16

            if has_avx512bf16():  # (its CPU kernel casts inputs and scales to bfloat16, whatever compute_dtype says)
                runs_as = "in bfloat16 by its AVX512-BF16 CPU kernel on this machine (compute_dtype is not used there)"
        return {
            "quant_type": p.quant_type,
            "double_quant": p.double_quant,
            "compute_dtype": str(compute).removeprefix("torch."),
            "blocksize": state.blocksize,
            "quantized_layers": len(layers),
            "quantization_config": stored,
            "versions": library_versions("bitsandbytes"),
            "evaluated": (
                f"the bitsandbytes 4-bit model itself ({len(layers)} Linear4bit layers, {p.quant_type} codes in blocks "
                f"of {state.blocksize} in safetensors), run by bitsandbytes at evaluation {runs_as}"
            ),
        }


# --- HQQ -----------------------------------------------------------------------------------------------------------


class HQQParams(Params):
    """HQQ settings, as ``hqq.core.quantize.hqq_base_quant_config`` takes them (``axis`` 1: groups of
    ``group_size`` consecutive input columns of each output row, the library's default)."""

    bits: Literal[8, 4, 3, 2, 1] = 4
    group_size: int = Field(64, gt=0)
    axis: Literal[0, 1] = 1

    @field_validator("bits", "axis", mode="before")
    @classmethod
    def _number(cls, value):
        return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value

    @field_validator("group_size")
    @classmethod
    def _multiple_of_8(cls, value: int) -> int:
        if value % 8:
            raise ValueError(f"HQQ group_size must be a multiple of 8, not {value}")
        return value


class HQQ(ModelAttack):
    name = "hqq"
    category = "Quantization"
    label = "HQQ"
    version = "1"
    Params = HQQParams
    requires = {"hqq": "quant"}

    def config_label(self) -> str:
        return group_label(self.params.bits, self.params.group_size, 64)

    def validate(self, base_model: str | None = None) -> None:
        """The group size divides every quantized layer along its axis: checked before any work, on the shapes."""
        if base_model is not None:
            self.check_groups((name, {0: rows, 1: columns}) for name, columns, rows in linear_shapes(base_model))

    def check_groups(self, widths) -> None:
        """``widths``: ``(layer name, {axis: its size along that axis})``."""
        p = self.params
        along = {0: "out_features", 1: "in_features"}[p.axis]
        for name, sizes in widths:
            if sizes[p.axis] % p.group_size:
                raise HarnessError(
                    f"HQQ group_size {p.group_size} does not divide the {along} ({sizes[p.axis]}) of {name}"
                )

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        import torch
        from hqq.core.quantize import HQQLinear, hqq_base_quant_config
        from safetensors.torch import save_file

        from harness.assets.models import load_causal_lm, load_tokenizer

        p = self.params
        model = load_causal_lm(str(model_dir), ctx.device, dtype="float32")
        layers = [
            (name, module)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.split(".")[-1] != "lm_head"  # as hqq's HF models
        ]
        self.check_groups((name, {0: m.out_features, 1: m.in_features}) for name, m in layers)
        quant_config = hqq_base_quant_config(nbits=p.bits, group_size=p.group_size, axis=p.axis)
        tensors, meta = {}, {}
        for name, module in layers:
            hqq_layer = HQQLinear(module, quant_config, del_orig=False, compute_dtype=torch.float32, device=ctx.device)
            with torch.no_grad():
                module.weight.copy_(hqq_layer.dequantize().reshape(module.weight.shape))
            tensors[f"{name}.W_q"] = hqq_layer.W_q.data
            tensors[f"{name}.scale"] = hqq_layer.meta["scale"]
            tensors[f"{name}.zero"] = hqq_layer.meta["zero"]
            if module.bias is not None:
                tensors[f"{name}.bias"] = module.bias.data
            meta[name] = {
                k: (list(v) if k == "shape" else v)
                for k, v in hqq_layer.meta.items()
                if k in ("nbits", "group_size", "axis", "shape", "packing", "view_as_float")
            }
        quantized = out_dir / QUANTIZED
        quantized.mkdir()
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, quantized / "model.safetensors")
        (quantized / "hqq_meta.json").write_text(json.dumps({"quant_config": quant_config, "layers": meta}, indent=1))
        model.save_pretrained(out_dir / MODEL, safe_serialization=True)
        load_tokenizer(str(model_dir)).save_pretrained(out_dir / MODEL)
        return {
            "bits": p.bits,
            "group_size": p.group_size,
            "axis": p.axis,
            "quant_config": quant_config,
            "quantized_layers": len(layers),
            "versions": library_versions("hqq"),
            "evaluated": (
                f"float32 copy of the HQQ {p.bits}-bit model in {QUANTIZED}/ (packed W_q, scale, zero of each "
                "layer), dequantized by hqq's HQQLinear.dequantize"
            ),
        }
