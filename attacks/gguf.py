"""GGUF quantization: the watermarked model written as a llama.cpp GGUF file of one of the types users download most,
and evaluated as a user of that file loads it (transformers' GGUF loader, dequantized to float32).

The types the ``gguf`` package quantizes itself (``OWN_TYPES``; F16 as a control) are written here (``write``),
following llama.cpp's rules for which tensors keep a higher precision; the file, and the type actually written for
every tensor, stay in the stage. The k-quants (``K_QUANTS``) are quantized by llama.cpp's own ``llama_model_quantize``
from an F16 file, through ``llama-cpp-python`` (which compiles llama.cpp when installed: 3 to 5 minutes on 2 cores),
and refused in one line where it is not. Reading a GGUF file back as a model is the assets' (``harness.assets.gguf``),
as for any GGUF file a user names.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Literal

from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.contract.attack import MODEL, QUANTIZED, AttackContext, ModelAttack, library_versions

# The GGUF types the attack writes: those the gguf package quantizes itself (``write``), and llama.cpp's k-quants.
OWN_TYPES = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "F16")
K_QUANTS = ("Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")
LLAMA_CPP = "pip install llama-cpp-python (it compiles llama.cpp: 3 to 5 minutes on 2 cores)"


class GGUFParams(Params):
    type: Literal[OWN_TYPES + K_QUANTS] = "Q4_0"


class GGUF(ModelAttack):
    name = "gguf"
    category = "Quantization"
    label = "GGUF"
    version = "3"  # 2: the special tokens the file names; 3: no GGUF quantization_config
    Params = GGUFParams
    requires = {"gguf": "gguf"}

    def config_label(self) -> str:
        return self.params.type

    def validate(self, base_model: str | None = None) -> None:
        if self.params.type in K_QUANTS and importlib.util.find_spec("llama_cpp") is None:
            raise HarnessError(f"GGUF type {self.params.type} is quantized by llama.cpp's own quantizer: {LLAMA_CPP}")
        if base_model is not None:
            from harness.assets import models

            kind = models.config(base_model).model_type
            if kind != "llama":
                raise HarnessError(
                    f"the GGUF attack writes Llama models only (its writer knows llama.cpp's Llama tensor layout and "
                    f"byte-level BPE vocabulary), and the base model is a '{kind}': quantize it with hqq, gptq, awq, "
                    "int8 or bnb-4bit"
                )

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        from harness.assets import gguf as gguf_files
        from harness.store import files

        kind = self.params.type
        (out_dir / QUANTIZED).mkdir()
        file = out_dir / QUANTIZED / f"model.{kind}.gguf"
        if kind in K_QUANTS:
            written = self._llama_cpp(model_dir, out_dir, file)
        else:
            written = write(model_dir, file, kind)
        report = gguf_files.load_back(file, out_dir / MODEL)
        counts: dict[str, int] = {}
        for tensor in written.values():
            counts[tensor["type"]] = counts.get(tensor["type"], 0) + 1
        return {
            "type": kind,
            "file": f"{QUANTIZED}/{file.name}",
            "file_sha256": files.file_sha256(file),
            "file_bytes": file.stat().st_size,
            "tensor_types": counts,
            "tensors": written,
            "versions": library_versions("gguf", "llama-cpp-python"),
            "evaluated": f"the {kind} GGUF file loaded back by transformers' GGUF loader (dequantized to float32), "
            "as a user of the file loads it",
            **{k: v for k, v in report.items() if k in ("architecture",)},
        }

    def _llama_cpp(self, model_dir: Path, out_dir: Path, file: Path) -> dict:
        """A k-quant by llama.cpp's quantizer from an F16 file of the model; the types it wrote, read back."""
        import ctypes

        import llama_cpp

        from harness.assets import gguf as gguf_files

        f16 = out_dir / QUANTIZED / "model.F16.gguf"
        write(model_dir, f16, "F16")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{self.params.type}")
        if llama_cpp.llama_model_quantize(str(f16).encode(), str(file).encode(), ctypes.byref(params)) != 0:
            raise HarnessError(f"llama.cpp could not quantize the model to {self.params.type}")
        f16.unlink()
        return gguf_files.tensor_types(file)


