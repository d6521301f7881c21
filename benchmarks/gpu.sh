#!/usr/bin/env bash
# Every GPU path of the harness, once, on one CUDA machine (issue 29), each part's raw output in its own log:
#
#     OUT=results/reference/gpu/raw GPU_BUDGET_S=570 bash benchmarks/gpu.sh
#
# Parts, in priority order (each stops at the budget's deadline; a part already done, marked in .gpu/state, is skipped,
# so a second call on the same warm machine goes on where the first stopped); issue 70's first minutes come first:
#   train_step  benchmarks/train_step.py at the SmolLM2-135M (16 x 512, with a profile of PRO's step and pool
#               regeneration) and 1B shapes: each method's step against plain fine-tuning, its pass-count and FLOP
#               predictions, peak memory
#   pro_memory  benchmarks/pro_memory.py at SmolLM2-135M's shape (30 layers, 16 x 512, PRO with FPL, bf16 autocast) on
#               the GPU at V = 49,152 and 262,144, chunked and unchunked: the chunked path's memory flat in V on CUDA
#   pytest_gpu  pytest -m gpu: the Llama-3.2-1B-shape KGW distillation step (bf16, with and without gradient
#               checkpointing: step time and peak memory) and the accelerate FSDP2 launch of Gu-KGW, PRO and
#               Gloaguen-KGW against one process
#   generate    benchmarks/generate.py at the 1B shape: the harness's sampler against HF generate at batch 128
#   detect      benchmarks/kgw_detect.py (V = 128,256, packed table on the GPU; KTH's detector is CPU only)
#   small       the small LM's build on the GPU and its held-out perplexity (tests/unit/test_small.py, gpu)
#
# The machine may have no network and none of the harness's extra packages: benchmarks/gpu_prepare.sh packs wheels and
# PRO's sentence encoder into .gpu/parts/, carried one part per call and unpacked by benchmarks/gpu_env.sh.
set -u
OUT=${OUT:-results/reference/gpu/raw}
STATE=.gpu/state
mkdir -p "$OUT" "$STATE"
DEADLINE=$(($(date +%s) + ${GPU_BUDGET_S:-570}))
export HARNESS_CACHE=${HARNESS_CACHE:-$PWD/.gpu/cache}
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    source benchmarks/gpu_env.sh
    python3 -c "import torch, transformers, accelerate, pydantic; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'pydantic', pydantic.__version__,
torch.cuda.get_device_name(), torch.cuda.device_count(), 'GPU(s)')"
    git log -1 --format='working tree at %H %s' 2>/dev/null || true
} >"$OUT/env.log" 2>&1  # (a group, not a subshell: what gpu_env.sh exports holds below)
if [ "$GPU_READY" != 1 ]; then
    cat "$OUT/env.log"
    exit 3
fi

part() {  # part NAME CAP_SECONDS: run the function NAME, output to NAME.log, for at most CAP s and within the deadline
    local name=$1 cap=$2 left
    left=$((DEADLINE - $(date +%s)))
    if [ -e "$STATE/$name.done" ]; then
        echo "$name: done in an earlier call" >>"$OUT/timing.txt"
        return
    fi
    if [ "$left" -lt 30 ]; then
        echo "$name: not run (the device time ran out)" >>"$OUT/timing.txt"
        return
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    local start=$(date +%s)
    echo "### $name (at most ${cap} s): $(declare -f "$name" | sed 1,2d | head -n -1)" >>"$OUT/$name.log"
    timeout -k 5 "$cap" bash -c "$name" >>"$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: rc $rc, $(($(date +%s) - start)) s" >>"$OUT/timing.txt"
    [ "$rc" -eq 0 ] && touch "$STATE/$name.done"
}

pytest_gpu() {
    python3 -m pytest -p no:cacheprovider -n 0 -m gpu -s --durations=0 tests/gpu tests/smoke/test_distributed.py ${PYTEST_K:+-k "$PYTEST_K"}
}
train_step() {  # SmolLM2's shape first, at grids/smol-gpu.yaml's batch: where PRO's 3.3 s a step goes there
    python3 benchmarks/train_step.py --random-shape smollm2-135m --batch-size 16 --seq-len 512 --steps 5 \
        --detect-texts 64 --profile &&
        python3 benchmarks/train_step.py --random-shape llama-1b --batch-size 8 --seq-len 512 --steps 5 \
            --detect-texts 256 --detect-tokens 200
}
pro_memory() {
    python3 benchmarks/pro_memory.py --device cuda --fpl --unchunked --layers 30 --batch-size 16 --seq-len 512 \
        --vocabs 49152,262144
}
generate() {
    python3 benchmarks/generate.py --random-shape llama-1b --dtype bfloat16 --prompts 2048 --prompt-tokens 50 \
        --new-tokens 200 --reference-prompts 256
}
detect() {
    python3 benchmarks/kgw_detect.py --texts 5000 --vocab 128256 --loop-texts 20 --fly-texts 50 --device cuda
}
small() {
    python3 -m pytest -p no:cacheprovider -n 0 -m gpu -s --durations=0 tests/unit/test_small.py
    local rc=$?
    cat "$HARNESS_CACHE"/small-*/build.json  # the build's training log (losses), for the perplexity it reaches
    return $rc
}

export -f pytest_gpu train_step pro_memory generate detect small
part train_step 170
part pro_memory 150
part pytest_gpu 260
part generate 60
part detect 70
part small 180
cat "$OUT/timing.txt"
