"""LoRA fine-tuning of the watermarked model through peft, as most fine-tunes of open models are made: low-rank
adapters on the attention and MLP projections train on instruction data (or on plain human text: a scrubbing
fine-tune, attacks/finetune.py) while every base weight stays frozen. At each requested step the adapters are merged
into a copy of the weights (peft's ``merge_and_unload``, so training goes on), and the merged model is what is saved
and evaluated, as users release it. One training run writes a checkpoint per requested step, each its own table row,
as ``finetune`` does, whose datasets, examples and training loop (``attacks.finetune.tune``) it shares.

QLoRA (``qlora=true``): the adapters train on a 4-bit NF4 copy of the weights with double quantization (bitsandbytes,
through peft's ``prepare_model_for_kbit_training``), and are merged into the float32 watermarked weights, as QLoRA
fine-tunes are released (merging into the 4-bit weights would re-round every targeted weight: a quantization attack on
top). Where bitsandbytes' 4-bit does not run on the device, the attack says so before any work. It is not the
durability study's ``4bit_qlora`` row, which trains nothing: that is ``bnb-4bit`` with nf4 (docs/attacks.md: the
durability study's rows).

Defaults are Gloaguen et al.'s LoRA (r 16, alpha 32, dropout 0.1, lr 2e-5, effective batch 32) on every projection of
a Llama block; they adapt the attention projections alone (``target_modules=q_proj,k_proj,v_proj,o_proj``).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from attacks.finetune import FineTune, FineTuneParams, checkpoint, tune
from harness.config.errors import HarnessError, first_line
from harness.contract.attack import AttackContext
from harness.contract.plugin import Sweep

LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRAParams(FineTuneParams):
    rank: int = Field(16, gt=0)  # r: each adapted weight W becomes W + (alpha / r) B A, B A of rank <= r
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.1, ge=0, lt=1)  # on the adapters' input, while training
    target_modules: tuple[str, ...] = LLAMA_PROJECTIONS  # the linear layers adapted, by name: q_proj,v_proj
    qlora: bool = False  # train on a 4-bit NF4 copy of the weights (bitsandbytes), merge into the float32 ones

    @field_validator("target_modules", mode="before")
    @classmethod
    def _split_modules(cls, value):
        if isinstance(value, str):
            return tuple(part.strip() for part in value.replace(";", ",").split(",") if part.strip())
        return value

    @field_validator("target_modules")
    @classmethod
    def _check_modules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("give at least one module to adapt, e.g. q_proj,v_proj")
        bad = [name for name in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise ValueError(f"target modules are a layer's own name (e.g. q_proj), not {', '.join(map(repr, bad))}")
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"target module {', '.join(twice)} given twice")
        return value


class LoRA(FineTune):
    name = "lora"
    category = "Finetuning"
    label = "LoRA"
    description = "LoRA fine-tuning steps s"
    sweep = Sweep("fine-tuning steps", "Fine-tuning on {label}", panels=True)  # x: the step of each checkpoint
    version = "1"
    Params = LoRAParams
    requires = {"peft": "lora"}
    # The main process trains alone: the frozen weights and the adapters fit where the model is evaluated, and each
    # merge copies the whole model, which sharded training would first have to gather.
    collective = False

    def table_label(self) -> str:
        kind = "QLoRA" if self.params.qlora else "LoRA"
        return f"{self.data.label}, {kind} r={self.params.rank}"

    def validate(self, base_model: str | None = None) -> None:
        """QLoRA's 4-bit runs on this device, and every target module is a linear layer of the base model at least
        ``rank`` wide (judged on its config's shapes, no weight loaded). (Whole batches: the main process trains
        alone, so no batch need split across processes.)"""
        if self.params.qlora:
            from harness.assets.models import default_device

            check_4bit(default_device())
        if base_model is not None:
            targeted_layers(base_model, self.params)

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        import copy

        import torch
        from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

        from harness.assets.models import load_causal_lm, load_tokenizer
        from harness.compute.training import save_model

        p = self.params
        tokenizer = load_tokenizer(str(model_dir))
        config = LoraConfig(r=p.rank, lora_alpha=p.alpha, lora_dropout=p.dropout, target_modules=list(p.target_modules),
                            bias="none", task_type="CAUSAL_LM")  # fmt: skip
        weights = load_causal_lm(str(model_dir), "cpu", dtype="float32")  # what each checkpoint's adapters merge into
        if p.qlora:
            check_4bit(ctx.device)
        base = load_4bit(model_dir, ctx.device) if p.qlora else copy.deepcopy(weights).to(ctx.device)
        with torch.random.fork_rng():  # the adapters' initial values, drawn from the seed alone
            torch.manual_seed(p.seed)
            model = get_peft_model(base, config)
        adapted = [name for name, module in model.named_modules() if hasattr(module, "lora_A") and module.lora_A]
        trainable = sum(param.numel() for param in model.parameters() if param.requires_grad)

        def save(step: int, unwrapped) -> None:
            adapters = {k: v.detach().to("cpu") for k, v in get_peft_model_state_dict(unwrapped).items()}
            # peft draws a fresh adapter's initial values from torch's generator: draw them aside, so that the
            # training's dropout after this step is the same whichever steps were asked for.
            with torch.random.fork_rng(devices=[]):
                release = get_peft_model(copy.deepcopy(weights), config)
            result = set_peft_model_state_dict(release, adapters)
            if result.unexpected_keys:
                raise RuntimeError(f"lora: adapter weights {result.unexpected_keys[:3]} found no layer to merge into")
            save_model(release.merge_and_unload(), out_dir / checkpoint(step), tokenizer)

        kind = "QLoRA (NF4 4-bit base, double quantization)" if p.qlora else "LoRA"
        evaluated = f"the float32 weights with the {kind} adapters merged in (peft merge_and_unload) at each step"
        versions = ("peft", "bitsandbytes") if p.qlora else ("peft",)
        report = tune(model, tokenizer, p, self.data, ctx.device, "LoRA fine-tune", save, evaluated, versions)
        return {
            **report,
            "adapters": {
                "rank": p.rank,
                "alpha": p.alpha,
                "scaling": p.alpha / p.rank,
                "dropout": p.dropout,
                "target_modules": list(p.target_modules),
                "adapted_layers": len(adapted),
                "trainable_parameters": trainable,
                "base": "bitsandbytes NF4 4-bit, double quantization, float32 compute" if p.qlora else "float32",
            },
        }


def targeted_layers(base_model: str, p: LoRAParams) -> list[tuple[str, int, int]]:
    """``(name, in_features, out_features)`` of the linear layers of ``base_model`` that ``p`` adapts (lm_head
    aside, as quant.linear_shapes lists them); a one-line error if a target module names none of them or ``rank``
    exceeds a targeted layer's width (a rank-r update of a layer narrower than r is no more than full rank)."""
    from attacks.quant import linear_shapes

    shapes = linear_shapes(base_model)
    present = {name.split(".")[-1] for name, _, _ in shapes}
    missing = [name for name in p.target_modules if name not in present]
    if missing:
        raise HarnessError(
            f"lora target module {', '.join(missing)} is no linear layer of {base_model}: its linear layers are "
            f"{', '.join(sorted(present))}"
        )
    targeted = [shape for shape in shapes if shape[0].split(".")[-1] in p.target_modules]
    name, columns, rows = min(targeted, key=lambda shape: min(shape[1], shape[2]))
    if p.rank > min(columns, rows):
        raise HarnessError(
            f"lora rank {p.rank} is above the width of {name} ({columns} -> {rows}): use a rank of at most "
            f"{min(columns, rows)}, or leave {name.split('.')[-1]} out of target_modules"
        )
    return targeted


