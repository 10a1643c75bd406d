#!/usr/bin/env bash
# Mixture-of-Experts speed, each figure beside its peer in the same run:
#   bench/moe_bench.sh [ROUNDS]          (default 2)
# 1. configs/bench-moe.toml (8 experts of half width, top 2: the same matmul FLOPs per token)
#    against configs/bench-llama.toml, f32 and bf16, one process on 2 threads, alternated ROUNDS
#    times so both see the same machine load.
# 2. bench-moe (f32) with `expert` on 2 ranks x 1 thread under mpirun, beside `data` on the same 2
#    ranks and one process on 2 threads.
# Every run prints its JSON line with a "run" label; the last line holds each label's median
# tokens/s, the MoE runs' median share of expert choices dropped at capacity (moe_dropped_fraction:
# a step with drops does less expert work, so a speed figure is read beside it) and the ratios
# asked for.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
loom=$PWD/build/release/tools/loom/loom
[[ -x $loom ]] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export OMP_WAIT_POLICY=passive
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
label() { python3 -c 'import json,sys
for l in sys.stdin:
    l = l.strip()
    if l.startswith("{"):
        d = json.loads(l); d["run"] = sys.argv[1]; print(json.dumps(d))' "$1" | tee -a "$log"; }
for ((r = 0; r < rounds; r++)); do
  for dtype in f32 bf16; do
    for cfg in bench-llama bench-moe; do
      OMP_NUM_THREADS=2 "$loom" bench configs/$cfg.toml --steps 6 --warmup 2 \
        --set model.dtype=$dtype | label "$cfg $dtype"
    done
  done
  OMP_NUM_THREADS=2 "$loom" bench configs/bench-moe.toml --steps 6 --warmup 2 | label "moe 1 process"
  for plan in expert data; do
    OMP_NUM_THREADS=1 "${mpirun[@]}" -np 2 "$loom" bench configs/bench-moe.toml --steps 6 \
      --warmup 2 --set "plan.mesh={$plan=2}" --set "plan.tactics=[{kind=\"$plan\",axis=\"$plan\"}]" |
      head -1 | label "moe $plan 2 ranks"
  done
done
python3 - "$log" <<'EOF'
import json, statistics, sys
runs, drops = {}, {}
for l in open(sys.argv[1]):
    d = json.loads(l)
    runs.setdefault(d["run"], []).append(d["tokens_per_s"])
    if "moe_dropped_fraction" in d:
        drops.setdefault(d["run"], []).append(d["moe_dropped_fraction"])
med = {k: statistics.median(v) for k, v in runs.items()}
out = {"median_tokens_per_s": med,
       "median_moe_dropped_fraction": {k: statistics.median(v) for k, v in drops.items()}}
for dt in ("f32", "bf16"):
    out[f"moe_over_llama_{dt}"] = med[f"bench-moe {dt}"] / med[f"bench-llama {dt}"]
out["expert2_over_1process"] = med["moe expert 2 ranks"] / med["moe 1 process"]
out["expert2_over_data2"] = med["moe expert 2 ranks"] / med["moe data 2 ranks"]
print(json.dumps(out))
EOF
