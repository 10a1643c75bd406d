#!/usr/bin/env bash
# The searched plan, run for real: `loom plan --search` picks a plan for CONFIG on R ranks of this
# machine (on CLUSTER, which `loom calibrate` writes first when it is missing), and the plan it
# prints is measured with `mpirun -np R loom bench` beside hand-written plans, alternated within
# each round so all see the same machine load; each plan's prediction (`loom plan` on CLUSTER) sits
# beside its measurement.
#
#   bench/search_real.sh [CONFIG] [CLUSTER] [ROUNDS] [RANKS]
#     (defaults configs/bench-llama.toml runs/search/local.toml 2 "2 4"; STEPS, WARMUP: loom
#     bench's, 6 and 2; BUDGET: the search's seconds, 120)
#
# Prints one JSON line per run (loom bench's, with "plan", "ranks" and "round"), one per plan with
# its median tokens/s and predicted step, and per rank count a summary: the searched plan's median
# against the fastest hand-written plan's.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/bench-llama.toml}
cluster=${2:-runs/search/local.toml}
rounds=${3:-2}
ranks_list=${4:-2 4}
steps=${STEPS:-6}
warmup=${WARMUP:-2}
loom=$PWD/build/release/tools/loom/loom
[[ -x $loom ]] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS
        -x OMP_WAIT_POLICY)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ ! -f $cluster ]]; then
  mkdir -p "$(dirname "$cluster")"
  "$loom" calibrate --out "$cluster" >&2
fi

data='{kind="data",axis="data"}'
declare -A mesh tactics
# hand-written plans: name -> mesh, tactics (the ones docs/plans.md shows, on 2 and 4 ranks)
for n in 2 4; do  # the data-parallel ones on every rank
  mesh[data_$n]="{data=$n}"; tactics[data_$n]="[$data]"
  for z in fsdp zero1 zero2; do
    mesh[${z}_$n]="{data=$n}"; tactics[${z}_$n]="[{kind=\"$z\",axis=\"data\"},$data]"
  done
done
mesh[megatron2]='{model=2}'; tactics[megatron2]='[{kind="megatron",axis="model"}]'
mesh[megatron_sequence2]='{model=2}'
tactics[megatron_sequence2]='[{kind="megatron",axis="model"},{kind="sequence",axis="model"}]'
mesh[megatron_data_2x2]='{data=2,model=2}'
tactics[megatron_data_2x2]="[{kind=\"megatron\",axis=\"model\"},$data]"
mesh[megatron_fsdp_2x2]='{data=2,model=2}'
tactics[megatron_fsdp_2x2]="[{kind=\"megatron\",axis=\"model\"},{kind=\"fsdp\",axis=\"data\"},$data]"
declare -A hand=([2]="data_2 fsdp_2 zero1_2 zero2_2 megatron2 megatron_sequence2"
                 [4]="data_4 fsdp_4 zero1_4 zero2_4 megatron_data_2x2 megatron_fsdp_2x2")

for ranks in $ranks_list; do
  # the search, and its plan as a config of its own
  "$loom" plan "$config" --cluster "$cluster" --devices "$ranks" --search \
    --budget "${BUDGET:-120}" --json >"$tmp/search$ranks.jsonl"
  python3 - "$config" "$tmp/search$ranks.jsonl" "$tmp/searched$ranks.toml" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2])]
open(sys.argv[3], "w").write(open(sys.argv[1]).read() + "\n" + rows[0]["toml"])
print(json.dumps({"ranks_searched": rows[-1]["devices"], "search": rows[-1]}))
EOF
done

predict() {  # predict RANKS NAME CONFIG [SETS...]: loom plan's step_ms
  local ranks=$1 name=$2 cfg=$3
  shift 3
  "$loom" plan "$cfg" --cluster "$cluster" --devices "$ranks" --json "$@" |
    python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['step_ms'])"
}
: >"$tmp/runs.jsonl"
for ((r = 0; r < rounds; r++)); do
  for ranks in $ranks_list; do
    for name in searched ${hand[$ranks]}; do
      if [[ $name == searched ]]; then
        cfg=$tmp/searched$ranks.toml sets=()
      else
        cfg=$config sets=(--set "plan.mesh=${mesh[$name]}" --set "plan.tactics=${tactics[$name]}")
      fi
      "${mpirun[@]}" -np "$ranks" "$loom" bench "$cfg" --steps "$steps" --warmup "$warmup" \
        "${sets[@]}" | python3 -c "
import json, sys
j = json.loads(sys.stdin.readline()); j.update(plan='$name', ranks=$ranks, round=$r)
print(json.dumps(j))" | tee -a "$tmp/runs.jsonl"
    done
  done
done

for ranks in $ranks_list; do
  for name in searched ${hand[$ranks]}; do
    if [[ $name == searched ]]; then
      p=$(predict "$ranks" "$name" "$tmp/searched$ranks.toml")
    else
      p=$(predict "$ranks" "$name" "$config" --set "plan.mesh=${mesh[$name]}" \
        --set "plan.tactics=${tactics[$name]}")
    fi
    echo "{\"plan\": \"$name\", \"ranks\": $ranks, \"predicted_step_ms\": $p}"
  done
done | tee "$tmp/predicted.jsonl"

python3 - "$tmp/runs.jsonl" "$tmp/predicted.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
pred = {(p["plan"], p["ranks"]): p["predicted_step_ms"] for p in map(json.loads, open(sys.argv[2]))}
for ranks in sorted({r["ranks"] for r in runs}):
    med = {}
    for name in dict.fromkeys(r["plan"] for r in runs if r["ranks"] == ranks):
        xs = [r for r in runs if r["ranks"] == ranks and r["plan"] == name]
        med[name] = statistics.median(x["tokens_per_s"] for x in xs)
        step = statistics.median(x["step_ms"]["median"] for x in xs)
        print(json.dumps({"plan": name, "ranks": ranks, "median_tokens_per_s": med[name],
                          "median_step_ms": step, "predicted_step_ms": pred[(name, ranks)],
                          "prediction_error": pred[(name, ranks)] / step - 1}))
    best = max((m, n) for n, m in med.items() if n != "searched")
    print(json.dumps({"ranks": ranks, "searched_tokens_per_s": med["searched"],
                      "best_hand_written": best[1], "best_hand_written_tokens_per_s": best[0],
                      "searched_over_best": med["searched"] / best[0]}))
EOF