def check_4bit(device: str) -> None:
    """A one-line error naming what QLoRA needs unless bitsandbytes' 4-bit NF4 runs on ``device``: tried on a small
    matrix (quantize, a 4-bit matmul and its backward), since which devices it supports depends on its version and
    build, and only the library knows."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise HarnessError(
            "lora with qlora=true needs bitsandbytes (0.50 or later on a CPU, or a CUDA GPU): "
            "pip install 'watermark-harness[quant]'"
        )
    import bitsandbytes
    import torch
    from bitsandbytes import functional

    try:
        weight = torch.linspace(-1, 1, 8 * 64, device=device).reshape(8, 64)
        packed, state = functional.quantize_4bit(weight, quant_type="nf4", compress_statistics=True)
        inputs = torch.ones(2, 64, device=device, requires_grad=True)
        out = bitsandbytes.matmul_4bit(inputs, packed.t(), quant_state=state)
        out.sum().backward()
        works = out.shape == (2, 8) and bool(torch.isfinite(out).all()) and inputs.grad is not None
        problem = "it computed no finite 4-bit product"
    except Exception as err:  # bitsandbytes raises many kinds for "no kernel for this device"
        works, problem = False, first_line(err)
    if not works:
        raise HarnessError(
            f"lora with qlora=true: bitsandbytes {bitsandbytes.__version__}'s 4-bit does not run on {device} "
            f"({problem}); QLoRA needs bitsandbytes 0.50 or later on a CPU, or a CUDA GPU"
        )


def load_4bit(model_dir: Path, device: str):
    """The model of ``model_dir`` with its linear layers (lm_head aside) in bitsandbytes' NF4 4-bit with double
    quantization, computing in float32, made ready for adapter training by peft (norms in float32, input gradients
    on)."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), quantization_config=quantization, device_map=device,
                                                 dtype=torch.float32, use_safetensors=True)  # fmt: skip
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
