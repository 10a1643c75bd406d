#!/usr/bin/env bash
# Two loom binaries on the same plan under mpirun: a change to the distributed runtime against the
# code before it. Alternates `loom bench` of A and B ROUNDS times (AB BA AB ...), each rank one
# thread, prints every run's JSON line (tagged "build": "a" or "b") and one summary line: the
# median step time and tokens/s of each and B's ratio to A.
#   bench/ab_ranks.sh A_LOOM B_LOOM NP ROUNDS CONFIG [--set KEY=VALUE ...]
# e.g. build the commit before a change into /tmp/before, then
#   bench/ab_ranks.sh /tmp/before/build/release/tools/loom/loom build/release/tools/loom/loom 4 3 \
#     configs/bench-llama.toml --set 'plan.mesh={data=2,model=2}' \
#     --set 'plan.tactics=[{kind="fsdp",axis="data"},{kind="megatron",axis="model"}]'
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 5 ]] || { sed -n 2,10p "$0" >&2; exit 2; }
a=$1 b=$2 np=$3 rounds=$4 config=$5
shift 5
for x in "$a" "$b"; do [[ -x $x ]] || { echo "ab_ranks: $x is not an executable" >&2; exit 2; }; done
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((r = 0; r < rounds; r++)); do
  order="a b"
  ((r % 2)) && order="b a"
  for tag in $order; do
    bin=$a
    [[ $tag == b ]] && bin=$b
    "${mpirun[@]}" -np "$np" "$bin" bench "$config" --steps 6 --warmup 1 "$@" |
      python3 -c 'import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        d=json.loads(l); d["build"]=sys.argv[1]; print(json.dumps(d))' "$tag" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = lambda t, f: statistics.median(f(r) for r in runs if r["build"] == t)
step = {t: med(t, lambda r: r["step_ms"]["median"]) for t in ("a", "b")}
tps = {t: med(t, lambda r: r["tokens_per_s"]) for t in ("a", "b")}
print(json.dumps({"summary": "ab_ranks", "config": runs[0]["config"], "plan": runs[0]["plan"],
                  "runs_each": sum(1 for r in runs if r["build"] == "a"),
                  "a_step_ms": round(step["a"], 1), "b_step_ms": round(step["b"], 1),
                  "a_tokens_per_s": round(tps["a"], 1), "b_tokens_per_s": round(tps["b"], 1),
                  "b_over_a_tokens_per_s": round(tps["b"] / tps["a"], 4)}))
PY