# --- writing: a transformers Llama folder as a GGUF file ------------------------------------------------------------
# What ``write`` takes: the types the gguf package quantizes itself, and F32 (a lossless file).
WRITABLE = ("F32", *OWN_TYPES)
# llama.cpp keeps the output projection in higher precision than the rest (llama_model_quantize: Q6_K for the
# legacy types); Q8_0 is the highest the gguf package writes.
OUTPUT_TYPE = "Q8_0"


def _tensor_type(name: str, shape: tuple, want: str) -> tuple[str, str]:
    """``(type, why)`` of one tensor, as llama.cpp's quantizer chooses it: 1-D tensors (norms) stay F32, the output
    projection keeps a higher precision, a tensor whose rows are not whole blocks of the type falls back to F16."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if len(shape) == 1:
        return "F32", "1-D tensors stay in F32"
    if want in ("F32", "F16"):
        return want, "asked"
    if name == "output.weight" and want != OUTPUT_TYPE:
        want, why = OUTPUT_TYPE, "the output projection keeps a higher precision"
    else:
        why = "asked"
    block = GGML_QUANT_SIZES[GGMLQuantizationType[want]][0]
    if shape[-1] % block:
        return "F16", f"rows of {shape[-1]} are not whole blocks of {block}"
    return want, why


def _permute(weight, heads: int, kv_heads: int | None = None):
    """Q and K rows in llama.cpp's rotary layout (pairs interleaved per head), as its converter writes them;
    transformers' GGUF loader undoes it."""
    if kv_heads is not None and heads != kv_heads:
        heads = kv_heads
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write(folder: Path | str, path: Path | str, qtype: str) -> dict:
    """Write the Llama model in the transformers folder ``folder`` as the GGUF file ``path``, its matrices in
    ``qtype`` (one of ``WRITABLE``) where llama.cpp's rules allow, with its tokenizer (byte-level BPE) and config in
    the metadata, as llama.cpp's converter does. Returns the type written for every tensor and why."""
    import gguf
    import numpy as np
    from transformers import AutoConfig, AutoTokenizer

    from harness.assets.weights import weight_reader

    if qtype not in WRITABLE:
        raise HarnessError(f"GGUF type {qtype} is not one the gguf package writes ({', '.join(WRITABLE)})")
    folder, path = Path(folder), Path(path)
    config = AutoConfig.from_pretrained(folder)
    if config.model_type != "llama":
        raise HarnessError(f"the GGUF writer takes Llama models, not '{config.model_type}'")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    if spec.get("model", {}).get("type") != "BPE":
        raise HarnessError("the GGUF writer takes byte-level BPE tokenizers (Llama 3's, SmolLM2's, the tiny LM's)")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(folder.name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or 10000.0))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(len(tokenizer))
    writer.add_file_type(gguf.LlamaFileType["ALL_F32" if qtype == "F32" else f"MOSTLY_{qtype}"])
    vocab = tokenizer.get_vocab()
    tokens = [None] * len(tokenizer)
    for token, index in vocab.items():
        if index < len(tokens):
            tokens[index] = token
    special = set(tokenizer.all_special_ids)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))]
    )
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    writer.add_token_merges(merges)
    for name, value in (
        ("bos", tokenizer.bos_token_id),
        ("eos", tokenizer.eos_token_id),
        ("pad", tokenizer.pad_token_id),
    ):
        if value is not None:
            getattr(writer, f"add_{name}_token_id")(value)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    weights = weight_reader(folder)
    written = {}
    for hf_name in weights:
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp reads the output projection from token_embd when there is none
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise HarnessError(f"the GGUF writer has no llama.cpp name for the tensor {hf_name}")
        data = weights[hf_name].float().numpy()
        if hf_name.endswith("q_proj.weight"):
            data = _permute(data, heads, heads)
        elif hf_name.endswith("k_proj.weight"):
            data = _permute(data, heads, kv_heads)
        kind, why = _tensor_type(name, data.shape, qtype)
        if kind == "F32":
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
        elif kind == "F16":
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float16))
        else:
            quant = gguf.GGMLQuantizationType[kind]
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
        written[name] = {"type": kind, "why": why}
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written
