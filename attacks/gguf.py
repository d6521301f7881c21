"""GGUF quantization: the watermarked model written as a llama.cpp GGUF file of one of the types users download most,
and evaluated as a user of that file loads it (transformers' GGUF loader, dequantized to float32).

The types the ``gguf`` package quantizes itself (Q8_0, Q5_1, Q5_0, Q4_1, Q4_0; F16 as a control) are written here,
following llama.cpp's rules for which tensors keep a higher precision (``harness.assets.gguf.write``); the file,
and the type actually written for every tensor, stay in the stage. The k-quants (Q6_K, Q5_K_M, Q4_K_M, Q3_K_M,
Q2_K) are quantized by llama.cpp's own ``llama_model_quantize`` from an F16 file, through ``llama-cpp-python``
(which compiles llama.cpp when installed: 3 to 5 minutes on 2 cores), and refused in one line where it is not.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from attacks.base import MODEL, AttackContext, ModelAttack, library_versions
from harness.config.errors import HarnessError
from harness.config.plugins import Params

QUANTIZED = "quantized"  # the GGUF file a user would download, beside the evaluated folder
OWN_TYPES = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "F16")
K_QUANTS = {"Q6_K": "Q6_K", "Q5_K_M": "Q5_K_M", "Q4_K_M": "Q4_K_M", "Q3_K_M": "Q3_K_M", "Q2_K": "Q2_K"}
LLAMA_CPP = "pip install llama-cpp-python (it compiles llama.cpp: 3 to 5 minutes on 2 cores)"


class GGUFParams(Params):
    type: Literal["Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "F16", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K"] = "Q4_0"


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
                raise HarnessError(f"the GGUF attack writes Llama models, and the base model is a '{kind}'")

    def apply(self, model_dir: Path, out_dir: Path, ctx: AttackContext) -> dict:
        from harness.assets import gguf as gguf_files
        from harness.store import files

        kind = self.params.type
        (out_dir / QUANTIZED).mkdir()
        file = out_dir / QUANTIZED / f"model.{kind}.gguf"
        if kind in K_QUANTS:
            written = self._llama_cpp(model_dir, out_dir, file)
        else:
            written = gguf_files.write(model_dir, file, kind)
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
        gguf_files.write(model_dir, f16, "F16")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{self.params.type}")
        if llama_cpp.llama_model_quantize(str(f16).encode(), str(file).encode(), ctypes.byref(params)) != 0:
            raise HarnessError(f"llama.cpp could not quantize the model to {self.params.type}")
        f16.unlink()
        return gguf_files.tensor_types(file)
