#!/usr/bin/env bash
# Loom's plans against PyTorch DDP (gloo) on the same model, global batch and threads, in one run:
#   bench/plan_bench.sh [CONFIG] [ROUNDS]
# Speed: 2 ranks x 1 thread under mpirun, Loom `data` and `fsdp` beside torch DDP, alternated ROUNDS
# times so all three see the same machine load. Memory: Loom `data` and `fsdp` on 2 and 4 ranks (each
# line's per_rank holds the planned parameter, gradient and moment bytes and the measured peak RSS).
# Every line is JSON; compare medians of ratios (docs/benchmarks.md#plans).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/bench-llama.toml}
rounds=${2:-3}
loom=$PWD/build/release/tools/loom/loom
[[ -x $loom ]] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
data='[{kind="data",axis="data"}]'
fsdp='[{kind="fsdp",axis="data"},{kind="data",axis="data"}]'
for ((r = 0; r < rounds; r++)); do
  "${mpirun[@]}" -np 2 "$loom" bench "$config" --steps 10 --warmup 2 \
    --set 'plan.mesh={data=2}' --set "plan.tactics=$data"
  "${mpirun[@]}" -np 2 "$loom" bench "$config" --steps 10 --warmup 2 \
    --set 'plan.mesh={data=2}' --set "plan.tactics=$fsdp"
  /usr/bin/python3 bench/peer/torch_ddp.py "$config" --ranks 2 --threads 1 --steps 10 --warmup 2
done
# memory: one process, then 4 ranks (2 cores: oversubscribed, so only the bytes are of interest)
"$loom" bench "$config" --steps 2 --warmup 1
for plan in data fsdp; do
  "${mpirun[@]}" -np 4 "$loom" bench "$config" --steps 2 --warmup 1 \
    --set 'plan.mesh={data=4}' --set "plan.tactics=${!plan}"
done
