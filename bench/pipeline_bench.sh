#!/usr/bin/env bash
# The pipeline tactic's bubble against its schedule's theory, and its speed and memory beside data
# parallelism on the same ranks, model and global batch:
#   bench/pipeline_bench.sh [CONFIG] [ROUNDS]
# 2 ranks x 1 thread under mpirun: `pipeline` over 2 stages with gpipe, 1f1b and interleaved (2
# chunks per stage) at 2, 4 and 8 micro-batches, and `data` on 2 ranks (the peer), alternated
# ROUNDS times so all see the same machine load. A stage's measured bubble is the part of its step
# spent waiting in recv (its exposed communication: a pipeline has no other collective), averaged
# over the stages; the theory is (p - 1) / (v m + p - 1), v = 1 for gpipe and 1f1b (1F1B's gain is
# memory: per_rank planned_peak_bytes).
# Every line is JSON; the last is the summary: per configuration the median step time, tokens/s,
# measured bubble and theory, and each rank's planned peak.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/bench-llama.toml}
rounds=${2:-2}
loom=$PWD/build/release/tools/loom/loom
[[ -x $loom ]] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((r = 0; r < rounds; r++)); do
  "${mpirun[@]}" -np 2 "$loom" bench "$config" --steps 6 --warmup 1 \
    --set 'plan.mesh={data=2}' --set 'plan.tactics=[{kind="data",axis="data"}]' | tee -a "$log"
  for schedule in gpipe 1f1b interleaved; do
    for m in 2 4 8; do
      "${mpirun[@]}" -np 2 "$loom" bench "$config" --steps 6 --warmup 1 \
        --set 'plan.mesh={pipe=2}' \
        --set "plan.tactics=[{kind=\"pipeline\",axis=\"pipe\",schedule=\"$schedule\",microbatches=$m}]" |
        tee -a "$log"
    done
  done
done
python3 - "$log" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    runs.setdefault(json.dumps(r["plan"]) + json.dumps(r.get("pipeline")), []).append(r)
out = []
for key, rs in runs.items():
    r0 = rs[0]
    step = statistics.median(r["step_ms"]["median"] for r in rs)
    row = {"plan": r0["plan"], "step_ms": step,
           "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
           "planned_peak_bytes": [p["planned_peak_bytes"] for p in r0["per_rank"]],
           "rounds": len(rs)}
    if "pipeline" in json.dumps(r0["plan"]):
        bubbles = [statistics.mean(p["exposed_comm_ms"] for p in r["per_rank"]) / r["step_ms"]["median"]
                   for r in rs]
        row["bubble_measured"] = statistics.median(bubbles)
        pl = r0["pipeline"]
        row["schedule"], row["microbatches"] = pl["schedule"], pl["microbatches"]
        p, m = pl["stages"], pl["microbatches"]
        v = pl.get("virtual_stages", 1)
        row["virtual_stages"] = v
        row["bubble_theory"] = (p - 1) / (v * m + p - 1)
    out.append(row)
print(json.dumps({"summary": out}))
EOF
