#!/usr/bin/env bash
# Loom's plans against PyTorch's data-parallel peers on the same model, global batch and threads:
#   bench/plan_bench.sh [CONFIG] [ROUNDS]
# Speed: 2 ranks x 1 thread. Loom `data` and `fsdp` under mpirun (fsdp also without the scheduled
# stage's passes, "+nopasses", and gathering each parameter once, "+once") beside
# bench/peer/torch_dist.py:
# DDP over gloo on Debian's PyTorch 1.13 (always) and, where bench/peer/setup_venv.sh has made
# $LOOM_PEER_VENV, DDP and FSDP2 (fully_shard) on PyTorch 2.x, alternated ROUNDS times so all see the
# same machine load. Memory: Loom `data` and `fsdp` on 2 and 4 ranks (each line's per_rank holds the
# planned parameter, gradient and moment bytes and the measured peak RSS). Every line is JSON; the
# last is the summary (bench/summary.py): medians, and Loom's ratio to the strongest peer.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/bench-llama.toml}
rounds=${2:-3}
loom=$PWD/build/release/tools/loom/loom
[[ -x $loom ]] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
source bench/peer/peers.sh
peer_args=(--ranks 2 --threads 1 --steps 10 --warmup 2)
data='[{kind="data",axis="data"}]'
fsdp='[{kind="fsdp",axis="data"},{kind="data",axis="data"}]'
wraps=()
[[ -n $venv_python ]] && wraps=(ddp fsdp2)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((r = 0; r < rounds; r++)); do
  for plan in data fsdp; do
    "${mpirun[@]}" -np 2 "$loom" bench "$config" --steps 10 --warmup 2 \
      --set 'plan.mesh={data=2}' --set "plan.tactics=${!plan}" | tee -a "$log"
  done
  # fsdp without the scheduled stage's passes (as lowered: unbucketed, synchronous), and with each
  # parameter gathered once per step
  for passes in "passes.bucket=none passes.prefetch=false" "passes.reshard_after_forward=false"; do
    sets=()
    for kv in $passes; do sets+=(--set "$kv"); done
    "${mpirun[@]}" -np 2 "$loom" bench "$config" --steps 10 --warmup 2 \
      --set 'plan.mesh={data=2}' --set "plan.tactics=$fsdp" "${sets[@]}" | tee -a "$log"
  done
  "${peer[@]}" /usr/bin/python3 bench/peer/torch_dist.py "$config" --wrap ddp "${peer_args[@]}" |
    tee -a "$log"
  for wrap in "${wraps[@]}"; do
    "${peer[@]}" "$venv_python" bench/peer/torch_dist.py "$config" --wrap "$wrap" "${peer_args[@]}" |
      tee -a "$log"
  done
done
python3 bench/summary.py <"$log"
# memory: one process, then 4 ranks (2 cores: oversubscribed, so only the bytes are of interest)
"$loom" bench "$config" --steps 2 --warmup 1
for plan in data fsdp; do
  "${mpirun[@]}" -np 4 "$loom" bench "$config" --steps 2 --warmup 1 \
    --set 'plan.mesh={data=4}' --set "plan.tactics=${!plan}"
done
