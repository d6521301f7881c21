#!/usr/bin/env bash
# A real-model reference grid (by default grids/smol-gpu-matched.yaml, SmolLM2-135M at a paper-like shape and matched
# quality, which needs the pack of `GEMMA=1 bash benchmarks/gpu_prepare.sh`) on a lent GPU machine, run in the
# background so that it outlives the call that starts it (issues 42 and 70):
#
#     OUT=<folder> WAIT_S=480 bash benchmarks/gpu_smol.sh
#
# Each call first gathers the part of benchmarks/gpu_prepare.sh's pack that it carries (benchmarks/gpu_env.sh); a call
# before the last part has arrived does nothing more. Once everything is in place, the first call starts the grid's
# groups one after another (GRID_GROUPS, most valuable first, each `harness grid --group`) under setsid, so the grid
# goes on between calls while the machine stays warm. With SHARDS=N (default 3) each group first runs as N shards side
# by side (`--shard I/N`: whole trainings each, so a calibration's swept trainings share the GPU), then once more
# whole, which makes the calibration's choice and runs the attacks on it. Every call then waits up to WAIT_S seconds
# (or until the grid ends) and writes to $OUT what the store holds so far, without model weights (store.tar.xz.*,
# split to the size a call brings back), with the grid's log and the device's name. Run it again on the same machine
# to wait for more; `harness export --grid`, `harness tables` and `harness report` then run here, on the unpacked
# store. RESTART=1 stops the grid running there (its whole process group; finished stages stay in the store) and
# starts GRID_GROUPS afresh, e.g. to give up on a training that cannot finish in the lease:
# RESTART=1 GRID_GROUPS=gu-kgw WAIT_S=170 bash benchmarks/gpu_smol.sh
# The first lease's grid: GRID=grids/smol-gpu.yaml GRID_GROUPS="core cawp attacks baselines" SHARDS=1.
set -u
OUT=${OUT:-/tmp/smol-out}
GRID=${GRID:-grids/smol-gpu-matched.yaml}
GRID_GROUPS=${GRID_GROUPS:-pro cawp gu-kth gloaguen-kgw gu-kgw later decoding}  # issue 70's order
SHARDS=${SHARDS:-3}
WORK=${SMOL_WORK:-/tmp/smol-gpu}  # store, cache and logs: kept while the machine stays warm
mkdir -p "$OUT" "$WORK"
export HARNESS_CACHE=$WORK/cache GRID GRID_GROUPS SHARDS WORK
source benchmarks/gpu_env.sh
[ "$GPU_READY" = 1 ] || exit 0  # a call that only carries a part

if [ "${RESTART:-0}" = 1 ] && [ -e "$WORK/grid.pgid" ]; then
    kill -- "-$(cat "$WORK/grid.pgid")" 2>/dev/null  # (setsid made it a group of its own: the grid and its children)
    sleep 3
    rm -f "$WORK/started" "$WORK/finished" "$WORK/grid.pgid"
    echo "stopped the running grid; starting: $GRID_GROUPS"
fi

if [ ! -e "$WORK/started" ]; then
    {
        date -u
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        python3 -c "import torch, transformers, mergekit, hqq, gguf; print('torch', torch.__version__, 'cuda',
torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
        cat /tmp/gpu-carry/.gpu/commit  # (what gpu_prepare.sh packed at; the tree travels without .git)
        echo "groups: $GRID_GROUPS"
    } >"$WORK/env.log" 2>&1
    date -u +%s >"$WORK/started"
    setsid nohup bash -c '
        for group in $GRID_GROUPS; do
            echo "### group $group: start $(date -u +%T)"
            if [ "$SHARDS" -gt 1 ]; then
                for i in $(seq "$SHARDS"); do
                    harness grid "$GRID" --group "$group" --shard "$i/$SHARDS" --results "$WORK/store" &
                done
                wait
                echo "### group $group: $SHARDS shards done at $(date -u +%T)"
            fi
            harness grid "$GRID" --group "$group" --results "$WORK/store"
            echo "### group $group: rc $? at $(date -u +%T)"
        done
        touch "$WORK/finished"' >>"$WORK/grid.log" 2>&1 </dev/null &
    echo $! >"$WORK/grid.pgid"  # setsid's child leads its own session and group
fi
end=$(($(date +%s) + ${WAIT_S:-60}))
while [ ! -e "$WORK/finished" ] && [ "$(date +%s)" -lt "$end" ]; do
    sleep 5
done
echo "grid $([ -e "$WORK/finished" ] && echo finished || echo 'still running'), $(($(date +%s) - $(cat "$WORK/started"))) s since it started"
grep -a "^### \|cells:\|failed" "$WORK/grid.log" | tail -20
# What the tables and the report need, without weights (a trained model is 0.5 GB; the KGW table 0.3 GB).
rm -f "$OUT"/store.tar.xz.*
[ -d "$WORK/store" ] && (cd "$WORK" && find store -type f -size -8M ! -name '*.safetensors' ! -name '*.bin' ! -name '*.pt' ! -name '*.lock' \
    -print0 | tar --null -T - -cf - | xz -T0 -3 | split -d -a 1 -b 15m - "$OUT/store.tar.xz.")
tail -c 2000000 "$WORK/grid.log" >"$OUT/grid.log"
cp "$WORK/env.log" "$OUT/env.log"
ls -l "$OUT"
